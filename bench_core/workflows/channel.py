"""The pipe protocol between the parent and a side's server in process mode (`worker`, `side_server`).

The channel is a pair of pipes (file descriptors R and W, passed as `--bench-serve=R,W`), never stdout, so whatever
the user's code prints goes to the server's log. One JSON line goes each way per step:

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

Failures come back as {"error": "..."}.
"""
from __future__ import annotations

import json
import os
import select
import time
from typing import Any, Mapping


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
