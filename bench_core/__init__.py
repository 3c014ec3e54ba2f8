"""bench_core: GPU-correct timing, baselines, a statistical gate and correctness-from-a-saved-state.

The front door, and the names a benchmark file imports: they stay here whatever moves inside the package.
The records and errors import without torch; the names that need torch (measuring, A/B, validation, the
distributed rank's step, the pytest-benchmark clocks) are imported on first use, so `import bench_core` and
the pure layers below it work where torch is missing or broken.
"""
from importlib import import_module

from bench_core.core.errors import BenchError, InvalidRecord, ScenarioError, StorageError
from bench_core.core.records import ColdStart, Measurement, Memory
from bench_core.core.scenario import STAGES, Scenario
from bench_core.core.version import __version__

_LAZY = {
    "measure": "bench_core.timing.measuring",
    "stage": "bench_core.workflows.diagnose.profile",
    "ab": "bench_core.workflows.ab",
    "ab_rounds": "bench_core.workflows.ab",
    "StartingState": "bench_core.workflows.validation.state",
    "Tolerance": "bench_core.workflows.validation.correctness",
    "Tolerances": "bench_core.workflows.validation.correctness",
    "Variant": "bench_core.workflows.validation.correctness",
    "validate": "bench_core.workflows.validation.correctness",
    "bind": "bench_core.workflows.validation.correctness",
    "RankStep": "bench_core.workflows.distributed.rank_program",
    "RankContext": "bench_core.workflows.distributed.rank_program",
    "ddp_training": "bench_core.workflows.distributed.rank_program",
    "single_process": "bench_core.workflows.distributed.rank_program",
    "cuda_sync_clock": "bench_core.files.pytest_benchmark",
    "cuda_event_clock": "bench_core.files.pytest_benchmark",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value   # once imported, an ordinary attribute
        return value
    raise AttributeError(f"module 'bench_core' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)


__all__ = [
    "__version__", "BenchError", "InvalidRecord", "ScenarioError", "StorageError",
    "STAGES", "Scenario", "ColdStart", "Measurement", "Memory", "measure", "stage", "ab", "ab_rounds", "StartingState",
    "Tolerance", "Tolerances", "Variant", "validate", "bind", "RankStep", "RankContext", "ddp_training",
    "single_process", "cuda_sync_clock", "cuda_event_clock",
]
