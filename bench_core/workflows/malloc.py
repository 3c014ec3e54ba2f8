"""The malloc policy of the processes that measure: glibc malloc's thresholds fixed (`PINNED_MALLOC`) in this
process, in both sides' servers (through their environment, `worker.server_env`), in the gate's fresh processes and
in distributed ranks, unless the user set them or asked otherwise (--bench-malloc as-is).
"""
from __future__ import annotations

import ctypes
import os

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
