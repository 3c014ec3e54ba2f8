"""One side of a side-by-side comparison in a process of its own, timed on request: the fallback for code
that cannot be loaded twice into one process (a `torch.library` operator, a compiled extension).

The parent starts `python -m bench_core.worker`, sends one JSON line saying where the side's code is, then
commands, one JSON line each, and reads one JSON line back per command:
  {"cmd": "build"}    call the test function again with a capturing bench: a fresh instance
  {"cmd": "sample"}   time one sample of it with the same sample loop as everything else (`sampling`)
  {"cmd": "measure", "warmup": W, "repeats": R}   a whole measurement of it (`measuring.measure`): a fresh
                      process's run, as the gate's replication asks for
  {"cmd": "quit"}     end
Failures come back as {"error": "..."}; the worker keeps serving. Timing happens here, so the pipe never
enters a sample.
"""
from __future__ import annotations

import importlib.util
import json
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

from .errors import ScenarioError


def serve(stdin=sys.stdin, stdout=sys.stdout) -> None:
    from .backends import backend_for
    from .capture import Sizing, capture
    from .sampling import Sampler, set_threads
    from .storage import scenario_doc

    init = json.loads(stdin.readline())
    sys.path[:0] = [str(p) for p in init["import_roots"]]
    set_threads(init.get("threads"))
    name, side = init["scenario"], init["side"]
    spec = importlib.util.spec_from_file_location("_bench_worker_test", init["test_file"])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    test = getattr(module, init["function"])
    sizing = Sizing(init["device"], init["quick"])
    sampler = Sampler(name, backend_for(init["device"]))
    params: Mapping[str, Any] = init["params"]
    inst = None

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
            if cmd == "build":
                inst = None  # the old instance goes before the new one allocates
                inst = capture(test, value_of, sizing, side, name)
                reply({"ok": True, "scenario": None if inst.scenario is None else scenario_doc(inst.scenario),
                       "test_file": module.__file__})
            elif cmd == "sample":
                if inst.setup is not None:
                    sampler.call("setup", inst.setup)
                s = sampler.sample(inst.fn, inst.block_size)
                reply({"host_ms": s.host_ms, "gpu_ms": s.gpu_ms})
            elif cmd == "measure":
                from .measuring import measure
                from .storage import measurement_doc

                scenario = inst.scenario.with_metadata(device=init["device"]) if inst.scenario else name
                m = measure(inst.fn, scenario=scenario, device=init["device"], warmup=doc["warmup"],
                            repeats=doc["repeats"], setup=inst.setup, load=inst.load, block_size=inst.block_size,
                            mode="block" if inst.block_size > 1 else "per_call", threads=init.get("threads"),
                            clock=inst.clock)
                reply({"measurement": measurement_doc(m)})
            else:
                reply({"error": f"unknown command {cmd!r}"})
        except ScenarioError as exc:
            reply({"error": exc.problem})


STARTUP_S = 120.0


class Worker:
    """The parent's handle on a worker process; ended with `close()` (or its context), by its own pid."""

    def __init__(self, init: Mapping[str, Any], timeout_s: float = 600.0):
        self.side, self.scenario, self.timeout_s = init["side"], init["scenario"], timeout_s
        # the parent's pid on the command line: a worker whose parent is gone is an orphan, findable by anyone
        self.proc = subprocess.Popen([sys.executable, "-m", "bench_core.worker", "--parent", str(os.getpid())],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self._write(init)   # it imports and loads while the parent starts the other side's worker

    def wait_ready(self) -> None:
        # importing torch on a loaded 2-core runner took over 3 s: a slow start is not a hang, so the start
        # gets at least STARTUP_S whatever the per-command limit
        self._read(expect="ready", timeout_s=max(self.timeout_s, STARTUP_S))

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
            err = (self.proc.stderr.read() or "").strip().splitlines()[-3:]
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
        from .storage import scenario_from_doc

        out = self._send({"cmd": "build"})
        return scenario_from_doc(out["scenario"]) if out.get("scenario") else None

    def sample(self):
        from .sampling import Sample

        out = self._send({"cmd": "sample"})
        return Sample(out["host_ms"], out["gpu_ms"])

    def measure(self, warmup: int, repeats: int, environment: Mapping[str, Any]):
        """A whole measurement in the worker (after `build`), with this process's environment attached."""
        from .storage import measurement_from_doc

        out = self._send({"cmd": "measure", "warmup": warmup, "repeats": repeats}, expect="measurement")
        return measurement_from_doc(out["measurement"], environment)

    def _kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                self._kill()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if not stream.closed:
                stream.close()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def import_roots(current_root: Path, side_root: Path, sys_path=None) -> list[str]:
    """The import roots a side's worker needs: its tree's counterparts of this process's roots in the repo."""
    from .revisions import search_roots

    return [str(p) for p in search_roots(current_root, side_root, sys_path)]


if __name__ == "__main__":
    serve()
