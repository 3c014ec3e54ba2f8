"""bench_core: GPU-correct timing, baselines, a statistical gate and correctness-from-a-saved-state."""

__version__ = "0.3.0"

from .errors import BenchError, InvalidRecord, ScenarioError, StorageError  # noqa: E402
from .scenario import STAGES, Scenario  # noqa: E402
from .records import ColdStart, Measurement, Memory  # noqa: E402
from .measuring import measure  # noqa: E402
from .diagnose import stage  # noqa: E402
from .interleaved import ab, ab_rounds  # noqa: E402
from .state import StartingState  # noqa: E402
from .correctness import Tolerance, Tolerances, Variant, validate  # noqa: E402

__all__ = [
    "__version__", "BenchError", "InvalidRecord", "ScenarioError", "StorageError",
    "STAGES", "Scenario", "ColdStart", "Measurement", "Memory", "measure", "stage", "ab", "ab_rounds", "StartingState",
    "Tolerance", "Tolerances", "Variant", "validate",
]
