"""A benchmark test called again, to capture its scenario as a fresh instance (for side-by-side rounds).

A benchmark test builds its model and data, then hands its step to `bench.run(scenario, fn, ...)` (or to
pytest-benchmark's `benchmark(fn, ...)`, which `workflows.adopted` turns into the same call).
Called with a `CaptureBench` instead, the test builds everything anew and stops at `bench.run`,
handing over the scenario and the step: a new instance with fresh allocations, of whichever code
the test function belongs to (the current tree's or another revision's). Nothing here needs pytest:
the caller says how to find each argument's value.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from bench_core.core.errors import ScenarioError
from bench_core.timing.counts import Sizing
from bench_core.timing.protocol import Instance
from bench_core.workflows.adopted import PbCalls


class _Captured(BaseException):
    # BaseException: a test's own `except Exception` around its body must not swallow the capture
    def __init__(self, scenario, fn, kwargs):
        super().__init__("captured")
        self.scenario, self.fn, self.kwargs = scenario, fn, kwargs


class CaptureBench(Sizing):
    """A `bench` whose `run` hands the scenario over instead of measuring it."""

    def run(self, scenario, fn, **kwargs):
        raise _Captured(scenario, fn, kwargs)

    def _not_a_scenario(self, *args, **kwargs):
        raise ScenarioError("side by side", "only tests that measure with bench.run are compared side by side; "
                                            "A/B, validation and reference checks run on the current code only")

    ab = validate = reference = _not_a_scenario


def instance_from(fn: Callable[[], Any], kwargs: dict, scenario=None) -> Instance:
    """The parts of a `bench.run(scenario, fn, **kwargs)` call that side-by-side rounds use."""
    block = kwargs.get("block_size", 1) if kwargs.get("mode", "per_call") == "block" else 1
    return Instance(fn, kwargs.get("setup"), kwargs.get("load"), block, scenario, clock=kwargs.get("clock"))


def capture(func: Callable, value_of: Callable[[str], Any], sizing: Sizing, side: str, name: str,
            metadata: dict | None = None) -> Instance:
    """Call the test function `func` with a CaptureBench as `bench` and `value_of(arg)` for every other
    argument; return the instance it hands to `bench.run`. `metadata`: what a pytest-benchmark test's scenario
    records of its test (its parameters, device and dtype), which the caller reads off the test."""
    bench = CaptureBench(sizing.device, sizing.quick)
    args = {}
    for arg in inspect.signature(func).parameters:
        if arg == "bench":
            args[arg] = bench
            continue
        if arg == "benchmark":   # a pytest-benchmark test: its one call is handed over as bench.run's would be
            args[arg] = PbCalls(name, bench.run, metadata=metadata)
            continue
        try:
            args[arg] = value_of(arg)
        except Exception as exc:
            raise ScenarioError(name, f"the {side}'s test needs {arg!r}, which this run cannot give it "
                                      f"({type(exc).__name__}: {exc})") from None
    try:
        func(**args)
    except _Captured as got:
        found = getattr(got.scenario, "name", None)
        if found is not None and found != name:   # a capture stops at the test's first bench.run
            raise ScenarioError(name, f"the {side}'s test measures more than one scenario, and side by side can "
                                      f"capture only its first ({found!r}): give {name!r} a test of its own") from None
        return instance_from(got.fn, got.kwargs, got.scenario)
    except ScenarioError:
        raise
    except Exception as exc:
        raise ScenarioError(name, f"the {side}'s test failed before bench.run: {type(exc).__name__}: {exc}") from exc
    raise ScenarioError(name, f"the {side}'s test finished without calling bench.run")
