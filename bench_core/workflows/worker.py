"""Each side of a side-by-side comparison in a pytest process of its own, in its own tree, serving samples on
request: process mode, for code that cannot share one process with the other side (a changed fixture, a
`torch.library` operator, a compiled extension), or another interpreter (`--bench-against-python`). This module
is the parent's side: its handle on one side's server (`Worker`), and the servers kept for a session (`WorkerPool`).

A side's server is `python -m pytest FILE --bench-serve=R,W` started in that side's tree: pytest collects the
side's own tests with its own conftest files, fixtures, parameters and plugins. The two talk over the `channel`;
the server's own side is `side_server`. The servers' environment fixes glibc malloc's thresholds
(`malloc.PINNED_MALLOC`), unless the user set them or asked otherwise (--bench-malloc as-is).
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Mapping

from bench_core.core.errors import ScenarioError
from bench_core.files import children
from bench_core.workflows.channel import Channel
from bench_core.workflows.malloc import PINNED_MALLOC

QUIT_GRACE_S = 10.0   # a server's interpreter takes about a second to end
LOG_LINES = 12        # of a server's log in an error: enough for the revision's own traceback


class Worker:
    """The parent's handle on one side's server; ended with `close()` (or its context), by its own pid, with the
    child of the round under way, if any.

    `init`: {"side", "tree", "python", "file", "argv", "env", "roots", "threads", "device", "forwarded"} (see
    `replay.process_sides`)."""

    def __init__(self, init: Mapping[str, Any], timeout_s: float = children.LIMIT_S):
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
    (`timing.signature_count.instructions`), its output files in `folder`."""
    return ["valgrind", "--tool=callgrind", "--collect-atstart=no", f"--callgrind-out-file={folder}/cg.%p.out",
            *argv]


class WorkerPool:
    """Side servers kept for a whole session, slot by slot: a server serves one scenario of its test file after
    another, because starting one (importing torch, collecting) costs seconds and serving a scenario less. A server
    that failed is ended and its slot started afresh; `close()` ends every one, by its own pid."""

    def __init__(self, timeout_s: float = children.LIMIT_S):
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


def server_env(roots: list[str], malloc: str = "as-is") -> dict[str, str]:
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
    from bench_core.workflows.side_by_side.importer import search_roots

    return [str(p) for p in search_roots(current_root, side_root, sys_path)]
