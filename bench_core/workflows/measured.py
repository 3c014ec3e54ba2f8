"""A scenario measured in this process as the session asks: its counts chosen (the command line, quick mode, the
scenario's own, the project's, bench_core's), its GPU timing modes applied (the command line's beat its own), its
progress shown; every workflow that measures here does so through `measure`."""
from __future__ import annotations

from typing import Any, Callable

from bench_core.core.errors import ScenarioError
from bench_core.core.records import Measurement
from bench_core.core.scenario import Scenario
from bench_core.timing.counts import DEFAULT_REPEATS, DEFAULT_WARMUP, QUICK
from bench_core.timing.measuring import measure as measure_series


def counts(config, warmup: int | None, repeats: int | None) -> tuple[int, int]:
    """(warmup, repeats): the command line's, then quick mode's, the scenario's own choice, the project's defaults
    ([tool.bench_core]), bench_core's."""
    c = config
    w = c.warmup if c.warmup is not None else QUICK.warmup if c.quick else \
        warmup if warmup is not None else c.default_warmup if c.default_warmup is not None else DEFAULT_WARMUP
    r = c.repeats if c.repeats is not None else QUICK.repeats if c.quick else \
        repeats if repeats is not None else c.default_repeats if c.default_repeats is not None else DEFAULT_REPEATS
    return w, r


def gpu_modes(config, scenario: Scenario) -> tuple[str | None, bool]:
    """The scenario's GPU timing modes, (cache, graph): the command line's beat its own."""
    return config.cache or scenario.cache, config.graph or scenario.graph


def gpu_modes_said(config, scenario: Scenario) -> str:
    """The scenario's GPU timing modes in words ("" where none)."""
    cache, graph = gpu_modes(config, scenario)
    return ", ".join([f"cache {cache}"] * bool(cache) + ["graph"] * graph)


def measure(session, scenario: Scenario, fn: Callable[[], Any], *, warmup: int | None = None,
            repeats: int | None = None, **kwargs) -> Measurement:
    """One series of `fn` here (`timing.measuring.measure`), with the session's counts, device, threads and GPU
    modes; a wrong keyword from the benchmark itself is the scenario's error, by name."""
    config = session.config
    w, r = counts(config, warmup, repeats)
    scenario = scenario.with_metadata(device=config.device)
    if session.progress is not None:
        kwargs = {"progress": session.progress.scenario(scenario.name), **kwargs}
    scenario, modes = _applied_modes(session, scenario)
    kwargs = {**modes, **kwargs}
    try:
        return measure_series(fn, scenario=scenario, device=config.device, warmup=w, repeats=r,
                              threads=config.threads, environment=session.environment, **kwargs)
    except TypeError as exc:
        raise ScenarioError(scenario.name, str(exc)) from exc


def _applied_modes(session, scenario: Scenario) -> tuple[Scenario, dict]:
    """The scenario and `measure`'s arguments for its GPU modes; the first cold scenario of the session checks
    the flush. On the CPU a scenario's modes are not applied, and its metadata says so."""
    config = session.config
    cache, graph = gpu_modes(config, scenario)
    if not cache and not graph:
        return scenario, {}
    if config.device == "cpu":
        return scenario.with_metadata(gpu_modes=f"not applied on the CPU: {gpu_modes_said(config, scenario)}"), {}
    check = cache == "cold" and not session.cache_checked
    session.cache_checked = session.cache_checked or check
    return scenario, {"cache": cache, "graph": graph, "cache_check": check}
