
import numpy as np
import pytest

from bench_core import ScenarioError
from bench_core.deciding.paired import paired_decision
from bench_core.deciding.verdicts import FASTER, INCONCLUSIVE, REJECTED, SLOWER, UNCHANGED
from bench_core.workflows.ab import ab, source_identity
from bench_core.timing.backends import CudaBackend
from fakes import FakeClock, FakeGPU


def _drifting(clock, base_ms, drift):
    """A callable whose cost is base_ms times the machine's current speed factor drift()."""
    def fn():
        clock.advance_ms(base_ms * drift())
    return fn


def test_interleaving_cancels_drift_that_would_fool_separate_runs():
    clock = FakeClock()
    rng = np.random.default_rng(0)
    level = {"v": 1.0}

    def drift():
        # the machine's speed wanders by +-10% between calls, far more than the 5% effect
        level["v"] = float(np.clip(level["v"] * (1 + 0.03 * rng.standard_normal()), 0.9, 1.1))
        return level["v"]

    res = ab(_drifting(clock, 10.0, drift), _drifting(clock, 9.5, drift), clock=clock, repeats=40, warmup=2)
    assert res.verdict == FASTER, res.reason
    assert res.speedup == pytest.approx(10 / 9.5, rel=0.02)
    assert res.ci_low > 1.01 and res.p_value < 0.01
    assert len(res.baseline_ms) == len(res.candidate_ms) == 40


def _mirrored(first_calls, pairs, always_ahead=False):
    """The calls a round makes after its first calls: mirrored pairs, starting with the side that ran last, and
    an untimed call ahead of a sample where the other side ran last (or of every sample)."""
    last, out = first_calls[-1], []
    order = [last, "B" if last == "A" else "A"]
    for _ in range(pairs):
        for side in order:
            out += [side] if side == last and not always_ahead else [side, side]
            last = side
        order.reverse()
    return out


@pytest.mark.parametrize("ms", [15.0, 1.0])
def test_pairs_are_mirrored_start_on_a_seeded_side_and_follow_their_own_call(ms):
    # 15 ms: the sample before is the call of its own step where it can be; 1 ms (two first calls under 20 ms
    # together): a short step, whose every sample gets its call ahead, which costs little there
    clock = FakeClock()
    calls = []
    a = lambda: (calls.append("A"), clock.advance_ms(ms))
    b = lambda: (calls.append("B"), clock.advance_ms(ms))
    starts = set()
    for seed in range(8):
        calls.clear()
        ab(a, b, clock=clock, repeats=20, warmup=0, seed=seed)
        assert sorted(calls[:2]) == ["A", "B"]
        pairs = _mirrored(calls[:2], 20, always_ahead=ms < 10)
        assert calls[2:2 + len(pairs)] == pairs              # long: 20 timed and 10 untimed calls a side
        assert pairs.count("A") == pairs.count("B") == (30 if ms > 10 else 40)
        starts.add(calls[2])
        first = list(calls)
        calls.clear()
        ab(a, b, clock=clock, repeats=20, warmup=0, seed=seed)
        assert calls == first                                # the order is reproducible
    assert starts == {"A", "B"}                              # and either side may start


def test_each_sample_starts_from_its_own_sides_state_not_the_others():
    # a cache: a call runs at its warm time only when the call before it was of the same step; after the other
    # side's, it pays a refill. A plain run's samples follow their own step, so the ratio asked about is 4.0
    clock, last = FakeClock(), {"who": None}

    def step(who, warm_ms):
        def call():
            clock.advance_ms(warm_ms + (0.0 if last["who"] == who else 0.1))
            last["who"] = who
        return call
    res = ab(step("A", 0.1), step("B", 0.4), clock=clock, repeats=20, warmup=0)
    assert res.baseline_ms == pytest.approx([0.1] * 20) and res.candidate_ms == pytest.approx([0.4] * 20)
    assert res.speedup == pytest.approx(0.25)          # not 0.5/0.2, as alternating calls alone would read


def test_exactly_equal_callables_are_unchanged():
    clock = FakeClock()
    res = ab(lambda: clock.advance_ms(2), lambda: clock.advance_ms(2), clock=clock)
    assert res.verdict == UNCHANGED and res.speedup == 1.0


def test_slower_candidate():
    clock = FakeClock()
    res = ab(lambda: clock.advance_ms(2), lambda: clock.advance_ms(2.2), clock=clock)
    assert res.verdict == SLOWER and res.speedup == pytest.approx(2 / 2.2)


def test_a_small_effect_inside_the_minimum_is_unchanged_and_a_wide_interval_inconclusive():
    base = [10.0 + 0.01 * i for i in range(30)]
    cand = [v / 1.004 for v in base]                     # a real but negligible 0.4%
    d = paired_decision(base, cand, min_effect=0.01)
    assert d.verdict == UNCHANGED and 1 / 1.01 <= d.ci_low <= d.ci_high <= 1.01
    rng = np.random.default_rng(3)                       # no change, but pairs that scatter by 10%
    noisy = [v * float(np.exp(rng.normal(0, 0.1))) for v in base]
    d = paired_decision(base, noisy, min_effect=0.01)
    assert d.verdict == INCONCLUSIVE and "too wide to rule out" in d.reason and d.ci_low < 1 / 1.01


def test_incorrect_candidate_gets_no_speed_verdict_and_is_not_timed():
    class Failed:
        ok = False

        def to_dict(self):
            return {"ok": False}

    called = []
    res = ab(lambda: called.append(1), lambda: called.append(2), correctness=Failed())
    assert res.verdict == REJECTED and res.speedup is None and not called
    assert res.correctness == {"ok": False}


def test_cuda_ab_uses_event_time():
    clock = FakeClock()
    gpu = FakeGPU(clock)
    res = ab(lambda: gpu.launch(2.0, 0.1), lambda: gpu.launch(1.0, 0.1), device="cuda", clock=clock,
             backend=CudaBackend(gpu))
    assert res.verdict == FASTER and res.speedup == pytest.approx(2.1 / 1.1)


def test_record_holds_what_makes_it_reproducible():
    clock = FakeClock()

    def base():
        clock.advance_ms(2)

    res = ab(base, lambda: clock.advance_ms(1), clock=clock, state_hash="abc", environment={"device": "cpu"})
    d = res.to_dict()
    assert d["identities"]["baseline"]["name"].endswith("test_record_holds_what_makes_it_reproducible.<locals>.base")
    assert len(d["identities"]["baseline"]["source_sha256"]) == 64
    assert d["params"]["repeats"] == 60 and d["params"]["order"] == "random per pair"
    assert d["state_hash"] == "abc" and d["baseline_summary"]["median"] == 2.0
    assert set(d["cold_start_ms"]) == {"baseline", "candidate"}
    assert "speedup 2.000x" in res.table()


def test_source_identity_of_a_builtin_is_not_observed():
    assert source_identity(len)["source_sha256"] is None


def test_bad_input_names_the_comparison():
    with pytest.raises(ScenarioError, match="'opt': candidate must be callable"):
        ab(lambda: None, 3, name="opt")
    with pytest.raises(ScenarioError, match="repeats must be an integer >= 6"):
        ab(lambda: None, lambda: None, repeats=3)

    def boom():
        raise RuntimeError("x")

    with pytest.raises(ScenarioError, match="candidate: the first call raised RuntimeError"):
        ab(lambda: None, boom)


def test_paired_decision_refuses_unpaired_input():
    with pytest.raises(ValueError):
        paired_decision([1.0] * 10, [1.0] * 9)
    d = paired_decision([0.0] * 10, [1.0] * 10)
    assert d.verdict == INCONCLUSIVE and "0 ms" in d.reason
    assert (d.speedup, d.ci_low, d.ci_high, d.p_value) == (None, None, None, None)


def test_identity_of_bound_variants_names_step_and_optimizer():
    import torch

    from bench_core.workflows.validation.state import StartingState
    from bench_core.workflows.validation.correctness import Variant, bind

    def step(model, opt, batch):
        opt.zero_grad()
        model(batch).sum().backward()
        opt.step()

    model = torch.nn.Linear(2, 2)
    state = StartingState.capture(model, torch.optim.SGD(model.parameters(), lr=0.1), [torch.ones(1, 2)])
    loop = bind(Variant(step, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, foreach=False), name="loop"),
                state, torch.nn.Linear(2, 2))
    fast = bind(Variant(step, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, foreach=True), name="fast"),
                state, torch.nn.Linear(2, 2))
    a, b = source_identity(loop), source_identity(fast)
    assert (a["name"], b["name"]) == ("loop", "fast")
    assert a["step"] == b["step"] and a["step"]["name"].endswith(".step")
    assert a["optimizer"]["source_sha256"] != b["optimizer"]["source_sha256"]
    loop()  # the bound step runs on its own model


# -- instance bias: identical code on separately built instances (issue 11) ---------------------------------
def _biased_factory(clock, ms, rng, sd):
    """Each call builds a new instance whose every call takes `ms` times its own persistent bias."""
    def make():
        k = float(np.exp(rng.normal(0, sd)))
        return lambda: clock.advance_ms(ms * k)
    return make


def test_plain_ab_mistakes_two_instances_for_two_programs_and_ab_rounds_does_not():
    from bench_core.workflows.ab import ab_rounds

    rng = np.random.default_rng(7)
    clock = FakeClock()
    mistaken = 0
    for _ in range(10):   # identical code, one fixed instance per side, each with ~3% of its own bias
        a, b = _biased_factory(clock, 2.0, rng, 0.03)(), _biased_factory(clock, 2.0, rng, 0.03)()
        mistaken += ab(a, b, clock=clock, repeats=20, warmup=1).verdict in (FASTER, SLOWER)
    assert mistaken >= 5
    # the same bias, a fresh instance every round: the rounds hold it, so a false call is an alpha-sized chance
    # (one of these 20 draws a -3.9% mean over its 12 rounds, p = 0.0002), not the rule it is above
    wrong = 0
    for seed in range(20):
        r = ab_rounds(_biased_factory(clock, 2.0, rng, 0.03), _biased_factory(clock, 2.0, rng, 0.03),
                      clock=clock, rounds=12, pairs=2, seed=seed)
        wrong += r.verdict not in (UNCHANGED, INCONCLUSIVE)
        assert r.params["rounds_run"] in (12, 24, 36) and f"{r.params['rounds_run']} rounds" in r.reason
    assert wrong <= 1


def test_ab_rounds_detects_a_real_five_percent_through_small_instance_bias():
    from bench_core.workflows.ab import ab_rounds

    rng = np.random.default_rng(8)
    clock = FakeClock()
    r = ab_rounds(_biased_factory(clock, 2.1, rng, 0.005), _biased_factory(clock, 2.0, rng, 0.005), clock=clock)
    assert r.verdict == FASTER and r.ci_low < 1.05 < r.ci_high
    assert len(r.baseline_ms) == 12 * 8 and r.params["rounds"] == 12 and r.params["pairs"] == 8


def test_ab_rounds_names_what_ran_and_refuses_non_factories():
    from bench_core.workflows.ab import ab_rounds

    clock = FakeClock()

    def base_step():
        clock.advance_ms(1.0)

    r = ab_rounds(lambda: base_step, lambda: base_step, clock=clock, rounds=3, pairs=1)
    assert r.identities["baseline"]["name"].endswith("base_step")
    with pytest.raises(ScenarioError, match="factory"):
        ab_rounds(lambda: None, lambda: base_step, clock=clock, rounds=3, pairs=1)
    with pytest.raises(ScenarioError, match="make_candidate must be callable"):
        ab_rounds(lambda: base_step, None)


def test_ab_tables_have_their_headers_over_their_columns_and_say_which_way_speedup_points():
    from bench_core.output.comparison_tables import decisions_table

    clock = FakeClock()
    r = ab(lambda: clock.advance_ms(2), lambda: clock.advance_ms(1), clock=clock, repeats=6, warmup=0)
    lines = r.table().splitlines()
    assert lines[0].split()[:2] == ["side", "callable"] and lines[2].startswith("baseline")
    assert lines[0].index("callable") == lines[2].index(r.identities["baseline"]["name"])   # aligned
    for text in (r.table(), decisions_table([("x", r)])):
        assert "speedup: baseline time / candidate time (>1 = candidate faster)" in text


def test_the_decisions_table_says_why_a_row_is_inconclusive_beside_an_interval_that_excludes_one():
    """#48: the A/B summary showed "inconclusive" beside 1.030 [1.004, 1.060] with no reason; the reason reached only
    the result's own table."""
    from bench_core.deciding.paired import speed_verdict
    from bench_core.output.comparison_tables import decisions_table
    from bench_core.workflows.ab import ABResult

    d = speed_verdict(1.03, 1.004, 1.060, 0.002, 0.01, 0.01)
    r = ABResult(d.verdict, d.reason, d.speedup, d.ci_low, d.ci_high, d.p_value, (1.0,) * 8, (0.97,) * 8)
    same = speed_verdict(1.0, 0.995, 1.005, 0.5, 0.01, 0.01)
    u = ABResult(same.verdict, same.reason, same.speedup, same.ci_low, same.ci_high, same.p_value, (1.0,) * 8,
                 (1.0,) * 8)
    text = " ".join(decisions_table([("pace", r), ("still", u)]).split())
    assert r.verdict == INCONCLUSIVE and u.verdict == UNCHANGED
    assert f"pace: inconclusive: {' '.join(d.reason.split())}" in text
    assert "beyond 1%" in text and "still: unchanged" not in text


def test_a_speedup_without_an_interval_is_shown_as_not_observed():
    from bench_core.workflows.ab import ABResult

    r = ABResult(INCONCLUSIVE, "every round gave the same ratio", 1.25, None, None, None)
    assert r.speedup_text == "1.250x [n/o]" and "1.250x [n/o]" in r.table()


def test_plain_callables_are_checked_against_each_other_when_no_correctness_result_is_given():
    """#28: a candidate returning x*2+1.001 instead of x*2+1 was "111.7x faster", with no word that correctness
    was not checked. Now its output is compared with the baseline's, and a wrong one is rejected."""
    import torch

    clock = FakeClock()
    x = torch.arange(8.0)

    def slow():
        clock.advance_ms(2.0)
        return x * 2 + 1

    def wrong():
        clock.advance_ms(0.1)
        return x * 2 + 1.001

    def right():
        clock.advance_ms(0.1)
        return (x + 0.5) * 2

    res = ab(slow, wrong, clock=clock)
    assert res.verdict == REJECTED and "output differs from the baseline's" in res.reason and "validate" in res.reason
    res = ab(slow, right, clock=clock)
    assert res.verdict == FASTER and "outputs equal within torch's default tolerance" in res.reason
    res = ab(lambda: clock.advance_ms(2), lambda: clock.advance_ms(1), clock=clock)
    assert res.verdict == FASTER and "correctness not checked: the callables return nothing" in res.reason
