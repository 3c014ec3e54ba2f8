"""The JSON formats of results: session files, baselines, A/B decisions, a fresh process's replica, and
pytest-benchmark's export; the records inside them as JSON documents, and the strict JSON reader they share.

Every format has its name, its schema version, its writer and its reader (which validates the whole file
before anything uses it). Every write goes through `atomic` (a new file never replaces an existing one), and a
baseline grows only by appending a run. The torch files, the ranks' exchange and the traces and plots live in
modules of their own beside this one. What each version changed is written down in docs/formats.md.
"""
from __future__ import annotations

import datetime as _dt
import json
import re
import uuid
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from bench_core.core.errors import InvalidRecord, StorageError
from bench_core.core.records import ColdStart, Measurement, Memory
from bench_core.core.scenario import Scenario, thaw
from bench_core.files.atomic import (atomic_write, baseline_lock, dump_json, safe_stem, write_new, write_stamped_json,
                                     write_unused)

SCHEMA_VERSION = 3
SESSION_FORMAT = "bench_core.session"
BASELINE_FORMAT = "bench_core.baseline"
DECISION_FORMAT = "bench_core.decision"
REPLICA_FORMAT = "bench_core.replica"         # a fresh process's measurements, read back at once, never stored
NAME_MAX = 100
_NAME_RE = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{NAME_MAX - 1}}}$")
_CONFLICT_RE = re.compile(r"^(<<<<<<<|=======$|>>>>>>>)", re.MULTILINE)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


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
            errors: Iterable[Mapping[str, str]] = (), created: str | None = None, run_id: str | None = None) -> dict:
    return {
        "created": created or now_iso(),
        "run_id": run_id or uuid.uuid4().hex,      # what makes a run the same run, wherever it is copied
        "environment": dict(environment),
        "results": [measurement_doc(m) for m in results],
        "errors": [dict(e) for e in errors],
    }


def write_session(folder: Path, results: Sequence[Measurement], environment: Mapping[str, Any],
                  errors: Iterable[Mapping[str, str]] = (), comparisons: Sequence[Mapping[str, Any]] = (),
                  against: Mapping[str, Any] | None = None,
                  replicas: Mapping[str, Sequence[Measurement]] | None = None,
                  run: Mapping[str, Any] | None = None, shard: Mapping[str, Any] | None = None) -> Path:
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
    if shard is not None:  # a part of a suite split over runners, for `bench-core merge`
        doc["shard"] = dict(shard)
    return write_stamped_json(folder, "session", doc)


def against_section(baseline: Mapping[str, Any], current: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                    one_side: Sequence[tuple[str, str]]) -> dict:
    """A session file's side-by-side section: both revisions, each compared scenario's record (comparison, rounds,
    code proof), and the scenarios measured on one side only with why; read back by `side_by_side_record`."""
    return {"baseline": dict(baseline), "current": dict(current), "scenarios": [dict(r) for r in records],
            "one_side": [{"scenario": n, "note": t} for n, t in one_side]}


def baseline_path(folder: Path, name: str) -> Path:
    if isinstance(name, str) and len(name) > NAME_MAX:   # said as what it is, not as a wrong character
        raise StorageError(Path(folder) / f"{name[:40]}....json", f"baseline name is {len(name)} characters long",
                           hint=f"use at most {NAME_MAX}")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise StorageError(Path(folder) / f"{name}.json", f"baseline name {name!r} is not valid",
                           hint="use letters, digits, '.', '_' or '-', starting with a letter or digit")
    return Path(folder) / f"{name}.json"



def save_baseline(folder: Path, name: str, results: Sequence[Measurement], environment: Mapping[str, Any],
                  append: bool = False, run_id: str | None = None) -> tuple[Path, int]:
    """Store a session as baseline `name`. An existing baseline grows by one run only with append=True.

    Returns the path and the number of runs the baseline now holds.
    """
    path = baseline_path(folder, name)
    run = run_doc(results, environment, run_id=run_id)
    # Read, append and write as one step: concurrent CI jobs appending to one baseline must not lose runs.
    with baseline_lock(path):
        if path.exists():
            if not append:
                raise StorageError(path, f"baseline {name!r} already exists and is never silently overwritten",
                                   hint="pass --bench-append to add this session as another run, or pick a new name")
            doc = load_baseline_doc(path)
            doc["runs"].append(run)
            atomic_write(path, dump_json(doc), overwrite=True)
            return path, len(doc["runs"])
        doc = {"format": BASELINE_FORMAT, "schema_version": SCHEMA_VERSION, "name": name, "runs": [run]}
        atomic_write(path, dump_json(doc), overwrite=False)
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


def read_json(path: Path) -> Any:
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
        raise StorageError(path, "missing", field=f"{where}{key}",
                           hint="the file is not a bench_core file or is damaged")
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
    doc = session_doc(path)
    return doc["environment"], session_results(doc, path)


def session_results(doc: Mapping[str, Any], path: Path) -> list[Measurement]:
    """A session document's measurements, each validated (`path`: where it was read, for the errors)."""
    return _load_results(doc, path, "")


def session_doc(path: Path) -> dict:
    """A session file's whole document, its header checked: every reader of a session file goes through here."""
    doc = read_json(path)
    _check_header(doc, path, SESSION_FORMAT)
    return doc


def side_by_side_record(doc: Mapping[str, Any], scenario: str) -> tuple[dict | None, list[str]]:
    """A session document's side-by-side record of `scenario` (its comparison, rounds and code proof), or None
    with the notes that say why it was measured on one side only."""
    against = doc.get("against") or {}
    recs = [r for r in against.get("scenarios", []) if r.get("scenario") == scenario]
    if recs:
        return recs[0], []
    return None, [o["note"] for o in against.get("one_side", []) if o.get("scenario") == scenario]


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
    return _baseline(read_json(path), path)[0]


def load_run_docs(path: Path) -> list[dict]:
    """The runs of a baseline file, or a session file taken as one run, each a document with `run_id`, `created`,
    `environment` and `results`, all checked before any is returned."""
    doc = read_json(path)
    if isinstance(doc, dict) and doc.get("format") == SESSION_FORMAT:
        _check_header(doc, path, SESSION_FORMAT)
        _load_results(doc, path, "")
        return [doc]
    return list(_baseline(doc, path)[0]["runs"])


def load_runs(path: Path) -> list[list[Measurement]]:
    """Runs of a baseline file, or of a session file taken as one run."""
    doc = read_json(path)
    if isinstance(doc, dict) and doc.get("format") == SESSION_FORMAT:
        _check_header(doc, path, SESSION_FORMAT)
        return [_load_results(doc, path, "")]
    return _baseline(doc, path)[1]


def load_candidate(path: Path) -> dict[str, list[Measurement]]:
    """What a file says of the code it measured, by scenario, one measurement per process: a session file's
    results with the fresh processes its gate started (`replicas`: each one more run of the candidate), or a
    baseline file's runs."""
    doc = read_json(path)
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


def is_merged(path: Path) -> bool:
    """Whether a session file is the merge of shards (`bench-core merge`)."""
    doc = read_json(path)
    return isinstance(doc, dict) and doc.get("format") == SESSION_FORMAT and isinstance(doc.get("merged"), dict)


def load_errors(path: Path) -> list[dict]:
    """The scenarios a session file records as failed (a baseline file records none)."""
    doc = read_json(path)
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
    with baseline_lock(path):
        doc = load_baseline_doc(path)
        if not 0 <= run < len(doc["runs"]):
            raise StorageError(path, f"there is no run {run}: the baseline holds runs 0..{len(doc['runs']) - 1}",
                               hint=f"list them with: python -m bench_core baseline list {name}")
        if len(doc["runs"]) == 1:
            raise StorageError(path, "this is the baseline's only run", hint="remove the file to drop the baseline")
        del doc["runs"][run]
        atomic_write(path, dump_json(doc), overwrite=True)
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
    return write_new(Path(path), dump_json({"format": REPLICA_FORMAT, "schema_version": SCHEMA_VERSION,
                                        "results": {m.name: measurement_doc(m) for m in results}}))


def read_replica(path: Path, name: str, environment: Mapping[str, Any]) -> Measurement | None:
    """Scenario `name`'s measurement from a fresh process's replica file; None when it measured no such scenario."""
    doc = read_json(path)
    _check_header(doc, Path(path), REPLICA_FORMAT)
    d = doc.get("results", {}).get(name)
    return None if d is None else measurement_from_doc(d, environment)


def write_decision(folder: Path, record: Mapping[str, Any], name: str) -> Path:
    """Write one A/B decision record (JSON) under a new name; never overwrites."""
    doc = {"format": DECISION_FORMAT, "schema_version": SCHEMA_VERSION, "created": now_iso(), "name": name,
           **record}
    return write_unused(folder, f"decision-{safe_stem(name, 'decision')}", dump_json(doc))


def write_pytest_benchmark(path: Path, doc: Mapping[str, Any], replace: bool = False) -> Path:
    """pytest-benchmark's JSON layout (built by `files.pytest_benchmark.to_pytest_benchmark`), never over an
    existing file, except where `replace` says the path is pytest-benchmark's own --benchmark-json, which
    replaces its file each run (atomically here: a reader never sees half of one)."""
    data = (json.dumps(doc, indent=1) + "\n").encode()
    return atomic_write(Path(path), data, overwrite=True) if replace else write_new(Path(path), data)
