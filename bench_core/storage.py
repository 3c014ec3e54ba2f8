"""The only module that touches the disk: session results, baselines, atomic writes, validation on load.

Schema history (both file kinds share the version number):
  1 (bench_core 0.1.0): first version. A session file holds `environment` once and `results`, a list
    of measurements with raw samples (`host_ms`, `gpu_ms`), the scenario record and the cold start;
    `errors` lists scenarios that failed; `comparisons` (when gated) the gate's decisions. A baseline
    holds `runs`, each one session's environment and results; a baseline grows by appending runs,
    never by rewriting old ones. A/B decision records (`bench_core.decision`) carry the same version.

Torch files, each with its own version:
  starting state (`bench_core.state`) 1 (0.1.0): payload (model, optimizer, rng, flags, batches), meta,
    sha256 of the payload's content.
  correctness reference (`bench_core.reference`) 1 (0.1.0): the baseline's per-step and final tensors,
    the number of steps and the hash of the starting state saved beside it (NAME.state.pt).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .errors import InvalidRecord, StorageError
from .records import Measurement

SCHEMA_VERSION = 1
SESSION_FORMAT = "bench_core.session"
BASELINE_FORMAT = "bench_core.baseline"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_CONFLICT_RE = re.compile(r"^(<<<<<<<|=======$|>>>>>>>)", re.MULTILINE)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# -- writing ---------------------------------------------------------------------------------------
def _dump(doc: Mapping[str, Any]) -> bytes:
    # allow_nan=False: a NaN must never reach a file that claims to hold timings.
    return (json.dumps(doc, indent=1, allow_nan=False) + "\n").encode()


def atomic_write(path: Path, data: bytes, overwrite: bool) -> Path:
    """Write through a temporary file in the same folder; a reader sees the old file or the new one whole.

    With overwrite=False an existing file is never replaced (os.link fails if the name is taken).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise StorageError(path, "file exists and is never overwritten") from None
            os.unlink(tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def run_record(results: Sequence[Measurement], environment: Mapping[str, Any],
               errors: Iterable[Mapping[str, str]] = (), created: str | None = None) -> dict:
    return {
        "created": created or now_iso(),
        "environment": dict(environment),
        "results": [m.to_dict() for m in results],
        "errors": [dict(e) for e in errors],
    }


def write_session(folder: Path, results: Sequence[Measurement], environment: Mapping[str, Any],
                  errors: Iterable[Mapping[str, str]] = (), comparisons: Sequence[Mapping[str, Any]] = ()) -> Path:
    """Write one session's results under a new, unused name in `folder`; returns the path."""
    doc = {"format": SESSION_FORMAT, "schema_version": SCHEMA_VERSION,
           **run_record(results, environment, errors)}
    if comparisons:  # the gate's decisions, for CI artifacts; never read back as results
        doc["comparisons"] = [dict(c) for c in comparisons]
    return _write_new(folder, "session", _dump(doc))


def _write_new(folder: Path, stem: str, data: bytes) -> Path:
    """Write under `<stem>-<utc time>[-i].json`, the first name not yet taken; never overwrites."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for i in range(1000):
        path = Path(folder) / (f"{stem}-{stamp}.json" if i == 0 else f"{stem}-{stamp}-{i}.json")
        try:
            return atomic_write(path, data, overwrite=False)
        except StorageError:
            continue
    raise StorageError(folder, f"could not find a free file name for {stem}")


def baseline_path(folder: Path, name: str) -> Path:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise StorageError(Path(folder) / f"{name}.json", f"baseline name {name!r} is not valid",
                           hint="use letters, digits, '.', '_' or '-', starting with a letter or digit")
    return Path(folder) / f"{name}.json"


def save_baseline(folder: Path, name: str, results: Sequence[Measurement], environment: Mapping[str, Any],
                  append: bool = False) -> tuple[Path, int]:
    """Store a session as baseline `name`. An existing baseline grows by one run only with append=True.

    Returns the path and the number of runs the baseline now holds.
    """
    path = baseline_path(folder, name)
    run = run_record(results, environment)
    if path.exists():
        if not append:
            raise StorageError(path, f"baseline {name!r} already exists and is never silently overwritten",
                               hint="pass --bench-append to add this session as another run, or pick a new name")
        doc = load_baseline_doc(path)
        doc["runs"].append(run)
        atomic_write(path, _dump(doc), overwrite=True)
        return path, len(doc["runs"])
    doc = {"format": BASELINE_FORMAT, "schema_version": SCHEMA_VERSION, "name": name, "runs": [run]}
    atomic_write(path, _dump(doc), overwrite=False)
    return path, 1


# -- reading ---------------------------------------------------------------------------------------
def _reject_constant(token: str):
    raise ValueError(f"{token} is not a valid timing")


def _read_json(path: Path) -> Any:
    path = Path(path)
    if not path.exists():
        raise StorageError(path, "file does not exist")
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise StorageError(path, "file is empty", hint="it was probably cut short; restore it from version control")
    if _CONFLICT_RE.search(text):
        raise StorageError(path, "file holds git conflict markers",
                           hint="resolve the merge: keep one side or append the runs of both")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise StorageError(path, f"not valid JSON ({exc})",
                           hint="the file may be truncated; restore it from version control") from None


def _need(doc: Mapping, key: str, typ, path: Path, where: str):
    if not isinstance(doc, Mapping) or key not in doc:
        raise StorageError(path, "missing", field=f"{where}{key}", hint="the file is not a bench_core file or is damaged")
    value = doc[key]
    if not isinstance(value, typ) or isinstance(value, bool) and typ is not bool:
        raise StorageError(path, f"has type {type(value).__name__}, expected {getattr(typ, '__name__', typ)}",
                           field=f"{where}{key}")
    return value


def _check_header(doc: Any, path: Path, fmt: str) -> None:
    if not isinstance(doc, dict):
        raise StorageError(path, "top level is not a JSON object")
    version = _need(doc, "schema_version", int, path, "")
    if version > SCHEMA_VERSION:
        raise StorageError(path, f"schema version {version} is newer than this bench_core reads ({SCHEMA_VERSION})",
                           field="schema_version", hint="upgrade bench_core")
    if version < 1:
        raise StorageError(path, f"unknown schema version {version}", field="schema_version")
    got = doc.get("format")
    if got != fmt:
        raise StorageError(path, f"format is {got!r}, expected {fmt!r}", field="format")


def _load_results(run: Mapping, path: Path, where: str) -> list[Measurement]:
    env = _need(run, "environment", dict, path, where)
    results = _need(run, "results", list, path, where)
    out = []
    for i, r in enumerate(results):
        here = f"{where}results[{i}]."
        for key, typ in (("scenario", dict), ("host_ms", list), ("cold_start", dict), ("device", str),
                         ("mode", str), ("block_size", int), ("warmup", int), ("repeats", int)):
            _need(r, key, typ, path, here)
        try:
            out.append(Measurement.from_dict(r, environment=env))
        except (InvalidRecord, KeyError, TypeError) as exc:
            raise StorageError(path, f"invalid measurement: {exc}", field=here.rstrip("."),
                               hint="fix or remove this result") from None
    return out


def load_session(path: Path) -> tuple[dict, list[Measurement]]:
    """Read a session file: (environment, measurements)."""
    doc = _read_json(path)
    _check_header(doc, path, SESSION_FORMAT)
    return doc["environment"], _load_results(doc, path, "")


def _baseline(doc: Any, path: Path) -> tuple[dict, list[list[Measurement]]]:
    """A baseline document checked whole, every run validated, before anything uses it."""
    _check_header(doc, path, BASELINE_FORMAT)
    runs = _need(doc, "runs", list, path, "")
    if not runs:
        raise StorageError(path, "baseline holds no runs", field="runs")
    return doc, [_load_results(run, path, f"runs[{j}].") for j, run in enumerate(runs)]


def load_baseline_doc(path: Path) -> dict:
    return _baseline(_read_json(path), path)[0]


def load_runs(path: Path) -> list[list[Measurement]]:
    """Runs of a baseline file, or of a session file taken as one run."""
    doc = _read_json(path)
    if isinstance(doc, dict) and doc.get("format") == SESSION_FORMAT:
        _check_header(doc, path, SESSION_FORMAT)
        return [_load_results(doc, path, "")]
    return _baseline(doc, path)[1]


def load_baseline(folder: Path, name: str) -> list[list[Measurement]]:
    path = baseline_path(folder, name)
    if not path.exists():
        known = sorted(p.stem for p in Path(folder).glob("*.json")) if Path(folder).is_dir() else []
        raise StorageError(path, f"baseline {name!r} does not exist",
                           hint=f"known baselines: {', '.join(known) or 'none'}; create one with --bench-save {name}")
    return load_runs(path)


def by_scenario(runs: Sequence[Sequence[Measurement]]) -> dict[str, list[Measurement]]:
    """Group runs' measurements per scenario name, keeping run order."""
    out: dict[str, list[Measurement]] = {}
    for run in runs:
        for m in run:
            out.setdefault(m.name, []).append(m)
    return out


def write_decision(folder: Path, record: Mapping[str, Any], name: str) -> Path:
    """Write one A/B decision record (JSON) under a new name; never overwrites."""
    doc = {"format": "bench_core.decision", "schema_version": SCHEMA_VERSION, "created": now_iso(), "name": name,
           **record}
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:80] or "decision"
    return _write_new(folder, f"decision-{safe}", _dump(doc))


# -- torch files: starting states and correctness references --------------------------------------------
def write_torch(path: Path, doc: Mapping[str, Any], overwrite: bool = False) -> Path:
    """torch.save through the same atomic, never-overwriting write as every other file."""
    import io

    import torch

    buf = io.BytesIO()
    torch.save(dict(doc), buf)
    return atomic_write(Path(path), buf.getvalue(), overwrite=overwrite)


def read_torch(path: Path, what: str, fmt: str, max_version: int) -> dict:
    """torch.load (tensors and plain containers only, on the CPU) with the header checked."""
    import torch

    path = Path(path)
    if not path.exists():
        raise StorageError(path, f"{what} file does not exist")
    try:
        doc = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise StorageError(path, f"cannot read the {what} ({type(exc).__name__}: {exc})",
                           hint=f"the file is truncated or not a bench_core {what}; save it again") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise StorageError(path, f"not a bench_core {what}", field="format")
    version = doc.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= max_version:
        raise StorageError(path, f"schema version {version!r} is not one this bench_core reads",
                           field="schema_version", hint="upgrade bench_core")
    return doc


def take_json(path: Path) -> Any:
    """Read a JSON file another library wrote for us, then remove it."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    finally:
        path.unlink(missing_ok=True)
