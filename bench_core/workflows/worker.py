"""Each side of a side-by-side comparison in a pytest process of its own, in its own tree, serving samples on
request: process mode, for code that cannot share one process with the other side (a changed fixture, a
`torch.library` operator, a compiled extension), or another interpreter (`--bench-against-python`).

A side's server is `python -m pytest FILE --bench-serve=R,W` started in that side's tree: pytest collects the
side's own tests with its own conftest files, fixtures, parameters and plugins. The channel is a pair of pipes
(file descriptors R and W), never stdout, so whatever the user's code prints goes to the server's log. One JSON
line goes each way per step:

  parent -> server                     server -> parent
  (first line) init                    {"ready": pid, python, torch,   after collection
                                        malloc: {MALLOC_* variables}}
  {"cmd": "item", file, function,      {"reached": scenario}           the item's first run (fixtures, then the test)
   param_id, cls, scenario}                                            up to its bench.run for that scenario
  {"cmd": "go"}                        {"serving": scenario, pid,      there: the step warmed once (and counted, if
                                        fork, files: {path: sha256},    asked), one side's after the other's
                                        kept: [fixture], signature}
  {"cmd": "round", cpus}               {"built": scenario_doc, pid}    the item run afresh up to its bench.run,
                                                                       held to `cpus` (both sides' the same)
  {"cmd": "sample", ahead}             {"host_ms", "gpu_ms"}           one sample, timed here, with `sampling`;
                                                                       `ahead`: after an untimed call of the step
  {"cmd": "warm", "ms"}                {"warmed": calls}               untimed calls for `ms` (`protocol.warm_for`)
  {"cmd": "first", warm_ms, ahead}     {"first": [host_ms, gpu_ms],    the round's first call, warm calls, then a
                                        "host_ms", "gpu_ms"}            sample, in one go (`first_then_sample`)
  {"cmd": "profile"}                   {"op_times": {op: [ms, calls]}} a profiler pass of the first run's
                                                                       step, after the rounds, in a child forked
                                                                       from the server
  {"cmd": "end"}                       {"ended": status}               the round's run of the item ends
  {"cmd": "done"}                      {"item_done": ..., "served"}    the item is done with
  {"cmd": "quit"}                      -                               the server ends

Each round runs the test item afresh: its function-scoped fixtures, then the test, whose bench.run serves the
round (the module's and the session's fixtures stay built in the server, as between the tests of a session). It
runs in a child forked from the server, where the server may fork: the child first lays out a heap of a random
shape, then runs the item. Forked children are cheap (the server has imported torch and the side's code once),
and measured to carry a fresh bias each, where the same process rebuilding its instance keeps its own
(`quality/fork_bias.py`, docs/side-by-side.md): a round in a forked child is then a unit of evidence as a round in
one process is. The server runs one torch thread until it forks (a child of a process that ran OpenMP on more
threads hangs), and the child takes the session's count. A server that has initialized CUDA cannot fork; it runs
each round's item itself, and its process is then the unit. The servers' environment fixes glibc malloc's
thresholds (`PINNED_MALLOC`), unless the user set them or asked otherwise (--bench-malloc as-is).
Failures come back as {"error": "..."}.
"""
from __future__ import annotations

import ctypes
import gc
import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from bench_core.core.errors import ScenarioError
from bench_core.files import children


class Channel:
    """One JSON line each way over a pair of pipe ends. Lines are read from the descriptor through a buffer of this
    object's own, so that a line that came in with the one before it is never left unseen while `recv` waits on the
    descriptor (as it would be where requests are sent ahead of their answers)."""

    def __init__(self, rfd: int, wfd: int):
        self.rfd, self.w = rfd, os.fdopen(wfd, "w", buffering=1)
        self._pending = b""

    def recv(self, timeout_s: float | None = None) -> dict | None:
        """The next line's document; None at the end of the pipe. Raises TimeoutError when none came in
        `timeout_s` (None: waits)."""
        line = self._line(timeout_s)
        return json.loads(line) if line else None

    def _line(self, timeout_s: float | None) -> str:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self._pending:
            if deadline is not None:
                ready, _, _ = select.select([self.rfd], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:
                    raise TimeoutError
            chunk = os.read(self.rfd, 1 << 16)
            if not chunk:
                return ""
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line.decode() + "\n"

    def send(self, doc: Mapping[str, Any]) -> None:
        self.w.write(json.dumps(doc) + "\n")
        self.w.flush()

    def close(self) -> None:
        if self.rfd >= 0:
            os.close(self.rfd)
            self.rfd = -1
        if not self.w.closed:
            self.w.close()


# --- the server's side: runs inside the side's pytest process ---------------------------------------------------

class ServeState:
    """A server's state: its channel, what the parent said about it, and the item under way."""

    def __init__(self, fds: tuple[int, int]):
        self.channel = Channel(*fds)
        init = self.channel.recv() or {}
        self.side, self.threads = init.get("side", "side"), init.get("threads")
        self.roots: list[str] = list(init.get("roots", []))
        self.signature = bool(init.get("signature"))   # count the step's work signature before serving it
        self.instructions: str | None = init.get("instructions")   # under callgrind: count, into this folder
        self.device: str = init.get("device") or "cpu"
        self.step: tuple | None = None      # (fn, setup) of the item's first run, for a profiler pass
        self.requested: str | None = None   # the scenario the item under way is to serve
        self.round = False                  # this run of the item serves a round (else: it warms and counts)
        self.reached = False                # this run of the item reached bench.run for the scenario asked for
        self.fork = True                    # rounds in forked children (decided by the item's first run)
        self.failure: str | None = None     # this run's own failure, when it had one
        self.ended_by: str | None = None    # how this run's serving ended: "end", "quit", "failed"
        self.places: tuple | None = None    # a round's child: (CPUs held to for its samples, CPUs it builds on)

    def begin(self, scenario: str) -> None:
        self.requested = scenario
        self.again()

    def again(self, round_: bool = False) -> None:
        """Before each run of the item: its first (`round_` False), or one serving a round."""
        self.round, self.reached, self.failure, self.ended_by = round_, False, None, None

    def missed(self, nodeid: str) -> str:
        return (f"{nodeid} did not reach bench.run for scenario {self.requested!r}"
                f"{' in a round' if self.round else ''}: {self.failure or 'it never measured it'}")


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


def first_run(channel: Channel, name: str, sampler, *, fork: bool, files: Mapping[str, str | None],
              warm: Callable[[], Any] | None, count: Callable[[], Mapping[str, Any]] | None,
              kept: list[str] = ()) -> str:
    """The item's first run in the server, at its bench.run: said ("reached"), then on the parent's "go" (the other
    side's server has reached its own, see `Worker.assign`) `warm()` untimed (forked children then inherit what a
    call sets up once per process: kernels chosen, primitive caches), then `count()`, whose fields (the step's work
    signature) go to the parent with the "serving" line, with `kept` (the fixtures every round reuses, see
    `serving.kept_fixtures`). Returns "served", "failed" (said), or "quit" (the parent ended it, or is gone)."""
    channel.send({"reached": name})
    doc = channel.recv()
    if doc is None or doc.get("cmd") != "go":
        return "quit"
    if warm is not None:
        try:
            sampler.call("the server's warming call", warm)
        except ScenarioError as exc:
            channel.send({"error": exc.problem})
            return "failed"
    counted = dict(count()) if count is not None else {}
    channel.send({"serving": name, "pid": os.getpid(), "fork": fork, "files": dict(files), "kept": list(kept),
                  **counted})
    return "served"


def serve_rounds(state: ServeState, run_item: Callable[[], None], nodeid: str) -> str:
    """Rounds of the item's scenario until the parent says "done" (or "quit", or is gone): returned. Each "round"
    runs the test item afresh (`run_item`: its function-scoped fixtures, then the test, whose bench.run serves the
    round with `serve_round`), in a child forked from this server where `state.fork`."""
    from bench_core.timing.sampling import build_cpus, hold_to, set_threads

    channel = state.channel
    while True:
        doc = channel.recv()
        cmd = None if doc is None else doc.get("cmd")
        if cmd in (None, "done", "quit"):
            return cmd or "quit"
        if cmd == "profile":
            _profile_reply(state)
            continue
        if cmd != "round":
            channel.send({"error": f"{cmd!r} outside a round"})
            continue
        state.again(round_=True)
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
            gc.freeze()
            _scatter_heap(random.Random(int.from_bytes(os.urandom(8), "little")))
            # it builds beside the other side's child, on the CPUs near its own (`build_cpus`), and is held to
            # `cpus` before its first call (`serve_round`): held to one CPU from the start, the two builds take turns
            state.places = (cpus, build_cpus(cpus))
            hold_to(state.places[1])   # before its threads start: they inherit it
            set_threads(state.threads)
            run_item()
            if not state.reached:
                channel.send({"error": state.missed(nodeid)})
            return _QUIT_STATUS if state.ended_by == "quit" else 0
        status = _in_child(round_child, failed=0)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == _QUIT_STATUS:   # the child took the parent's "quit"
            return "quit"
        channel.send({"ended": status})


_QUIT_STATUS = 75   # a round's child ending on the parent's "quit": the server ends too


SERVED_PROFILE_CALLS = 1   # a verdict's explanation, not its evidence: one profiled call a pass, `PASSES` passes in
                           # the one forked child (more cost a visible share of a process-mode comparison's time:
                           # docs/lab/from-the-code.md)


def _profile_reply(state: ServeState) -> None:
    """The parent's "profile", answered from a child forked from the server, where it may fork: profiler passes in
    the server itself change what the next items' warming calls leave for their children to inherit, and can leave
    one side's children slow in every round (docs/side-by-side.md)."""
    from bench_core.timing.sampling import set_threads

    if not state.fork:
        state.channel.send(_profiled(state))
        return

    def profile_child() -> int:
        set_threads(state.threads)
        state.channel.send(_profiled(state))
        return 0
    status = _in_child(profile_child, failed=1)
    if status != 0:   # it ended before it answered
        state.channel.send({"error": f"profiler pass: its process ended with wait status {status}"})


def _profiled(state: ServeState) -> dict:
    """The profiler passes of the item's first instance (the server's), after its rounds: `PASSES` of them, in
    the one child forked for them, each pass an operator's sample for `deciding.explained`."""
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
    from bench_core.workflows.side_by_side.revisions import resolved

    path = resolved(file)
    # a module may name a file that is not there (torch's `_classes`, `_ops`: "_classes.py", which a relative path
    # would place in this process's working directory, a side's tree): it was not loaded from that tree
    found = path if path.is_file() and any(path.is_relative_to(r) for r in roots) else None
    if os.path.isabs(file):
        _WHERE[key] = found
    return found


# --- the parent's side ------------------------------------------------------------------------------------------

QUIT_GRACE_S = 10.0   # a server's interpreter takes about a second to end
LOG_LINES = 12        # of a server's log in an error: enough for the revision's own traceback


class Worker:
    """The parent's handle on one side's server; ended with `close()` (or its context), by its own pid, with the
    child of the round under way, if any.

    `init`: {"side", "tree", "python", "file", "argv", "env", "roots", "threads", "device", "forwarded"} (see
    `replay.process_sides`)."""

    def __init__(self, init: Mapping[str, Any], timeout_s: float = 600.0):
        self.init, self.side, self.timeout_s = dict(init), init["side"], timeout_s
        self.scenario, self.ran, self.child, self.profiled_in = "server", {}, None, None
        self._started, self._spec, self.key, self.environment = False, None, None, {}
        self._item: str | None = None   # the assigned item: None, "sent", "reached"
        self.log = tempfile.TemporaryFile()   # what the server's code prints: a file, never a pipe that fills up
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        argv = list(init["argv"]) + [f"--bench-serve={to_child},{from_child}"]
        env = init.get("env")
        if init.get("instructions"):
            argv = callgrind_argv(argv, init["instructions"])
            # the interpreter's hash seed changes its dictionaries' layout, and so the instructions it runs
            env = {**(env if env is not None else os.environ), "PYTHONHASHSEED": "0"}
        try:
            self.proc = children.start(argv, cwd=init["tree"], env=env, stdin=subprocess.DEVNULL,
                                       stdout=self.log, stderr=subprocess.STDOUT, pass_fds=(to_child, from_child))
        finally:
            os.close(to_child)
            os.close(from_child)
        self.channel = Channel(to_parent, from_parent)
        self._write({k: init.get(k) for k in ("side", "threads", "device", "roots", "signature", "instructions")})

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def assign(self, spec: Mapping[str, Any]) -> None:
        """The test item to serve next ({"scenario", "file", "function", "param_id"}), run by `start_item`, `reach`
        and `wait_ready`, each called for both servers of a pair before the next. A pair's servers warm (and count)
        their steps one after the other, never side by side: with whole first runs side by side, warming included,
        a pair's rounds share their servers' bias, and a memory-bound A/A estimate spreads wider than its rounds
        predict. Where rounds fork, the tests up to their bench.run run side by side, as the servers' starts do,
        which leaves the rounds no such shared bias (docs/side-by-side.md has both checks); on CUDA, where a
        server's own process is measured, nothing runs side by side."""
        self._spec, self.scenario, self._item = dict(spec), spec["scenario"], None

    def start_item(self) -> None:
        """Started; and where rounds fork, the assigned item sent, so that its test runs beside the other side's."""
        # importing torch and collecting on a loaded runner takes seconds: a slow start is not a hang
        if not self._started:
            out = self._read("ready", timeout_s=max(self.timeout_s, children.STARTUP_S))
            self.environment = {k: out.get(k) for k in ("python", "torch", "malloc")}
            self._started = True
        if self._spec is not None and self._item is None and (self.init.get("device") or "cpu") != "cuda":
            self._send_item()

    def reach(self) -> None:
        """The assigned item run up to its bench.run (sent now, where `start_item` did not)."""
        self.start_item()
        if self._spec is not None and self._item is None:
            self._send_item()
        if self._item == "sent":
            self._read("reached")
            self._item = "reached"

    def wait_ready(self) -> None:
        """The assigned item's step warmed (and counted) at its bench.run; `ran` keeps what the server loaded."""
        self.reach()
        if self._spec is not None:
            self._spec, self._item = None, None
            out = self._send({"cmd": "go"}, "serving")
            self.ran = {"pid": out["pid"], "forked_rounds": out["fork"], "files": out["files"],
                        "kept": out.get("kept", []),
                        "forwarded": self.init.get("forwarded", []),
                        "interpreter": self.init["python"], **self.environment, "tree": self.init["tree"],
                        **{k: out[k] for k in ("signature", "signature_error", "instructions", "instructions_error")
                           if k in out}}

    def _send_item(self) -> None:
        self._write({"cmd": "item", **self._spec})
        self._item = "sent"

    def round(self, cpus=None):
        """A fresh instance for a round (held to `cpus`); returns the scenario record it declared (or None)."""
        self.start_round(cpus)
        return self.built()

    def start_round(self, cpus=None) -> None:
        """Asks for a fresh instance (`built()` waits for it), so that two servers build side by side; the round's
        process is held to `cpus` (None: left where the system puts it, see `sampling.shared_cpus`)."""
        self._write({"cmd": "round"} if cpus is None else {"cmd": "round", "cpus": list(cpus)})

    def built(self):
        """The instance asked for is built; returns the scenario record it declared (or None)."""
        from bench_core.files.storage import scenario_from_doc

        out = self._read("built")
        self.child = out["pid"] if out["pid"] != self.proc.pid else None
        return scenario_from_doc(out["built"]) if out.get("built") else None

    def sample(self, ahead: bool = False):
        """One sample of the round's instance; `ahead`: after an untimed call of it (`protocol.ahead_of`)."""
        from bench_core.timing.sampling import Sample

        out = self._send({"cmd": "sample", "ahead": ahead}, "host_ms")
        return Sample(out["host_ms"], out["gpu_ms"])

    def first_then_sample(self, warm_ms: float, ahead: bool = False):
        """The round's first call, untimed calls up to `warm_ms`, then a sample, in one request
        (`protocol.first_then_sample`): (the first call's sample, the sample)."""
        from bench_core.timing.sampling import Sample

        out = self._send({"cmd": "first", "warm_ms": warm_ms, "ahead": ahead}, "first")
        return Sample(*out["first"]), Sample(out["host_ms"], out["gpu_ms"])

    def warm(self, ms: float) -> int:
        """Untimed calls of the round's fresh instance, in its process, while they have taken less than `ms`."""
        return int(self._send({"cmd": "warm", "ms": ms}, "warmed")["warmed"])

    def start_profile(self) -> None:
        """Asks for the profiler passes of this side's step, in a child of the server, after the measured rounds
        (`profiled()` waits for them), so that two servers profile side by side."""
        self._write({"cmd": "profile"})

    def profiled(self) -> list[dict[str, tuple[float, int]]]:
        """Each pass: per operator, self time per step (ms) and calls per step."""
        out = self._read("op_times")
        self.profiled_in = out.get("pid")
        passes = out["op_times"]
        passes = [passes] if isinstance(passes, dict) else passes   # a server of an older bench_core: one pass
        return [{op: (float(ms), int(n)) for op, (ms, n) in one.items()} for one in passes]

    def end_round(self) -> None:
        self.start_end()
        self.ended()

    def start_end(self) -> None:
        self._write({"cmd": "end"})

    def ended(self) -> None:
        out = self._read("ended")
        self.child = None
        if out["ended"]:
            raise ScenarioError(self.scenario, f"the {self.side}'s round process ended with status {out['ended']}")

    def done(self) -> None:
        out = self._send({"cmd": "done"}, "item_done")
        if not out.get("served", True):
            raise ScenarioError(self.scenario, out.get("error", "the item ended early"))

    def _send(self, doc: Mapping[str, Any], expect: str) -> dict:
        self._write(doc)
        return self._read(expect)

    def _write(self, doc: Mapping[str, Any]) -> None:
        try:
            self.channel.send(doc)
        except (BrokenPipeError, OSError, ValueError):
            pass  # the read that follows says why

    def _read(self, expect: str, timeout_s: float | None = None) -> dict:
        try:
            out, why = self.channel.recv(timeout_s or self.timeout_s), "ended"
        except TimeoutError:
            out, why = None, "did not answer in time"
        if out is None:
            self._kill()                      # a hung or broken server gets no polite goodbye
            err = self.log_tail()
            self.close()
            raise ScenarioError(self.scenario, f"the {self.side}'s process ({self._where()}) {why}:\n"
                                               f"{chr(10).join(err) or 'no output'}")
        if "error" in out:
            raise ScenarioError(self.scenario, f"{self.side}: {out['error']}")
        if expect not in out:
            if "ended" in out:
                raise ScenarioError(self.scenario, f"the {self.side}'s round process ended (status {out['ended']}) "
                                                   f"before answering: {' / '.join(self.log_tail(3))}")
            raise ScenarioError(self.scenario, f"the {self.side}'s process answered {out!r}")
        return out

    def _where(self) -> str:
        return f"pytest {Path(self.init['file']).name} in {self.init['tree']}"

    def log_tail(self, lines: int = LOG_LINES) -> list[str]:
        """The last lines the server printed (pytest's report, tracebacks, its code's own prints)."""
        try:
            self.log.seek(0)
            return self.log.read().decode(errors="replace").strip().splitlines()[-lines:]
        except (OSError, ValueError):
            return []

    def _kill(self) -> None:
        children.end(self.proc, others=[self.child] if self.child else [], still_ours=children.alive, grace_s=0.0)

    def ask_to_quit(self) -> None:
        if self.proc.poll() is None:
            self._write({"cmd": "quit"})

    def close(self) -> None:
        children.end(self.proc, others=[self.child] if self.child else [], still_ours=children.alive,
                     ask=self.ask_to_quit, grace_s=QUIT_GRACE_S)
        self.child = None
        self.channel.close()
        if not self.log.closed:
            self.log.close()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def callgrind_argv(argv: list[str], folder: str) -> list[str]:
    """A server's command under valgrind's callgrind, collecting nothing until the step toggles it on
    (`timing.signature.instructions`), its output files in `folder`."""
    return ["valgrind", "--tool=callgrind", "--collect-atstart=no", f"--callgrind-out-file={folder}/cg.%p.out",
            *argv]


class WorkerPool:
    """Side servers kept for a whole session, slot by slot: a server serves one scenario of its test file after
    another, because starting one (importing torch, collecting) costs seconds and serving a scenario less. A server
    that failed is ended and its slot started afresh; `close()` ends every one, by its own pid."""

    def __init__(self, timeout_s: float = 600.0):
        self.timeout_s = timeout_s
        self._slots: dict[tuple, Worker] = {}
        self.started, self.scenarios = 0, set()     # what the session's process mode cost, for its report
        self._scratch: str | None = None

    def get(self, side: str, k: int, init: Mapping[str, Any], spec: Mapping[str, Any]) -> Worker:
        """Slot (side, k)'s server for `init` (one with other settings, or a dead one, is replaced), to serve
        `spec`; the caller's `serve` starts the item, so both sides of a pair start together."""
        key = (side, k, json.dumps({n: v for n, v in init.items() if n != "env"}, sort_keys=True, default=str))
        w = self._slots.get(key)
        if w is not None and not w.alive:
            self.discard(key)
            w = None
        if w is None:
            w = self._slots[key] = Worker(init, timeout_s=self.timeout_s)
            self.started += 1
        w.key = key
        w.assign(spec)
        self.scenarios.add(spec["scenario"])
        return w

    def release(self, worker: Worker, ok: bool) -> None:
        """After a pair's work: kept for the next scenario, or ended if anything went wrong in the pair."""
        if not ok:
            self.discard(worker.key)

    def discard(self, key) -> None:
        w = self._slots.pop(key, None)
        if w is not None:
            w.close()

    def scratch(self) -> str:
        """A folder for the servers' own files (callgrind's), removed with the pool."""
        if self._scratch is None:
            self._scratch = tempfile.mkdtemp(prefix="bench_core-servers-")
        return self._scratch

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._slots.values() if w.alive]

    def close(self) -> None:
        for w in self._slots.values():   # all asked first: an interpreter takes about a second to end
            w.ask_to_quit()
        for key in list(self._slots):
            self.discard(key)
        if self._scratch is not None:
            import shutil

            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


# glibc decides per process whether a freed large block is kept for reuse or returned to the system (and faulted in
# again on the next allocation): its thresholds move with the process's own history. Each forked round draws its own
# way, which spreads one round's ratio on a memory-bound step several times wider than fixed thresholds do
# (quality/fork_bias.py, docs/side-by-side.md). Fixed, blocks up to 32 MB (glibc's largest dynamic threshold) come
# from the heap and freed memory is kept, as in a long-running process that has warmed up; larger ones are mapped
# afresh, as always.
PINNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3   # glibc's mallopt parameters (malloc.h)


def pin_malloc() -> bool:
    """PINNED_MALLOC's thresholds fixed in this running process (glibc's `mallopt`, whose int caps the trim
    threshold at 2 GB), for the comparisons it holds both sides of: True where they now are; False where the user
    set them, or the C library is not glibc (it has no mallopt, or refuses)."""
    if any(k in os.environ for k in PINNED_MALLOC):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    trim = min(int(PINNED_MALLOC["MALLOC_TRIM_THRESHOLD_"]), 2 ** 31 - 1)
    return (mallopt(M_MMAP_THRESHOLD, int(PINNED_MALLOC["MALLOC_MMAP_THRESHOLD_"])) == 1
            and mallopt(M_TRIM_THRESHOLD, trim) == 1)


def settle_malloc(asked: str, *, serving: bool = False) -> str:
    """`--bench-malloc` applied to this process, said as the session's environment records it: "pinned", "as-is",
    "set by the environment: ..." (the user's own `MALLOC_*` variables, which win), or "as-is: ..." where glibc
    cannot be asked. The processes a session starts are told as well: the gate's fresh processes by the option,
    distributed ranks by their spec, both sides' servers by their variables (`server_env`), which is what a server
    (`serving`) goes by."""
    own = {k: os.environ[k] for k in PINNED_MALLOC if k in os.environ}
    if own:
        return "pinned" if own == PINNED_MALLOC else "set by the environment: " + ", ".join(
            f"{k}={v}" for k, v in sorted(own.items()))
    if asked == "as-is" or serving:
        return "as-is"
    return "pinned" if pin_malloc() else "as-is: this C library has no glibc mallopt"


def server_env(roots: list[str], malloc: str = "pinned") -> dict[str, str]:
    """The server's environment: its tree's import roots first, so the project's modules come from that tree even
    where the project is installed (editable) from the current one; glibc malloc's thresholds fixed (`malloc`
    "pinned"), unless the user set them."""
    env = dict(os.environ)
    if malloc == "pinned" and not any(k in env for k in PINNED_MALLOC):
        env.update(PINNED_MALLOC)
    env["PYTHONPATH"] = os.pathsep.join(roots + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    for name in ("PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST"):   # the session's own, not the side's
        env.pop(name, None)
    return env


def import_roots(current_root: Path, side_root: Path, sys_path=None) -> list[str]:
    """The import roots a side's server needs: its tree's counterparts of this process's roots in the repo."""
    from bench_core.workflows.side_by_side.revisions import search_roots

    return [str(p) for p in search_roots(current_root, side_root, sys_path)]
