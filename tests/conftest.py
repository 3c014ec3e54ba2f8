import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

pytest_plugins = ["pytester"]

# pytester's in-process runs forget every module imported during them, so a module that registers a torch
# operator library at import (torch._dynamo, which an optimizer step imports lazily) would register twice
# in the next run; imported once here, it stays. (In-process runs instead of subprocesses: about 5 s each.)
import torch._dynamo  # noqa: E402, F401

from bench_core.timing.sampling import keep_frozen  # noqa: E402


@pytest.fixture(autouse=True)
def _gc_frozen():
    """Every measurement collects garbage before its samples (`sampling.gc_paused`); with torch, pytest and
    what earlier tests left in one heap, a full collection took 0.19 s here (35 of them: 7 s of one test).
    Frozen before each test (as `sampling.gc_frozen` does for rounds), a collection traverses only what this
    test made; what earlier tests left is kept rather than collected. Frozen through `keep_frozen`, so every
    measurement knows the freeze is kept without counting the frozen objects (a walk over most of the heap)."""
    keep_frozen()
    yield


_inline_run = pytest.Pytester.inline_run


def _inline_run_frozen(self, *args, **kwargs):
    """pytester's in-process runs, each after what the test's earlier runs left is collected and frozen: their
    sessions stay alive until the test ends (pytester's finalizers hold them), and every measurement of a later run
    collected them all again (test_shards' merge test, 17 runs: 3.7 s, 2.2 s with this, a helper's timing)."""
    import gc

    gc.collect()
    keep_frozen()
    return _inline_run(self, *args, **kwargs)


pytest.Pytester.inline_run = _inline_run_frozen
