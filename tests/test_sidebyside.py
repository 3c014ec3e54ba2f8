"""Side-by-side rounds with a fake clock: exact arithmetic, instance bias inside the interval, failures by side."""
import math
import os

import numpy as np
import pytest

from bench_core.timing.backends import CpuBackend
from bench_core.deciding.comparison import GateConfig
from bench_core.deciding.gate import decide_family
from bench_core.deciding.verdicts import FASTER, INCOMPARABLE, INCONCLUSIVE, SLOWER, UNCHANGED
from bench_core.core.errors import ScenarioError
from bench_core.timing.sampling import Sampler
from bench_core.core.scenario import Scenario
from bench_core.deciding.rounds import estimate_rounds
from bench_core.timing.protocol import Instance, SideError, run_rounds
from fakes import FakeClock


def builders(clock, base_ms, cand_ms, bias=None, log=None):
    """Each build is a fresh instance whose calls take its side's time times this instance's own bias."""
    bias = bias or (lambda side, r: 1.0)

    def make(side, ms):
        def build(r):
            k = bias(side, r)
            if log is not None:
                log.append((side, r))
            return Instance(lambda: clock.advance_ms(ms * k))
        return build
    return {"baseline": make("baseline", base_ms), "candidate": make("candidate", cand_ms)}


def test_a_known_ratio_is_estimated_exactly_and_samples_are_per_round():
    clock = FakeClock()
    res = run_rounds(builders(clock, 2.0, 2.2), Sampler("s", CpuBackend(), clock), rounds=4, pairs=3, warmup=1)
    assert len(res.baseline) == len(res.candidate) == 4
    assert all(len(r) == 3 for r in res.baseline)
    assert {x.host_ms for r in res.baseline for x in r} == {2.0}
    assert res.round_log_ratios == pytest.approx([math.log(1.1)] * 4)
    assert len(res.cold["baseline"]) == 4   # one first call per round, kept apart


def test_every_round_builds_both_sides_anew():
    clock, log = FakeClock(), []
    run_rounds(builders(clock, 1.0, 1.0, log=log), Sampler("s", CpuBackend(), clock), rounds=5, pairs=2)
    assert sorted(log) == sorted((s, r) for s in ("baseline", "candidate") for r in range(5))


def test_order_within_pairs_is_random_but_seeded():
    def order(seed):
        clock, seen = FakeClock(), []
        b = {s: (lambda s: lambda r: Instance(lambda: seen.append(s)))(s) for s in ("baseline", "candidate")}
        run_rounds(b, Sampler("s", CpuBackend(), clock), rounds=3, pairs=6, warmup=0, seed=seed)
        return seen
    first = order(1)
    assert first == order(1) and first != order(2)
    firsts = first[::2]
    assert 0 < firsts.count("baseline") < len(firsts)   # neither side always goes first


def biased_run(seed, sd, cand_ms, rounds, pairs, base_ms=5.0):
    """Rounds whose instances each carry a persistent bias, log-normal with this sd; returns (rounds, biases)."""
    rng = np.random.default_rng(seed)
    biases = {(s, r): float(np.exp(rng.normal(0, sd))) for s in ("baseline", "candidate") for r in range(rounds)}
    clock = FakeClock()
    res = run_rounds(builders(clock, base_ms, cand_ms, bias=lambda s, r: biases[(s, r)]),
                     Sampler("s", CpuBackend(), clock), rounds=rounds, pairs=pairs)
    return res, biases


def decide(res, threshold=0.02, **kw):
    est = estimate_rounds("s", res, threshold, timer="host", **kw)
    return decide_family([est], GateConfig(threshold=threshold))[0]


def test_instance_bias_lands_in_the_interval_not_in_the_answer():
    # identical code; each instance carries its own persistent bias of a few percent, as measured on this machine
    res, biases = biased_run(3, 0.04, 5.0, rounds=12, pairs=4)
    c = decide(res)
    assert c.verdict not in (SLOWER, FASTER)
    assert c.ci_low < 1.0 < c.ci_high
    spread = np.std([math.log(biases[("candidate", r)] / biases[("baseline", r)]) for r in range(12)], ddof=1)
    assert c.se == pytest.approx(spread / math.sqrt(12), rel=1e-6)   # the round spread, not the pair spread (0)
    assert c.df == 11 and c.baseline_runs == 12


def test_a_real_slowdown_through_the_bias_is_slower_and_a_speedup_faster():
    for cand, verdict in ((5.5, SLOWER), (4.5, FASTER)):
        c = decide(biased_run(4, 0.01, cand, rounds=10, pairs=4)[0])
        assert c.verdict == verdict, c.reason
        assert c.ci_low < cand / 5.0 < c.ci_high


def test_identical_quiet_sides_are_unchanged_and_a_flat_clock_is_inconclusive():
    assert decide(biased_run(5, 0.002, 5.0, rounds=10, pairs=2)[0]).verdict == UNCHANGED
    clock = FakeClock()
    flat = run_rounds(builders(clock, 5.0, 5.0), Sampler("s", CpuBackend(), clock), rounds=5, pairs=2)
    c = decide(flat)
    assert c.verdict == INCONCLUSIVE and "same ratio" in c.reason


def test_zero_time_samples_and_different_scenarios_are_not_decided():
    clock = FakeClock()
    res = run_rounds(builders(clock, 0.0, 1.0), Sampler("s", CpuBackend(), clock), rounds=3, pairs=2)
    assert decide(res).verdict == INCONCLUSIVE
    diff = {"metadata.dtype": ("float32", "bfloat16")}
    c = decide(res, differences=diff)
    assert c.verdict == INCOMPARABLE and "dtype" in c.reason


@pytest.mark.parametrize("failing", ["baseline", "candidate"])
def test_a_failure_names_its_side(failing):
    clock = FakeClock()
    b = builders(clock, 1.0, 1.0)

    def boom():
        raise RuntimeError("kaput")

    good = b[failing]
    b[failing] = lambda r: Instance(boom) if r == 1 else good(r)
    with pytest.raises(SideError, match="kaput") as info:
        run_rounds(b, Sampler("s", CpuBackend(), clock), rounds=3, pairs=2)
    assert info.value.side == failing and isinstance(info.value, ScenarioError)


def test_the_scenario_record_of_each_side_is_kept():
    clock = FakeClock()
    sc = {"baseline": Scenario("s", ("forward",), {"dtype": "float32"}),
          "candidate": Scenario("s", ("forward",), {"dtype": "bfloat16"})}
    b = {s: (lambda s: lambda r: Instance(lambda: clock.advance_ms(1.0), scenario=sc[s]))(s) for s in sc}
    res = run_rounds(b, Sampler("s", CpuBackend(), clock), rounds=3, pairs=1)
    assert res.scenarios == sc


def test_too_few_rounds_are_refused():
    with pytest.raises(ValueError, match="at least 3 rounds"):
        run_rounds(builders(FakeClock(), 1, 1), Sampler("s", CpuBackend(), FakeClock()), rounds=2, pairs=3)


def test_on_a_gpu_both_sides_are_timed_by_events_one_at_a_time():
    from bench_core.timing.backends import CudaBackend
    from fakes import FakeGPU

    clock = FakeClock()
    gpu = FakeGPU(clock)
    running = []

    def side(ms):
        def build(r):
            def step():
                running.append(gpu.free_at <= clock.now)   # nothing of the other side still on the device
                gpu.launch(work_ms=ms, launch_ms=0.1)
            return Instance(step)
        return build

    res = run_rounds({"baseline": side(2.0), "candidate": side(3.0)}, Sampler("s", CudaBackend(gpu), clock),
                     rounds=3, pairs=2)
    assert all(running)                                       # every sample synchronized before the next
    assert all(x.gpu_ms is not None for r in res.candidate for x in r)
    assert res.round_log_ratios == pytest.approx([math.log(3.1 / 2.1)] * 3)   # GPU time is the primary figure


def _worker_test(tmp_path, body):
    """A side's server for a test file in `tmp_path` whose test_w runs `body`: its init and the item it serves."""
    import sys

    from bench_core.shells.replay import server_command
    from bench_core.workflows.worker import server_env

    f = tmp_path / "test_w.py"
    f.write_text("import os, time\n\ndef test_w(bench):\n    " + body + "\n")
    argv = server_command(sys.executable, f, tmp_path, None, device="cpu", quick=True, threads=1, timeout_s=0)
    return ({"side": "baseline", "tree": str(tmp_path), "python": sys.executable, "file": str(f),
             "roots": [str(tmp_path)], "threads": 1, "device": "cpu", "argv": argv, "env": server_env([str(tmp_path)])},
            {"scenario": "w", "file": str(f), "function": "test_w", "param_id": None})


@pytest.mark.parametrize("body, needle", [
    ("time.sleep(60)", "the baseline's process \\(pytest test_w.py in .*\\) did not answer in time"),
    # the test runs in a child of the server, which says how it ended
    ("os._exit(3)", "test_w.py::test_w: the test's first run, in a child of this side's process, ended with exit "
                    "code 3")])
def test_a_server_that_hangs_or_crashes_is_named_and_ended(tmp_path, body, needle):
    from bench_core.workflows.worker import Worker

    init, spec = _worker_test(tmp_path, body)
    (tmp_path / "tmp").mkdir()
    init["env"]["TMPDIR"] = str(tmp_path / "tmp")
    w = Worker(init, timeout_s=2)
    w.assign(spec)
    with pytest.raises(ScenarioError, match=needle):
        w.wait_ready()
    if "exit code" in needle:   # the crash was its test's child's: the server is whole, and ends when it is closed
        assert w.proc.poll() is None
        w.close()
    assert w.proc.poll() is not None          # ended, not left behind
    assert list((tmp_path / "tmp").iterdir()) == []   # nor a file of its own, ended in its first run


def test_a_server_asked_to_quit_runs_its_exit_handlers_and_skips_the_interpreters_teardown(tmp_path):
    """#27: taking the interpreter down object by object was 0.75 s of a CNN server's 0.92 s end, while the parent
    waited; exit handlers (temporary folders, logging, the user's own) still run."""
    from bench_core.workflows.worker import Worker

    init, spec = _worker_test(tmp_path, 'from bench_core import Scenario\n    '
                                        'bench.run(Scenario("w", ("compute",)), lambda: None)')
    with (tmp_path / "test_w.py").open("a") as f:
        f.write("\nimport atexit\natexit.register(lambda: open('exit_handler_ran', 'w').close())\n"
                "class Torn:\n    def __del__(self, mark=os.path.abspath('torn_down'), open=open):\n"
                "        open(mark, 'w').close()\nkept = Torn()\n")
    with Worker(init, timeout_s=60) as w:
        w.assign(spec)
        w.wait_ready()
        w.done()
        w.ask_to_quit()
        status = w.proc.wait(timeout=60)
    assert status == 0 and (tmp_path / "exit_handler_ran").exists(), w.log_tail()
    assert not (tmp_path / "torn_down").exists()   # the module's objects were never taken down one by one


def test_a_server_serves_each_round_from_a_freshly_forked_child_that_ends_with_its_round(tmp_path):
    """Each round in a child of its own, ended with its round; the profiler passes in children of their own. The
    test's first run (in a child too) calls the step once, which imports a module lazily, as an optimizer's first
    use does (most of a second each round, built afresh in every child); the server then imports the same modules,
    never running the step, so no round's child imports it again, as a fresh process has it by the time it
    measures."""
    from bench_core.workflows.worker import Worker

    (tmp_path / "lazy_mod.py").write_text(f"import os\nwith open({str(tmp_path / 'imports.log')!r}, 'a') as f:\n"
                                          f"    f.write(str(os.getpid()) + '\\n')\n")
    init, spec = _worker_test(tmp_path, "from bench_core import Scenario\n    def step():\n        import lazy_mod\n"
                                        "        time.sleep(0.002)\n    bench.run(Scenario('w', ('compute',)), step)")
    children = []
    with Worker(init) as w:
        w.assign(spec)
        w.wait_ready()
        assert w.ran["forked_rounds"] and str(tmp_path / "test_w.py") in w.ran["files"]
        cpu = max(os.sched_getaffinity(0))
        for held in ((cpu,), None):
            assert w.round(held).name == "w"
            children.append(w.child)
            # held: to the round's CPUs; else where its server runs
            assert os.sched_getaffinity(w.child) == (set(held) if held else os.sched_getaffinity(w.proc.pid))
            s = w.sample()
            assert 1.5 < s.host_ms < 50 and s.gpu_ms is None
            w.end_round()
            assert not os.path.exists(f"/proc/{children[-1]}/cmdline")   # the round's child has ended
        assert len(set(children)) == 2 and w.proc.pid not in children
        profiled = []
        for _ in range(2):   # a profiler pass in a child of its own: the server, which later items fork, is left alone
            w.start_profile()
            passes = w.profiled()
            assert len(passes) == 3 and all(isinstance(p, dict) for p in passes)
            profiled.append(w.profiled_in)
        assert len(set(profiled)) == 2 and not set(profiled) & {None, w.proc.pid, *children}
        w.done()   # answered once the server has waited for the last profiling child
        assert not any(os.path.exists(f"/proc/{pid}/cmdline") for pid in profiled)
    assert w.proc.poll() is not None
    importers = [int(line) for line in (tmp_path / "imports.log").read_text().split()]
    assert len(importers) == 2 and importers[1] == w.proc.pid != importers[0]   # the first run's child, the server
    assert not set(importers) & {*children, *profiled}


def test_a_round_child_builds_beside_the_other_and_samples_held_with_no_collection_of_its_servers_objects(tmp_path):
    """#27: held to one CPU from its start, the two sides' children built their instances by turns; and a round's
    child sampled with the collector on, over everything its server had made (7 ms in one sample here)."""
    from bench_core.timing.sampling import build_cpus
    from bench_core.workflows.worker import Worker

    log = tmp_path / "log.txt"
    init, spec = _worker_test(tmp_path, f'import gc\n    from bench_core import Scenario\n    '
                                        f'def note(what):\n        with open({str(log)!r}, "a") as f:\n'
                                        f'            f.write(f"{{what}} {{sorted(os.sched_getaffinity(0))}} '
                                        f'{{gc.isenabled()}} {{gc.get_freeze_count() > 0}}\\n")\n    '
                                        f'note("build")\n    bench.run(Scenario("w", ("compute",)), '
                                        f'lambda: note("step"))')
    cpu = max(os.sched_getaffinity(0))
    with Worker(init) as w:
        w.assign(spec)
        w.wait_ready()
        log.write_text("")   # the server's own first run wrote here too
        w.round((cpu,))
        cold, s = w.first_then_sample(0.0)   # the round's first call and a sample, in one request
        w.sample(ahead=True)
        w.end_round()
        w.done()
    lines = log.read_text().splitlines()
    wide = sorted(build_cpus((cpu,)))
    assert lines[0] == f"build {wide} True True"   # built where the other side's child may build too
    # the first call, the sample, the call ahead and its sample: held, the collector off, the server's objects frozen
    assert lines[1:] == [f"step {[cpu]} False True"] * 4
    assert cold.host_ms > 0 and s.host_ms > 0


def test_a_round_child_ends_with_its_server_even_one_killed_outright(tmp_path):
    import signal
    import time

    from bench_core.workflows.worker import Worker

    init, spec = _worker_test(tmp_path, 'from bench_core import Scenario\n    '
                                        'bench.run(Scenario("w", ("compute",)), lambda: None)')
    with Worker(init) as w:
        w.assign(spec)
        w.wait_ready()
        w.round()
        child = w.child
        os.kill(w.proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{child}/cmdline") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{child}/cmdline")


def test_a_server_whose_code_prints_still_answers_and_its_prints_go_to_its_log(tmp_path):
    """A model that reports its size on stdout (and a lot of it: more than a pipe holds) must not break the
    channel; what it printed is kept, and named when the server fails."""
    from bench_core.workflows.worker import Worker

    init, spec = _worker_test(tmp_path, 'from bench_core import Scenario\n    '
                                        'print("number of parameters: 0.41M\\n" * 20000, flush=True)\n    '
                                        'bench.run(Scenario("w", ("compute",)), lambda: None)')
    with Worker(init) as w:
        w.assign(spec)
        w.wait_ready()
        assert w.round().name == "w" and w.sample().host_ms >= 0
        w.end_round()
        assert "number of parameters: 0.41M" in w.log_tail(40)


def test_a_pool_serves_one_scenario_after_another_and_ends_a_server_that_failed(tmp_path):
    from bench_core.workflows.worker import WorkerPool

    init, spec_w = _worker_test(tmp_path, 'from bench_core import Scenario\n    '
                                          'bench.run(Scenario("w", ("compute",)), lambda: time.sleep(0.001))')
    with (tmp_path / "test_w.py").open("a") as f:
        f.write('\ndef test_v(bench):\n    from bench_core import Scenario\n'
                '    bench.run(Scenario("v", ("compute",)), lambda: None)\n')
    spec_v = {**spec_w, "scenario": "v", "function": "test_v"}
    pool = WorkerPool(timeout_s=60)
    try:
        w = pool.get("baseline", 0, init, spec_w)
        w.wait_ready()
        assert w.round().name == "w" and w.sample().host_ms >= 1.0
        w.end_round()
        w.done()
        pool.release(w, True)
        again = pool.get("baseline", 0, init, spec_v)       # the same process, now serving the next scenario
        again.wait_ready()
        assert again is w and again.round().name == "v" and pool.pids() == [w.proc.pid]
        pool.release(again, False)                           # something went wrong in its pair: ended
        assert w.proc.poll() is not None and pool.pids() == []
        fresh = pool.get("baseline", 0, init, spec_v)        # the slot starts afresh
        assert fresh is not w and fresh.alive
    finally:
        pool.close()
    assert pool.pids() == [] and fresh.proc.poll() is not None and not os.path.exists(f"/proc/{fresh.proc.pid}/cmdline")


class _FakeServer:
    """A side's server as the parent sees it: asked for a round (or its end), then waited for; `log` keeps the
    order of both servers' events."""

    def __init__(self, side, ms, fail_at=None, log=None, samples=None, requests=None, steps=None):
        self.side, self.ms, self.fail_at, self.builds, self.closed, self.ends = side, ms, fail_at, 0, False, 0
        self.log = log if log is not None else []
        self.steps = steps if steps is not None else []   # both servers' item steps in order: (step, side)
        self.samples = samples   # both servers' samples in order: (side, ahead)
        self.asked = []   # per sample: whether an untimed call of the step was asked for ahead of it
        self.cpus = []    # per round: the CPUs its process was to be held to
        self.requests = requests if requests is not None else []   # both servers' requests in order: (side, kind)

    def start_item(self):
        self.steps.append(("start_item", self.side))

    def reach(self):
        self.steps.append(("reach", self.side))

    def wait_ready(self):
        self.steps.append(("wait_ready", self.side))

    def start_round(self, cpus=None):
        self.log.append(("ask", self.side))
        self.cpus.append(cpus)

    def built(self):
        self.log.append(("built", self.side))
        self.builds += 1
        if self.builds == self.fail_at:
            raise ScenarioError("s", "broke on its build")

    def sample(self, ahead=False, request=True):
        from bench_core.timing.sampling import Sample
        if request:
            self.requests.append((self.side, "sample"))
        self.asked.append(ahead)
        if self.samples is not None:
            self.samples.append((self.side, ahead))
        return Sample(self.ms, None)

    def first_then_sample(self, warm_ms, ahead=False):
        self.requests.append((self.side, "first"))
        cold = self.sample(False, request=False)
        if warm_ms > self.ms:
            self.warm(warm_ms - self.ms)
        return cold, self.sample(ahead, request=False)

    def warm(self, ms):
        self.asked.append(f"warm {ms:g}")

    def start_end(self):
        pass

    def ended(self):
        self.ends += 1

    def close(self):
        self.closed = True


def test_rounds_joined_from_pairs_of_processes_refuse_a_unit_count_that_is_not_one_per_round():
    from bench_core.timing.protocol import Rounds, joined

    clock = FakeClock()
    part = run_rounds(builders(clock, 2.0, 3.0), Sampler("s", CpuBackend(), clock), rounds=2, pairs=1, min_rounds=1)
    both = joined([part, part])
    assert both.units == (0, 0, 1, 1) and both.to_dict()["units"] == [0, 0, 1, 1]
    assert "units" not in part.to_dict()
    with pytest.raises(ValueError, match="3 units for 2 rounds"):
        Rounds(part.baseline, part.candidate, units=(0, 1, 2))


def test_server_pairs_go_back_to_the_pool_whole_or_are_ended_when_their_pair_failed():
    from bench_core.timing.protocol import run_processes

    made, released, log, steps = {}, [], [], []

    def spawn(side, ms, fail_at=None):
        def start(k):
            made[(side, k)] = _FakeServer(side, ms, fail_at if k == 1 else None, log, steps=steps)
            return made[(side, k)]
        return start
    res = run_processes({"baseline": spawn("baseline", 2.0), "candidate": spawn("candidate", 3.0)},
                        Sampler("s", CpuBackend(), FakeClock()), processes=3, rounds=2, pairs=2,
                        release=lambda side, k, w, ok: released.append((side, k, ok)))
    # one Rounds, each pair of processes its own unit of evidence
    assert res.units == (0, 0, 1, 1, 2, 2) and res.unit_log_ratios == pytest.approx([math.log(1.5)] * 3)
    assert sorted(released) == sorted((s, k, True) for k in range(3) for s in ("baseline", "candidate"))
    assert all(w.ends == w.builds == 2 for w in made.values())    # every round's instance ended with its round
    # both servers are asked for a round before either is waited for: their children build side by side
    assert all([e for e, _ in log[i:i + 4]] == ["ask", "ask", "built", "built"] for i in range(0, len(log), 4))
    # each step of a pair's item for both servers before the next: the tests run side by side, the warming apart
    assert [e for e, _ in steps] == (["start_item"] * 2 + ["reach"] * 2 + ["wait_ready"] * 2) * 3
    released.clear()
    with pytest.raises(SideError, match="broke on its build"):
        run_processes({"baseline": spawn("baseline", 2.0, fail_at=1), "candidate": spawn("candidate", 3.0)},
                      Sampler("s", CpuBackend(), FakeClock()), processes=3, rounds=1, pairs=1,
                      release=lambda side, k, w, ok: released.append((side, k, ok)))
    assert sorted(released) == [("baseline", 0, True), ("baseline", 1, False), ("candidate", 0, True),
                                ("candidate", 1, False)]
    # without a pool every server is ended after its pair
    run_processes({"baseline": spawn("baseline", 2.0), "candidate": spawn("candidate", 2.0)},
                  Sampler("s", CpuBackend(), FakeClock()), processes=3, rounds=1, pairs=1)
    assert all(w.closed for w in made.values())


def test_later_looks_run_only_while_go_on_asks_for_them():
    clock, seen = FakeClock(), []

    def go_on(res):
        seen.append(len(res.baseline))
        return len(seen) == 1
    res = run_rounds(builders(clock, 1.0, 1.1), Sampler("s", CpuBackend(), clock), rounds=3, pairs=2,
                     extend_to=(6, 9), go_on=go_on)
    assert seen == [3, 6] and len(res.baseline) == len(res.candidate) == len(res.cold["candidate"]) == 6
    for bad in ((3,), (9, 6)):
        with pytest.raises(ValueError, match="later looks must grow past 3 rounds"):
            run_rounds(builders(clock, 1.0, 1.0), Sampler("s", CpuBackend(), clock), rounds=3, pairs=2, extend_to=bad)


def against_session(rounds, max_rounds):
    from types import SimpleNamespace

    from bench_core.session import BenchSession, SessionConfig
    from bench_core.workflows.side_by_side.compare import AgainstConfig

    s = BenchSession(SessionConfig(results_dir=None, against=AgainstConfig("HEAD", rounds=rounds, pairs=2,
                                                                           max_rounds=max_rounds)), {})
    s.revision = SimpleNamespace(revision=SimpleNamespace(commit="0123456789abcdef"))   # extracted elsewhere
    s.family_size = 1
    return s


def sequential(seed, cand_ms, rounds=4, max_rounds=12, sd=0.03):
    """One --bench-against scenario through the session: every instance carries a log-normal bias."""
    rng = np.random.default_rng(seed)
    biases = {(s, r): float(np.exp(rng.normal(0, sd))) for s in ("baseline", "candidate") for r in range(max_rounds)}
    clock = FakeClock()
    b = builders(clock, 5.0, cand_ms, bias=lambda s, r: biases[(s, r)])
    s = against_session(rounds, max_rounds)
    m, c = s.run_against(Scenario("s", ("compute",)), b["candidate"](0), b["candidate"], b["baseline"], clock=clock)
    return c, s.side_by_side[0].to_dict()


def test_a_possible_change_runs_on_to_later_looks_and_is_decided_there():
    c, rec = sequential(seed=11, cand_ms=5.4)     # +8% through a 3% instance bias
    n = len(rec["rounds"]["samples_host_gpu_ms"]["baseline"])
    assert n in (8, 12) and c.baseline_runs == n
    assert c.verdict == SLOWER and c.looks == 3 and "alpha split over 3 looks (at 4, 8, 12 rounds)" in c.adjustment
    assert "12 at most for a possible change (looks at 4, 8, 12)" in c.method   # the rounds it ran: its own row
    # the same rounds with the later looks turned off: the first look alone leaves it undecided
    one, rec1 = sequential(seed=11, cand_ms=5.4, max_rounds=4)
    assert len(rec1["rounds"]["samples_host_gpu_ms"]["baseline"]) == 4 and one.verdict == INCONCLUSIVE
    assert one.looks == 1 and "looks" not in one.adjustment


def test_side_by_side_chases_a_slowdown_only_while_one_past_half_its_threshold_looks_likely():
    """#27: a pair of processes keeps a bias of about 1%, so a memory-bound A/A looked slower than 1.0 at p < 0.2 in
    10 of 24 sessions, and each ran on to 24 or 36 rounds to end "unchanged"."""
    import math
    from types import SimpleNamespace

    from scipy import stats

    from bench_core.deciding.sequential import possible_change

    def undecided(ratio, se=0.006, df=11):
        p = float(stats.t.sf(math.log(ratio) / 0.006, df))
        return SimpleNamespace(verdict=INCONCLUSIVE, unusable=False, ratio=ratio, p_value=p, se=se, df=df,
                               slow_share=None, candidate_runs=12)
    biased = undecided(1.012)                         # slower than 1.0 at p = 0.04: chased before
    assert biased.p_value < 0.05 and possible_change(biased, 0.2)
    assert not possible_change(biased, 0.2, beyond=0.01)    # past 1%: p = 0.37
    assert possible_change(undecided(1.02), 0.2, beyond=0.01) and possible_change(undecided(1.04), 0.2, 0.01)
    assert not possible_change(undecided(0.99), 0.2, beyond=0.01)
    no_interval = undecided(1.012, se=None)           # a comparison without a t-interval keeps the plain rule
    assert possible_change(no_interval, 0.2, beyond=0.01)


def test_unchanged_code_stops_at_the_first_look():
    c, rec = sequential(seed=11, cand_ms=5.0)
    assert len(rec["rounds"]["samples_host_gpu_ms"]["baseline"]) == 4
    assert c.verdict != SLOWER


def test_a_possible_speedup_is_chased_to_later_looks_as_a_possible_slowdown_is():
    slower, rec_slower = sequential(seed=11, cand_ms=5.4)      # +8% and -8% through the same instance biases
    faster, rec_faster = sequential(seed=11, cand_ms=5.0 / 1.08)
    assert len(rec_faster["rounds"]["samples_host_gpu_ms"]["baseline"]) > 4
    assert slower.verdict == SLOWER and faster.verdict == FASTER


@pytest.mark.parametrize("short", [False, True])
def test_a_served_pair_sample_asks_its_server_for_a_call_of_its_own_step_first_and_a_first_call_does_not(short):
    from bench_core.timing.protocol import run_served

    samples = []
    steps = (("baseline", 2.0), ("candidate", 3.0)) if short else (("baseline", 12.0), ("candidate", 13.0))
    servers = {side: _FakeServer(side, ms, samples=samples) for side, ms in steps}
    run_served(servers, Sampler("s", CpuBackend(), FakeClock()), rounds=3, pairs=3, warmup=1)
    assert len(samples) == 3 * (2 + 2 + 6)   # per round: a first call and a warmup call each, then three pairs
    for r in range(3):
        first, pairs = samples[10 * r:10 * r + 4], samples[10 * r + 4:10 * r + 10]
        assert not any(ahead for _, ahead in first)
        # mirrored pairs (A B, B A, A B) from the side that ran last: a call ahead only where the other side did
        sides = [side for side, _ in pairs]
        assert sides[0] == first[-1][0] and sides == [sides[0], sides[1], sides[1], sides[0], sides[0], sides[1]]
        # a short step (first calls under 20 ms together): a call ahead of every sample, which costs little there
        assert [ahead for _, ahead in pairs] == ([True] * 6 if short else [False, True, False, True, False, True])


def test_shared_cpus_draws_the_threads_a_round_may_use_or_nothing_where_that_is_every_cpu():
    import random

    from bench_core.timing.sampling import shared_cpus

    rng = random.Random(3)
    drawn = [shared_cpus(rng, 1, {0, 1, 2, 3}) for _ in range(40)]
    assert all(len(c) == 1 and set(c) <= {0, 1, 2, 3} for c in drawn) and len(set(drawn)) == 4
    assert set(shared_cpus(rng, 2, {4, 7, 9})) < {4, 7, 9}
    assert shared_cpus(rng, 2, {0, 1}) is None and shared_cpus(rng, 8, {0, 1}) is None
    assert shared_cpus(rng, None, {0, 1, 2}) is None            # torch's own count: every CPU


def test_a_round_is_held_to_cpus_the_last_round_left_free_so_a_busy_cpu_is_left_alone():
    """#27: held to a CPU drawn at random, half of the rounds beside a busy process ran at half speed (loaded
    process-mode trials cost 5.5x a plain run, which the scheduler puts on the free CPU)."""
    import random

    from bench_core.timing.sampling import busy_shares, cpu_ticks, shared_cpus

    text = "cpu  9 0 9 9 0 0 0 0 0 0\ncpu0 10 0 5 80 5 0 0 0 0 0\ncpu1 1 2 3 4 5 6 7 8 0 0\nintr 5 0\n"
    assert cpu_ticks(text) == {0: (15, 100), 1: (27, 36)}
    assert cpu_ticks("intr 5\n") is None
    assert busy_shares({0: (15, 100), 1: (27, 36)}, {0: (25, 110), 1: (28, 46)}) == {0: 1.0, 1: 0.1}
    assert busy_shares(None, {0: (1, 2)}) is None and busy_shares({0: (1, 2)}, {0: (1, 2)}) is None
    rng = random.Random(5)
    assert shared_cpus(rng, 1, {0, 1}, {0: 1.0, 1: 0.1}, last=(0,)) == (1,)     # away from the busy one
    assert shared_cpus(rng, 1, {0, 1}, {0: 1.0, 1: 0.6}, last=(1,)) == (1,)     # its own round kept it busy: kept
    quiet = {c: 0.05 for c in range(4)}
    drawn = {shared_cpus(rng, 1, set(range(4)), quiet, last=(2,)) for _ in range(60)}
    assert drawn == {(0,), (1,), (3,)}                                          # a quiet machine: drawn afresh
    two = {shared_cpus(rng, 2, set(range(4)), {0: 0.6, 1: 0.6, 2: 0.9, 3: 0.1}, last=(0, 1)) for _ in range(40)}
    assert two == {(0, 3), (1, 3)}                                              # topped up from the last round's
    assert shared_cpus(rng, 1, {0, 1}, {0: 0.9, 1: 0.7}, last=(5,)) == (1,)     # none free: the least busy


def test_served_rounds_leave_a_cpu_that_other_work_keeps_busy(monkeypatch):
    from bench_core.timing.protocol import run_served

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    reads = []

    def ticks():   # CPU 0 busy all the time with other work; CPU 1 busy a third of the time
        n = len(reads)
        reads.append(n)
        return {0: (10 * n, 10 * n), 1: (3 * n, 10 * n)}
    servers = {side: _FakeServer(side, ms) for side, ms in (("baseline", 12.0), ("candidate", 13.0))}
    run_served(servers, Sampler("s", CpuBackend(), FakeClock()), rounds=12, pairs=2, threads=1, ticks=ticks)
    held = servers["baseline"].cpus
    assert held == servers["candidate"].cpus and len(reads) == 12
    assert set(held[1:]) == {(1,)}   # after round 0, which has nothing to go by


def test_a_rounds_process_builds_on_every_cpu_of_the_memory_nodes_it_will_run_on():
    from bench_core.timing.sampling import build_cpus, cpu_list

    assert cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11} and cpu_list("5") == {5}
    with pytest.raises(ValueError):
        cpu_list("0-a")
    nodes = [{0, 1, 2, 3}, {4, 5, 6, 7}]
    assert build_cpus((5,), {0, 1, 2, 3, 4, 5, 6, 7}, nodes) == (4, 5, 6, 7)   # its node's CPUs, not the other's
    assert build_cpus((1, 6), set(range(8)), nodes) == tuple(range(8))        # held across both nodes
    assert build_cpus((5,), {1, 5, 6}, nodes) == (5, 6)                         # only CPUs it may use
    assert build_cpus((5,), set(range(8)), []) == (5,)                          # nodes unknown: where it is held
    assert build_cpus(None, set(range(8)), nodes) is None                       # nothing held: nothing to say


@pytest.mark.parametrize("threads", [1, None])
def test_both_servers_of_a_round_hold_it_to_the_same_cpus_drawn_afresh_each_round(monkeypatch, threads):
    """#27: a process waiting on a pipe wakes on the CPU it last ran on, so each side kept a CPU of its own for a
    round, and a CPU slowed for a while was one side's bias."""
    from bench_core.timing.protocol import run_served

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    servers = {side: _FakeServer(side, ms) for side, ms in (("baseline", 12.0), ("candidate", 13.0))}
    # /proc/stat unread (as off Linux): drawn at random each round, whatever else this machine is running
    run_served(servers, Sampler("s", CpuBackend(), FakeClock()), rounds=12, pairs=2, threads=threads,
               ticks=lambda: None)
    assert servers["baseline"].cpus == servers["candidate"].cpus and len(servers["baseline"].cpus) == 12
    if threads is None:
        assert set(servers["baseline"].cpus) == {None}
    else:
        assert all(len(c) == 1 for c in servers["baseline"].cpus) and len(set(servers["baseline"].cpus)) > 1


def test_rounds_timed_in_other_processes_leave_this_ones_collector_alone(monkeypatch):
    """A full collection of the parent (70 ms a scenario once torch is imported) bought nothing where every sample
    is timed in a side's own process; in one process it keeps collections out of the samples."""
    import gc

    from bench_core.timing.protocol import Instance, run_rounds, run_served

    collected = []
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(a) or 0)
    servers = {side: _FakeServer(side, ms) for side, ms in (("baseline", 12.0), ("candidate", 13.0))}
    run_served(servers, Sampler("s", CpuBackend(), FakeClock()), rounds=3, pairs=2)
    assert collected == [] and gc.isenabled()
    run_rounds({side: (lambda r: Instance(lambda: None)) for side in ("baseline", "candidate")},
               Sampler("s", CpuBackend(), FakeClock()), rounds=3, pairs=2)
    assert len(collected) == 1 + 3 and gc.isenabled()   # once before the rounds, then once before each round's pairs


def test_after_round_0_a_sides_first_call_comes_just_before_its_first_sample_and_saves_a_call_ahead():
    from bench_core.timing.protocol import run_served

    samples, requests = [], []
    servers = {side: _FakeServer(side, ms, samples=samples, requests=requests)
               for side, ms in (("baseline", 12.0), ("candidate", 13.0))}
    run_served(servers, Sampler("s", CpuBackend(), FakeClock()), rounds=3, pairs=2, warmup=0)
    assert len(samples) == 3 * (2 + 4)          # per round: a first call each, then two pairs
    sides, ahead = [s for s, _ in samples[:6]], [a for _, a in samples[:6]]
    # round 0 settles the plan from both first calls, then its mirrored pairs start with the side that ran last
    assert sides == [sides[0], sides[1], sides[1], sides[0], sides[0], sides[1]]
    assert ahead == [False, False, False, True, False, True]
    for r in (1, 2):
        sides, ahead = [s for s, _ in samples[6 * r:6 * r + 6]], [a for _, a in samples[6 * r:6 * r + 6]]
        x, y = sides[0], sides[2]
        assert x != y and sides == [x, x, y, y, y, x]   # first call, sample; first call, sample, sample; sample
        assert ahead == [False, False, False, False, False, True]   # one call ahead a round, not two
        # a first call and the sample after it are one request: the round's process does not wait on the parent
        # between them
        at = 6 + 4 * (r - 1)   # round 0 asked six times, each later round four
        assert requests[at:at + 4] == [(x, "first"), (y, "first"), (y, "sample"), (x, "sample")]
    assert requests[:6] == [(s, "sample") for s in [s for s, _ in samples[:6]]]   # round 0: each call asked alone


def test_loaded_files_name_only_files_that_are_there(tmp_path, monkeypatch):
    """torch's `_classes` and `_ops` modules say their file is "_classes.py": resolved from a side's tree, that
    read as a file of the tree with no content."""
    import sys
    import types

    from bench_core.workflows.side_server import loaded_files

    (tmp_path / "real_mod.py").write_text("X = 1\n")
    monkeypatch.chdir(tmp_path)
    for name, file in (("real_mod", str(tmp_path / "real_mod.py")), ("fake_classes", "_classes.py")):
        mod = types.ModuleType(name)
        mod.__file__ = file
        monkeypatch.setitem(sys.modules, name, mod)
    files = loaded_files([str(tmp_path)])
    assert list(files) == [str((tmp_path / "real_mod.py").resolve())] and all(files.values())


def test_loaded_files_resolve_a_modules_file_once_and_read_its_content_each_time(tmp_path, monkeypatch):
    """A server asks at each item's first run; resolving the file of every module torch loaded, each time, was most
    of that run for a small step (#27). Where a file lies is kept; what it holds is read afresh."""
    import os
    import sys
    import types
    from pathlib import Path

    from bench_core.workflows.side_server import loaded_files

    (tmp_path / "kept_mod.py").write_text("X = 1\n")
    mod = types.ModuleType("kept_mod")
    mod.__file__ = str(tmp_path / "kept_mod.py")
    monkeypatch.setitem(sys.modules, "kept_mod", mod)
    first = loaded_files([str(tmp_path)])
    resolved, real = [], Path.resolve

    def counted(self, *args, **kwargs):
        resolved.append(str(self))
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Path, "resolve", counted)
    (tmp_path / "kept_mod.py").write_text("X = 2\n")
    second = loaded_files([str(tmp_path)])
    monkeypatch.undo()
    assert list(first) == list(second) == [str((tmp_path / "kept_mod.py").resolve())]
    assert first != second   # the new content's hash
    assert str(tmp_path) in resolved   # the root, each time
    assert not [p for p in resolved if os.path.isabs(p) and p.endswith(".py")]   # no module's file again


def test_a_server_runs_the_untimed_call_ahead_of_a_sample_only_when_asked():
    import json

    from bench_core.timing.protocol import Instance
    from bench_core.workflows.channel import Channel
    from bench_core.workflows.side_server import serve_round

    calls = []
    inst = Instance(fn=lambda: calls.append("fn"), setup=lambda: calls.append("setup"))
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    with os.fdopen(w_in, "w") as feed:
        for doc in ({"cmd": "sample", "ahead": True}, {"cmd": "sample", "ahead": False}, {"cmd": "end"}):
            feed.write(json.dumps(doc) + "\n")
    channel = Channel(r_in, w_out)
    assert serve_round(channel, inst, Sampler("s", CpuBackend(), FakeClock())) == "end"
    channel.w.close()
    with os.fdopen(r_out) as back:
        replies = [json.loads(line) for line in back]
    assert [set(r) for r in replies] == [{"built", "pid"}, {"host_ms", "gpu_ms"}, {"host_ms", "gpu_ms"}]
    assert calls == ["setup", "fn", "setup", "fn", "setup", "fn"]   # ahead: its own setup and call, then the sample


def test_a_channel_reads_two_answers_that_came_in_one_write_without_waiting_for_a_third():
    # two answers may lie in the pipe together (requests sent ahead of their answers); waiting on the descriptor for
    # the second would hang until the timeout
    from bench_core.workflows.channel import Channel

    r, w = os.pipe()
    os.write(w, b'{"ready": 1}\n{"serving": "s"}\n{"par')
    channel = Channel(r, os.open(os.devnull, os.O_WRONLY))
    try:
        assert channel.recv(timeout_s=0.0) == {"ready": 1}
        assert channel.recv(timeout_s=0.0) == {"serving": "s"}
        with pytest.raises(TimeoutError):        # half a line is not a line
            channel.recv(timeout_s=0.0)
        os.write(w, b't": 2}\n')
        os.close(w)
        assert channel.recv(timeout_s=1.0) == {"part": 2}
        assert channel.recv(timeout_s=1.0) is None   # the pipe's end
    finally:
        channel.close()


def test_a_fresh_instance_is_warmed_for_warm_ms_before_its_pairs_and_a_slow_one_gets_no_extra_call():
    from bench_core.timing.protocol import Instance, run_rounds

    clock = FakeClock()

    def fresh(settled_ms, first_calls_ms, calls):
        def build(r):
            n = {"calls": 0}

            def fn():   # a fresh instance's first four calls are 60% slow, as a forked child's were
                n["calls"] += 1
                calls.append(n["calls"])
                order.append((calls, n["calls"]))
                clock.advance_ms(first_calls_ms if n["calls"] <= 4 else settled_ms)
            return Instance(fn)
        return build
    small, big, order = [], [], []
    res = run_rounds({"baseline": fresh(0.1, 0.16, small), "candidate": fresh(20.0, 20.0, big)},
                     Sampler("s", CpuBackend(), clock), rounds=3, pairs=2, warmup=0, warm_ms=10.0)
    assert [x for r in res.primary("baseline") for x in r] == pytest.approx([0.1] * 6)
    assert max(small) > 50                          # about 10 ms of 0.1 ms calls after the first
    # the slow step: its first call, then only its 2 samples and a call ahead of each that follows the small one's
    rounds = [i for i, (who, k) in enumerate(order) if who is big and k == 1] + [len(order)]
    for start, end in zip(rounds, rounds[1:]):
        calls = [who for who, _ in order[start:end]]
        after_small = sum(1 for a, b in zip(calls, calls[1:]) if a is small and b is big)
        assert calls.count(big) == 1 + 2 + after_small and after_small <= 2


def test_a_short_step_takes_more_pairs_settled_by_round_zero_and_a_long_one_its_least():
    from bench_core.timing.protocol import PAIRS_MAX, Instance, pairs_for, run_rounds

    assert pairs_for(2, 40.0, 5.0) == 8 and pairs_for(2, 40.0, 30.0) == 2 and pairs_for(3, 40.0, 16.0) == 3
    assert pairs_for(2, 40.0, 0.2) == PAIRS_MAX and pairs_for(2, 0.0, 0.2) == 2 and pairs_for(2, 40.0, 0.0) == 2

    def pairs_taken(ms, first_ms):
        clock = FakeClock()

        def build(r):
            n = {"calls": 0}

            def fn():   # round 0's first calls are slow (a cold start): later rounds' fast ones change nothing
                n["calls"] += 1
                clock.advance_ms(first_ms if n["calls"] == 1 and r == 0 else ms)
            return Instance(fn)
        res = run_rounds({"baseline": build, "candidate": build}, Sampler("s", CpuBackend(), clock), rounds=3,
                         pairs=2, pairs_ms=40.0)
        return {len(r) for side in ("baseline", "candidate") for r in getattr(res, side)}
    assert pairs_taken(2.0, 2.5) == {8}     # 40 ms / (2.5 + 2.5 ms) of first calls
    assert pairs_taken(2.0, 10.0) == {2}    # round 0's first calls took 20 ms: 2 pairs, in every round
    assert pairs_taken(17.0, 17.0) == {2}


def test_the_side_by_side_simulation_drives_the_decisions_own_looks_and_chase():
    import importlib.util
    import pathlib

    from bench_core.deciding.sequential import planned_looks
    from bench_core.workflows.side_by_side.compare import Judge

    path = pathlib.Path(__file__).parents[1] / "quality" / "against_sim.py"
    spec = importlib.util.spec_from_file_location("against_sim", path)
    sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim)
    looks = planned_looks(12, 36, 12)
    judge = Judge(Scenario("s", ("compute",)), "cpu", 0.02, GateConfig(threshold=0.02), 9, looks)
    rng = np.random.default_rng(3)
    # quiet rounds: a 30% slowdown and unchanged code are both decided at the first look
    assert sim.trial(rng, judge, looks, 1.3, 0.003, 0.01, False) == (SLOWER, 12)
    assert sim.trial(rng, judge, looks, 1.0, 0.003, 0.01, False) == (UNCHANGED, 12)
    # noisy rounds: a 5% slowdown the first look leaves undecided is chased to a later look
    runs = [sim.trial(rng, judge, looks, 1.05, 0.03, 0.05, True) for _ in range(10)]
    assert any(n > 12 for _, n in runs) and all(n in looks for _, n in runs)


def test_an_undecided_comparison_says_whether_its_rounds_ran_out_or_the_keep_going_rule_stopped_them():
    """The advice names what would change the outcome: at the last look, the most rounds; stopped at an earlier
    look because a change beyond half the threshold no longer looked likely, rounds at each look (the torchsort
    sceptic's inconclusive run had been told to raise a maximum it never reached)."""
    from bench_core.deciding.sequential import planned_looks
    from bench_core.timing.protocol import Rounds
    from bench_core.timing.sampling import Sample
    from bench_core.workflows.side_by_side.compare import Judge

    looks = planned_looks(12, 36, 12)
    judge = Judge(Scenario("s", ("compute",)), "cpu", 0.02, GateConfig(threshold=0.02), 1, looks)

    def rounds(n):   # a null change, rounds spread +-10%: nothing within 2% can be ruled out
        base = tuple((Sample(10.0),) for _ in range(n))
        cand = tuple((Sample(10.0 * math.exp(0.1 * (-1) ** k)),) for k in range(n))
        return Rounds(baseline=base, candidate=cand)
    stopped, ran_out = judge(rounds(24), "host"), judge(rounds(36), "host")
    assert stopped.verdict == ran_out.verdict == INCONCLUSIVE
    assert "stopped after 24 of up to 36 rounds" in stopped.reason and "--bench-rounds, now 12" in stopped.reason
    # what stopped it is said as what it is (a wide interval had read "a change beyond 1.0% no longer looked likely")
    assert "did not point to a change beyond 1.0% clearly enough to chase (one-sided p >= 0.2)" in stopped.reason
    assert "--bench-max-rounds" not in stopped.reason
    assert "more rounds would narrow it (--bench-max-rounds, now 36)" in ran_out.reason


def _quality_script(name: str):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "quality" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_slow_sample_census_reads_the_round_childrens_counts(tmp_path, capsys):
    faults = _quality_script("sample_faults")
    # name, what, ahead, host ms, faults, involuntary switches, moved, wall ms, ms on a CPU, ms waiting for one
    (tmp_path / "101.tsv").write_text(
        "memory[same]\tthe first call\t0\t30.0\t7900\t0\tFalse\t30.1\t30.0\t0.0\n"
        "memory[same]\tpair 0\t0\t24.0\t1953\t0\tFalse\t24.1\t24.0\t0.0\n"
        "memory[same]\ta sample\t0\t19.0\t0\t0\tFalse\t19.1\t19.0\t0.0\n")
    (tmp_path / "102.tsv").write_text(
        "memory[plus5]\ta sample\t1\t19.2\t0\t1\tFalse\t38.5\t38.4\t0.0\n"
        "cnn[same]\ta sample\t0\t27.0\t30\t0\tTrue\t27.1\t26.0\t0.5\n")
    by = faults.samples_by_workload(tmp_path)
    assert sorted(by) == ["cnn", "memory"] and len(by["memory"]) == 3   # the first call is a cold observation
    faults.fault_table(by)
    out = capsys.readouterr().out
    assert "memory: 3 samples, median 19.20 ms, 1 over 1.06x it" in out
    assert "samples with over 1,000 faults: 1 (1 of them slow)" in out
    cnn, memory = out.split("memory:")
    # a sample with a call ahead is not timed against its whole request: only the two without one are
    assert "slow (no call ahead, 1): wall  24.10 ms" in memory and "rest (no call ahead, 1): wall  19.10 ms" in memory
    assert "rest (no call ahead, 1): wall  27.10 ms, on a CPU  26.00 ms, waiting for one  0.50 ms, neither  0.60" in cnn


def test_the_slow_sample_census_reads_each_sides_faster_sample_past_a_one_sided_outlier(tmp_path, capsys):
    faults = _quality_script("sample_faults")
    rounds = {"baseline": [[[20.0, 0], [20.0, 0]], [[20.0, 0], [26.0, 0]]],
              "candidate": [[[21.0, 0], [21.0, 0]], [[21.0, 0], [21.0, 0]]]}
    doc = {"against": {"scenarios": [{"scenario": "memory[plus5]", "rounds": {"samples_host_gpu_ms": rounds}}]}}
    (tmp_path / "session.json").write_text(__import__("json").dumps(doc))
    faults.spread_table(tmp_path / "session.json")
    out = capsys.readouterr().out
    assert "2 rounds" in out and "(each side's faster sample, 1.050)" in out   # the outlier moved only the mean
    assert "(samples averaged, estimate 1.050)" not in out
