"""Scan trace strings for what must not leave the machine, and redact it. Pure functions."""
from __future__ import annotations

import re
from collections import Counter
from typing import Any

# Order matters: the most specific patterns first, so a token inside a path is named as a token.
PATTERNS: tuple[tuple[str, re.Pattern], ...] = (
    ("email", re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")),
    ("token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|sk-[A-Za-z0-9_-]{16,}|"
                         r"hf_[A-Za-z0-9]{20,}|xox[abpr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|"
                         r"eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,})")),
    ("secret", re.compile(r"(?i)\b(?:password|passwd|secret|token|api[_-]?key|access[_-]?key)\s*[=:]\s*[^\s,;\"']+")),
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
