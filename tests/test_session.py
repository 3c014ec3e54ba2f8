"""BenchSession without pytest: counts, gating with replication in fresh processes, storage at the end."""
import re
from dataclasses import replace

import pytest

from bench_core import Scenario, StorageError
from bench_core.deciding.comparison import GateConfig
from bench_core.session import BenchSession, SessionConfig
from bench_core.workflows.measured import counts
from fakes import FakeClock
from helpers import ENV, FreshProcesses


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
    config = _session(tmp_path).config
    assert counts(config, None, None) == (3, 20) and counts(config, 5, 7) == (5, 7)
    assert counts(_session(tmp_path, quick=True).config, 5, 7) == (1, 5)
    assert counts(_session(tmp_path, quick=True, repeats=9).config, 5, 7) == (1, 9)


def _baseline(tmp_path, runs=3):
    for i in range(runs):
        s = _session(tmp_path, save="main", append=i > 0, repeats=10, warmup=0)
        clock = FakeClock()
        s.run(Scenario("a", ("forward",)), _levels(clock, [2.0 + 0.01 * i]), clock=clock)
        s.finish()


def _replicas(levels, calls=None):
    """A stand-in for fresh processes: each call is one new process's measurement at the next level."""
    from bench_core import measure

    calls = [] if calls is None else calls

    def replicate(warmup, repeats):
        clock = FakeClock()
        level = levels[min(len(calls), len(levels) - 1)]
        calls.append((warmup, repeats))
        return measure(_levels(clock, [level]), scenario=Scenario("a", ("forward",)).with_metadata(device="cpu"),
                       warmup=warmup, repeats=repeats, clock=clock, environment=ENV)
    return replicate


def test_a_slow_first_process_is_replicated_away(tmp_path):
    _baseline(tmp_path, runs=5)
    s = _session(tmp_path, compare="main", repeats=10, warmup=0)
    clock = FakeClock()
    calls = []
    # this process is slow; fresh processes are not
    m, c = s.run(Scenario("a", ("forward",)), _levels(clock, [3.0]), clock=clock,
                 replica=FreshProcesses(_replicas([2.02], calls)))
    assert c.verdict != "slower" and not s.fails(c)
    assert c.candidate_runs == 1 + len(calls) >= 3 and calls[0] == (0, 10)   # the session's own counts
    assert "2 fresh process(es)" in c.method or "4 fresh process(es)" in c.method
    assert s.results == (m,) and m.repeats == 10      # the kept result is this process's own
    assert [r.summary.median for r in s.replicas["a"]] == [2.02] * len(calls)


def test_a_slowdown_every_process_sees_fails(tmp_path):
    _baseline(tmp_path, runs=5)
    s = _session(tmp_path, compare="main", repeats=10, warmup=0)
    clock = FakeClock()
    m, c = s.run(Scenario("a", ("forward",)), _levels(clock, [3.0]), clock=clock, replica=FreshProcesses(_replicas([3.0])))
    assert c.verdict == "slower" and c.candidate_runs == 3 and s.fails(c)
    # the baseline was recorded in one sitting, seconds apart: the report says it may be too uniform
    text = dict(s.summary_sections())["bench_core comparison with baseline 'main'"]
    assert "warning: baseline 'main': its 5 runs were recorded within 0 min" in text
    assert "runs b/c (b spread)" in text and "5/3 (" in text


def test_without_fresh_processes_one_run_never_says_slower_and_says_why(tmp_path):
    from bench_core import ScenarioError

    _baseline(tmp_path, runs=5)
    s = _session(tmp_path, compare="main", repeats=10, warmup=0)
    clock = FakeClock()
    _, c = s.run(Scenario("a", ("forward",)), _levels(clock, [3.0]), clock=clock)
    assert c.verdict == "inconclusive" and "one slow process looks the same" in c.reason and c.more_runs == 3

    def broken(warmup, repeats):
        raise ScenarioError("a", "worker processes cannot be given ['tmp_path']")
    clock = FakeClock()
    _, c = s.run(Scenario("a", ("forward",)), _levels(clock, [3.0]), clock=clock, replica=FreshProcesses(broken))
    assert c.verdict == "inconclusive" and "replication stopped: worker processes cannot be given" in c.reason
    # a single-look gate (min_runs=1) decides on this process alone, as a dedicated runner may want
    one = _session(tmp_path, compare="main", repeats=10, warmup=0, gate=GateConfig(min_runs=1, max_runs=1))
    clock = FakeClock()
    _, c = one.run(Scenario("a", ("forward",)), _levels(clock, [3.0]), clock=clock)
    assert c.verdict == "slower" and c.candidate_runs == 1


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
    s.run(Scenario("a", ("forward",)), _levels(clock, [3.0]), clock=clock, replica=FreshProcesses(_replicas([3.0])))
    (line, *advice), failures = s.finish()
    assert failures == [] and advice[0].startswith("next: where the time went")   # the gate failed "a"
    doc = json.loads(open(line.removeprefix("results written to ")).read())
    assert doc["comparisons"][0]["verdict"] == "slower" and "results written" in line
    assert doc["comparisons"][0]["adjustment"].startswith("none (one scenario); alpha split over 3 looks")
    assert [r["summary"]["median"] for r in doc["replicas"]["a"]] == [3.0, 3.0]   # raw runs kept


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


def test_a_machine_with_slow_processes_is_gated_on_two_levels_and_stored(tmp_path):
    import json
    import re

    # 10 baseline runs of three scenarios; runs 2 and 7 were slow processes (+40% in every scenario)
    for i in range(10):
        s = _session(tmp_path, save="main", append=i > 0, repeats=10, warmup=0)
        for name, level in (("a", 2.0), ("b", 5.0), ("c", 9.0)):
            clock = FakeClock()
            jitter = 1 + 0.01 * ((7 * i) % 5 - 2)
            s.run(Scenario(name, ("forward",)), _levels(clock, [level * jitter * (1.4 if i in (2, 7) else 1.0)]),
                  clock=clock)
        s.finish()
    s = _session(tmp_path, compare="main", repeats=10, warmup=0)
    assert s.prior.slow is not None and s.prior.slow.share == pytest.approx(0.2, abs=0.02)
    clock = FakeClock()
    _, c = s.run(Scenario("a", ("forward",)), _levels(clock, [2.5]), clock=clock, replica=FreshProcesses(_replicas([2.5])))
    assert c.verdict == "slower" and c.ratio == pytest.approx(1.25, rel=0.02)
    assert c.slow_runs[0] == pytest.approx(2.0, abs=0.1)      # the baseline's two slow runs, told apart
    text = " ".join(" ".join(body for _, body in s.summary_sections()).split())     # unwrapped
    assert re.search(r"20% of runs \+4\d% slow, fitted from 30 runs of 3 scenarios", text)   # the +40%, with jitter
    (line, *_), failures = s.finish()
    assert failures == []      # the record, with its posterior's figures, reaches the file
    stored = json.loads(open(line.removeprefix("results written to ")).read())["comparisons"][0]
    assert stored["verdict"] == "slower" and stored["df"] is None
    assert stored["slow_share"] == pytest.approx(0.2, abs=0.02)


def test_a_run_has_one_mode_and_what_cannot_run_together_is_refused_by_the_config_itself(tmp_path):
    from bench_core.core.modes import GATE, PLAIN, REPLICA, SAVE, SERVE, SIDE_BY_SIDE
    from bench_core.workflows.side_by_side.compare import AgainstConfig

    against = AgainstConfig(rev="HEAD~1")
    assert SessionConfig().mode == PLAIN and SessionConfig(save="b").mode == SAVE
    assert SessionConfig(compare="b", save="c").mode == GATE and SessionConfig(against=against).mode == SIDE_BY_SIDE
    assert SessionConfig(serve=(3, 4)).mode == SERVE and SessionConfig(replica=tmp_path / "r.json").mode == REPLICA
    assert SessionConfig(save="b").gated and not SessionConfig(replica=tmp_path / "r.json").gated
    # a server or fresh process whose project's ini addopts say --bench-compare is still that process
    assert SessionConfig(serve=(3, 4), compare="b").mode == SERVE and SessionConfig(replica=tmp_path, save="b").mode \
        == REPLICA
    for kwargs, words in (({"against": against, "compare": "b"}, "does not mix with a stored baseline"),
                          ({"concurrent": "worker gw0", "compare": "b"}, "run the benchmarks without -n"),
                          ({"cache": "cold"}, "--bench-cache is a GPU timing mode"),
                          ({"device": "cuda", "graph": True, "against": against}, "side by side (--bench-against)")):
        with pytest.raises(ValueError, match=re.escape(words)):
            SessionConfig(**kwargs)
    # and a config changed later is checked again: under xdist the plugin marks a gated run concurrent
    with pytest.raises(ValueError, match="without -n"):
        replace(SessionConfig(save="b"), concurrent="worker gw1")


def test_under_confirm_only_a_change_the_gate_would_call_costs_fresh_processes(tmp_path):
    _baseline(tmp_path, runs=5)
    confirm = GateConfig(chase="confirm")
    s = _session(tmp_path, compare="main", repeats=10, warmup=0, gate=confirm)
    clock, calls = FakeClock(), []
    # this process reads 1.5x, past the threshold and changed-looking over the family: fresh processes look again
    m, c = s.run(Scenario("a", ("forward",)), _levels(clock, [3.0]), clock=clock, replica=FreshProcesses(_replicas([2.02], calls)))
    assert len(calls) >= 2 and c.candidate_runs == 1 + len(calls) and c.verdict != "slower"
    clock, calls = FakeClock(), []
    s = _session(tmp_path, compare="main", repeats=10, warmup=0, gate=confirm)
    # +2%: a possible change the default would chase, never one the gate would call: no process spent
    m, c = s.run(Scenario("a", ("forward",)), _levels(clock, [2.06]), clock=clock, replica=FreshProcesses(_replicas([2.06], calls)))
    assert calls == [] and c.candidate_runs == 1 and c.verdict == "inconclusive"
