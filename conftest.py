import sys
from pathlib import Path

# Benchmarks import their shared models as `models`; tests import helpers from `tests/`.
sys.path.insert(0, str(Path(__file__).parent / "benchmarks"))


def pytest_collection_modifyitems(config, items):
    import pytest

    if config.getoption("--gpu"):
        return
    skip = pytest.mark.skip(reason="needs a real GPU: run with --gpu")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
