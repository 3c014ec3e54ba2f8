"""A pytest test replayed elsewhere: called again for a fresh instance of its scenario (this tree's or the
revision's version of the test function), served by a worker process that calls it anew (side by side in worker
mode), or run again as a whole by pytest in a fresh process (the stored gate's replication). The plugin's `bench.run` hands the test's
request here; what pytest knows (its fixtures, its parameters, its file) is read here and nowhere else."""
from __future__ import annotations

import json
import os
import shlex
import sys
import traceback
from pathlib import Path

from bench_core.core.errors import ScenarioError
from bench_core.core.scenario import thaw
from bench_core.shells import options as opt
from bench_core.workflows import measured
from bench_core.workflows.replicas import Replica
from bench_core.workflows.side_by_side.revisions import defines
from bench_core.workflows.side_by_side.capture import capture, instance_from


# a fresh process that runs one test again (the gate's replication) names a pytest-benchmark test's scenario as the
# session that started it did: {node id: scenario name}, since that name can depend on which tests were collected
NAMES_ENV = "BENCH_CORE_PB_NAMES"


def run_against(session, request, sizing, scenario, fn, kwargs):
    """Side by side with --bench-against's revision: this call's step is round 0 of the current side;
    every other instance comes from calling the test function again (this tree's, and the revision's), in this
    process where both sides can share it faithfully, else each side in a pytest process of its own."""
    loaded, name, a = session.revision, scenario.name, session.config.against
    modes = measured.gpu_modes_said(session.config, scenario)
    if session.config.device != "cpu" and modes:
        raise ScenarioError(name, f"its GPU timing modes ({modes}) are taken by plain runs and the stored-baseline "
                                  f"gate; side by side ({opt.AGAINST}) does not apply them, so it is not compared: "
                                  f"gate it against a stored baseline ({opt.COMPARE})")
    value_of = fixture_values(request)
    # a pytest-benchmark test's scenario records what its test was given: the revision's capture records the same
    described = thaw(scenario.metadata) if "benchmark" in request.fixturenames else None

    def rebuild(_round):
        return capture(request.function, value_of, sizing, "current tree", name, described)

    live = instance_from(fn, kwargs, scenario)
    path, function, missing = counterpart_test(loaded, request, name)
    if missing is not None:   # the revision lacks it: measured alone, and reported
        return session.run_alone(scenario, fn, f"measured on the current tree only: {missing}",
                                 new=new_here(loaded, request, name), **kwargs)
    if a.in_processes:
        why = f"{opt.AGAINST_PYTHON} {a.python}" if a.python else opt.AGAINST_PROCESSES
        return _in_processes(session, request, scenario, live, path, function, kwargs, f"asked for ({why})")
    if loaded.compiled is not None:   # two builds of one extension module: never in one process
        return _in_processes(session, request, scenario, live, path, function, kwargs, loaded.compiled.why)
    if request.cls is not None:   # a method needs its class's instance, which only a side's own pytest makes
        return _in_processes(session, request, scenario, live, path, function, kwargs,
                             f"a test method ({request.cls.__name__}.{request.function.__name__}) is run by each "
                             f"side's own pytest")
    theirs, why, isolate = revision_function(session, request, name, path, function)
    if isolate:  # cannot share this process: each side in a process of its own
        return _in_processes(session, request, scenario, live, path, function, kwargs, why)
    if theirs is None:
        return session.run_alone(scenario, fn, f"measured on the current tree only: {why}",
                                 new=new_here(loaded, request, name), **kwargs)
    unfaithful = same_code(session, request, theirs)
    if unfaithful:
        return _in_processes(session, request, scenario, live, path, function, kwargs,
                             f"in one process {loaded.revision.label}'s side would run the current tree's code for "
                             f"{'; '.join(unfaithful)}, which differs in {loaded.revision.label}")

    def rev_build(_round):
        return capture(theirs, value_of, sizing, f"revision {loaded.revision.label}", name, described)

    return session.run_against(scenario, live, rebuild, rev_build, items=kwargs.get("items"),
                               proof={**loaded.proof(request.path, request.function, theirs),
                                      **borrowed_test(loaded, path)},
                               clock=kwargs.get("clock"), backend=kwargs.get("backend"),
                               servers=lambda: process_sides(session, request, name, path, function))


def fixture_values(request):
    """How a test called again gets each argument: its parameter, else its fixture's value in this session."""
    def value_of(arg):
        return request.node.funcargs[arg] if arg in request.node.funcargs else request.getfixturevalue(arg)
    return value_of


def _in_processes(session, request, scenario, live, path, function, kwargs, why):
    sides = process_sides(session, request, scenario.name, path, function)
    loaded = session.revision
    return session.run_against_processes(scenario, live, sides, items=kwargs.get("items"), proof={
        "why_processes": why, **({"compiled": loaded.compiled.to_dict()} if loaded.compiled is not None else {}),
        **borrowed_test(loaded, path)})


def borrowed_test(loaded, path) -> dict:
    """The record's word that the revision's side ran this tree's untracked test file (copied into its tree)."""
    return {"test_from_this_tree": str(path.relative_to(loaded.root))} if path in loaded.borrowed else {}


def new_here(loaded, request, name) -> bool:
    """The revision has no test declaring this scenario, nor this test's file and function: new in this tree."""
    path = loaded.counterpart(request.path)
    return not loaded.declaring(name) and (
        path in loaded.borrowed or not path.exists()
        or f"def {request.function.__name__}(" not in path.read_text(errors="replace"))


def same_code(session, request, theirs) -> list[str]:
    """What would make both sides run the current tree's code although it differs in the revision: fixtures
    (their values are this session's, made by this tree's code) and project modules the revision's test
    imported from this tree. Empty when each side runs its own."""
    from bench_core.workflows.side_by_side import fidelity

    loaded = session.revision
    defs = getattr(getattr(request.node, "_fixtureinfo", None), "name2fixturedefs", {})
    fixtures = {n: d[-1].func for n, d in defs.items() if d and n not in ("bench", "benchmark", "request")}
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
    if not path.exists() and not declared:   # a benchmark written since and never committed measures REV's code too
        path = loaded.borrow_test(request.path) or path
    if not path.exists():
        return None, None, f"{path.relative_to(loaded.root)} does not exist in {label}"
    cls = request.cls.__name__ if request.cls is not None and not declared else None
    if not defines(path, function, cls):   # known before any side's process is asked for it
        return None, None, f"{cls + '.' if cls else ''}{function} does not exist in {label}"
    return path, function, None


def revision_function(session, request, name, path, function):
    """(the revision's version of this test, None, False), or (None, why there is none, whether the reason is
    that it cannot share this process). `path` and `function` name the revision's counterpart of the test
    (`counterpart_test`). A test module of the revision that does not compile or import is the revision's own
    error: a ScenarioError with its traceback."""
    from bench_core.core.errors import RevisionError

    loaded = session.revision
    label = loaded.revision.label
    ops = loaded.operator_code()
    if ops:   # found before loading: a second registration must never replace the current side's kernel
        return None, (f"{', '.join(ops)} differ(s) between {label} and this tree and register(s) torch operators: "
                      f"such code cannot be loaded twice into one process faithfully"), True
    try:
        module = loaded.module_at(path)
    except (SyntaxError, ImportError) as exc:
        if path in loaded.borrowed:   # this tree's new benchmark of code REV does not have: new, not a failure
            return None, f"this tree's untracked {path.name} does not load against {label}: {type(exc).__name__}: " \
                         f"{exc}", False
        trace = "".join(traceback.format_exception(exc)[-4:]).strip()
        raise ScenarioError(name, f"{label}'s test module does not load, so it cannot be compared: "
                                  f"{type(exc).__name__}: {exc}\n{trace}") from exc
    except Exception as exc:
        detail = str(exc) if isinstance(exc, RevisionError) else f"{type(exc).__name__}: {exc}"
        return None, (f"{label}'s test module cannot be loaded beside the current code ({detail}): code that "
                      f"registers global names (a torch.library operator) or a compiled extension cannot be "
                      f"loaded twice into one process"), True
    theirs = getattr(module, function, None)
    return (theirs, None, False) if theirs is not None else (None, f"{function} does not exist in {label}", False)


def process_sides(session, request, name, path, function):
    """Each side's server (see `workflows.worker`) and the test item it serves, for process mode: the current
    tree's test in this interpreter, the revision's counterpart in the revision's tree (and in
    --bench-against-python's interpreter, when given)."""
    from bench_core.workflows.worker import import_roots, server_env

    loaded, c = session.revision, session.config
    here = Path(str(request.config.rootpath)).resolve()
    ini = Path(str(request.config.inipath)).resolve() if request.config.inipath else None
    trees = [str(loaded.current_root), str(loaded.root)]
    if loaded.compiled is not None:   # what a side loaded from either side's just-in-time builds is reported too
        trees += [str(loaded.compiled.extensions_folder(s)) for s in ("candidate", "baseline")]
    forwarded = forwarded_args(request.config)
    xdist = request.config.pluginmanager.hasplugin("xdist")   # in this interpreter's children too

    def side(label, tree, file, func, python):
        moved = (lambda p: tree / p.relative_to(loaded.current_root)) if tree != loaded.current_root else (lambda p: p)
        inside = (lambda p: p is not None and p.is_relative_to(loaded.current_root))
        roots = import_roots(loaded.current_root, tree)
        argv = server_command(python, file, moved(here) if inside(here) else tree,
                              moved(ini) if inside(ini) else None, device=c.device, quick=c.quick,
                              threads=c.threads, timeout_s=c.timeout_s,
                              xdist=python == sys.executable and xdist) + forwarded
        env = server_env(roots, c.malloc)
        if loaded.compiled is not None:   # each side's just-in-time extensions built in a folder of its own
            env["TORCH_EXTENSIONS_DIR"] = str(loaded.compiled.extensions_folder(label))
        init = {"side": label, "tree": str(tree), "python": python, "file": str(file), "roots": trees,
                "forwarded": forwarded,
                "threads": c.threads, "device": c.device, "argv": argv, "env": env, "signature": c.signature}
        spec = {"scenario": name, "file": str(file), "function": func,
                "param_id": getattr(getattr(request.node, "callspec", None), "id", None),
                "cls": request.cls.__name__ if request.cls is not None else None}   # two classes, one method name
        return init, spec
    return {"candidate": side("candidate", loaded.current_root, Path(str(request.path)).resolve(),
                              request.function.__name__, sys.executable),
            "baseline": side("baseline", loaded.root, path, function, c.against.python or sys.executable)}


# pytest's own options that change how a side's code runs, forwarded as typed; the rest of pytest's (selection,
# reporting, debugging) are the session's, and bench_core's own are set for the server by `server_command`
_PYTEST_FORWARDED = {"-p": True, "-o": True, "--override-ini": True, "-W": True, "--pythonwarnings": True,
                     "--import-mode": True}


def forwarded_args(config) -> list[str]:
    """The session's command-line options that each side's server gets too, as typed (PYTEST_ADDOPTS first, then
    the command line): those a conftest file or plugin added with `parser.addoption` (pytest's "custom options":
    a model size, a data path), and pytest's -p, -o, -W and --import-mode. A revision whose conftest lacks such an
    option fails its server with pytest's own usage error, which the comparison quotes."""
    takes_value = dict(_PYTEST_FORWARDED)
    for arg in getattr(getattr(getattr(config, "_parser", None), "_anonymous", None), "options", []):
        attrs = arg.attrs()
        valued = attrs.get("nargs") != 0 and attrs.get("action") not in (
            "store_true", "store_false", "store_const", "append_const", "count")
        takes_value.update({n: valued for n in arg.names() if not n.startswith("--bench")})
    tokens = shlex.split(os.environ.get("PYTEST_ADDOPTS", "")) + [str(a) for a in config.invocation_params.args]
    out, i = [], 0
    while i < len(tokens):
        t = tokens[i]
        if t == "--":
            break
        name, attached = (t.partition("=")[0], "=" in t) if t.startswith("--") else (t[:2], len(t) > 2)
        if t.startswith("-") and name in takes_value:
            out.append(t)
            if takes_value[name] and not attached and i + 1 < len(tokens):
                out.append(tokens[i + 1])
                i += 1
        i += 1
    return out


def pytest_child(python: str, target: str, root: Path, inifile: Path | None, *, device: str, quick: bool,
                 threads: int | None, timeout_s: float | None, xdist: bool = False) -> list[str]:
    """The pytest command of every child bench_core starts (a side's server, the gate's fresh process): `target`
    collected under `root` with this session's device, threads, limit and quick mode, writing no files of its own,
    alone on its cores and in file order (no randomly). `xdist`: pytest-xdist is loaded here, so it is in the child
    too, where a project's `addopts = -n 4` must still parse: `-n 0` runs the item in the child itself."""
    argv = [python, "-m", "pytest", target, "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *["-n", "0"] * xdist,
            f"--rootdir={root}", opt.NO_OUT, f"{opt.THREADS}={'auto' if threads is None else threads}",
            f"{opt.TIMEOUT}={timeout_s or 0}"]
    argv += ["-c", str(inifile)] if inifile is not None and Path(inifile).exists() else []
    argv += [opt.GPU] if device == "cuda" else []
    return argv + ([opt.QUICK] if quick else [])


def server_command(python: str, file: Path, tree: Path, inifile: Path | None, **session) -> list[str]:
    """The pytest command of a side's server: that side's test file, collected in its own tree, measuring nothing
    itself (no files, no gate); its output uncaptured, as the test prints it."""
    return pytest_child(python, str(file), tree, inifile, **session) + ["-s"]


def replica(session, request, name):
    """How the gate's replication runs this test item again (`replica_for`), from what pytest knows of it."""
    config = request.config
    return replica_for(session.config, request.node.nodeid, name, Path(str(config.rootpath)), config.inipath,
                       xdist=config.pluginmanager.hasplugin("xdist"), forwarded=forwarded_args(config))


def replica_for(c, nodeid: str, name: str, root: Path, inipath, *, xdist: bool = False, forwarded=()):
    """The test item `nodeid` run again by pytest in a fresh process of this tree, with its own fixtures,
    parameters and conftest files (and the session's own conftest options, `forwarded`: a model size, a compiler),
    measuring only, with this session's device, threads, GPU modes and malloc, its scenario named `name` whatever
    it collects (`workflows.replicas` runs it, adding the counts)."""
    argv = pytest_child(sys.executable, nodeid, root, inipath, device=c.device, quick=c.quick, threads=c.threads,
                        timeout_s=c.timeout_s, xdist=xdist)
    argv += [f"{opt.CACHE}={c.cache}"] if c.cache else []    # a fresh process asks the same question
    argv += [opt.GRAPH] if c.graph else []
    argv += [f"{opt.MALLOC}={c.malloc}"]       # the fresh process settles it itself, at its own start
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}   # forwarded in argv already
    env[NAMES_ENV] = json.dumps({nodeid: name})
    return Replica(nodeid, tuple([*argv, *forwarded]), str(root), env, (opt.REPLICA, opt.WARMUP, opt.REPEATS))
