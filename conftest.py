import sys
from pathlib import Path

# Benchmarks import their shared models as `models`; tests import helpers from `tests/`.
# (The `gpu` marker and its skip without --gpu come from the bench_core plugin itself.)
sys.path.insert(0, str(Path(__file__).parent / "benchmarks"))
