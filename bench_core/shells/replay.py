"""A pytest test replayed elsewhere: called again for a fresh instance of its scenario (this tree's or the
revision's version of the test function), served by a worker process that calls it anew (side by side in worker
mode), or run again as a whole by pytest in a fresh process (the stored gate's replication). The plugin's `bench.run` hands the test's
request here; what pytest knows (its fixtures, its parameters, its file) is read here and nowhere else."""
from __future__ import annotations

import inspect
import json
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

from bench_core.core.errors import ScenarioError
from bench_core.files import children, storage
from bench_core.shells import options as opt
from bench_core.workflows.side_by_side.capture import capture, instance_from


def run_against(session, request, sizing, scenario, fn, kwargs):
    """Side by side with --bench-against's revision: this call's step is round 0 of the current side;
    every other instance comes from calling the test function again (this tree's, and the revision's)."""
    loaded, name = session.revision, scenario.name

    def value_of(arg):
        return request.node.funcargs[arg] if arg in request.node.funcargs else request.getfixturevalue(arg)

    def rebuild(_round):
        return capture(request.function, value_of, sizing, "current tree", name)

    theirs, why, isolate = revision_function(session, request, name)
    if isolate:  # cannot share this process: both sides in pairs of worker processes
        sides = worker_sides(session, request, name)
        if sides is not None:
            return session.run_against_workers(scenario, instance_from(fn, kwargs, scenario), sides,
                                               items=kwargs.get("items"), proof={"why_workers": why})
    if theirs is None:  # the revision lacks it or cannot load it: measured alone, and reported
        session.not_compared(name, f"measured on the current tree only: {why}", new=new_here(loaded, request, name))
        return session.run(scenario, fn, **kwargs)

    unfaithful = same_code(session, request, theirs)
    if unfaithful:
        raise ScenarioError(name, f"cannot be compared side by side in one process: {loaded.revision.label}'s side "
                                  f"would run the current tree's code for {'; '.join(unfaithful)}, which differs in "
                                  f"{loaded.revision.label}. Compare it against a stored baseline (--bench-compare), "
                                  f"or keep that code out of fixtures shared by both sides")

    def rev_build(_round):
        return capture(theirs, value_of, sizing, f"revision {loaded.revision.label}", name)

    live = instance_from(fn, kwargs, scenario)
    return session.run_against(scenario, live, rebuild, rev_build, items=kwargs.get("items"),
                               proof=loaded.proof(request.path, request.function, theirs),
                               clock=kwargs.get("clock"), backend=kwargs.get("backend"))


def new_here(loaded, request, name) -> bool:
    """The revision has no test declaring this scenario, nor this test's file and function: new in this tree."""
    path = loaded.counterpart(request.path)
    return not loaded.declaring(name) and (
        not path.exists() or f"def {request.function.__name__}(" not in path.read_text(errors="replace"))


def same_code(session, request, theirs) -> list[str]:
    """What would make both sides run the current tree's code although it differs in the revision: fixtures
    (their values are this session's, made by this tree's code) and project modules the revision's test
    imported from this tree. Empty when each side runs its own."""
    from bench_core.workflows.side_by_side import fidelity

    loaded = session.revision
    defs = getattr(getattr(request.node, "_fixtureinfo", None), "name2fixturedefs", {})
    fixtures = {n: d[-1].func for n, d in defs.items() if d and n not in ("bench", "request")}
    module = sys.modules.get(theirs.__module__)
    return (fidelity.fixture_problems(fixtures, loaded.current_root, loaded.root)
            + ([f"{f} (imported by its test from this tree)"
                for f in fidelity.borrowed(module, loaded.current_root, loaded.root)] if module else []))


def counterpart_test(loaded, request, name):
    """(file, function, None) of the revision's counterpart of this test: the test that declares the same
    scenario name (tests get renamed and moved), else the one with this test's file and name; or (.., why not)."""
    label = loaded.revision.label
    declared = loaded.declaring(name)
    if len(declared) > 1:
        where = ", ".join(f"{p.relative_to(loaded.root)}::{f}" for p, f in declared)
        return None, None, f"{label} declares scenario {name!r} in {len(declared)} tests ({where}): none is its " \
                           f"counterpart for sure"
    path, function = declared[0] if declared else (loaded.counterpart(request.path), request.function.__name__)
    if not path.exists():
        return None, None, f"{path.relative_to(loaded.root)} does not exist in {label}"
    return path, function, None


def revision_function(session, request, name):
    """(the revision's version of this test, None, False), or (None, why there is none, whether the reason is
    that it cannot share this process). The revision's test is the one that declares the same scenario name
    (tests get renamed and moved), else the one with this test's file and name. A test module of the revision
    that does not compile or import is the revision's own error: a ScenarioError with its traceback."""
    from bench_core.workflows.side_by_side.revisions import RevisionError

    loaded = session.revision
    label = loaded.revision.label
    if request.cls is not None:
        return None, "only module-level test functions are compared side by side", False
    path, function, why = counterpart_test(loaded, request, name)
    if why is not None:
        return None, why, False
    ops = loaded.operator_code()
    if ops:   # found before loading: a second registration must never replace the current side's kernel
        return None, (f"{', '.join(ops)} differ(s) between {label} and this tree and register(s) torch operators: "
                      f"such code cannot be loaded twice into one process faithfully"), True
    try:
        module = loaded.module_at(path)
    except (SyntaxError, ImportError) as exc:
        trace = "".join(traceback.format_exception(exc)[-4:]).strip()
        raise ScenarioError(name, f"{label}'s test module does not load, so it cannot be compared: "
                                  f"{type(exc).__name__}: {exc}\n{trace}") from exc
    except Exception as exc:
        detail = str(exc) if isinstance(exc, RevisionError) else f"{type(exc).__name__}: {exc}"
        return None, (f"{label}'s test module cannot be loaded beside the current code "
                      f"({detail}): code that registers global names (a torch.library operator) or a "
                      f"compiled extension cannot be loaded twice into one process"), True
    theirs = getattr(module, function, None)
    return (theirs, None, False) if theirs is not None else (None, f"{function} does not exist in {label}", False)


def worker_spec(request, name):
    """The test a worker process serves to call this test again (its init is per side), or why it
    cannot: the test takes a fixture other than its parameters, or a parameter JSON cannot carry."""
    params = dict(getattr(getattr(request.node, "callspec", None), "params", {}))
    needs = set(inspect.signature(request.function).parameters) - {"bench"}
    try:
        json.dumps(params)
    except TypeError:
        needs.add("a parameter JSON cannot carry")
    if needs - set(params):
        return None, f"worker processes cannot be given {sorted(needs - set(params))}"
    return {"scenario": name, "function": request.function.__name__, "params": params,
            "test_file": str(request.path)}, None


def worker_init(session, side, roots):
    config = session.config
    return {"side": side, "import_roots": roots, "device": config.device, "quick": config.quick,
            "threads": config.threads}


def worker_sides(session, request, name):
    """Each side's worker init and test for --bench-against's worker mode, or None when there can be none."""
    from bench_core.workflows.worker import import_roots

    loaded = session.revision
    spec, why = worker_spec(request, name)
    path, function, missing = counterpart_test(loaded, request, name)
    if spec is None or missing is not None:
        session.not_compared(name, why or missing)
        return None
    return {"candidate": (worker_init(session, "candidate", import_roots(loaded.current_root, loaded.current_root)),
                          spec),
            "baseline": (worker_init(session, "baseline", import_roots(loaded.current_root, loaded.root)),
                         {**spec, "test_file": str(path), "function": function})}


def replicator(session, request, name):
    """The gate's replication: this test item run again by pytest in a fresh process of this tree, with its own
    fixtures, parameters and conftest files, measuring only; its measurement of this scenario comes back."""
    config = request.config
    root = Path(str(config.rootpath))
    limit = (session.config.timeout_s or 600.0) + children.STARTUP_S

    def replicate(warmup, repeats):
        with tempfile.TemporaryDirectory(prefix="bench_core-replica-") as tmp:
            out, log_path = Path(tmp) / "replica.json", Path(tmp) / "pytest.log"
            argv = replica_command(session, request.node.nodeid, root, config.inipath, out, warmup, repeats)
            with storage.open_log(log_path) as log:
                proc = children.start(argv, cwd=str(root), stdout=log, stderr=subprocess.STDOUT)
                try:
                    code = proc.wait(timeout=limit)
                except subprocess.TimeoutExpired:
                    code = None
                finally:
                    children.end(proc)
            tail = storage.log_tail(log_path, 3)
            if code is None:
                raise ScenarioError(name, f"the fresh process ran past {limit:g} s and was ended: {tail}")
            m = storage.read_replica(out, name, session.environment) if out.exists() else None
            if m is None:
                raise ScenarioError(name, f"the fresh process (pytest {request.node.nodeid}, exit {code}) did not "
                                          f"measure this scenario: {tail}")
            return m
    return replicate


def replica_command(session, nodeid: str, root: Path, inipath, out: Path, warmup: int, repeats: int) -> list[str]:
    """The pytest command that runs one test item again in a fresh process, measuring only (no gate, no files
    but the replica's), with this session's device, counts and threads."""
    c = session.config
    argv = [sys.executable, "-m", "pytest", nodeid, "-q", "-p", "no:cacheprovider", f"--rootdir={root}",
            "--bench-no-out", f"{opt.REPLICA}={out}", f"{opt.WARMUP}={warmup}", f"{opt.REPEATS}={repeats}",
            f"{opt.THREADS}={'auto' if c.threads is None else c.threads}", f"{opt.TIMEOUT}={c.timeout_s or 0}"]
    argv += ["-c", str(inipath)] if inipath else []
    argv += [opt.GPU] if c.device == "cuda" else []
    return argv + ([opt.QUICK] if c.quick else [])
