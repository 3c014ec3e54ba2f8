"""BenchSession without pytest: counts, gating with confirmation, storage at the end."""
import pytest

from bench_core import Scenario, StorageError
from bench_core.compare import GateConfig
from bench_core.session import BenchSession, SessionConfig
from fakes import FakeClock
from helpers import ENV


def _session(tmp_path, **kw):
    return BenchSession(SessionConfig(**{"results_dir": tmp_path / "res", "baselines_dir": tmp_path / "bl", **kw}), ENV)


def _levels(clock, levels):
    """fn whose calls take levels[i] ms; the last level repeats."""
    state = {"i": 0}

    def fn():
        clock.advance_ms(levels[min(state["i"], len(levels) - 1)])
        state["i"] += 1

    return fn


def test_counts_priority(tmp_path):
    s = _session(tmp_path)
    assert s.counts(None, None) == (3, 20) and s.counts(5, 7) == (5, 7)
    assert _session(tmp_path, quick=True).counts(5, 7) == (1, 5)
    assert _session(tmp_path, quick=True, repeats=9).counts(5, 7) == (1, 9)


def _baseline(tmp_path, runs=3):
    for i in range(runs):
        s = _session(tmp_path, save="main", append=i > 0, repeats=10, warmup=0)
        clock = FakeClock()
        s.run(Scenario("a", ("forward",)), _levels(clock, [2.0 + 0.01 * i]), clock=clock)
        s.finish()


def test_a_transient_slowdown_is_confirmed_away(tmp_path):
    _baseline(tmp_path)
    s = _session(tmp_path, compare="main", repeats=10, warmup=0)
    clock = FakeClock()
    # cold start + 10 slow samples (an episode), then calm again for the confirmation samples
    m, c = s.run(Scenario("a", ("forward",)), _levels(clock, [3.0] * 11 + [2.0]), clock=clock)
    assert c.verdict != "slower" and "not confirmed" in c.reason
    assert m.repeats == 30                      # the kept result holds every sample taken
    assert s.results == [m] and not s.fails(c)


def test_a_persistent_slowdown_fails(tmp_path):
    _baseline(tmp_path)
    s = _session(tmp_path, compare="main", repeats=10, warmup=0)
    clock = FakeClock()
    m, c = s.run(Scenario("a", ("forward",)), _levels(clock, [3.0]), clock=clock)
    assert c.verdict == "slower" and c.reason.startswith("confirmed") and s.fails(c)


def test_no_confirmation_when_disabled(tmp_path):
    _baseline(tmp_path)
    s = _session(tmp_path, compare="main", repeats=10, warmup=0, gate=GateConfig(confirm_repeats=0))
    clock = FakeClock()
    m, c = s.run(Scenario("a", ("forward",)), _levels(clock, [3.0] * 11 + [2.0]), clock=clock)
    assert c.verdict == "slower" and m.repeats == 10


def test_missing_scenarios_are_listed(tmp_path):
    _baseline(tmp_path, runs=1)
    s = _session(tmp_path, compare="main")
    assert s.missing_from_run() == ["a"]


def test_save_refuses_existing_name_before_measuring(tmp_path):
    _baseline(tmp_path, runs=1)
    with pytest.raises(StorageError, match="already exists"):
        _session(tmp_path, save="main")


def test_finish_writes_nothing_for_an_empty_session(tmp_path):
    assert _session(tmp_path).finish() == ([], [])
    assert not (tmp_path / "res").exists()


def test_gate_decisions_are_kept_in_the_session_file(tmp_path):
    import json

    _baseline(tmp_path)
    s = _session(tmp_path, compare="main", repeats=10, warmup=0)
    clock = FakeClock()
    s.run(Scenario("a", ("forward",)), _levels(clock, [3.0]), clock=clock)
    (line,), failures = s.finish()
    assert failures == []
    doc = json.loads(open(line.removeprefix("results written to ")).read())
    assert doc["comparisons"][0]["verdict"] == "slower" and "results written" in line
    assert doc["comparisons"][0]["adjustment"] == "none (one scenario)"


def test_every_write_is_attempted_and_every_failure_names_its_file(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("")              # the results folder cannot be made, even by root
    s = _session(tmp_path, save="main", repeats=3, warmup=0, results_dir=blocked / "res")
    clock = FakeClock()
    s.run(Scenario("a", ("forward",)), _levels(clock, [2.0]), clock=clock)
    lines, failures = s.finish()
    assert any(str(blocked / "res") in f and "could not be written" in f for f in failures), failures
    assert any("baseline 'main' saved" in line for line in lines)   # the baseline write still happened


def test_an_incomplete_session_is_not_stored_as_a_baseline_run(tmp_path):
    s = _session(tmp_path, save="main", repeats=3, warmup=0)
    clock = FakeClock()
    s.run(Scenario("a", ("forward",)), _levels(clock, [2.0]), clock=clock)
    lines, failures = s.finish(incomplete="the session was interrupted")
    assert any("NOT saved: the session was interrupted" in line for line in lines) and not failures
    assert not (tmp_path / "bl" / "main.json").exists()
    s = _session(tmp_path, save="main", repeats=3, warmup=0, save_incomplete=True)
    s.run(Scenario("a", ("forward",)), _levels(clock, [2.0]), clock=clock)
    s.finish(incomplete="1 test(s) failed")
    assert (tmp_path / "bl" / "main.json").exists()
