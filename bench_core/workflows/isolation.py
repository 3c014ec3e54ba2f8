"""What a scenario may change for the scenarios after it: torch's process-wide settings, the environment
variables, the random generators, and processes it started. Captured before a scenario and checked after it:
each scenario starts from the session's state, and one that leaves something changed, or a process behind,
is named (and the state restored, the process ended)."""
from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any, Callable

from bench_core.files import children

SETTINGS: dict[str, tuple[Callable[[Any], Any], Callable[[Any, Any], None]]] = {
    # name -> (read it from torch, set it on torch)
    "default dtype": (lambda t: t.get_default_dtype(), lambda t, v: t.set_default_dtype(v)),
    "deterministic algorithms": (lambda t: (t.are_deterministic_algorithms_enabled(),
                                            t.is_deterministic_algorithms_warn_only_enabled()),
                                 lambda t, v: t.use_deterministic_algorithms(v[0], warn_only=v[1])),
    "mkldnn": (lambda t: t.backends.mkldnn.enabled, lambda t, v: setattr(t.backends.mkldnn, "enabled", v)),
    "cudnn": (lambda t: (t.backends.cudnn.enabled, t.backends.cudnn.benchmark, t.backends.cudnn.deterministic),
              lambda t, v: [setattr(t.backends.cudnn, k, x) for k, x in zip(("enabled", "benchmark",
                                                                              "deterministic"), v)]),
    "TF32": (lambda t: (t.backends.cuda.matmul.allow_tf32, t.backends.cudnn.allow_tf32),
             lambda t, v: (setattr(t.backends.cuda.matmul, "allow_tf32", v[0]),
                           setattr(t.backends.cudnn, "allow_tf32", v[1]))),
    "float32 matmul precision": (lambda t: t.get_float32_matmul_precision(),
                                 lambda t, v: t.set_float32_matmul_precision(v)),
}


# set by pytest around every test, and by torch.compile the first time it caches: not the test's doing
OWN_VARIABLES = {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR"}


@dataclass
class Snapshot:
    settings: dict[str, Any]
    environ: dict[str, str]
    rng: tuple[Any, Any, Any]
    children: set[int]


def child_pids(parent: int | None = None) -> set[int]:
    """The live child processes of `parent` (this process), from /proc; empty where there is no /proc."""
    parent = os.getpid() if parent is None else parent
    out = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == parent and fields[0] != "Z":
                out.add(int(entry))
    return out


def capture() -> Snapshot:
    import numpy as np
    import torch

    return Snapshot({name: read(torch) for name, (read, _) in SETTINGS.items()}, dict(os.environ),
                    (torch.get_rng_state(), random.getstate(), np.random.get_state()), child_pids())


def restore(before: Snapshot, keep_children: set[int] = frozenset()) -> list[str]:
    """Put back what changed since `before`: the random generators always (silently: using them is what a step
    does), every setting and variable that changed, and end each process started since (and not in
    `keep_children`). Returns what was changed or left behind, in words."""
    import numpy as np
    import torch

    said = []
    for name, (read, write) in SETTINGS.items():
        now = read(torch)
        if now != before.settings[name]:
            said.append(f"{name} {before.settings[name]} -> {now}")
            write(torch, before.settings[name])
    env = dict(os.environ)
    for key in sorted(set(env) | set(before.environ)):
        if env.get(key) != before.environ.get(key) and key not in OWN_VARIABLES:
            said.append(f"environment variable {key} {before.environ.get(key)!r} -> {env.get(key)!r}")
            if key in before.environ:
                os.environ[key] = before.environ[key]
            else:
                del os.environ[key]
    torch.set_rng_state(before.rng[0])
    random.setstate(before.rng[1])
    np.random.set_state(before.rng[2])
    left = sorted(child_pids() - before.children - set(keep_children))
    if left:
        said.append(f"{len(left)} process(es) still running ({', '.join(map(str, left))}), now ended")
        children.end_pids(left, still_ours=lambda pid: pid in child_pids())
        for pid in left:   # reap what ended, so no zombie stays
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
    return said
