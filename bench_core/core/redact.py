"""Scan trace strings for what must not leave the machine, and redact it. Pure functions."""
from __future__ import annotations

import re
from collections import Counter
from typing import Any

# Order matters: the most specific patterns first, so a token inside a path is named as a token. Token prefixes
# are matched after any non-alphanumeric character (an underscore included: `my_ghp_...`), not at \b.
_EDGE = r"(?<![A-Za-z0-9])"
PATTERNS: tuple[tuple[str, re.Pattern], ...] = (
    ("private_key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)")),
    ("url_credentials", re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^\s/:@\"']+:[^\s/@\"']+@")),
    ("email", re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")),
    ("token", re.compile(_EDGE + r"(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|sk-[A-Za-z0-9_-]{16,}|"
                         r"hf_[A-Za-z0-9]{20,}|xox[abpr]-[A-Za-z0-9-]{10,}|(?:AKIA|ASIA)[0-9A-Z]{16}|"
                         r"glpat-[A-Za-z0-9_-]{20,}|AIza[0-9A-Za-z_-]{35}|"
                         r"eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,})")),
    # "Authorization: <anything>", or a scheme followed by something that looks like a credential (a digit,
    # 12+ characters): "basic operations" and "token embeddings" are words, not secrets
    ("authorization", re.compile(r"(?i)\bauthorization\s*[=:]\s*(?:(?:bearer|basic)\s+)?[A-Za-z0-9._~+/=-]{4,}|"
                                 r"\b(?:bearer|basic)\s+(?=[A-Za-z._~+/=-]*[0-9])[A-Za-z0-9._~+/=-]{12,}")),
    ("secret", re.compile(r"(?i)(?<![A-Za-z0-9])(?:[A-Za-z0-9]+_)*(?:password|passwd|secret|token|api[_-]?key|"
                          r"access[_-]?key|private[_-]?key)\s*[=:]\s*[^\s,;\"']+")),
    ("home_path", re.compile(r"(?:/home/[^/\s\"']+|/Users/[^/\s\"']+|/root(?=/|\b)|[A-Za-z]:\\Users\\[^\\\s\"']+)")),
    ("private_path", re.compile(r"(?:/private/[^\s\"']+|/var/folders/[^\s\"']+|/mnt/secret[^\s\"']*)")),
)


def redact_text(text: str, found: Counter) -> str:
    for kind, pat in PATTERNS:
        text, n = pat.subn(f"<redacted:{kind}>", text)
        if n:
            found[kind] += n
    return text


def redact(obj: Any, found: Counter | None = None) -> tuple[Any, Counter]:
    """A copy of a JSON-like object with every sensitive string (keys too) redacted, and counts by kind."""
    found = Counter() if found is None else found
    if isinstance(obj, str):
        return redact_text(obj, found), found
    if isinstance(obj, dict):
        return {redact_text(k, found) if isinstance(k, str) else k: redact(v, found)[0] for k, v in obj.items()}, found
    if isinstance(obj, list):
        return [redact(v, found)[0] for v in obj], found
    return obj, found


def describe(found: Counter) -> str:
    if not found:
        return "nothing sensitive found"
    return "redacted " + ", ".join(f"{n} {kind}" for kind, n in sorted(found.items()))
