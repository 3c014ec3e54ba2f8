"""One side of a side-by-side comparison in a process of its own, timed on request: the fallback for code
that cannot be loaded twice into one process (a `torch.library` operator, a compiled extension).

The parent starts `python -m bench_core.workflows.worker`, sends one JSON line saying where the side's code is
(its import roots, threads, device), then commands, one JSON line each, and reads one JSON line back per
command:
  {"cmd": "load", "scenario": ..., "test_file": ..., "function": ..., "params": {...}}
                      the test to serve from now on (a worker serves one scenario after another)
  {"cmd": "build"}    call the test function again with a capturing bench: a fresh instance
  {"cmd": "sample"}   time one sample of it with the same sample loop as everything else (`sampling`)
  {"cmd": "quit"}     end
Failures come back as {"error": "..."}; the worker keeps serving. Timing happens here, so the pipe never
enters a sample. The channel is the worker's original stdout, kept for the replies alone: whatever the user's
code prints (a model that reports its size) goes to the worker's log, never into the channel.
"""
from __future__ import annotations

import importlib.util
import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping

from bench_core.core.errors import ScenarioError
from bench_core.files import children


def serve(stdin=sys.stdin, stdout=sys.stdout) -> None:
    from bench_core.timing.backends import backend_for
    from bench_core.timing.counts import Sizing
    from bench_core.workflows.side_by_side.capture import capture
    from bench_core.timing.sampling import Sampler, set_threads
    from bench_core.files.storage import scenario_doc

    init = json.loads(stdin.readline())
    sys.path[:0] = [str(p) for p in init["import_roots"]]
    set_threads(init.get("threads"))
    side, sizing = init["side"], Sizing(init["device"], init["quick"])
    modules: dict[str, Any] = {}    # test files loaded so far: a module is executed once per process
    test = name = sampler = inst = None
    params: Mapping[str, Any] = {}

    def load(doc):
        nonlocal test, name, sampler, params, inst
        path = doc["test_file"]
        if path not in modules:
            spec = importlib.util.spec_from_file_location(f"_bench_worker_test{len(modules)}", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            modules[path] = module
        inst = None
        test, name, params = getattr(modules[path], doc["function"]), doc["scenario"], doc["params"]
        sampler = Sampler(name, backend_for(init["device"]))

    def value_of(arg):
        if arg not in params:
            raise KeyError(f"a worker is given only the test's parameters, not the fixture {arg!r}")
        return params[arg]

    def reply(doc):
        stdout.write(json.dumps(doc) + "\n")
        stdout.flush()

    reply({"ready": os.getpid()})
    for line in stdin:
        doc = json.loads(line)
        cmd = doc.get("cmd")
        try:
            if cmd == "quit":
                break
            if cmd == "load":
                load(doc)
                from bench_core.workflows.side_by_side.revisions import file_sha256

                ran = modules[doc["test_file"]].__file__
                reply({"ok": True, "test_file": ran, "test_file_sha256": file_sha256(ran), "pid": os.getpid()})
            elif test is None and cmd in ("build", "sample"):
                reply({"error": f"{cmd!r} before any test was loaded"})
            elif cmd == "build":
                inst = None  # the old instance goes before the new one allocates
                inst = capture(test, value_of, sizing, side, name)
                reply({"ok": True, "scenario": None if inst.scenario is None else scenario_doc(inst.scenario)})
            elif cmd == "sample":
                if inst.setup is not None:
                    sampler.call("setup", inst.setup)
                s = sampler.sample(inst.fn, inst.block_size)
                reply({"host_ms": s.host_ms, "gpu_ms": s.gpu_ms})
            else:
                reply({"error": f"unknown command {cmd!r}"})
        except ScenarioError as exc:
            reply({"error": exc.problem})


QUIT_GRACE_S = 10.0   # a worker's interpreter takes about a second to end


class Worker:
    """The parent's handle on a worker process; ended with `close()` (or its context), by its own pid."""

    def __init__(self, init: Mapping[str, Any], timeout_s: float = 600.0, spec: Mapping[str, Any] | None = None):
        self.init, self.side, self.timeout_s = dict(init), init["side"], timeout_s
        self._started, self._spec, self._loaded = False, None, None
        self.ran: dict = {}           # what the worker says it loaded for its test: file, sha256, its pid
        self.scenario = "worker"      # named by the scenario it serves, once one is assigned
        if spec is not None:
            self.assign(spec)
        # the parent's pid on the command line: a worker whose parent is gone is an orphan, findable by anyone
        self.log = tempfile.TemporaryFile()   # what the worker's code prints: a file, never a pipe that fills up
        self.proc = children.start([sys.executable, "-m", "bench_core.workflows.worker", "--parent", str(os.getpid())],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                   bufsize=1)
        self._write(init)   # it imports and loads while the parent starts the other side's worker

    def wait_ready(self) -> None:
        """Ready to serve: started, and the assigned test loaded."""
        # importing torch on a loaded runner takes seconds: a slow start is not a hang, so the start gets at
        # least STARTUP_S whatever the per-command limit
        if not self._started:
            self._read(expect="ready", timeout_s=max(self.timeout_s, children.STARTUP_S))
            self._started = True
        if self._spec is not None and self._spec != self._loaded:
            out = self._send({"cmd": "load", **self._spec}, expect="ok")
            self._loaded = self._spec
            self.ran = {k: out[k] for k in ("test_file", "test_file_sha256", "pid")}

    def assign(self, spec: Mapping[str, Any]) -> None:
        """The test to serve next: {"scenario", "test_file", "function", "params"}; loaded by `wait_ready`,
        so a pair of workers starts (or loads) side by side."""
        self._spec, self.scenario = dict(spec), spec["scenario"]

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def _send(self, doc: Mapping[str, Any], expect: str | None = None) -> dict:
        self._write(doc)
        return self._read(expect)

    def _write(self, doc: Mapping[str, Any]) -> None:
        try:
            self.proc.stdin.write(json.dumps(doc) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the read that follows says why

    def _read(self, expect: str | None = None, timeout_s: float | None = None) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s or self.timeout_s)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            why = "did not answer in time" if not ready else "ended"
            self._kill()                      # a hung or broken worker gets no polite goodbye
            err = self.log_tail()
            self.close()
            raise ScenarioError(self.scenario, f"the {self.side}'s worker process {why}: "
                                               f"{' / '.join(err) or 'no output'}")
        out = json.loads(line)
        if "error" in out:
            raise ScenarioError(self.scenario, out["error"])
        if expect and expect not in out:
            raise ScenarioError(self.scenario, f"the {self.side}'s worker answered {out!r}")
        return out

    def build(self):
        """A fresh instance in the worker; returns the scenario record it declared (or None)."""
        from bench_core.files.storage import scenario_from_doc

        out = self._send({"cmd": "build"})
        return scenario_from_doc(out["scenario"]) if out.get("scenario") else None

    def sample(self):
        from bench_core.timing.sampling import Sample

        out = self._send({"cmd": "sample"})
        return Sample(out["host_ms"], out["gpu_ms"])

    def log_tail(self, lines: int = 3) -> list[str]:
        """The last lines the worker printed (its tracebacks, its code's own prints)."""
        try:
            self.log.seek(0)
            return self.log.read().decode(errors="replace").strip().splitlines()[-lines:]
        except (OSError, ValueError):
            return []

    def _kill(self) -> None:
        children.end(self.proc, grace_s=0.0)

    def ask_to_quit(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
            except (OSError, ValueError):
                pass    # already going; close() waits or kills

    def close(self) -> None:
        children.end(self.proc, ask=self.ask_to_quit, grace_s=QUIT_GRACE_S)
        for stream in (self.proc.stdin, self.proc.stdout, self.log):
            if not stream.closed:
                stream.close()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class WorkerPool:
    """Worker processes kept for a whole session, slot by slot ((side, k) -> Worker): a pair of processes
    serves one scenario after another, because starting one (importing torch) costs seconds and sampling
    a scenario in it well under one (docs/side-by-side.md has the cost of each). A worker that failed is ended
    and its slot started afresh; `close()` ends every one, by its own pid."""

    def __init__(self, timeout_s: float = 600.0):
        self.timeout_s = timeout_s
        self._slots: dict[tuple[str, int], Worker] = {}
        self.started, self.scenarios = 0, set()     # what the session's worker mode cost, for its report

    def get(self, side: str, k: int, init: Mapping[str, Any], spec: Mapping[str, Any]) -> Worker:
        """Slot (side, k)'s worker for `init`, assigned `spec` (a slot with none, a dead one or one for other
        roots is started afresh); the caller's `wait_ready` loads it, so both sides of a pair go together."""
        w = self._slots.get((side, k))
        if w is not None and (not w.alive or w.init != dict(init)):
            self.discard(side, k)
            w = None
        if w is None:
            w = self._slots[(side, k)] = Worker(init, timeout_s=self.timeout_s)
            self.started += 1
        w.assign(spec)
        self.scenarios.add(spec["scenario"])
        return w

    def release(self, side: str, k: int, worker: Worker, ok: bool) -> None:
        """After a pair's work: kept for the next scenario, or ended if anything went wrong in the pair."""
        if not ok:
            self.discard(side, k)

    def discard(self, side: str, k: int) -> None:
        w = self._slots.pop((side, k), None)
        if w is not None:
            w.close()

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._slots.values() if w.alive]

    def close(self) -> None:
        for w in self._slots.values():   # all asked first: a worker's interpreter takes about a second to end
            w.ask_to_quit()
        for side, k in list(self._slots):
            self.discard(side, k)


def import_roots(current_root: Path, side_root: Path, sys_path=None) -> list[str]:
    """The import roots a side's worker needs: its tree's counterparts of this process's roots in the repo."""
    from bench_core.workflows.side_by_side.revisions import search_roots

    return [str(p) for p in search_roots(current_root, side_root, sys_path)]


if __name__ == "__main__":
    channel = os.fdopen(os.dup(1), "w", buffering=1)   # the replies' own copy of stdout
    os.dup2(2, 1)                                      # prints by the code under test go to the log
    serve(stdout=channel)
