"""How every file bench_core writes is written: atomically, through a temporary file in the same folder, so a
reader sees the old file or the new one whole; a new file never replaces an existing one unless asked to; a name
not yet taken is found for files that accumulate. Also the lock around a baseline's read-modify-write, the
`.bench` folder that ignores itself, and the report appended to a job summary. The formats themselves live in
`storage`, `torch_files`, `exchange` and `artifacts`, all of which write through here.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Mapping

from bench_core.core.errors import StorageError


def dump_json(doc: Mapping[str, Any]) -> bytes:
    # allow_nan=False: a NaN must never reach a file that claims to hold timings.
    return (json.dumps(doc, indent=1, allow_nan=False) + "\n").encode()


STALE_TMP_S = 600   # a temporary file this old belongs to a write that was killed


def atomic_write(path: Path, data: bytes, overwrite: bool) -> Path:
    """Write through a temporary file in the same folder; a reader sees the old file or the new one whole.

    With overwrite=False an existing file is never replaced (os.link fails if the name is taken). The new
    file gets the mode an ordinary write would give it (the umask's), or the mode of the file it replaces.
    Temporary files that killed writes of this name left behind are removed. A failure (a full disk, a
    read-only folder) is a StorageError naming the file.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_tmp(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise StorageError(path, f"could not be written: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(path))
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise StorageError(path, "file exists and is never overwritten") from None
            os.unlink(tmp)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise StorageError(path, f"could not be written: {exc.strerror or exc}") from exc
        raise
    return path


def _mode_for(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _remove_stale_tmp(path: Path) -> None:
    import time

    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        try:
            if time.time() - tmp.stat().st_mtime > STALE_TMP_S:
                tmp.unlink()
        except OSError:
            pass  # another process's, or gone already


def write_new(path: Path, data: bytes) -> Path:
    """Write a new file atomically; an existing file of that name is never replaced (StorageError)."""
    return atomic_write(path, data, overwrite=False)


def write_unused(folder: Path, stem: str, data: bytes, suffix: str = ".json", stamped: bool = True) -> Path:
    """Write under `<stem>[-<utc time>][-i]<suffix>`, the first name not yet taken; never overwrites."""
    if stamped:
        stem = f"{stem}-{_dt.datetime.now(_dt.timezone.utc).strftime('%Y%m%dT%H%M%SZ')}"
    for i in range(1000):
        path = Path(folder) / (f"{stem}{suffix}" if i == 0 else f"{stem}-{i}{suffix}")
        try:
            return write_new(path, data)
        except StorageError:
            if not path.exists():  # not a name clash: something else is wrong, say it
                raise
    raise StorageError(folder, f"could not find a free file name for {stem}")


def write_stamped_json(folder: Path, stem: str, doc: Any) -> Path:
    """A JSON document under `folder/<stem>-<utc time>.json`, a new name every time (quality scripts'
    reports, session files)."""
    return write_unused(folder, stem, dump_json(doc))


def safe_stem(name: str, default: str) -> str:
    """A file name part from a scenario or decision name: no separators, no surprises."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:80] or default


def baseline_lock(path: Path):
    """The lock every read-modify-write of a baseline holds: a file in this machine's temporary folder named
    after the baseline's absolute path, never beside the baseline, where it would lie untracked in the user's
    repository (and make its tree dirty). Writers on one machine exclude each other; a baseline folder shared by
    several machines needs one writer at a time."""
    import hashlib

    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    locks = Path(tempfile.gettempdir()) / "bench_core-locks"
    locks.mkdir(exist_ok=True)
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:24]
    return FileLock(str(locks / f"{key}.lock"), timeout=120)


def ignored_by_git(folder: Path) -> None:
    """bench_core's own folder (`.bench`, which holds results and the history) ignores itself, as pytest's cache
    does: nothing bench_core leaves there shows as untracked in the user's repository. Other folders (a
    baselines folder is meant to be committed or cached) are left alone."""
    folder = Path(folder)
    top = next((p for p in (folder, *folder.parents) if p.name == ".bench"), None)
    if top is None:
        return
    try:
        top.mkdir(parents=True, exist_ok=True)
        marker = top / ".gitignore"
        if not marker.exists():
            marker.write_text("# written by bench_core: this folder ignores itself\n*\n")
    except OSError:   # a read-only tree: the writes that follow say so, naming their files
        pass


def append_text(path: Path, text: str) -> Path:
    """Add a report to the end of `path` (a job summary is meant to be appended to): nothing already in it is lost."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise StorageError(path, f"could not be written: {exc.strerror or exc}") from None
    return path
