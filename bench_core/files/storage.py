"""The one owner of every on-disk format, and the only module that touches the disk.

Every format has its name, its schema version, its writer and its reader (which validates the whole file
before anything uses it). Every write is atomic; a new file never replaces an existing one (`write_new`), and a
baseline grows only by appending a run. What each version changed is written down in docs/formats.md.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from bench_core.core.errors import InvalidRecord, StorageError
from bench_core.core.records import ColdStart, Measurement, Memory
from bench_core.core.scenario import Scenario, thaw

SCHEMA_VERSION = 3
SESSION_FORMAT = "bench_core.session"
BASELINE_FORMAT = "bench_core.baseline"
DECISION_FORMAT = "bench_core.decision"
REPLICA_FORMAT = "bench_core.replica"         # a fresh process's measurements, read back at once, never stored
STATE_FORMAT, STATE_SCHEMA_VERSION = "bench_core.state", 2
REFERENCE_FORMAT, REFERENCE_SCHEMA_VERSION = "bench_core.reference", 1
NAME_MAX = 100
_NAME_RE = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{NAME_MAX - 1}}}$")
_CONFLICT_RE = re.compile(r"^(<<<<<<<|=======$|>>>>>>>)", re.MULTILINE)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# -- writing ---------------------------------------------------------------------------------------
def _dump(doc: Mapping[str, Any]) -> bytes:
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


# -- records as JSON -------------------------------------------------------------------------------------
def scenario_doc(s: Scenario) -> dict:
    return {"name": s.name, "window": list(s.window), "metadata": thaw(s.metadata),
            "noise_threshold": s.noise_threshold, "description": s.description,
            **({"no_growth": list(s.no_growth)} if s.no_growth else {}),
            **({"cache": s.cache} if s.cache else {}), **({"graph": True} if s.graph else {})}


def scenario_from_doc(d: Mapping[str, Any]) -> Scenario:
    if not isinstance(d.get("window"), list):
        raise InvalidRecord(f"scenario.window must be a list of stage names, got {d.get('window')!r}")
    no_growth = d.get("no_growth", [])
    if not isinstance(no_growth, list):
        raise InvalidRecord(f"scenario.no_growth must be a list of counter names, got {no_growth!r}")
    return Scenario(name=d["name"], window=tuple(d["window"]), metadata=d.get("metadata") or {},
                    noise_threshold=d.get("noise_threshold"), description=d.get("description", ""),
                    no_growth=tuple(no_growth), cache=d.get("cache"), graph=d.get("graph", False))


def measurement_doc(m: Measurement, with_environment: bool = False) -> dict:
    d = {
        "scenario": scenario_doc(m.scenario),
        "device": m.device,
        "mode": m.mode,
        "block_size": m.block_size,
        "warmup": m.warmup,
        "repeats": m.repeats,
        "timer": m.timer,
        "host_ms": list(m.host_ms),
        "gpu_ms": list(m.gpu_ms) if m.gpu_ms is not None else None,
        "cold_start": dict(m.cold_start.__dict__),
        "items": m.items,
        "threads": m.threads,
        "memory": m.memory.to_dict(),
        "summary": m.summary.to_dict(),  # derived, for readers of the file; recomputed on load
        "throughput_per_s": m.throughput,
    }
    if m.telemetry is not None:
        d["telemetry"] = {**thaw(m.telemetry), "flags": list(m.telemetry["flags"])}
    if m.work is not None:
        d["work"] = thaw(m.work)
    if m.ranks is not None:
        d["ranks"] = m.ranks.to_dict()
    if m.signature is not None:
        d["signature"] = m.signature.to_dict()
    if m.op_times is not None:
        d["op_times"] = {op: [ms, n] for op, (ms, n) in m.op_times.items()}
    if m.gpu_timing is not None:
        d["gpu_timing"] = thaw(m.gpu_timing)
    if with_environment:
        d["environment"] = thaw(m.environment)
    return d


def measurement_from_doc(d: Mapping[str, Any], environment: Mapping[str, Any] | None = None) -> Measurement:
    threads = d.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)):
        raise InvalidRecord(f"threads must be a whole number or null, got {threads!r}")
    return Measurement(
        scenario=scenario_from_doc(d["scenario"]),
        device=d["device"],
        mode=d["mode"],
        block_size=d["block_size"],
        warmup=d["warmup"],
        repeats=d["repeats"],
        host_ms=tuple(d["host_ms"]),
        gpu_ms=tuple(d["gpu_ms"]) if d.get("gpu_ms") is not None else None,
        cold_start=ColdStart(**d["cold_start"]),
        items=d.get("items"),
        threads=d.get("threads"),
        memory=Memory(**(d.get("memory") or {})),
        environment=environment if environment is not None else d.get("environment") or {},
        telemetry=d.get("telemetry"),
        work=d.get("work"),
        ranks=None if d.get("ranks") is None else _ranks_from_doc(d["ranks"]),
        signature=None if d.get("signature") is None else _signature_from_doc(d["signature"]),
        op_times=d.get("op_times"),
        gpu_timing=d.get("gpu_timing"),
    )


def _signature_from_doc(d: Any):
    from bench_core.core.signature import Signature

    try:
        return Signature.from_dict(d)
    except (ValueError, TypeError) as exc:
        raise InvalidRecord(f"signature: {exc}") from None


def _ranks_from_doc(d: Any):
    from bench_core.core.ranks import RankSamples

    if not isinstance(d, Mapping):
        raise InvalidRecord("ranks must be an object")
    return RankSamples.from_dict(d)


def run_doc(results: Sequence[Measurement], environment: Mapping[str, Any],
            errors: Iterable[Mapping[str, str]] = (), created: str | None = None) -> dict:
    return {
        "created": created or now_iso(),
        "run_id": uuid.uuid4().hex,      # what makes a run the same run, wherever it is copied
        "environment": dict(environment),
        "results": [measurement_doc(m) for m in results],
        "errors": [dict(e) for e in errors],
    }


def write_session(folder: Path, results: Sequence[Measurement], environment: Mapping[str, Any],
                  errors: Iterable[Mapping[str, str]] = (), comparisons: Sequence[Mapping[str, Any]] = (),
                  against: Mapping[str, Any] | None = None,
                  replicas: Mapping[str, Sequence[Measurement]] | None = None,
                  run: Mapping[str, Any] | None = None) -> Path:
    """Write one session's results under a new, unused name in `folder`; returns the path. `run`: the run's
    document made already (`run_doc`), where something else records the same run."""
    doc = {"format": SESSION_FORMAT, "schema_version": SCHEMA_VERSION,
           **(dict(run) if run is not None else run_doc(results, environment, errors))}
    if comparisons:  # the gate's decisions, for CI artifacts; never read back as results
        doc["comparisons"] = [dict(c) for c in comparisons]
    if against is not None:  # side by side with another revision: both revisions, rounds, code proof
        doc["against"] = dict(against)
    if replicas:  # the gate's fresh-process runs: raw samples kept, never read back as results
        doc["replicas"] = {name: [measurement_doc(m) for m in ms] for name, ms in replicas.items()}
    return write_stamped_json(folder, "session", doc)


def _write_new(folder: Path, stem: str, data: bytes, suffix: str = ".json", stamped: bool = True) -> Path:
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
    return _write_new(folder, stem, _dump(doc))


def safe_stem(name: str, default: str) -> str:
    """A file name part from a scenario or decision name: no separators, no surprises."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:80] or default


def baseline_path(folder: Path, name: str) -> Path:
    if isinstance(name, str) and len(name) > NAME_MAX:   # said as what it is, not as a wrong character
        raise StorageError(Path(folder) / f"{name[:40]}....json", f"baseline name is {len(name)} characters long",
                           hint=f"use at most {NAME_MAX}")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise StorageError(Path(folder) / f"{name}.json", f"baseline name {name!r} is not valid",
                           hint="use letters, digits, '.', '_' or '-', starting with a letter or digit")
    return Path(folder) / f"{name}.json"


def _baseline_lock(path: Path):
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


def save_baseline(folder: Path, name: str, results: Sequence[Measurement], environment: Mapping[str, Any],
                  append: bool = False) -> tuple[Path, int]:
    """Store a session as baseline `name`. An existing baseline grows by one run only with append=True.

    Returns the path and the number of runs the baseline now holds.
    """
    path = baseline_path(folder, name)
    run = run_doc(results, environment)
    # Read, append and write as one step: concurrent CI jobs appending to one baseline must not lose runs.
    with _baseline_lock(path):
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


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:   # json would keep the last silently: three runs read as one
        raise ValueError(f"the key {twice[0]!r} appears twice in one object (a bad merge or a hand edit); keep one")
    return dict(pairs)


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
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicate_keys)
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
    if isinstance(version, bool) or version > SCHEMA_VERSION:
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
            out.append(measurement_from_doc(r, environment=env))
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
    loaded = [_load_results(run, path, f"runs[{j}].") for j, run in enumerate(runs)]
    seen: dict = {}
    for j, (raw, run) in enumerate(zip(runs, loaded)):
        key = raw.get("run_id") or (raw.get("created"), tuple((m.name, m.host_ms) for m in run))
        if key in seen:  # e.g. a merge conflict resolved by keeping both sides: one run counted twice
            raise StorageError(path, f"run {j} is run {seen[key]} again: a run counted twice would make the "
                                     f"baseline look surer than it is", field=f"runs[{j}]",
                               hint=f"remove one of runs[{seen[key]}] and runs[{j}]")
        seen[key] = j
    return doc, loaded


def load_baseline_doc(path: Path) -> dict:
    return _baseline(_read_json(path), path)[0]


def load_run_docs(path: Path) -> list[dict]:
    """The runs of a baseline file, or a session file taken as one run, each a document with `run_id`, `created`,
    `environment` and `results`, all checked before any is returned."""
    doc = _read_json(path)
    if isinstance(doc, dict) and doc.get("format") == SESSION_FORMAT:
        _check_header(doc, path, SESSION_FORMAT)
        _load_results(doc, path, "")
        return [doc]
    return list(_baseline(doc, path)[0]["runs"])


def load_runs(path: Path) -> list[list[Measurement]]:
    """Runs of a baseline file, or of a session file taken as one run."""
    doc = _read_json(path)
    if isinstance(doc, dict) and doc.get("format") == SESSION_FORMAT:
        _check_header(doc, path, SESSION_FORMAT)
        return [_load_results(doc, path, "")]
    return _baseline(doc, path)[1]


def load_candidate(path: Path) -> dict[str, list[Measurement]]:
    """What a file says of the code it measured, by scenario, one measurement per process: a session file's
    results with the fresh processes its gate started (`replicas`: each one more run of the candidate), or a
    baseline file's runs."""
    doc = _read_json(path)
    if not (isinstance(doc, dict) and doc.get("format") == SESSION_FORMAT):
        return by_scenario(_baseline(doc, path)[1])
    _check_header(doc, path, SESSION_FORMAT)
    out = by_scenario([_load_results(doc, path, "")])
    replicas = doc.get("replicas") or {}
    if not isinstance(replicas, dict):
        raise StorageError(path, "replicas must be an object: scenario -> measurements", field="replicas")
    for name, docs in replicas.items():
        ms = _load_results({"environment": doc["environment"], "results": docs}, path, f"replicas.{name}.")
        out.setdefault(name, []).extend(ms)
    return out


def load_errors(path: Path) -> list[dict]:
    """The scenarios a session file records as failed (a baseline file records none)."""
    doc = _read_json(path)
    if isinstance(doc, dict) and doc.get("format") == SESSION_FORMAT:
        errors = _need(doc, "errors", list, path, "")
        return [e for e in errors if isinstance(e, dict)]
    return []


def load_baseline(folder: Path, name: str) -> list[list[Measurement]]:
    path = baseline_path(folder, name)
    if not path.exists():
        known = sorted(p.stem for p in Path(folder).glob("*.json")) if Path(folder).is_dir() else []
        raise StorageError(path, f"baseline {name!r} does not exist",
                           hint=f"known baselines: {', '.join(known) or 'none'}; create one with --bench-save {name}")
    return load_runs(path)


def baseline_runs(folder: Path, name: str) -> list[dict]:
    """What each run of baseline NAME is: index, run_id, date, commit (dirty or not), device, scenario count."""
    path = baseline_path(folder, name)
    if not path.exists():
        load_baseline(folder, name)   # raises the error that names the known baselines
    doc = load_baseline_doc(path)
    return [{"run": i, "run_id": r.get("run_id"), "created": r.get("created"),
             "commit": (r["environment"].get("git_commit") or "")[:12] or None,
             "dirty": r["environment"].get("git_dirty"), "device": r["environment"].get("device"),
             "torch": r["environment"].get("torch"), "scenarios": len(r["results"])}
            for i, r in enumerate(doc["runs"])]


def drop_run(folder: Path, name: str, run: int) -> tuple[Path, int]:
    """Remove run number `run` from baseline NAME (atomically, under the baseline's lock); the last run
    cannot be dropped (remove the file instead). Returns the path and the runs left."""
    path = baseline_path(folder, name)
    with _baseline_lock(path):
        doc = load_baseline_doc(path)
        if not 0 <= run < len(doc["runs"]):
            raise StorageError(path, f"there is no run {run}: the baseline holds runs 0..{len(doc['runs']) - 1}",
                               hint=f"list them with: python -m bench_core baseline list {name}")
        if len(doc["runs"]) == 1:
            raise StorageError(path, "this is the baseline's only run", hint="remove the file to drop the baseline")
        del doc["runs"][run]
        atomic_write(path, _dump(doc), overwrite=True)
        return path, len(doc["runs"])


def by_scenario(runs: Sequence[Sequence[Measurement]]) -> dict[str, list[Measurement]]:
    """Group runs' measurements per scenario name, keeping run order."""
    out: dict[str, list[Measurement]] = {}
    for run in runs:
        for m in run:
            out.setdefault(m.name, []).append(m)
    return out


def write_replica(path: Path, results: Sequence[Measurement]) -> Path:
    """A fresh process's measurements, by scenario, for the process that started it (`read_replica`)."""
    return write_new(Path(path), _dump({"format": REPLICA_FORMAT, "schema_version": SCHEMA_VERSION,
                                        "results": {m.name: measurement_doc(m) for m in results}}))


def read_replica(path: Path, name: str, environment: Mapping[str, Any]) -> Measurement | None:
    """Scenario `name`'s measurement from a fresh process's replica file; None when it measured no such scenario."""
    doc = _read_json(path)
    _check_header(doc, Path(path), REPLICA_FORMAT)
    d = doc.get("results", {}).get(name)
    return None if d is None else measurement_from_doc(d, environment)


def write_decision(folder: Path, record: Mapping[str, Any], name: str) -> Path:
    """Write one A/B decision record (JSON) under a new name; never overwrites."""
    doc = {"format": DECISION_FORMAT, "schema_version": SCHEMA_VERSION, "created": now_iso(), "name": name,
           **record}
    return _write_new(folder, f"decision-{safe_stem(name, 'decision')}", _dump(doc))


def write_pytest_benchmark(path: Path, doc: Mapping[str, Any], replace: bool = False) -> Path:
    """pytest-benchmark's JSON layout (built by `files.pytest_benchmark.to_pytest_benchmark`), never over an
    existing file, except where `replace` says the path is pytest-benchmark's own --benchmark-json, which
    replaces its file each run (atomically here: a reader never sees half of one)."""
    data = (json.dumps(doc, indent=1) + "\n").encode()
    return atomic_write(Path(path), data, overwrite=True) if replace else write_new(Path(path), data)


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


# -- diagnose: profiler traces ---------------------------------------------------------------------------
def profiler_json(export) -> Any:
    """Run `export(path)` (a profiler's Chrome-trace export) into a private temporary folder and return
    the parsed JSON; the raw, unredacted file never stays on disk."""
    with tempfile.TemporaryDirectory(prefix="bench_core-trace-") as tmp:
        path = Path(tmp) / "trace.json"
        export(str(path))
        return json.loads(path.read_text())


def write_trace(folder: Path, scenario: str, doc: Any, tensorboard: bool = False) -> Path:
    """A (redacted) Chrome trace under a new name in `folder`; optionally a copy where TensorBoard's
    profiler plugin looks for it. Returns the trace's path."""
    data = json.dumps(doc).encode()
    path = _write_new(Path(folder), safe_stem(scenario, "scenario"), data, suffix=".trace.json", stamped=False)
    if tensorboard:
        tb = Path(folder) / "tensorboard" / "plugins" / "profile" / path.name.removesuffix(".trace.json")
        write_new(tb / "host.pt.trace.json", data)
    return path


def write_plot(folder: Path, name: str, data: bytes) -> Path:
    """A PNG distribution plot under a new name in `folder` (NAME.png, then NAME-1.png...)."""
    return _write_new(Path(folder), safe_stem(name, "scenario"), data, suffix=".png", stamped=False)


def write_hypotheses(trace: Path, doc: Mapping[str, Any]) -> Path:
    """The diagnose pass's facts and hypotheses beside their trace (`NAME.trace.json` ->
    `NAME.hypotheses.json`), never replacing a file."""
    trace = Path(trace)
    return write_new(trace.with_name(trace.name.removesuffix(".trace.json") + ".hypotheses.json"),
                     _dump(dict(doc)))


def write_rank_hypotheses(folder: Path, scenario: str, doc: Mapping[str, Any]) -> Path:
    """What a distributed scenario's traces say together (`NAME.ranks.hypotheses.json`), under a new name."""
    return _write_new(Path(folder), safe_stem(scenario, "scenario"), _dump(dict(doc)), suffix=".ranks.hypotheses.json",
                      stamped=False)


# -- torch files: starting states and correctness references --------------------------------------------
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


# -- the exchange between a distributed scenario's parent and its ranks ----------------------------------
# Files in a private temporary folder the parent removes afterwards: the spec the parent writes, each rank's
# status (pid and phase, rewritten at each phase) and traceback, and the gathered result of each node.
RANK_SPEC, RANK_RESULT = "spec.json", "node{node}.result.json"


def rank_exchange():
    """A private temporary folder for one launch, removed with everything in it when the context ends."""
    return tempfile.TemporaryDirectory(prefix="bench_core-ranks-")


def open_log(path: Path):
    """A launcher's output file (its ranks' prints and tracebacks), written by the child process."""
    return open(path, "wb")


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")   # a child's colours (a project's addopts: --color=yes)


def log_tail(path: Path, lines: int = 4) -> str:
    """The last lines of a child's log, as plain text for a reason line."""
    try:
        text = _ANSI.sub("", Path(path).read_text(errors="replace"))
    except OSError:
        return ""
    return " / ".join(text.strip().splitlines()[-lines:])


def write_rank_spec(folder: Path, spec: Mapping[str, Any]) -> Path:
    return write_new(Path(folder) / RANK_SPEC, _dump(dict(spec)))


def read_rank_spec(path: Path) -> dict:
    return _read_json(path)


def write_rank_status(folder: Path, rank: int, doc: Mapping[str, Any]) -> Path:
    return atomic_write(Path(folder) / f"rank{rank}.status.json", _dump(dict(doc)), overwrite=True)


def write_rank_error(folder: Path, rank: int, phase: str, trace: str) -> Path:
    return atomic_write(Path(folder) / f"rank{rank}.error.json", _dump({"rank": rank, "phase": phase,
                                                                       "traceback": trace}), overwrite=True)


def write_rank_result(folder: Path, node: int, doc: Mapping[str, Any]) -> Path:
    return write_new(Path(folder) / RANK_RESULT.format(node=node), _dump(dict(doc)))


def read_rank_files(folder: Path) -> dict[str, Any]:
    """What the ranks left: {"status": {rank: doc}, "errors": {rank: doc}, "results": [doc, ...]}; a file
    cut short by a killed rank is skipped (the status of a rank that died mid-write is simply unknown)."""
    out: dict[str, Any] = {"status": {}, "errors": {}, "results": []}
    for path in sorted(Path(folder).glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if path.name.endswith(".status.json"):
            out["status"][int(path.name[4:].split(".")[0])] = doc
        elif path.name.endswith(".error.json"):
            out["errors"][int(doc["rank"])] = doc
        elif path.name.endswith(".result.json"):
            out["results"].append(doc)
    return out
