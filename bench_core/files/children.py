"""The processes bench_core starts (worker processes, the distributed launcher and its ranks): started here,
and ended here by their own ids, politely first, then by signal, within a grace period each. The one child-
process manager: whoever starts a child ends it through `end`, so every child ends with its job."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

GRACE_S = 5.0
LIMIT_S = 600.0     # how long a child may take where its session sets no limit of its own
STARTUP_S = 120.0   # a child that imports torch (and collects tests) takes seconds on a loaded runner: not a hang


def start(argv: Sequence[str], **popen) -> subprocess.Popen:
    """A child process running `argv` (`popen`: subprocess.Popen's own keywords: pipes, log file, env, cwd)."""
    return subprocess.Popen(list(argv), **popen)


@dataclass(frozen=True)
class Ran:
    """How a child run to its end ended: its exit code (None: it ran past its limit and was ended) and the last
    lines of its log, for a reason line."""

    code: int | None
    tail: str


def run_logged(argv: Sequence[str], log: Path, limit_s: float | None, *, tail_lines: int = 4,
               ending: Callable[[subprocess.Popen], None] | None = None, **popen) -> Ran:
    """`argv` run to its end, or ended once it runs past `limit_s` (None: no limit), also when this process is
    interrupted; its output goes to the file `log` (never a pipe that fills up). `ending(proc)` ends it and what it
    started (default: `end`), after a clean exit too: a grandchild it lost track of ends with the job."""
    with open(log, "wb") as out:
        proc = start(argv, stdout=out, stderr=subprocess.STDOUT, **popen)
        try:
            code = proc.wait(timeout=limit_s or None)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            (ending or end)(proc)
    return Ran(code, log_tail(log, tail_lines))


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")   # a child's colours (a project's addopts: --color=yes)


def log_tail(path: Path, lines: int = 4) -> str:
    """The last lines of a child's log, as plain text for a reason line."""
    try:
        text = _ANSI.sub("", Path(path).read_text(errors="replace"))
    except OSError:
        return ""
    return " / ".join(text.strip().splitlines()[-lines:])


def end_group(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """End `proc`, started in a session of its own (`start_new_session=True`), with every process of its group:
    a build's shell leaves its compilers running otherwise. SIGTERM, then SIGKILL, each with up to `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            proc.poll()
            try:
                os.killpg(proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.05)
        else:
            continue
        break
    proc.wait()


def alive(pid: int) -> bool:
    """`pid` runs (not a zombie): for a process not ours to reap, such as a child of a child (Linux's /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def end_pids(pids: Iterable[int], still_ours: Callable[[int], bool], grace_s: float = GRACE_S) -> None:
    """End processes known only by their ids (started by code under test, say): SIGTERM, then SIGKILL, each
    followed by up to `grace_s` for them to go; `still_ours(pid)` tells which are still there."""
    pids = [p for p in pids if still_ours(p)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            if still_ours(pid):
                _signal(pid, sig)
        deadline = time.monotonic() + grace_s
        while any(still_ours(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not any(still_ours(p) for p in pids):
            return


def end(proc: subprocess.Popen, *, others: Iterable[int] = (), still_ours: Callable[[int], bool] = lambda pid: True,
        ask: Callable[[], None] | None = None, grace_s: float = GRACE_S) -> None:
    """End `proc` and the processes `others` it started (which may run in sessions of their own, so ending
    `proc` alone would leave them behind): `ask` politely first, where given; then SIGTERM, then SIGKILL, each
    followed by up to `grace_s` for everyone to go. `still_ours(pid)` tells a live pid of ours from an id the
    system has given to someone else since. `proc` is reaped."""
    others = [p for p in others if still_ours(p)]

    def gone(wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        while True:
            done = proc.poll() is not None and not any(still_ours(p) for p in others)
            if done or time.monotonic() >= deadline:
                return done
            time.sleep(0.05)

    if ask is not None and proc.poll() is None:
        ask()
        if gone(grace_s):
            return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is None:
            proc.send_signal(sig)
        for pid in others:
            if still_ours(pid):
                _signal(pid, sig)
        if gone(grace_s):
            break
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def sigterm_as_interrupt():
    """SIGTERM (what `timeout` and a cancelled CI job send) taken as Ctrl-C: pytest then ends the session as
    interrupted, so every child process is ended by its pid and every temporary tree removed on the way out (each
    is in a `finally`), what was measured is written, and no baseline is stored from it. Returns the handler it
    replaced (None where it replaced none: a handler of the user's stays, and so does a thread's session)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return None

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")
    return signal.signal(signal.SIGTERM, interrupt)
