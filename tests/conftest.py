import gc
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

pytest_plugins = ["pytester"]

# pytester's in-process runs forget every module imported during them, so a module that registers a torch
# operator library at import (torch._dynamo, which an optimizer step imports lazily) would register twice
# in the next run; imported once here, it stays. (In-process runs instead of subprocesses: about 5 s each.)
import torch._dynamo  # noqa: E402, F401


@pytest.fixture(autouse=True)
def _gc_frozen():
    """Every measurement collects garbage before its samples (`sampling.gc_paused`); with torch, pytest and
    what earlier tests left in one heap, a full collection took 0.19 s here (35 of them: 7 s of one test).
    Frozen before each test (as `sampling.gc_frozen` does for rounds), a collection traverses only what this
    test made; what earlier tests left is kept rather than collected. `gc_frozen` keeps a freeze it finds, so a
    test's later measurements stay cheap too (undone after the first, the suite's 134 of them cost 17 s)."""
    gc.freeze()
    yield
