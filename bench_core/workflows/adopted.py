"""A pytest-benchmark test as a bench_core scenario: its one `benchmark(fn, *args, **kwargs)` or
`benchmark.pedantic(...)` call becomes one `bench.run(scenario, step, **options)`, so every bench_core workflow
(the stored gate, side by side, bisect, the history) takes it as it takes a `bench` test.

Nothing here needs pytest: the caller gives the scenario's name and metadata, the `run` to hand the step to (the
plugin's `bench.run`, or side by side's capture), the test's `@pytest.mark.benchmark(...)` settings and the
session's pytest-benchmark options. What cannot be honoured as asked is said, in the scenario's notes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from bench_core.core.scenario import Scenario

WINDOW = ("call",)
MIN_ROUNDS = 5      # fewer samples give no spread to decide on: a pedantic call's smaller `rounds` is raised to this

# marker settings bench_core does not apply, and why (said in the scenario's notes, never dropped silently)
NOT_APPLIED = {
    "max_time": "bench_core takes a fixed number of samples (--bench-repeats), not as many as fit a time",
    "min_time": "bench_core times one call a sample and does not calibrate",
    "calibration_precision": "bench_core times one call a sample and does not calibrate",
    "precision": "bench_core takes a fixed number of samples, and its gates decide with intervals of their own",
    "confidence": "bench_core's gates decide at their own alpha (--bench-alpha)",
    "timer": "bench_core times with its own clocks: a host clock read after synchronizing, CUDA events under --gpu",
    "cprofile": "bench_core measures profiler-free; a diagnose pass is --bench-profile DIR",
}


@dataclass(frozen=True)
class PbOptions:
    """The session's pytest-benchmark options that keep their meaning under bench_core (None: not given)."""

    warmup: bool | None = None          # --benchmark-warmup on/off
    warmup_iterations: int | None = None
    min_rounds: int | None = None       # --benchmark-min-rounds
    disabled: bool = False              # --benchmark-disable: each benchmark runs once, unmeasured


def plain(value: Any) -> Any:
    """A parameter's value (or a test's `extra_info`) as JSON can keep it: numbers, strings and booleans as they
    are, lists and mappings item by item, the rest as text (a torch dtype, a device)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    return str(value)


def counts(marker: Mapping[str, Any], options: PbOptions) -> tuple[int | None, int | None, list[str]]:
    """(warmup, repeats, notes) for a `benchmark(...)` call: the marker's settings beat the session's
    pytest-benchmark options, which beat bench_core's own counts (None: bench_core's). bench_core's command
    line (--bench-warmup, --bench-repeats, --bench-quick) beats all of them, as it beats a `bench` test's."""
    notes = [f"{key}={marker[key]!r} not applied: {why}" for key, why in NOT_APPLIED.items() if key in marker]
    if marker.get("disable_gc") is False:
        notes.append("disable_gc=False not applied: bench_core pauses the garbage collector during samples")
    from bench_core.timing.counts import DEFAULT_REPEATS

    rounds = marker.get("min_rounds", options.min_rounds)
    repeats = None if rounds is None else max(int(rounds), DEFAULT_REPEATS)
    warm = marker.get("warmup", options.warmup)
    iterations = marker.get("warmup_iterations", options.warmup_iterations)
    # as there, warmup never outlasts the samples (pytest-benchmark caps it at its rounds)
    warmup = None if warm is None else 0 if not warm else (
        None if iterations is None else min(int(iterations), repeats or DEFAULT_REPEATS))
    return warmup, repeats, notes


class PbCalls:
    """pytest-benchmark's fixture API, each call handed to `run(scenario, step, **options)`.

    `benchmark(fn, *args, **kwargs)` returns what `fn` returns, from one more call after the samples, untimed,
    as pytest-benchmark does; `pedantic` returns the last call's result. One call per test, as there."""

    def __init__(self, name: str, run: Callable[..., Any], *, metadata: Mapping[str, Any] | None = None,
                 marker: Mapping[str, Any] | None = None, options: PbOptions = PbOptions()):
        self.name = name
        self.group = (marker or {}).get("group")
        self.extra_info: dict[str, Any] = {}
        self.measurement = None
        self.used: str | None = None
        self._run = run
        self._metadata = dict(metadata or {})
        self._marker = dict(marker or {})
        self._options = options

    def scenario(self, notes: list[str]) -> Scenario:
        extra = {"source": "pytest-benchmark"}
        extra.update({"group": self.group} if self.group is not None else {})
        extra.update({"notes": notes} if notes else {})
        return Scenario(self.name, WINDOW, {**self._metadata, **extra})

    def _use(self, how: str) -> None:
        if self.used is not None:
            raise RuntimeError(f"the benchmark fixture can be used once a test; it was used in {self.used} mode "
                               f"(as pytest-benchmark's: give each measurement a test of its own)")
        self.used = how

    def __call__(self, fn: Callable[..., Any], *args, **kwargs):
        self._use("benchmark(...)")
        if self._options.disabled:
            return fn(*args, **kwargs)
        warmup, repeats, notes = counts(self._marker, self._options)
        step = (lambda: fn(*args, **kwargs)) if args or kwargs else fn
        self.measurement = self._run(self.scenario(notes), step, warmup=warmup, repeats=repeats)
        return fn(*args, **kwargs)

    def pedantic(self, target: Callable[..., Any], args=(), kwargs=None, setup=None, teardown=None, rounds=1,
                 warmup_rounds=0, iterations=1):
        self._use("benchmark.pedantic(...)")
        _check_pedantic(args, kwargs, setup, rounds, warmup_rounds, iterations)
        call = _PedanticCall(target, tuple(args), dict(kwargs or {}), setup, teardown)
        if self._options.disabled:
            call.prepare()
            call.step()
            call.finish()
            return call.last
        _, _, notes = counts(self._marker, self._options)
        options: dict[str, Any] = {"warmup": warmup_rounds, "repeats": max(rounds, MIN_ROUNDS)}
        if rounds < MIN_ROUNDS:
            notes.append(f"rounds={rounds} raised to {MIN_ROUNDS}: fewer samples give no spread to decide on")
        if setup is not None or teardown is not None:
            options["setup"] = call.prepare
        if iterations > 1:
            options.update(mode="block", block_size=iterations)
        try:
            self.measurement = self._run(self.scenario(notes), call.step, **options)
        finally:   # a failing gate, or side by side's capture, stops inside run: the last teardown still runs
            call.finish()
        return call.last

    def weave(self, target, **kwargs):
        raise RuntimeError("benchmark.weave (and benchmark.patch) is not taken over by bench_core: it times every "
                           "call of a patched function inside another, which bench_core cannot separate from the "
                           "test; measure the function with benchmark(fn, ...) instead, or leave this suite to "
                           "pytest-benchmark (--bench-pb-fixture leave)")

    patch = weave


class _PedanticCall:
    """A pedantic target with its arguments: `setup()` may return (args, kwargs) for the next call, and
    `teardown(*args, **kwargs)` runs after each call (here: before the next call's setup, and at the end), both
    untimed."""

    def __init__(self, target, args, kwargs, setup, teardown):
        self.target, self.setup, self.teardown = target, setup, teardown
        self.arguments = (args, kwargs)
        self.pending = False
        self.last = None
        self.given = bool(args or kwargs)

    def prepare(self) -> None:
        self.finish()
        if self.setup is not None:
            got = self.setup()
            if got:
                if self.given:
                    raise TypeError("Can't use `args` or `kwargs` if `setup` returns the arguments.")
                self.arguments = got

    def step(self):
        args, kwargs = self.arguments
        self.last = self.target(*args, **kwargs)
        self.pending = self.teardown is not None
        return self.last

    def finish(self) -> None:
        if self.pending:
            self.pending = False
            args, kwargs = self.arguments
            self.teardown(*args, **kwargs)


def _check_pedantic(args, kwargs, setup, rounds, warmup_rounds, iterations) -> None:
    """pytest-benchmark's own checks of a pedantic call, with its messages."""
    if not isinstance(iterations, int) or iterations < 1:
        raise ValueError("Must have positive int for `iterations`.")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError("Must have positive int for `rounds`.")
    if not isinstance(warmup_rounds, int) or warmup_rounds < 0:
        raise ValueError("Must have positive int for `warmup_rounds`.")
    if iterations > 1 and setup:
        raise ValueError("Can't use more than 1 `iterations` with a `setup` function.")
