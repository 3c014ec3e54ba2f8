"""Counted work beside a measurement: each step's FLOPs and its work signature, each counted once after its timed
window (profiler-free), the roofs utilization is a share of (a known GPU's peak and bandwidth, or the CPU's,
measured once), and two signatures compared exactly, as facts beside a timing verdict."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from bench_core.core.records import Measurement


def count_work(session, m: Measurement, fn: Callable[[], Any], setup: Callable[[], Any] | None) -> Measurement:
    """The result with its counted work; a step the counter cannot run is not counted, and the session says
    why. On the CPU the machine's roofs are measured once, for the utilization figure."""
    from bench_core.timing.flops import count

    try:
        work = count(fn, setup)
    except Exception as exc:  # noqa: BLE001 - a step the counter cannot run is not counted, and says why
        session.not_counted(m.name, "FLOPs not counted", f"{type(exc).__name__}: {exc}")
        return m
    measure_cpu_roofs(session)
    return replace(m, work=work.to_dict())


def count_sides(session, name: str, sides: dict[str, Callable[[], Any]], factories: bool) -> dict[str, int]:
    """Counted FLOPs of one step of each A/B side (`factories`: each side is a factory of steps, built first),
    after the A/B; a side that cannot be built or counted says why."""
    from bench_core.timing.flops import count

    return {side: w.flops for side, w in each_side(session, name, sides, factories, count, "FLOPs").items()}


def each_side(session, name: str, sides: dict[str, Callable[[], Any]], factories: bool, counter, what: str) -> dict:
    """`counter(step)` of one step of each side; a side whose step cannot be built or counted is left out, and the
    session says why (the A/B stands)."""
    counted = {}
    for side, fn in sides.items():
        try:
            counted[side] = counter(fn() if factories else fn)
        except Exception as exc:  # noqa: BLE001 - not counted, and says why; the A/B stands
            session.not_counted(name, f"{what} not counted", f"{type(exc).__name__}: {exc}", side)
    return counted


def measure_cpu_roofs(session) -> None:
    """On the CPU, the machine's matmul peak and copy bandwidth, measured once per session (outside every
    timed window) and kept in the environment: the roofs utilization is a share of."""
    from bench_core.timing.flops import cpu_bandwidth, cpu_peak

    if session.config.device == "cpu" and "cpu_peak_flops" not in session.environment:
        session.environment["cpu_peak_flops"] = cpu_peak()
        session.environment["cpu_bandwidth_bytes_per_s"] = cpu_bandwidth()


def count_signature(session, m: Measurement, fn: Callable[[], Any], setup: Callable[[], Any] | None) -> Measurement:
    """The result with its step's work signature; a step the recorder cannot run is not counted, and says why."""
    sig = signature_of(session, m.name, fn, setup)
    return m if sig is None else replace(m, signature=sig)


def count_op_times(session, m: Measurement, fn: Callable[[], Any], setup: Callable[[], Any] | None) -> Measurement:
    """The result with one profiler pass's time per operator (after its window), kept so that a later verdict
    against it (a stored baseline's) can say where the time moved; a step that cannot be profiled says why."""
    from bench_core.workflows.diagnose.moved import op_times

    try:
        return replace(m, op_times=op_times(fn, setup, device=session.config.device))
    except Exception as exc:  # noqa: BLE001 - not taken, and says why
        session.not_counted(m.name, "no profiler pass", f"{type(exc).__name__}: {exc}")
        return m


def signature_of(session, name: str, fn: Callable[[], Any], setup: Callable[[], Any] | None, side: str = ""):
    from bench_core.timing.signature_count import record

    try:
        return record(fn, setup)
    except Exception as exc:  # noqa: BLE001 - not counted, and says why
        session.not_counted(name, "work signature not counted", f"{type(exc).__name__}: {exc}", side or None)
        return None


def counts_signature(session, scenario) -> bool:
    """Whether a scenario's step is counted: asked for the session (`--bench-signature`, `--bench-no-growth`), or
    the scenario declares counters that must not grow."""
    return session.config.signature or bool(scenario.no_growth)


def with_facts(session, c, base, cand, scenario=None):
    """The comparison with how the two work signatures differ (facts, exactly), and the counters that must not
    grow and did (`--bench-no-growth` and the scenario's own `no_growth`: the item fails); unchanged where either
    side was not counted, and where counters must not grow, the session says they were not checked."""
    from bench_core.deciding.signature_diff import attach

    no_growth = tuple(dict.fromkeys(session.config.no_growth + (scenario.no_growth if scenario else ())))
    if c is not None and no_growth and (base is None or cand is None):
        which = "the baseline's" if base is None else "this run's"
        session.not_counted(c.name, f"{', '.join(no_growth)} not checked for growth",
                            f"{which} work signature was not counted")
    return attach(c, base, cand, no_growth)


def signature_facts(session, name: str, baseline, candidate, factories: bool) -> tuple[str, ...]:
    """An A/B's two work signatures compared exactly (`factories`: each side is a factory of steps, built first);
    empty where a side could not be counted, which the session says."""
    from bench_core.deciding.signature_diff import differences
    from bench_core.timing.signature_count import record

    sigs = each_side(session, name, {"baseline": baseline, "candidate": candidate}, factories, record,
                      "work signature")
    return tuple(differences(sigs["baseline"], sigs["candidate"])) if len(sigs) == 2 else ()


def explain_sides(session, name: str, baseline: Callable[[], Any], candidate: Callable[[], Any],
                  factories: bool, step_ms: float | None) -> tuple[str, ...]:
    """An A/B's slower or faster verdict explained: alternated profiler passes of each side's step (`factories`:
    each side is a factory of steps, built for each pass), after the A/B, told apart from the profiler's noise
    (`deciding.explained`; `step_ms`: the measured step difference); empty where a side could not be profiled,
    which the session says."""
    from bench_core.deciding.explained import explained
    from bench_core.workflows.diagnose.moved import PASSES, op_times

    dev = session.config.device
    passes: dict[str, list] = {"baseline": [], "candidate": []}
    for i in range(PASSES):
        order = ("baseline", "candidate") if i % 2 == 0 else ("candidate", "baseline")
        times = each_side(session, name, {side: {"baseline": baseline, "candidate": candidate}[side] for side in order},
                          factories, lambda fn: op_times(fn, device=dev), "time per operator")
        if len(times) < 2:
            return ()
        for side, t in times.items():
            passes[side].append(t)
    return tuple(explained(passes["baseline"], passes["candidate"], step_ms))
