"""*Rounds* of alternated pairs, the timing sequence of two versions of a scenario side by side: rounds of fresh
instances, in one process, in side servers' forked children, or in ranks behind a barrier (a single step's
sequence, the series, is `timing.measuring`).

Where timing noise lives on a shared machine (docs/measurements.md): the level of a whole run drifts, so the
two sides alternate sample by sample, in mirrored pairs that start on a seeded random side, and each pair's
ratio cancels the drift. But each instance (each set of allocations) keeps a bias of its own of several
percent on memory-bound and CNN work, so every round builds both sides anew, and the *round* is the unit of
evidence: a round's estimate is the median log ratio of its pairs, and the interval comes from the spread of
the round estimates (a t-interval with rounds - 1 degrees of freedom). The instance bias is then inside the
interval instead of inside the answer.

Each timed sample of a pair starts where a plain run's does, from a call of its own step (the caches, the
last-level one above all, hold its data, and the core is awake). Without that, side by side in forked children
reads a short step, and less so a memory-bound one, slower than a plain run does, which pulls a ratio towards 1
(docs/side-by-side.md). So the pairs of a round are mirrored (A B, B A, A B,
...), the first starting with the side whose first call ran last, and a side's sample that follows the other
side's call gets an untimed call of its own ahead of it (`ahead_of`): half the calls of an untimed call ahead of
every sample. A short step (round 0's two first calls under `SHORT_MS` together) gets the call ahead of every
sample all the same: the call costs little there, and a sample after its own one, across the gap in which the
parent asked for it, is not back to back (docs/side-by-side.md, "Mirrored pairs"). Where
both sides must make the same number of calls (a distributed rank's two configurations end equal),
`ahead="always"` puts one ahead of every sample whatever the step.

A short step's pair is cheap and noisy (a preemption is a large part of a 2 ms sample), so with `pairs_ms` a round
takes more pairs than `pairs`, up to `PAIRS_MAX`, while round 0's two first calls say that fewer would take less
than `pairs_ms` (`pairs_for`); every round then takes that many.

A fresh instance also runs slower for its first calls (a forked child's copy-on-write faults, allocations touched
for the first time): with `warm_ms`, each instance's first call is followed by untimed calls until the two have
taken `warm_ms` (`warm_for`), so that a 0.1 ms step reaches its settled time before its pairs while a step slower
than that costs no extra call.

The decision over the rounds is `deciding.rounds`. Pure apart from calling the builders and the sampler.
"""
from __future__ import annotations

import math
import random
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from bench_core.core.errors import ScenarioError
from bench_core.timing.sampling import (Sample, Sampler, busy_shares, cpu_ticks, gc_frozen, gc_paused,
                                        shared_cpus)

SIDES = ("baseline", "candidate")


class SideError(ScenarioError):
    """One side of a side-by-side comparison failed; `side` says which."""

    def __init__(self, side: str, cause: ScenarioError):
        self.side = side
        super().__init__(cause.scenario, f"{side}: {cause.problem}")


def on_side(side: str, fn: Callable[[], Any]) -> Any:
    """Run `fn` for `side`; a ScenarioError comes back as a SideError naming that side."""
    try:
        return fn()
    except SideError:
        raise
    except ScenarioError as exc:
        raise SideError(side, exc) from exc


@dataclass(frozen=True)
class Instance:
    """One freshly built side of a round: the zero-argument step and its optional `load` and `setup`."""

    fn: Callable[[], Any]
    setup: Callable[[], Any] | None = None
    load: Callable[[], Any] | None = None
    block_size: int = 1
    scenario: Any = None           # the side's own Scenario record, when it declared one
    remote: Callable[[bool], Sample] | None = None   # takes a sample elsewhere (a worker process) instead of `fn`;
                                                      # its argument: the sample follows an untimed call (`ahead_of`)
    clock: Any = None              # the clock the test asked for (tests: a fake), for a whole measurement of it
    remote_warm: Callable[[float], Any] | None = None   # with `remote`: `warm_for` there, for so many ms
    remote_first: Callable[[float, bool], tuple[Sample, Sample]] | None = None   # with `remote`: `first_then_sample`
                                                                                  # there, in one request


@dataclass(frozen=True)
class Rounds:
    """Raw material of a side-by-side comparison: per round and side, the timed samples."""

    baseline: tuple[tuple[Sample, ...], ...]
    candidate: tuple[tuple[Sample, ...], ...]
    cold: Mapping[str, tuple[Sample, ...]] = field(default_factory=dict)   # first call of each round
    load_ms: Mapping[str, float | None] = field(default_factory=dict)     # round 0's `load`, timed once
    seed: int = 0
    scenarios: Mapping[str, Any] = field(default_factory=dict)            # each side's record, from round 0
    # the pair of processes that served each round, where a process keeps a bias of its own for all its rounds;
    # empty: every round drew its own (fresh instances in one process, or each in a freshly forked child)
    units: tuple[int, ...] = ()

    def __post_init__(self):
        if self.units and len(self.units) != len(self.baseline):
            raise ValueError(f"{len(self.units)} units for {len(self.baseline)} rounds: one per round")

    def primary(self, side: str) -> tuple[tuple[float, ...], ...]:
        return tuple(tuple(x.primary_ms for x in r) for r in getattr(self, side))

    @property
    def round_log_ratios(self) -> list[float]:
        """Per round: median over its pairs of log(candidate / baseline)."""
        return [float(np.median(np.log(np.asarray(c)) - np.log(np.asarray(b))))
                for b, c in zip(self.primary("baseline"), self.primary("candidate"))]

    @property
    def unit_log_ratios(self) -> list[float]:
        """The units of evidence: each round's log ratio, or, where rounds share a pair of processes (`units`), the
        mean of that pair's rounds, so the bias a process keeps lands in the spread instead of in the answer."""
        return unit_means(self.round_log_ratios, self.units)

    def to_dict(self) -> dict:
        def ms(rounds):
            return [[[x.host_ms, x.gpu_ms] for x in r] for r in rounds]

        return {"samples_host_gpu_ms": {s: ms(getattr(self, s)) for s in SIDES},
                "cold_host_gpu_ms": {k: [[x.host_ms, x.gpu_ms] for x in v] for k, v in self.cold.items()},
                "load_ms": dict(self.load_ms), "seed": self.seed, "round_log_ratios": self.round_log_ratios,
                **({"units": list(self.units)} if self.units else {})}


def unit_means(logs: Sequence[float], units: Sequence[int] = ()) -> list[float]:
    """Per unit of evidence, in the order units first appear: the mean of its rounds' log ratios (`units`: each
    round's unit; empty: every round its own)."""
    if not units:
        return list(logs)
    by_unit: dict[int, list[float]] = {}
    for unit, v in zip(units, logs):
        by_unit.setdefault(unit, []).append(v)
    return [float(np.mean(v)) for v in by_unit.values()]


def joined(parts: Sequence[Rounds]) -> Rounds:
    """Rounds run by several pairs of processes, one `Rounds` each, as one, each pair its own unit."""
    if not parts:
        raise ValueError("no rounds to join")
    cold = {s: tuple(x for p in parts for x in p.cold.get(s, ())) for s in SIDES}
    return Rounds(tuple(r for p in parts for r in p.baseline), tuple(r for p in parts for r in p.candidate), cold,
                  dict(parts[0].load_ms), parts[0].seed, dict(parts[0].scenarios),
                  tuple(k for k, p in enumerate(parts) for _ in p.baseline))


def ahead_of(sampler: Sampler, inst: Instance, what: str) -> None:
    """The untimed call of a side's own step just before its timed sample (see above), with its setup."""
    if inst.setup is not None:
        sampler.call(f"setup before the call ahead of {what}", inst.setup)
    sampler.warm(inst.fn, f"the call ahead of {what}")


ROUND_WARM_MS = 10.0    # comparisons' `warm_ms`: a fresh fork's first calls run slow (docs/side-by-side.md)
WARM_CALLS_MAX = 1000   # `warm_for`'s bound: a step whose calls return at once (queued device work) ends anyway
ROUND_PAIRS_MS = 40.0   # comparisons' `pairs_ms`: a 1.6 ms matmul step gets 8 pairs, a 17 ms one its `pairs`
PAIRS_MAX = 8
SHORT_MS = 20.0         # round 0's two first calls under this together: a call ahead of every sample (see above)


def pairs_for(least: int, ms: float, first_calls_ms: float) -> int:
    """Pairs a round takes: `least`, or more (up to PAIRS_MAX) while a pair, as long as the two sides' first
    calls together (`first_calls_ms`, an overestimate of a settled pair), would take less than `ms` in all."""
    if ms <= 0 or not first_calls_ms > 0:
        return least
    return max(least, min(PAIRS_MAX, math.ceil(ms / first_calls_ms)))


def warm_for(sampler: Sampler, inst: Instance, ms: float, what: str) -> int:
    """Untimed calls of `inst` (each after its setup, its device work waited for) while they have taken less than
    `ms` in all; returns how many ran."""
    start, n = sampler.clock(), 0
    while n < WARM_CALLS_MAX and (sampler.clock() - start) / 1e6 < ms:
        if inst.setup is not None:
            sampler.call(f"setup before {what}'s warm call {n}", inst.setup)
        sampler.warm(inst.fn, f"{what}'s warm call {n}")
        sampler.backend.synchronize()
        n += 1
    return n


def sample_of(sampler: Sampler, inst: Instance, what: str, ahead: bool) -> Sample:
    """One timed sample of a local instance (its setup first), after `ahead_of` where `ahead`."""
    if ahead:
        ahead_of(sampler, inst, what)
    if inst.setup is not None:
        sampler.call(f"setup before {what}", inst.setup)
    return sampler.sample(inst.fn, inst.block_size, what=what)


def first_then_sample(sampler: Sampler, inst: Instance, warm_ms: float, ahead: bool, of: str = "") -> tuple[Sample,
                                                                                                      Sample]:
    """A round's first call of `inst` (its cold observation), untimed calls while they and it have taken less than
    `warm_ms`, then its first sample (after `ahead_of` where `ahead`), in one go: in a round's process, with no wait
    on the parent between the first call and the sample: such a wait can leave a fresh child's second call slow
    (seen standalone, not in the suite: docs/lab/from-the-code.md)."""
    cold = sample_of(sampler, inst, f"the first call{of}", False)
    if warm_ms - cold.primary_ms > 0:
        warm_for(sampler, inst, warm_ms - cold.primary_ms, f"the first call{of}")
    return cold, sample_of(sampler, inst, f"pair 0{of}", ahead)


def run_rounds(build: Mapping[str, Callable[[int], Instance]], sampler: Sampler, *, rounds: int, pairs: int,
               warmup: int = 1, seed: int = 0, min_rounds: int = 3, extend_to: Sequence[int] = (),
               go_on: Callable[[Rounds], bool] | None = None, after_build: Callable[[int], Any] | None = None,
               after_round: Callable[[int], Any] | None = None, warm_ms: float = 0.0, pairs_ms: float = 0.0,
               ahead: str = "switch", timed_here: bool = True) -> Rounds:
    """`build[side](round)` makes a fresh instance of that side. Each round: build both (in random order),
    a first (cold) call and `warmup` more of each, kept out of the estimate, untimed calls while its first
    call and they have taken less than `warm_ms`, then `pairs` pairs (more for a short step with `pairs_ms`),
    mirrored, each sample after a call of its own step: the sample before it, or an untimed call ahead of it
    (`ahead="switch"`: where the other side ran last, or always for a short step; `"always"`: before every
    sample). After round 0 (and without `warmup`), a side's first call comes just before its first sample,
    which then needs no call ahead: one call a round fewer. Nothing of the other side runs between a sample and
    the call before it. A distributed rank passes neither `warm_ms` nor `pairs_ms` (the ranks would disagree on
    how many calls) and `ahead="always"`. A failure raises SideError.
    The rounds are the unit of evidence, so there must be `min_rounds` of them (3, for a spread with 2
    degrees of freedom), unless these rounds are one part of a larger unit (a pair of processes).

    A sequential design: after `rounds` rounds, and at each of `extend_to` in turn, `go_on(rounds so
    far)` decides whether to run on to the next of `extend_to` (the looks, and the alpha they spend, are
    the caller's to plan).

    The one rounds loop: a plain A/B is one round of one instance a side, side by side and A/B with rounds
    are many, and a distributed rank runs the same loop with its barrier as the sampler's `before_sample`.
    `after_build(r)` runs once both sides of round r are built, `after_round(r)` once its pairs are taken
    (a rank checks there that both sides start and end equal); neither is timed. `timed_here` False: every
    sample is timed in another process (`run_served`), so this one leaves its collector alone: a full collection
    of a pytest process that has imported torch is slow, and both sides' processes would wait for it
    (docs/lab/from-the-code.md)."""
    if rounds < min_rounds or pairs < 1:
        raise ValueError(f"side by side needs at least {min_rounds} rounds and 1 pair, got {rounds} and {pairs}")
    if list(extend_to) != sorted(set(extend_to)) or any(n <= rounds for n in extend_to):
        raise ValueError(f"later looks must grow past {rounds} rounds, got {list(extend_to)}")
    if ahead not in ("switch", "always"):
        raise ValueError(f"ahead must be 'switch' or 'always', got {ahead!r}")
    runner = _Runner(build, sampler, random.Random(seed), after_build, after_round,
                     single=rounds == 1 and not extend_to, paused=gc_paused if timed_here else nullcontext)
    plan = _Plan(pairs, warmup, warm_ms, pairs_ms, always_ahead=ahead == "always")
    with gc_frozen() if timed_here else nullcontext():
        for r in range(rounds):
            runner.round(r, plan)
        for target in extend_to:
            if go_on is None or not go_on(runner.result(seed)):
                break
            for r in range(len(runner.samples["baseline"]), target):
                runner.round(r, plan)
    return runner.result(seed)


@dataclass
class _Plan:
    """What each round takes, settled by round 0's first calls: `pairs` (more for a short step where `pairs_ms`
    asks) and whether every sample gets a call ahead (a short step's do)."""

    pairs: int
    warmup: int
    warm_ms: float
    pairs_ms: float
    always_ahead: bool = False

    def settle(self, first_calls_ms: float) -> None:
        self.pairs = pairs_for(self.pairs, self.pairs_ms, first_calls_ms)
        self.always_ahead = self.always_ahead or first_calls_ms < SHORT_MS


class _Runner:
    """The state of a side-by-side run as its rounds go by."""

    def __init__(self, build: Mapping[str, Callable[[int], Instance]], sampler: Sampler, rng: random.Random,
                 after_build=None, after_round=None, single: bool = False, paused=gc_paused):
        self.build, self.sampler, self.rng, self.paused = build, sampler, rng, paused
        self.after_build, self.after_round = after_build, after_round
        self.single = single   # one round only: its samples are named without a round number
        self.last: str | None = None   # the side whose step ran last (on this machine, in whichever process)
        self.samples: dict[str, list[tuple[Sample, ...]]] = {s: [] for s in SIDES}
        self.cold: dict[str, list[Sample]] = {s: [] for s in SIDES}
        self.load_ms: dict[str, float | None] = {s: None for s in SIDES}
        self.scenarios: dict[str, Any] = {}
        self.inst: dict[str, Instance] = {}

    def timed(self, side: str, what: str, ahead: bool = False) -> Sample:
        """A sample of `side`; with `ahead`, after an untimed call of its own step (`ahead_of`)."""
        i = self.inst[side]
        self.last = side
        if i.remote is not None:
            return on_side(side, lambda: i.remote(ahead))
        return on_side(side, lambda: sample_of(self.sampler, i, what, ahead))

    def paired(self, side: str, what: str, always_ahead: bool) -> Sample:
        """A pair's sample of `side`, after a call of its own step: the one before it, or one ahead of it."""
        return self.timed(side, what, ahead=always_ahead or self.last != side)

    def first(self, side: str, plan: "_Plan", what: str, where: str) -> None:
        """The first call of `side`'s instance (its cold observation), then untimed calls up to `plan.warm_ms`."""
        self.cold[side].append(self.timed(side, what))
        self.warmed(side, plan.warm_ms - self.cold[side][-1].primary_ms, where)

    def first_then_paired(self, side: str, plan: "_Plan", what: str, where: str, pair: str) -> Sample:
        """`first`, then `paired`: in one request where the instance lives in another process."""
        i = self.inst[side]
        if i.remote_first is None:
            self.first(side, plan, what, where)
            return self.paired(side, pair, plan.always_ahead)
        self.last = side
        cold, sample = on_side(side, lambda: i.remote_first(plan.warm_ms, plan.always_ahead))
        self.cold[side].append(cold)
        return sample

    def warmed(self, side: str, ms: float, what: str) -> None:
        i = self.inst[side]
        if ms <= 0:
            return
        if i.remote_warm is not None:
            on_side(side, lambda: i.remote_warm(ms))
        elif i.remote is None:
            on_side(side, lambda: warm_for(self.sampler, i, ms, what))

    def round(self, r: int, plan: _Plan) -> None:
        of = "" if self.single else f" of round {r}"
        for side in self.rng.sample(SIDES, 2):
            self.inst[side] = on_side(side, lambda: self.sampler.call(f"building round {r}",
                                                                      lambda: self.build[side](r)))
            load = self.inst[side].load
            if load is not None:
                ms = on_side(side, lambda: self.sampler.elapsed_ms(load, f"load (round {r})"))
                if r == 0:
                    self.load_ms[side] = ms
            if r == 0:
                self.scenarios[side] = self.inst[side].scenario
        if self.after_build is not None:
            self.after_build(r)
        firsts = self.rng.sample(SIDES, 2)
        # round 0 settles the plan from both first calls, and warmup calls come after both; later rounds take
        # each side's first call just before its first sample, which then needs no call ahead of it
        late = set() if r == 0 or plan.warmup else set(SIDES)
        for side in firsts:
            if side not in late:
                self.first(side, plan, f"the first call{of}", f"round {r}")
        if r == 0:
            plan.settle(sum(self.cold[s][-1].primary_ms for s in SIDES))
        for w in range(plan.warmup):
            for side in self.rng.sample(SIDES, 2):
                self.timed(side, f"warmup {w}{of}")
        got: dict[str, list[Sample]] = {s: [] for s in SIDES}
        order = firsts if late else [self.last, *(s for s in SIDES if s != self.last)]
        with self.paused():
            for p in range(plan.pairs):
                for side in order:
                    if side in late:
                        late.discard(side)
                        got[side].append(self.first_then_paired(side, plan, f"the first call{of}", f"round {r}",
                                                                f"pair {p}{of}"))
                    else:
                        got[side].append(self.paired(side, f"pair {p}{of}", plan.always_ahead))
                order.reverse()
        for side in SIDES:
            self.samples[side].append(tuple(got[side]))
        if self.after_round is not None:
            self.after_round(r)
        self.inst.clear()  # this round's instances go before the next round allocates its own

    def result(self, seed: int) -> Rounds:
        return Rounds(tuple(self.samples["baseline"]), tuple(self.samples["candidate"]),
                      {k: tuple(v) for k, v in self.cold.items()}, dict(self.load_ms), seed, dict(self.scenarios))


def run_served(pair: Mapping[str, Any], sampler: Sampler, *, threads: int | None = None,
               ticks: Callable[[], Mapping[int, tuple[int, int]] | None] = cpu_ticks, **rounds_kw) -> Rounds:
    """Rounds whose instances live in other processes (`pair[side]`: a `worker.Worker` serving its test): each
    round both servers make a fresh instance (`start_round(cpus)`), held together to the same `threads` CPUs, drawn
    afresh each round from those the last round left free (`sampling.shared_cpus`, with `ticks()` read at each
    round's start: `sampling.cpu_ticks`), samples are asked for (`sample()`), and the instance goes when the round
    ends (`end_round()`). Each round is a unit of evidence where the servers fork it from a state no round changed;
    servers that cannot fork are joined as units by `run_processes`. `rounds_kw` are `run_rounds`'s."""
    started: set[tuple[int, str]] = set()
    places = random.Random(rounds_kw.get("seed", 0) + 0x5EED)   # its own stream: the call order stays the seed's
    last: dict[str, Any] = {"ticks": None, "cpus": None}

    def draw() -> tuple[int, ...] | None:
        now = ticks()
        last["cpus"] = shared_cpus(places, threads, busy=busy_shares(last["ticks"], now), last=last["cpus"])
        last["ticks"] = now
        return last["cpus"]

    def builder(side: str):
        def build(r: int) -> Instance:
            # both servers asked at once: their children fork and set up side by side, untimed, and the first
            # instance built waits for the other before any call is timed (run_rounds builds both first)
            if (r, side) not in started:
                cpus = draw()
                for s in SIDES:
                    started.add((r, s))
                    on_side(s, lambda: pair[s].start_round(cpus))
            return Instance(fn=lambda: None, remote=pair[side].sample, remote_warm=pair[side].warm,
                            remote_first=pair[side].first_then_sample, scenario=pair[side].built())
        return build

    def after_round(r: int) -> None:
        for side in SIDES:
            on_side(side, pair[side].start_end)
        for side in SIDES:
            on_side(side, pair[side].ended)
    return run_rounds({s: builder(s) for s in SIDES}, sampler, after_round=after_round, timed_here=False,
                      **rounds_kw)


def with_pair(spawn: Mapping[str, Callable[[int], Any]], k: int, work: Callable[[Mapping[str, Any]], Any], *,
              seed: int = 0, release: Callable[[str, int, Any, bool], None] | None = None) -> Any:
    """`work(pair)` with pair `k` of servers ready to serve: `spawn[side](k)` gives side's server, the two started
    in a seeded random order, each loading its code while the other starts, then each step of both before the
    next (`Worker.assign`). Afterwards each server goes to `release(side, k, server, ok)` (default: ended)."""
    release = release or (lambda side, j, w, ok: w.close())
    pair: dict[str, Any] = {}
    ok = False
    try:
        for side in random.Random(seed + k).sample(SIDES, 2):
            pair[side] = on_side(side, lambda: spawn[side](k))
        for step in ("start_item", "reach", "wait_ready"):
            for side, w in pair.items():
                on_side(side, getattr(w, step))
        out = work(pair)
        ok = True
        return out
    finally:
        for side, w in pair.items():
            release(side, k, w, ok)


def run_processes(spawn: Mapping[str, Callable[[int], Any]], sampler: Sampler, *, processes: int, rounds: int,
                  pairs: int, seed: int = 0, release: Callable[[str, int, Any, bool], None] | None = None,
                  warm_ms: float = 0.0, threads: int | None = None) -> Rounds:
    """Side by side in `processes` pairs of servers that keep their own bias and cannot fork (see `run_served`):
    each pair in turn runs `rounds` rounds, and is the unit of evidence (`Rounds.units`)."""
    if processes < 3:
        raise ValueError(f"worker mode needs at least 3 pairs of processes, got {processes}")
    return joined([with_pair(spawn, k, lambda pair: run_served(pair, sampler, rounds=rounds, pairs=pairs, seed=seed + k,
                                                               min_rounds=1, warm_ms=warm_ms, threads=threads),
                             seed=seed, release=release)
                   for k in range(processes)])
