"""A pytest test replayed elsewhere: called again for a fresh instance of its scenario (this tree's or the
revision's version of the test function), or served by a worker process that calls it anew (side by side in
worker mode, and the stored gate's fresh-process replication). The plugin's `bench.run` hands the test's
request here; what pytest knows (its fixtures, its parameters, its file) is read here and nowhere else."""
from __future__ import annotations

import inspect
import json
import sys

from bench_core.core.errors import ScenarioError
from bench_core.workflows.side_by_side.capture import capture, instance_from


def run_against(session, request, sizing, scenario, fn, kwargs):
    """Side by side with --bench-against's revision: this call's step is round 0 of the current side;
    every other instance comes from calling the test function again (this tree's, and the revision's)."""
    loaded, name = session.revision, scenario.name

    def value_of(arg):
        return request.node.funcargs[arg] if arg in request.node.funcargs else request.getfixturevalue(arg)

    def rebuild(_round):
        return capture(request.function, value_of, sizing, "current tree", name)

    theirs, why, isolate = revision_function(session, request)
    if isolate:  # cannot share this process: both sides in pairs of worker processes
        sides = worker_sides(session, request, name)
        if sides is not None:
            return session.run_against_workers(scenario, instance_from(fn, kwargs, scenario), sides,
                                               items=kwargs.get("items"), proof={"why_workers": why})
    if theirs is None:  # the revision lacks it or cannot load it: measured alone, and reported
        session.not_compared(name, f"measured on the current tree only: {why}")
        return session.run(scenario, fn, **kwargs)

    def rev_build(_round):
        return capture(theirs, value_of, sizing, f"revision {loaded.revision.label}", name)

    live = instance_from(fn, kwargs, scenario)
    return session.run_against(scenario, live, rebuild, rev_build, items=kwargs.get("items"),
                               proof=loaded.proof(request.path, request.function, theirs),
                               clock=kwargs.get("clock"), backend=kwargs.get("backend"))


def revision_function(session, request):
    """(the revision's version of this test function, None, False), or (None, why there is none, whether
    the reason is that it cannot share this process)."""
    from bench_core.workflows.side_by_side.revisions import RevisionError

    loaded = session.revision
    if request.cls is not None:
        return None, "only module-level test functions are compared side by side", False
    if not loaded.counterpart(request.path).exists():
        return None, f"{loaded.counterpart(request.path).relative_to(loaded.root)} does not exist in " \
                     f"{loaded.revision.label}", False
    try:
        module = loaded.module_for(request.path)
    except Exception as exc:
        detail = str(exc) if isinstance(exc, RevisionError) else f"{type(exc).__name__}: {exc}"
        return None, (f"{loaded.revision.label}'s test module cannot be loaded beside the current code "
                      f"({detail}): code that registers global names (a torch.library operator) or a "
                      f"compiled extension cannot be loaded twice into one process"), True
    theirs = getattr(module, request.function.__name__, None)
    return (theirs, None, False) if theirs is not None else (
        None, f"{request.function.__name__} does not exist in {loaded.revision.label}", False)


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
    if spec is None:
        session.not_compared(name, why)
        return None
    return {"candidate": (worker_init(session, "candidate", import_roots(loaded.current_root, loaded.current_root)),
                          spec),
            "baseline": (worker_init(session, "baseline", import_roots(loaded.current_root, loaded.root)),
                         {**spec, "test_file": str(loaded.counterpart(request.path))})}


def replicator(session, request, name):
    """The gate's replication: this test measured again in a fresh process of this tree, which imports
    what this process imports (its whole sys.path)."""
    from bench_core.workflows.worker import Worker

    spec, why = worker_spec(request, name)

    def replicate(warmup, repeats):
        if spec is None:
            raise ScenarioError(name, why)
        init = worker_init(session, "candidate", [p for p in sys.path if p])
        with Worker(init, timeout_s=session.config.timeout_s or 600.0, spec=spec) as worker:
            worker.wait_ready()
            worker.build()
            return worker.measure(warmup, repeats, session.environment)
    return replicate
