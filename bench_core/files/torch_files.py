"""The torch-serialized formats: a starting state (`StartingState.save`) and a correctness reference (the
baseline's observed tensors from one starting state). Read with `weights_only`, on the CPU, the header checked
before anything uses the document; written atomically, as every file is (`atomic`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from bench_core.core.errors import StorageError
from bench_core.files.atomic import atomic_write

STATE_FORMAT, STATE_SCHEMA_VERSION = "bench_core.state", 2
REFERENCE_FORMAT, REFERENCE_SCHEMA_VERSION = "bench_core.reference", 1


def _write_torch(path: Path, doc: Mapping[str, Any], overwrite: bool) -> Path:
    import io

    import torch

    buf = io.BytesIO()
    torch.save(dict(doc), buf)
    return atomic_write(Path(path), buf.getvalue(), overwrite=overwrite)


def _read_torch(path: Path, what: str, fmt: str, max_version: int) -> dict:
    """torch.load (tensors and plain containers only, on the CPU) with the header checked."""
    import torch

    path = Path(path)
    if not path.exists():
        raise StorageError(path, f"{what} file does not exist")
    try:
        doc = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise StorageError(path, f"is not a readable {what}: it is truncated, damaged or not a torch file "
                                 f"({type(exc).__name__})", hint=f"save the {what} again") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise StorageError(path, f"not a bench_core {what}", field="format")
    version = doc.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= max_version:
        raise StorageError(path, f"schema version {version!r} is not one this bench_core reads",
                           field="schema_version", hint="upgrade bench_core")
    return doc


def write_state(path: Path, payload: Mapping[str, Any], meta: Mapping[str, Any], content_hash: str,
                version: int = STATE_SCHEMA_VERSION, overwrite: bool = False) -> Path:
    return _write_torch(path, {"format": STATE_FORMAT, "schema_version": version, "meta": dict(meta),
                               "hash": content_hash, "payload": payload}, overwrite)


def read_state(path: Path) -> dict:
    """A starting-state document: `payload`, `meta`, `hash` (checking the hash is the state's job)."""
    doc = _read_torch(path, "starting state", STATE_FORMAT, STATE_SCHEMA_VERSION)
    for key in ("payload", "hash"):
        if key not in doc:
            raise StorageError(path, "missing", field=key, hint="the file is damaged; save the state again")
    return doc


def write_reference(path: Path, baseline: str, steps: int, state_hash: str, observed: Mapping[str, Any],
                    device: str = "cpu") -> Path:
    """The baseline's observed tensors from one starting state (saved beside it); never overwrites."""
    return _write_torch(path, {"format": REFERENCE_FORMAT, "schema_version": REFERENCE_SCHEMA_VERSION,
                               "baseline": baseline, "steps": steps, "state_hash": state_hash,
                               "records": dict(observed), "device": device}, overwrite=False)


def read_reference(path: Path) -> dict:
    doc = _read_torch(path, "reference", REFERENCE_FORMAT, REFERENCE_SCHEMA_VERSION)
    for key in ("baseline", "steps", "state_hash", "records"):
        if key not in doc:
            raise StorageError(path, "missing", field=key, hint="the file is damaged; record the reference again")
    return doc
