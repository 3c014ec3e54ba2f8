"""The server's side of process mode: what runs inside a side's pytest process (`--bench-serve`, driven by
`shells/serving.py`) to serve its test item's rounds over the `channel`.

Where the server may fork, it never runs the item itself: the item's first run (which reports what the side
loaded and counts its step) and each round run in children forked from it, so every child starts from the state a
fresh process of the side has after collecting its tests, its allocator untouched by the step (glibc's malloc
as-is tunes its thresholds from what a process freed, and a server that had run the step passed its tuning to
every child: docs/lab/program-as-run.md). A round's child runs the whole item afresh, its module's and session's
fixtures included, as a fresh process would, after laying out a heap of a random shape; it is then a unit of
evidence as a round in one process is (`quality/fork_bias.py`). The server runs one torch thread (a child of a
process that ran OpenMP on more threads hangs), and a round's child takes the session's count. A server that has
initialized CUDA cannot fork; it runs the item itself, keeping the module's fixtures between rounds, and its
process is then the unit.
"""
from __future__ import annotations

import ctypes
import os
import random
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

from bench_core.core.errors import ScenarioError
from bench_core.timing.sampling import keep_frozen
from bench_core.workflows.channel import Channel


class ServeState:
    """A server's state: its channel, what the parent said about it, and the item under way."""

    def __init__(self, fds: tuple[int, int]):
        self.channel = Channel(*fds)
        self.pid = os.getpid()   # the server's, which its children report as theirs
        init = self.channel.recv() or {}
        self.side, self.threads = init.get("side", "side"), init.get("threads")
        self.roots: list[str] = list(init.get("roots", []))
        self.signature = bool(init.get("signature"))   # count the step's work signature before serving it
        self.instructions: str | None = init.get("instructions")   # under callgrind: count, into this folder
        self.device: str = init.get("device") or "cpu"
        self.step: tuple | None = None      # (fn, setup) of the instance a profiler pass profiles
        self.requested: str | None = None   # the scenario the item under way is to serve
        self.purpose = "first"              # what this run of the item is for: "first" (count, report), a
                                            # "round", or a "profile" pass
        self.reached = False                # this run of the item reached bench.run for the scenario asked for
        self.fork = True                    # the item runs in forked children (decided before its first run)
        self.failure: str | None = None     # this run's own failure, when it had one
        self.ended_by: str | None = None    # how this run's serving ended: "end", "quit", "failed"
        self.places: tuple | None = None    # a round's child: (CPUs held to for its samples, CPUs it builds on)

    def begin(self, scenario: str) -> None:
        self.requested = scenario
        self.again()

    def again(self, purpose: str = "first") -> None:
        """Before each run of the item, for `purpose` (see `self.purpose`)."""
        self.purpose, self.reached, self.failure, self.ended_by = purpose, False, None, None

    @property
    def round(self) -> bool:
        return self.purpose == "round"

    def missed(self, nodeid: str) -> str:
        return (f"{nodeid} did not reach bench.run for scenario {self.requested!r}"
                f"{'' if self.purpose == 'first' else ' in a ' + self.purpose}: "
                f"{self.failure or 'it never measured it'}")


_KEEP: list = []   # a forked child's scattered heap, alive until the child ends


def _scatter_heap(rng: random.Random) -> None:
    """Blocks of random sizes and number, never freed, before the child builds: where its instance lands is drawn
    afresh, instead of inherited from the server, which alone leaves memory-bound work with the server's bias
    (docs/side-by-side.md)."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    _KEEP.extend(libc.malloc(rng.randint(1, 64) << rng.randint(4, 16)) for _ in range(rng.randint(1, 64)))
    import torch

    _KEEP.append(torch.empty(rng.randint(0, 1 << 22), dtype=torch.uint8))


def _die_with_parent() -> None:
    """A forked child ends with its server, even one killed by SIGKILL (Linux; elsewhere the closed pipe ends it)."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except (AttributeError, OSError):
        pass


def _in_child(work: Callable[[], int], failed: int) -> int:
    """`work()` in a child forked from this server, which ends with it (exit code: what it returned, `failed` if it
    raised; it never returns into the server's loop) and with the server; returns its wait status."""
    pid = os.fork()
    if pid == 0:
        code = failed
        try:
            _die_with_parent()
            code = work()
        finally:
            os._exit(code)
    return os.waitpid(pid, 0)[1]


def can_fork(device: str) -> bool:
    if not hasattr(os, "fork") or device == "cuda":
        return False
    torch = sys.modules.get("torch")
    return torch is None or not torch.cuda.is_initialized()


def first_run(channel: Channel, name: str, sampler, *, pid: int, fork: bool, files: Mapping[str, str | None],
              warm: Callable[[], Any] | None, count: Callable[[], Mapping[str, Any]] | None,
              kept: list[str] = ()) -> str:
    """The item's first run (`first_of`), at its bench.run: said ("reached"), then on the parent's "go" (the other
    side's server has reached its own, see `Worker.assign`) `warm()` untimed (in a child: what the step's first call
    imports, the server imports; a server that cannot fork: its rounds start warm), then `count()`, whose fields
    (the step's work signature) go to the parent with the "serving" line, with the server's `pid` and `kept` (the
    fixtures every round reuses, see `serving.kept_fixtures`). Returns "served", "failed" (said), or "quit" (the
    parent ended it, or is gone)."""
    channel.send({"reached": name})
    doc = channel.recv()
    if doc is None or doc.get("cmd") != "go":
        return "quit"
    if warm is not None:
        try:
            sampler.call("the first run's warming call", warm)
        except ScenarioError as exc:
            channel.send({"error": exc.problem})
            return "failed"
    counted = dict(count()) if count is not None else {}
    channel.send({"serving": name, "pid": pid, "fork": fork, "files": dict(files), "kept": list(kept),
                  **counted})
    return "served"


def first_of(state: ServeState, run_item: Callable[[], None], nodeid: str) -> str:
    """The item's first run (see `first_run`), in a child forked from this server where it may fork, so that the
    server never runs the step; returns "served", "said" (its failure is said) or "quit". The modules that run
    imported (its fixtures, its step's first call) are then imported here, so that each round's child starts with
    them loaded, as a fresh process has them by the time it measures: built afresh in every child, an optimizer's
    lazy imports alone took most of a second a round."""
    def first(imported: int | None = None) -> int:
        run_item()
        if imported is not None:
            os.write(imported, "\n".join(sorted(sys.modules)).encode())
        if state.ended_by == "quit":
            return _QUIT_STATUS
        if state.ended_by == "failed":   # said already
            return _SAID_STATUS
        if not state.reached:
            state.channel.send({"error": state.missed(nodeid)})
            return _SAID_STATUS
        return 0
    state.fork = can_fork(state.device)
    if not state.fork:
        code = first()
        return {0: "served", _QUIT_STATUS: "quit"}.get(code, "said")
    # the child's word on what it imported, in a file with no name (a process killed here leaves nothing behind)
    with tempfile.TemporaryFile() as imported:
        status = _in_child(lambda: first(imported.fileno()), failed=_FAILED_STATUS)
        imported.seek(0)
        _import_as(imported.read().decode().split())
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    if code in (0, _QUIT_STATUS, _SAID_STATUS):
        return {0: "served", _QUIT_STATUS: "quit"}.get(code, "said")
    state.channel.send({"error": f"{nodeid}: the test's first run, in a child of this side's process, "
                                 f"{_ended_how(status)}"})
    return "said"


def _import_as(names: list[str]) -> None:
    """Imports each module of `names` this process lacks, parents first; one that does not import by its name
    (a module registered under another, an extension's submodule) is left to the child that needs it."""
    import importlib

    for name in sorted(set(names) - set(sys.modules), key=lambda n: (n.count("."), n)):
        if name in sys.modules or name == "__main__":
            continue
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - any failure only leaves the import to the rounds' children
            pass


def _ended_how(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"was killed by signal {os.WTERMSIG(status)}"
    code = os.WEXITSTATUS(status)
    return "raised out of pytest" if code == _FAILED_STATUS else f"ended with exit code {code}"


def serve_rounds(state: ServeState, run_item: Callable[[], None], nodeid: str) -> str:
    """Rounds of the item's scenario until the parent says "done" (or "quit", or is gone): returned. Each "round"
    runs the test item afresh (`run_item`: its function-scoped fixtures, then the test, whose bench.run serves the
    round with `serve_round`), in a child forked from this server where `state.fork`."""
    from bench_core.timing.sampling import build_cpus, hold_to, own_threads, set_threads

    channel = state.channel
    while True:
        doc = channel.recv()
        cmd = None if doc is None else doc.get("cmd")
        if cmd in (None, "done", "quit"):
            return cmd or "quit"
        if cmd == "profile":
            _profile_reply(state, run_item, nodeid)
            continue
        if cmd != "round":
            channel.send({"error": f"{cmd!r} outside a round"})
            continue
        state.again("round")
        if not state.fork:
            hold_to(doc.get("cpus"))
            run_item()
            if state.ended_by == "quit":
                return "quit"
            if not state.reached:
                channel.send({"error": state.missed(nodeid)})
            channel.send({"ended": 0})
            continue
        def round_child(cpus=doc.get("cpus")) -> int:
            # what the server made is frozen out of the child's collections, as one process freezes what exists
            # before its rounds (`sampling.gc_frozen`): a collection that walked it would land in a sample
            # (docs/side-by-side.md) and write to the pages of every object it walked, which a forked child copies
            keep_frozen()
            _scatter_heap(random.Random(int.from_bytes(os.urandom(8), "little")))
            # it builds beside the other side's child, on the CPUs near its own (`build_cpus`), and is held to
            # `cpus` before its first call (`serve_round`): held to one CPU from the start, the two builds take turns
            state.places = (cpus, build_cpus(cpus))
            hold_to(state.places[1])   # before its threads start: they inherit it
            set_threads(own_threads(state.threads))
            run_item()
            if not state.reached:
                channel.send({"error": state.missed(nodeid)})
            return _QUIT_STATUS if state.ended_by == "quit" else 0
        status = _in_child(round_child, failed=0)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == _QUIT_STATUS:   # the child took the parent's "quit"
            return "quit"
        channel.send({"ended": status})


_QUIT_STATUS = 75   # a child ending on the parent's "quit": the server ends too
_SAID_STATUS = 76   # a child whose run of the item failed, which it said to the parent
_FAILED_STATUS = 77   # a child that raised out of its run of the item


SERVED_PROFILE_CALLS = 1   # a verdict's explanation, not its evidence: one profiled call a pass, `PASSES` passes in
                           # the one forked child (more cost a visible share of a process-mode comparison's time:
                           # docs/lab/from-the-code.md)


def _profile_reply(state: ServeState, run_item: Callable[[], None], nodeid: str) -> None:
    """The parent's "profile", answered from a child forked from the server, where it may fork, which runs the item
    afresh up to its bench.run (`profile`): profiler passes in the server itself would change what the next items'
    children inherit (docs/side-by-side.md)."""
    from bench_core.timing.sampling import own_threads, set_threads

    if not state.fork:
        state.channel.send(_profiled(state))
        return

    def profile_child() -> int:
        set_threads(own_threads(state.threads))
        state.again("profile")
        run_item()
        if not state.reached:
            state.channel.send({"error": f"profiler pass: {state.missed(nodeid)}"})
        return 0
    status = _in_child(profile_child, failed=1)
    if status != 0:   # it ended before it answered
        state.channel.send({"error": f"profiler pass: its process ended with wait status {status}"})


def profile(state: ServeState, fn, setup) -> None:
    """At bench.run in a child run for the profiler passes: they are answered from this run's instance."""
    state.step = (fn, setup)
    state.channel.send(_profiled(state))


def _profiled(state: ServeState) -> dict:
    """The profiler passes of the item's instance (its first run's where the server cannot fork, else one built
    for them in the child), after its rounds: `PASSES` of them, each an operator's sample for
    `deciding.explained`."""
    from bench_core.timing.backends import backend_for
    from bench_core.timing.protocol import ROUND_WARM_MS, Instance, warm_for
    from bench_core.timing.sampling import Sampler
    from bench_core.workflows.diagnose.moved import PASSES, op_times

    if state.step is None:
        return {"error": "profiler pass: the item has no instance in its server"}
    try:
        # the pass runs in a freshly forked child, whose first calls run slow as a round's do, so it warms as a
        # round does (`ROUND_WARM_MS`): with one warm call, a short step's profiled calls can read several times
        # its settled time (docs/lab/from-the-code.md)
        warm_for(Sampler(state.requested or "profiled", backend_for(state.device)), Instance(*state.step),
                 ROUND_WARM_MS, "the profiler pass")
        passes = [op_times(*state.step, calls=SERVED_PROFILE_CALLS, device=state.device) for _ in range(PASSES)]
        return {"op_times": passes, "pid": os.getpid()}
    except Exception as exc:  # noqa: BLE001 - the verdict stands; the parent says why there is no pass
        return {"error": f"profiler pass: {type(exc).__name__}: {exc}"}


def serve_round(channel: Channel, inst, sampler, places: tuple | None = None) -> str:
    """One round's instance (`inst`, this run of the test's), sampled until another command than "sample" comes
    (returned; "quit" when the parent is gone). `places`: (the CPUs to hold this process to for its samples, the
    CPUs it built on and ends on, beside the other side's), as `ServeState.places`."""
    from bench_core.files.storage import scenario_doc
    from bench_core.timing.sampling import gc_paused, hold_to

    if inst.clock is not None:   # the clock the test asked for (a test's fake), as in one process
        sampler = type(sampler)(sampler.scenario, sampler.backend, inst.clock)
    held, wide = places or (None, None)
    hold_to(held)
    # as one process takes its pairs: no collection lands in a sample; the one before them comes before "built",
    # so that it never runs beside the other side's first call
    with gc_paused():
        channel.send({"built": None if inst.scenario is None else scenario_doc(inst.scenario), "pid": os.getpid()})
        cmd = _serve_samples(channel, inst, sampler)
    hold_to(wide)   # the test's teardown and the process's end, beside the other side's
    return cmd


def _serve_samples(channel: Channel, inst, sampler) -> str:
    """`serve_round`'s loop: returns the first command that is neither "sample", "first" nor "warm"."""
    from bench_core.timing.protocol import first_then_sample, sample_of, warm_for

    while True:
        doc = channel.recv()
        cmd = "quit" if doc is None else doc.get("cmd")
        if cmd not in ("sample", "first", "warm"):
            return cmd
        try:
            if cmd == "warm":
                channel.send({"warmed": warm_for(sampler, inst, float(doc["ms"]), "the round's instance")})
                continue
            if cmd == "first":
                cold, s = first_then_sample(sampler, inst, float(doc["warm_ms"]), bool(doc.get("ahead")))
                channel.send({"first": [cold.host_ms, cold.gpu_ms], "host_ms": s.host_ms, "gpu_ms": s.gpu_ms})
                continue
            s = sample_of(sampler, inst, "a sample", bool(doc.get("ahead")))
            channel.send({"host_ms": s.host_ms, "gpu_ms": s.gpu_ms})
        except ScenarioError as exc:
            channel.send({"error": exc.problem})


def loaded_files(roots: list[str]) -> dict[str, str | None]:
    """The modules this process loaded from inside `roots` (the trees of both sides): path -> sha256 (read afresh
    each time; where a module's file lies is resolved once a process, see `_inside`)."""
    from bench_core.workflows.side_by_side.revisions import file_sha256

    inside = tuple(Path(r).resolve() for r in roots)
    out = {}
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        path = _inside(str(f), inside) if f else None
        if path is not None:
            out[str(path)] = file_sha256(path)
    return dict(sorted(out.items()))


_WHERE: dict[tuple[str, tuple[Path, ...]], Path | None] = {}


def _inside(file: str, roots: tuple[Path, ...]) -> Path | None:
    """A module's file, resolved (`revisions.resolved`), where it is a file inside `roots`; else None. The answer
    is remembered for absolute names too: a server asks at each item's first run, about every module torch loaded."""
    key = (file, roots)
    if key in _WHERE:
        return _WHERE[key]
    from bench_core.workflows.side_by_side.importer import in_environment
    from bench_core.workflows.side_by_side.revisions import resolved

    path = resolved(file)
    # a module may name a file that is not there (torch's `_classes`, `_ops`: "_classes.py", which a relative path
    # would place in this process's working directory, a side's tree): it was not loaded from that tree
    # and one in an environment kept in a tree (its installed packages, torch among them) is not the tree's code
    found = path if path.is_file() and any(path.is_relative_to(r) and not in_environment(path, r) for r in roots) \
        else None
    if os.path.isabs(file):
        _WHERE[key] = found
    return found
