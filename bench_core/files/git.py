"""Asking git: the one place bench_core runs it (the environment record, revisions to compare with)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Mapping


class GitUnavailable(OSError):
    """git itself could not run (not installed, not startable, too slow)."""


def run(root: str | Path, *args: str, binary: bool = False, timeout: float = 120.0,
        env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """`git ARGS` in `root`, its output captured (bytes when `binary`); a failing command is returned, not raised.
    `env`: variables added to this process's environment for the command (a private index, say)."""
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, timeout=timeout, text=not binary,
                              env=None if env is None else {**os.environ, **env})
    except (OSError, subprocess.SubprocessError) as exc:
        raise GitUnavailable(f"git {' '.join(args)} could not run in {root}: {exc}") from None


def output(root: str | Path, *args: str, timeout: float = 5.0) -> str | None:
    """What a git command printed, stripped; None where git could not run or failed (not observed)."""
    try:
        out = run(root, *args, timeout=timeout)
    except GitUnavailable:
        return None
    return out.stdout.strip() if out.returncode == 0 else None
