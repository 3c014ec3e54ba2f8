"""A side's server in --bench-against's process mode (`--bench-serve`): this pytest process runs the test items
its parent asks for, each up to its bench.run, and serves that scenario's rounds over the channel
(`workflows.worker` has the protocol). Registered as a plugin only in a server; what pytest knows is read here."""
from __future__ import annotations

import atexit
import os
import platform
import sys
from pathlib import Path

import pytest



def start(config, session) -> None:
    """This process becomes a server: one torch thread until a round forks (a child of a process that ran OpenMP
    on more threads hangs), the channel opened, these hooks registered."""
    from bench_core.timing.sampling import set_threads
    from bench_core.workflows.side_server import ServeState

    set_threads(1)
    session.serving = ServeState(session.config.serve)
    config.pluginmanager.register(_Hooks(session), "bench_core_serving")


class _Hooks:
    def __init__(self, session):
        self.session, self.status, self.quit = session, 0, False

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session):
        """The items the parent asks for, not the collected ones in order."""
        if session.testsfailed and not session.config.option.continue_on_collection_errors:
            return None   # collection failed: pytest reports it, the server ends, the parent reads its log
        serve_items(session.items, self.session.serving)
        self.quit = True   # it returns only on the parent's "quit", or once the parent is gone
        return True

    def pytest_sessionfinish(self, session, exitstatus):
        self.status = int(exitstatus)

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config):
        """A server the parent asked to quit ends here, once pytest is done with it: its exit handlers run
        (temporary folders, logging, the user's own), then the process ends without the interpreter taking down
        every object one by one, most of a large server's end, for which the parent waits (docs/side-by-side.md)."""
        if self.quit:
            atexit._run_exitfuncs()
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os._exit(self.status)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if report.failed:   # what the parent is told went wrong
            self.session.serving.failure = str(report.longrepr)[-2000:]


def serve_items(items, state) -> None:
    """A side's server (`--bench-serve`): run the test items the parent asks for, one at a time, each up to its
    bench.run for the scenario asked for (warmed and counted there, see `serve`), then its rounds, each a run of
    the item afresh."""
    from bench_core.workflows.side_server import first_of, serve_rounds

    torch = sys.modules.get("torch")
    state.channel.send({"ready": os.getpid(), "python": platform.python_version(),
                        "torch": getattr(torch, "__version__", None),
                        "malloc": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_")}})
    while True:
        doc = state.channel.recv()
        if doc is None or doc.get("cmd") == "quit":
            return
        if doc.get("cmd") != "item":
            state.channel.send({"error": f"expected an item, got {doc!r}"})
            continue
        wanted = (str(Path(doc["file"]).resolve()), doc["function"], doc.get("param_id"), doc.get("cls"))
        found = [i for i in items if (str(Path(str(i.path)).resolve()), getattr(i, "originalname", i.name),
                                      getattr(getattr(i, "callspec", None), "id", None),
                                      getattr(getattr(i, "cls", None), "__name__", None)) == wanted]
        if len(found) != 1:
            state.channel.send({"error": f"{len(found)} test items here match {Path(doc['file']).name}::"
                                         f"{doc['function']}[{doc.get('param_id')}] (collected: {len(items)})"})
            continue
        item = found[0]
        adoption = item.config.pluginmanager.get_plugin("bench_core_pb")
        if adoption is not None:   # a benchmark test is named as the parent named it, whatever this server collected
            adoption.names[item.nodeid] = doc["scenario"]

        def run_item(item=item):
            # in a forked child, the item is the session's last: every fixture it built (the module's and the
            # session's too: a server that forks builds none) is torn down before the child ends, as at a fresh
            # process's end, so what a fixture started (a process, a file) ends with its round. In a server that
            # cannot fork, the next item is the item's parent: a run tears down only the item itself, so the
            # module's and the session's fixtures stay built, as between the tests of one session (the module, not
            # a test method's class: the next item may be another class's, whose setup needs this class torn down)
            nextitem = None if state.fork else item.getparent(pytest.Module) or item.parent
            item.ihook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        state.begin(doc["scenario"])
        first = first_of(state, run_item, item.nodeid)
        if first == "quit":
            return
        if first == "said":
            continue
        if serve_rounds(state, run_item, item.nodeid) == "quit":
            return
        state.channel.send({"item_done": doc["scenario"], "served": True})


def kept_fixtures(item) -> list[str]:
    """The item's fixtures of a wider scope than the test whose values hold torch state, as "name (scope)", where
    a server that cannot fork builds them once and every round reuses them (a forked round rebuilds them all)."""
    from bench_core.workflows.side_by_side.fidelity import holds_torch_state

    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    kept = []
    for name, value in getattr(item, "funcargs", {}).items():
        scope = getattr((defs.get(name) or [None])[-1], "scope", "function")
        if scope != "function" and holds_torch_state(value):
            kept.append(f"{name} ({scope})")
    return sorted(kept)


def serve(session, request, sizing, scenario, fn, kwargs):
    """bench.run inside a side's server: the scenario asked for is warmed and counted on the item's first run, and
    each later run of the item serves one round of it; any other scenario of the test is passed over (None)."""
    from bench_core.timing.backends import backend_for
    from bench_core.timing.sampling import Sampler, own_threads, set_threads
    from bench_core.workflows import side_server
    from bench_core.workflows.side_by_side.capture import instance_from

    state, name = session.serving, scenario.name
    if name != state.requested or state.reached:
        return None
    state.reached = True
    device = session.config.device
    sampler = Sampler(name, backend_for(device))
    if state.round:
        state.ended_by = side_server.serve_round(state.channel, instance_from(fn, kwargs, scenario), sampler,
                                                  state.places)
        pytest.skip(f"served a round of scenario {name!r} to a side-by-side comparison")
    setup = kwargs.get("setup")
    if state.purpose == "profile":
        side_server.profile(state, fn, setup)
        pytest.skip(f"profiled scenario {name!r} for a side-by-side comparison")
    if not state.fork:
        set_threads(own_threads(session.config.threads))
    state.step = (fn, setup)

    def warm():
        # where the server forks, this runs in the first run's child, whose imports the server then takes over
        # (`side_server.first_of`); a server that cannot fork runs its rounds itself: they start warm, as in one
        # process
        if setup is not None:
            setup()
        fn()

    def count():   # one step of this side, counted exactly, for the parent to compare with the other side's
        from bench_core.timing.signature_count import instructions, record

        what, counter = (("instructions", lambda: instructions(fn, setup, state.instructions)) if state.instructions
                         else ("signature", lambda: record(fn, setup).to_dict()))
        try:
            return {what: counter()}
        except Exception as exc:  # noqa: BLE001 - not counted, and the parent says why
            return {f"{what}_error": f"{type(exc).__name__}: {exc}"}
    counted = state.signature or bool(scenario.no_growth) or bool(state.instructions)
    state.ended_by = side_server.first_run(state.channel, name, sampler, pid=state.pid, fork=state.fork,
                                           files=side_server.loaded_files(state.roots),
                                           warm=warm,
                                           count=count if counted else None,
                                           kept=[] if state.fork else kept_fixtures(request.node))
    pytest.skip(f"warmed scenario {name!r} for a side-by-side comparison")
