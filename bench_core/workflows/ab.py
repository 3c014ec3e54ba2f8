"""Interleaved A/B timing: baseline and candidate alternate in one process, compared pair by pair.

The level of a whole run drifts by several percent on a shared machine, but two workloads timed
back to back see the same machine: the ratio within a pair cancels the drift. Each pair runs A and B
in a seeded random order (no order bias), under the same warmup and repeat counts, profiler-free.
An incorrect candidate gets no speed verdict at all.
"""
from __future__ import annotations

import hashlib
import inspect
import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

from bench_core.timing.backends import Backend, backend_for
from bench_core.core.errors import ScenarioError
from bench_core.timing.sampling import Clock, Sampler
from bench_core.timing.protocol import ROUND_WARM_MS, Instance, run_rounds
from bench_core.core.stats import summarize
from bench_core.deciding.paired import PairedDecision, paired_decision
from bench_core.deciding.rounds import rounds_decision
from bench_core.deciding.sequential import chase, planned_looks
from bench_core.deciding.verdicts import FASTER, INCONCLUSIVE, REJECTED, SLOWER, SPEEDUP_MEANS
from bench_core.output.fitting import wrap
from bench_core.workflows.outcome import Outcome



@runtime_checkable
class Composite(Protocol):
    """A callable made of named parts (a bound variant: its step, its optimizer factory, the settings
    its optimizer was built with), so a decision record names each callable part with its own source
    hash and keeps the other parts as they are."""

    def identity_parts(self) -> tuple[str, Mapping[str, Callable]]: ...


def source_identity(fn: Callable) -> dict:
    """Qualified name and a hash of the source: what makes a decision reproducible.

    A `Composite` (such as a step bound by `bench_core.workflows.validation.correctness.bind`) names each of its parts,
    since two variants may share a step and differ only in the optimizer they build.
    """
    if isinstance(fn, Composite):
        label, parts = fn.identity_parts()
        return {"name": label, **{k: source_identity(v) if callable(v) else v for k, v in parts.items()}}
    target = inspect.unwrap(getattr(fn, "func", fn))
    name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"
    try:
        src = inspect.getsource(target)
        digest = hashlib.sha256(src.encode()).hexdigest()
    except (OSError, TypeError):
        digest = None  # built-ins, lambdas typed at a prompt: not observed
    return {"name": name, "source_sha256": digest}


@dataclass(frozen=True)
class ABResult:
    verdict: str
    reason: str
    speedup: float | None                 # baseline time / candidate time (>1: candidate faster)
    ci_low: float | None                  # interval of the speedup
    ci_high: float | None
    p_value: float | None                 # Wilcoxon signed-rank on paired log ratios
    baseline_ms: tuple[float, ...] = ()
    candidate_ms: tuple[float, ...] = ()
    cold_start_ms: Mapping[str, float] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)
    identities: Mapping[str, Any] = field(default_factory=dict)
    correctness: Mapping[str, Any] | None = None
    state_hash: str | None = None
    environment: Mapping[str, Any] = field(default_factory=dict)
    flops: Mapping[str, int] = field(default_factory=dict)   # counted FLOPs per step, per side (absent: not counted)
    facts: tuple[str, ...] = ()           # how the candidate's work signature differs from the baseline's, per step
    moved: tuple[str, ...] = ()           # a slower or faster verdict's profiler pass: operators whose time moved

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items()}
        d["baseline_ms"], d["candidate_ms"] = list(self.baseline_ms), list(self.candidate_ms)
        d["baseline_summary"] = summarize(self.baseline_ms).to_dict() if self.baseline_ms else None
        d["candidate_summary"] = summarize(self.candidate_ms).to_dict() if self.candidate_ms else None
        for k in ("cold_start_ms", "params", "identities", "environment", "flops"):
            d[k] = dict(d[k])
        d["facts"], d["moved"] = list(self.facts), list(self.moved)
        return d

    @property
    def speedup_text(self) -> str:
        if self.speedup is None:
            return "-"
        # rounds that all gave one ratio have a speedup and no interval: not observed, never a crash
        ci = "n/o" if self.ci_low is None else f"{self.ci_low:.3f}, {self.ci_high:.3f}"
        return f"{self.speedup:.3f}x [{ci}]"

    def table(self) -> str:
        from tabulate import tabulate

        rows = []
        for label, xs in (("baseline", self.baseline_ms), ("candidate", self.candidate_ms)):
            if xs:
                s = summarize(xs)
                rows.append([label, self.identities.get(label, {}).get("name", "-"), f"{self.cold_start_ms.get(label, math.nan):.3f}",
                             f"{s.median:.4f}", f"{s.iqr:.4f}", f"{s.min:.4f}", f"{s.max:.4f}", s.n])
        # a named first column: tabulate shifts every header left when the first one is empty
        out = tabulate(rows, headers=["side", "callable", "cold ms", "median ms", "IQR ms", "min ms", "max ms", "n"],
                       disable_numparse=True) if rows else ""
        p = "-" if self.p_value is None else f"{self.p_value:.2g}"
        return (f"{out}\n{wrap(f'speedup {self.speedup_text}, p={p}: {self.verdict} ({self.reason})')}\n"
                f"{SPEEDUP_MEANS}").lstrip()


def ab(baseline: Callable[[], Any], candidate: Callable[[], Any], *, device: str = "cpu", warmup: int = 5,
       repeats: int = 60, alpha: float = 0.01, min_effect: float = 0.01, seed: int = 0,
       correctness=None, state_hash: str | None = None, environment: Mapping[str, Any] | None = None,
       clock: Clock | None = None, backend: Backend | None = None, name: str = "ab") -> ABResult:
    """Time two zero-argument callables interleaved, pair by pair, and decide.

    `correctness`: a ValidationReport; when it failed, nothing is timed and the verdict is
    "rejected: incorrect". The primary figure is GPU time on CUDA, host time on the CPU.
    """
    for label, fn in (("baseline", baseline), ("candidate", candidate)):
        if not callable(fn):
            raise ScenarioError(name, f"{label} must be callable, got {type(fn).__name__}")
    if not isinstance(repeats, int) or repeats < 6:
        raise ScenarioError(name, f"repeats must be an integer >= 6 (pairs), got {repeats!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ScenarioError(name, f"warmup must be an integer >= 0, got {warmup!r}")
    params = {"device": device, "warmup": warmup, "repeats": repeats, "alpha": alpha, "min_effect": min_effect,
              "seed": seed, "order": "random per pair"}
    ident = {"baseline": source_identity(baseline), "candidate": source_identity(candidate)}
    corr = correctness.to_dict() if correctness is not None else None
    common = dict(params=params, identities=ident, correctness=corr, state_hash=state_hash,
                  environment=environment or {})
    if correctness is not None and not correctness.ok:
        return ABResult(REJECTED, "the candidate failed correctness, so it gets no speed verdict",
                        None, None, None, None, **common)
    # one round of the one rounds loop: one instance a side, a first call each kept apart, then the pairs
    fns = {"baseline": baseline, "candidate": candidate}
    res = run_rounds({side: (lambda r, fn=fn: Instance(fn)) for side, fn in fns.items()},
                     Sampler(name, backend or backend_for(device), clock), rounds=1, pairs=repeats, warmup=warmup,
                     seed=seed, min_rounds=1)
    cold = {side: v[0].primary_ms for side, v in res.cold.items()}
    samples = {side: [x for r in res.primary(side) for x in r] for side in fns}
    for label, xs in samples.items():
        bad = [v for v in xs if not math.isfinite(v) or v < 0]
        if bad:
            raise ScenarioError(name, f"{label} produced an impossible sample {bad[0]!r} ms")
    d = paired_decision(samples["baseline"], samples["candidate"], alpha, min_effect)
    if correctness is None:
        d = unchecked(d, baseline, candidate, name)
    return ABResult(d.verdict, d.reason, d.speedup, d.ci_low, d.ci_high, d.p_value, tuple(samples["baseline"]),
                    tuple(samples["candidate"]), cold, **common)


def unchecked(d: PairedDecision, baseline: Callable[[], Any], candidate: Callable[[], Any], name: str) -> PairedDecision:
    """An A/B given no correctness result: both sides called once more (untimed) and their outputs compared
    within torch's default tolerance for their dtype. Outputs that differ reject the candidate; outputs that
    cannot be compared leave the verdict, and its reason says that correctness was not checked."""
    import torch

    sampler = Sampler(name, backend_for("cpu"))
    b, c = (sampler.call(f"{side}'s output check", fn) for side, fn in (("baseline", baseline),
                                                                          ("candidate", candidate)))
    hint = "pass correctness= a validate(...) report, with a declared tolerance where a difference is intended"
    if b is None and c is None:
        return replace(d, reason=f"{d.reason}; correctness not checked: the callables return nothing to compare "
                                 f"({hint})")
    try:
        torch.testing.assert_close(c, b)
    except AssertionError as exc:
        first = " ".join(str(exc).split())[:200]
        return PairedDecision(REJECTED, f"the candidate's output differs from the baseline's ({first}): {hint}")
    except (TypeError, ValueError, RuntimeError) as exc:
        return replace(d, reason=f"{d.reason}; correctness not checked: outputs of type {type(b).__name__} and "
                                 f"{type(c).__name__} cannot be compared ({type(exc).__name__}; {hint})")
    return replace(d, reason=f"{d.reason}; outputs equal within torch's default tolerance")


def ab_rounds(make_baseline: Callable[[], Callable[[], Any]], make_candidate: Callable[[], Callable[[], Any]], *,
              device: str = "cpu", rounds: int = 12, pairs: int = 8, max_rounds: int | None = None,
              chase_p: float = 0.2, alpha: float = 0.01, min_effect: float = 0.01,
              seed: int = 0, correctness=None, state_hash: str | None = None,
              environment: Mapping[str, Any] | None = None, clock: Clock | None = None,
              backend: Backend | None = None, name: str = "ab") -> ABResult:
    """A/B whose interval describes the code change, not the two instances it happened to get.

    `make_baseline()` and `make_candidate()` build a fresh zero-argument step (a fresh model, fresh
    tensors: e.g. `lambda: bind(variant, state, make_model())`). Every round builds both anew and
    alternates `pairs` pairs in a seeded random order (see `sidebyside`); the speedup is exp(-mean of the
    rounds' median log ratios), its interval (at 1 - alpha) and p (two-sided) come from a t-test over rounds, so the
    bias each instance carries (several percent on memory-bound and CNN work) is inside the interval. Same
    verdict rule as `ab`.

    Sequential, as `--bench-against` is: the first look after `rounds` rounds; a difference it leaves
    undecided but likely (p < `chase_p`, either direction: a speed-up is what an A/B is usually after)
    runs on, a look every `rounds` rounds, up to `max_rounds` (3 x rounds unless given; = rounds: one
    look). Alpha is split over the looks (Bonferroni), so the error rate holds whatever the path, and the
    interval shown is at that split level. Why 8 pairs a round: docs/validation.md.
    """
    max_rounds = 3 * rounds if max_rounds is None else max_rounds
    if max_rounds < rounds:
        raise ScenarioError(name, f"max_rounds ({max_rounds}) must be at least rounds ({rounds})")
    looks = planned_looks(rounds, max_rounds, rounds)
    level = alpha / len(looks)
    for label, fn in (("make_baseline", make_baseline), ("make_candidate", make_candidate)):
        if not callable(fn):
            raise ScenarioError(name, f"{label} must be callable (a factory of steps), got {type(fn).__name__}")
    params = {"device": device, "rounds": rounds, "pairs": pairs, "alpha": alpha, "min_effect": min_effect,
              "seed": seed, "order": "random per pair; both sides built anew every round", "looks": list(looks),
              "alpha_per_look": level, "chase_p": chase_p}
    first: dict[str, Callable] = {}

    def builder(label: str, make: Callable[[], Callable[[], Any]]):
        def build(r: int) -> Instance:
            fn = make()
            if not callable(fn):
                raise TypeError(f"{label}'s factory returned {type(fn).__name__}, not a step to call")
            first.setdefault(label, fn)
            return Instance(fn)
        return build

    corr = correctness.to_dict() if correctness is not None else None
    if correctness is not None and not correctness.ok:
        return ABResult(REJECTED, "the candidate failed correctness, so it gets no speed verdict", None, None, None,
                        None, params=params, identities={}, correctness=corr, state_hash=state_hash,
                        environment=environment or {})
    def go_on(res) -> bool:
        flat = [x for side in ("baseline", "candidate") for r in res.primary(side) for x in r]
        if min(flat) <= 0:
            return False
        d = rounds_decision(res.round_log_ratios, level, min_effect)
        return chase(d.verdict == INCONCLUSIVE, d.p_value, chase_p)

    res = run_rounds({"baseline": builder("baseline", make_baseline), "candidate": builder("candidate", make_candidate)},
                     Sampler(name, backend or backend_for(device), clock), rounds=looks[0], pairs=pairs, seed=seed,
                     extend_to=looks[1:], go_on=go_on, warm_ms=ROUND_WARM_MS)
    params["rounds_run"] = len(res.round_log_ratios)
    ident = {label: source_identity(fn) for label, fn in first.items()}
    base = tuple(x for r in res.primary("baseline") for x in r)
    cand = tuple(x for r in res.primary("candidate") for x in r)
    cold = {k: v[0].primary_ms for k, v in res.cold.items()}
    common = dict(params=params, identities=ident, correctness=corr, state_hash=state_hash,
                  environment=environment or {})
    if min(base + cand) <= 0:
        return ABResult(INCONCLUSIVE, "a sample is 0 ms (below the timer's resolution): no ratio", None, None, None,
                        None, base, cand, cold, **common)
    v = rounds_decision(res.round_log_ratios, level, min_effect)
    if correctness is None:
        v = unchecked(v, make_baseline(), make_candidate(), name)   # fresh instances, as every round's
    return ABResult(v.verdict, v.reason, v.speedup, v.ci_low, v.ci_high, v.p_value, base, cand, cold, **common)


def run_ab(session, name: str, baseline: Callable[[], Any], candidate: Callable[[], Any], *, validation=None,
           state_hash: str | None = None, rounds: int | None = None, **kwargs) -> Outcome:
    """An A/B in the session: on its device, after the candidate's correctness result, as the outcome the
    session records with its decisions (and each side's counted FLOPs, where asked).

    With `rounds`, `baseline` and `candidate` are factories of steps and every round builds both anew
    (`ab_rounds`): the interval then covers what each instance's allocations add.
    """
    from bench_core.timing.counts import QUICK
    from bench_core.workflows.counted_work import count_sides, explain_sides, signature_facts

    decide = ab
    if rounds is not None:
        if session.config.quick:
            rounds, kwargs = QUICK.rounds, {**kwargs, "pairs": QUICK.pairs, "max_rounds": QUICK.rounds}
        kwargs["rounds"] = rounds
        decide = ab_rounds
    elif session.config.quick:
        kwargs.setdefault("repeats", QUICK.ab_repeats)
        kwargs.setdefault("warmup", QUICK.ab_warmup)
    if state_hash is None and validation is not None:
        state_hash = validation.state_hash
    res = decide(baseline, candidate, device=session.config.device, correctness=validation, state_hash=state_hash,
                 environment=session.environment, name=name, **kwargs)
    if session.config.count_flops:  # after the A/B, profiler-free: one more step of each side, counted
        res = replace(res, flops=count_sides(session, name, {"baseline": baseline, "candidate": candidate},
                                             factories=rounds is not None))
    if session.config.signature:    # the same: what each side's step does, compared exactly
        res = replace(res, facts=signature_facts(session, name, baseline, candidate, factories=rounds is not None))
    if res.verdict in (SLOWER, FASTER) and not session.config.quick and kwargs.get("clock") is None:
        step = (statistics.median(res.candidate_ms) - statistics.median(res.baseline_ms)
                if res.candidate_ms and res.baseline_ms else None)
        res = replace(res, moved=explain_sides(session, name, baseline, candidate, factories=rounds is not None,
                                               step_ms=step))
    return Outcome(name, decision=res)
