"""The pytest plugin end to end, with pytester: small benchmark files, real pytest sessions."""
import json

import pytest

FAKE_BENCH = '''
from bench_core import Scenario
from fakes import FakeClock, work

LEVEL = {level}

def test_alpha(bench):
    clock = FakeClock()
    m = bench.run(Scenario("alpha", ("forward",), {{"dtype": "float32"}}), work(clock, 50.0, LEVEL),
                  clock=clock, items=8)
    assert m.summary.median == LEVEL

def test_beta(bench):
    clock = FakeClock()
    bench.run(Scenario("beta", ("forward",)), work(clock, 3.0), clock=clock)
'''


@pytest.fixture
def bt(pytester, request):
    """A pytester with the project's fakes importable in the inner session."""
    import fakes

    pytester.makeconftest(f"import sys; sys.path.insert(0, {str(fakes.__file__.rsplit('/', 1)[0])!r})")
    return pytester


def test_session_table_json_and_per_test_properties(bt):
    bt.makepyfile(test_b=FAKE_BENCH.format(level=2.0))
    res = bt.runpytest("--bench-repeats", "4", "--bench-warmup", "1", "--junitxml=out.xml")
    res.assert_outcomes(passed=2)
    # what to do next, and whose the pytest-benchmark header line is
    res.stdout.fnmatch_lines(["bench_core: tests using pytest-benchmark's `benchmark` fixture are measured by "
                              "bench_core*the `benchmark:` line is pytest-benchmark's own",
                              "next: keep this run as a baseline (--bench-save NAME), then gate later runs*"])
    assert all(len(line) <= 120 for line in res.stdout.lines if line.startswith(("next:", "      ")))
    res.stdout.fnmatch_lines(["*bench_core results*", "alpha*50.000*2.000*4,000/s*",
                              "every row: device: cpu, threads: *, timer: host, mode: per_call*n: 4, window mem: n/o",
                              "*results written to*session-*.json"])
    files = list((bt.path / ".bench" / "results").glob("session-*.json"))
    assert len(files) == 1
    doc = json.loads(files[0].read_text())
    assert [r["scenario"]["name"] for r in doc["results"]] == ["alpha", "beta"]
    assert doc["results"][0]["host_ms"] == [2.0] * 4
    assert doc["results"][0]["cold_start"]["first_call_ms"] == 50.0
    assert doc["environment"]["device"] == "cpu"
    assert 'name="bench_median_ms" value="2.0"' in (bt.path / "out.xml").read_text()


def test_gpu_flag_without_cuda_stops_the_session(bt, monkeypatch):
    import bench_core.timing.devices

    monkeypatch.setattr(bench_core.timing.devices, "cuda_available", lambda: False)
    bt.makepyfile(test_b=FAKE_BENCH.format(level=2.0))
    res = bt.runpytest("--gpu")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*--gpu was given but CUDA is not available*Refusing to run on the CPU*"])
    assert not (bt.path / ".bench").exists()


def test_gpu_marked_tests_are_skipped_on_cpu_with_a_reason(bt):
    bt.makepyfile(test_g='''
import pytest

@pytest.mark.gpu
def test_marked(bench):
    raise AssertionError("must not run")

def test_unmarked(bench):
    pass
''')
    res = bt.runpytest("-rs", "--strict-markers")   # the plugin registers the one marker itself
    res.assert_outcomes(skipped=1, passed=1)
    res.stdout.fnmatch_lines(["*needs a CUDA device: run with --gpu*"])


def test_gpu_session_with_fake_cuda_reports_both_figures(bt, monkeypatch):
    import bench_core.timing.devices

    monkeypatch.setattr(bench_core.timing.devices, "cuda_available", lambda: True)
    bt.makepyfile(test_k='''
from bench_core import Scenario
from bench_core.timing.backends import CudaBackend
from fakes import FakeClock, FakeGPU

def test_kernel(bench):
    assert bench.device == "cuda" and bench.size(cpu=1, gpu=2) == 2
    clock = FakeClock(); gpu = FakeGPU(clock)
    m = bench.run(Scenario("kern", ("compute",)), lambda: gpu.launch(2.0, 0.5), clock=clock,
                  backend=CudaBackend(gpu))
    assert m.timer == "cuda_event"
''')
    res = bt.runpytest("--gpu", "--bench-repeats", "3", "--bench-no-out")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["kern*cuda_event*2.500*", "*(end-to-end)*host+sync*2.500*", "every row: device: cuda*"])


def test_a_failing_scenario_fails_its_own_test_and_the_others_still_report(bt):
    bt.makepyfile(test_f='''
from bench_core import Scenario

def test_broken(bench):
    def step():
        raise ValueError("shape mismatch")
    bench.run(Scenario("broken", ("forward",)), step)

def test_bad_repeats(bench):
    bench.run(Scenario("few", ("forward",)), lambda: None, repeats=1)

def test_fine(bench):
    bench.run(Scenario("fine", ("forward",)), lambda: None)
''')
    res = bt.runpytest()
    res.assert_outcomes(passed=1, failed=2)
    res.stdout.fnmatch_lines([
        "*scenario 'broken': the first call (cold start) raised ValueError: shape mismatch*",
        "*scenario 'few': repeats must be an integer >= 2, got 1*",
        "fine*", "every row: device: cpu*",
        "failed scenarios:", "  broken: the first call (cold start) raised ValueError: shape mismatch",
    ])


def test_save_then_compare_fails_only_the_regressed_scenario(bt, capsys):
    from bench_core.shells.cli import main

    bt.makepyfile(test_b=FAKE_BENCH.format(level=2.0))
    bt.runpytest("--bench-save", "main", "--bench-repeats", "10").assert_outcomes(passed=2)
    for _ in range(2):
        bt.runpytest("--bench-save", "main", "--bench-append", "--bench-repeats", "10").assert_outcomes(passed=2)
    doc = json.loads((bt.path / "baselines" / "main.json").read_text())
    assert len(doc["runs"]) == 3

    bt.makepyfile(test_b=FAKE_BENCH.format(level=4.0).replace("assert m.summary.median == LEVEL", "pass"))
    res = bt.runpytest("--bench-compare", "main", "--bench-repeats", "10", "--junitxml=out.xml")
    res.assert_outcomes(passed=1, failed=1)
    res.stdout.fnmatch_lines(["*scenario 'alpha': slower against baseline 'main'*", "*alpha*2*4*2.000*slower*",
                              "*bench_core comparison with baseline 'main'*"])
    xml = (bt.path / "out.xml").read_text()
    assert "slower against baseline" in xml and 'name="bench_verdict" value="slower"' in xml
    res.stdout.fnmatch_lines(["*Captured bench_core call*", "alpha*50.000*4.000*", "every row: device: cpu, threads: *, timer: host*"])  # the test's own section
    # "slower" came from this process and two fresh worker processes that ran the test again
    path = max((bt.path / ".bench" / "results").glob("session-*.json"))
    doc = json.loads(path.read_text())
    alpha = next(c for c in doc["comparisons"] if c["name"] == "alpha")
    assert alpha["candidate_runs"] == 3 and "this process and 2 fresh process(es)" in alpha["method"]
    assert [r["summary"]["median"] for r in doc["replicas"]["alpha"]] == [4.0, 4.0]

    # #28: the session said slower from this process and two fresh ones; the CLI on the same file ignored the
    # replicas and exited 0. It now reads every process the file holds and says the same, scenario by scenario
    # (the same session file as above: its fresh processes are what the CLI must read)
    session = {c["name"]: c["verdict"] for c in doc["comparisons"]}
    capsys.readouterr()
    assert main(["compare", str(bt.path / "baselines" / "main.json"), str(path), "--json"]) == 1
    cli_doc = json.loads(capsys.readouterr().out)
    cli = {c["name"]: c["verdict"] for c in cli_doc}
    assert cli == session and session["alpha"] == "slower"
    # the same adjusted p-values too: the CLI adjusts as the session did (each scenario decided as its test ends),
    # not with Holm over all of them, which differs at the margin
    session_p = {c["name"]: c["p_adjusted"] for c in doc["comparisons"]}
    assert {c["name"]: c["p_adjusted"] for c in cli_doc} == session_p

    # a dedicated runner may let one process decide: no worker is started
    res = bt.runpytest("--bench-compare", "main", "--bench-repeats", "10", "--bench-min-runs", "1",
                       "--bench-max-runs", "1", "--bench-no-out")
    res.assert_outcomes(passed=1, failed=1)
    res.stdout.fnmatch_lines(["*alpha*2.000*slower*", "every row: runs b/c (b spread): 3/1*"])


def test_saving_over_an_existing_baseline_is_refused_at_the_start(bt):
    bt.makepyfile(test_b=FAKE_BENCH.format(level=2.0))
    bt.runpytest("--bench-save", "main").assert_outcomes(passed=2)
    before = (bt.path / "baselines" / "main.json").read_text()
    res = bt.runpytest("--bench-save", "main")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*baseline 'main' already exists and is never silently overwritten*--bench-append*"])
    assert (bt.path / "baselines" / "main.json").read_text() == before


def test_compare_with_a_missing_or_broken_baseline_is_a_usage_error(bt):
    bt.makepyfile(test_b=FAKE_BENCH.format(level=2.0))
    res = bt.runpytest("--bench-compare", "ghost")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*baseline 'ghost' does not exist*--bench-save ghost*"])
    (bt.path / "baselines").mkdir(exist_ok=True)
    (bt.path / "baselines" / "torn.json").write_text('{"format": "bench_core.baseline", "sch')
    res = bt.runpytest("--bench-compare", "torn")
    res.stderr.fnmatch_lines(["*torn.json: not valid JSON*"])


def test_environment_mismatch_fails_as_incomparable_unless_allowed(bt):
    bt.makepyfile(test_b=FAKE_BENCH.format(level=2.0))
    bt.runpytest("--bench-save", "main", "--bench-repeats", "5").assert_outcomes(passed=2)
    path = bt.path / "baselines" / "main.json"
    doc = json.loads(path.read_text())
    doc["runs"][0]["environment"]["torch_major_minor"] = "1.13"
    doc["runs"][0]["environment"]["hostname"] = "elsewhere"
    path.write_text(json.dumps(doc))
    res = bt.runpytest("--bench-compare", "main", "--bench-repeats", "5")
    res.assert_outcomes(failed=2)
    res.stdout.fnmatch_lines(["*incomparable*torch_major_minor: '1.13' -> *"])
    res = bt.runpytest("--bench-compare", "main", "--bench-repeats", "5", "--bench-allow-env-mismatch")
    res.assert_outcomes(passed=2)


def test_quick_mode_and_size_knob(bt):
    bt.makepyfile(test_q='''
from bench_core import Scenario

def test_q(bench):
    assert bench.size(cpu=16, gpu=128, quick=2) == 2
    m = bench.run(Scenario("q", ("forward",)), lambda: None, repeats=50)
    assert (m.warmup, m.repeats) == (1, 5)
''')
    bt.runpytest("--bench-quick").assert_outcomes(passed=1)


def test_pytest_benchmark_json_export_is_read_by_its_compare(bt):
    import subprocess
    import sys

    bt.makepyfile(test_b=FAKE_BENCH.format(level=2.0))
    bt.runpytest("--bench-pb-json", "pb.json", "--bench-repeats", "4").assert_outcomes(passed=2)
    doc = json.loads((bt.path / "pb.json").read_text())
    assert doc["benchmarks"][0]["stats"]["median"] == pytest.approx(0.002)
    out = subprocess.run([sys.executable, "-m", "pytest_benchmark", "compare", str(bt.path / "pb.json")],
                         capture_output=True, text=True, cwd=bt.path)
    assert out.returncode == 0, out.stderr
    assert "alpha" in out.stdout and "beta" in out.stdout


def test_ab_through_the_fixture_reports_and_records_decisions(bt):
    bt.makepyfile(test_inner_ab='''
import pytest
from fakes import FakeClock

class Report:
    def __init__(self, ok):
        self.ok = ok
        self.state_hash = "feed"
    def to_dict(self):
        return {"ok": self.ok}
    def table(self):
        return "correctness: FAIL (made up)"

def test_fast(bench):
    clock = FakeClock()
    res = bench.ab("halved", lambda: clock.advance_ms(2), lambda: clock.advance_ms(1), validation=Report(True),
                   clock=clock)
    assert res.verdict == "faster" and res.state_hash == "feed"

def test_wrong(bench):
    bench.ab("wrong", lambda: None, lambda: None, validation=Report(False))

def test_wrong_output(bench):   # no validation report: the A/B's own comparison of the outputs rejects it
    clock = FakeClock()
    bench.ab("wrong_output", lambda: clock.advance_ms(2) or 2.0, lambda: clock.advance_ms(1) or 3.0, clock=clock)
''')
    res = bt.runpytest()
    res.assert_outcomes(passed=1, failed=2)
    res.stdout.fnmatch_lines(["*A/B 'wrong_output': candidate rejected as incorrect*"])
    assert "AttributeError" not in res.stdout.str()   # the reason, not a crash over the missing report
    res.stdout.fnmatch_lines(["*A/B 'wrong': candidate rejected as incorrect*", "*correctness: FAIL (made up)*",
                              "*bench_core A/B decisions*",
                              "halved*2.000*1.000*2.000x*60*pass*faster",
                              "wrong*-*-*FAIL*rejected: incorrect"])
    records = sorted((bt.path / ".bench" / "results").glob("decision-*.json"))
    assert sorted(json.loads(p.read_text())["name"] for p in records) == ["halved", "wrong", "wrong_output"]
    doc = json.loads(records[0].read_text())
    assert doc["format"] == "bench_core.decision" and len(doc["baseline_ms"]) == 60
    assert doc["correctness"] == {"ok": True} and doc["environment"]["device"] == "cpu"


def test_reference_saved_then_checked_across_a_code_change(bt):
    body = '''
import torch
from bench_core import StartingState

SCALE = {scale}

def step(model, opt, batch):
    opt.zero_grad()
    loss = (model(batch) * SCALE).pow(2).mean()
    loss.backward()
    opt.step()
    return {{"loss": loss}}

def test_ref(bench):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = StartingState.capture(model, opt, [torch.randn(3, 4)])
    bench.reference("linear_sgd", step, state, model, opt, steps=2)
'''
    bt.makepyfile(test_r=body.format(scale=1.0))
    res = bt.runpytest("-rs")
    res.assert_outcomes(skipped=1)
    res.stdout.fnmatch_lines(["*no reference 'linear_sgd'*record one with --bench-ref-save*"])
    bt.runpytest("--bench-ref-save").assert_outcomes(passed=1)
    assert (bt.path / "references" / "linear_sgd.pt").exists()
    assert (bt.path / "references" / "linear_sgd.state.pt").exists()
    bt.runpytest().assert_outcomes(passed=1)                 # unchanged code matches its reference
    bt.makepyfile(test_r=body.format(scale=1.001))            # "the code changed"
    res = bt.runpytest()
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*reference 'linear_sgd': the current code no longer matches*",
                              "*step?0?.output.loss*exceeds tolerance*", "*first divergent step: 0*"])


AGAINST_V1 = '''
from bench_core import Scenario
from fakes import SHARED_CLOCK, work_on_shared_clock

def test_alpha(bench):
    bench.run(Scenario("alpha", ("forward",)), work_on_shared_clock(2.0), clock=SHARED_CLOCK)

def test_beta(bench):
    bench.run(Scenario("beta", ("forward",)), work_on_shared_clock(3.0), clock=SHARED_CLOCK)

def test_gamma(bench):
    raise RuntimeError("broken in the old revision")
'''

AGAINST_V2 = AGAINST_V1.replace("work_on_shared_clock(2.0)", "work_on_shared_clock(4.0)").replace(
    'raise RuntimeError("broken in the old revision")',
    'bench.run(Scenario("gamma", ("forward",)), work_on_shared_clock(1.0), clock=SHARED_CLOCK)') + '''
def test_delta(bench):
    bench.run(Scenario("delta", ("forward",)), work_on_shared_clock(1.0), clock=SHARED_CLOCK)
'''


def committed(pytester, **files):
    """Make `pytester.path` a git repository whose one commit holds `files`."""
    import subprocess

    def git(*args):
        subprocess.run(["git", *args], cwd=pytester.path, check=True, capture_output=True,
                       env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
                            "GIT_COMMITTER_EMAIL": "t@example.invalid", "HOME": str(pytester.path),
                            "PATH": "/usr/bin:/bin"})
    git("init", "-q")
    pytester.makepyfile(**files)
    git("add", "-A")
    git("commit", "-qm", "v1")


@pytest.fixture
def against_repo(bt):
    committed(bt, test_sides_inner=AGAINST_V1)
    bt.makepyfile(test_sides_inner=AGAINST_V2)   # uncommitted: the working tree is the candidate
    return bt


def test_against_a_revision_fails_only_the_slower_scenario_and_reports_one_sided_ones(against_repo):
    res = against_repo.runpytest("--bench-against", "HEAD", "--bench-rounds", "5", "--bench-pairs", "3")
    res.assert_outcomes(passed=3, failed=1)
    res.stdout.fnmatch_lines(["scenario 'alpha': slower against revision 'HEAD': significant*",
                              "*FAILED test_sides_inner.py::test_alpha*"])
    out = " ".join(res.stdout.str().split())     # notes wrap at 120 columns
    assert "gamma: not compared: HEAD (" in out and "broken in the old revision" in out
    assert "delta: measured on the current tree only: test_delta does not exist in HEAD" in out
    assert "dirty (diff sha256" in out and "5 rounds, 15 at most for a possible change (looks at 5, 10, 15) x 3 pairs" in out
    # side by side counts rounds, each scenario its own, in its row: never "runs", never one scenario's for all
    assert "rounds b/c" in out and "runs b/c" not in out and "rounds ran" not in out
    assert "medians of all samples pooled; the ratio and its interval: the estimate over runs (rounds)" in out
    (path,) = (against_repo.path / ".bench" / "results").glob("session-*.json")
    doc = json.loads(path.read_text())
    ag = doc["against"]
    assert ag["current"]["dirty"] and len(ag["baseline"]["commit"]) == 40
    rows = {r["scenario"]: r for r in ag["scenarios"]}
    assert set(rows) == {"alpha", "beta"}
    alpha = rows["alpha"]
    assert alpha["comparison"]["verdict"] == "slower" and alpha["comparison"]["ratio"] == pytest.approx(2.0, rel=0.03)
    assert len(alpha["rounds"]["samples_host_gpu_ms"]["baseline"]) == 5
    code = alpha["code"]
    assert code["baseline"]["code_from_revision"] is True
    assert code["baseline"]["test_file_sha256"] != code["current"]["test_file_sha256"]
    assert rows["beta"]["comparison"]["verdict"] != "slower"
    assert {"slower", "unchanged", "inconclusive"} >= {c["verdict"] for c in doc["comparisons"]}


@pytest.mark.parametrize("args, needle", [
    (["--bench-against", "no-such-rev"], "*revision 'no-such-rev' is unknown here*"),
    (["--bench-against", "HEAD", "--bench-compare", "main"], "*does not mix with a stored baseline*"),
    (["--bench-against", "HEAD", "--bench-rounds", "2"], "*needs at least 3 rounds and 1 pair per round, got 2 and 2*"),
    (["--bench-against", "HEAD", "--bench-rounds", "6", "--bench-max-rounds", "5"],
     "*--bench-max-rounds (5) must be at least --bench-rounds (6)*"),
    (["--bench-against", "HEAD", "--bench-worker-pairs", "2"], "*--bench-worker-pairs needs at least 3 pairs*"),
])
def test_against_usage_errors_stop_the_session_before_any_work(against_repo, args, needle):
    res = against_repo.runpytest(*args)
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines([needle])


@pytest.mark.parametrize("opt", ["--bench-compare", "--bench-save"])
def test_a_baseline_name_given_empty_is_an_error_not_a_quiet_no_op(bt, opt):
    # an unset $BASELINE in CI: `--bench-compare "$BASELINE"` must not go green having compared nothing
    bt.makepyfile(test_b=FAKE_BENCH.format(level=2.0))
    res = bt.runpytest(opt, "")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*baseline name '' is not valid*"])


def test_a_hanging_scenario_fails_by_name_within_its_time_limit(bt):
    bt.makepyfile(test_hang='''
import time
from bench_core import Scenario

def test_hangs(bench):
    bench.run(Scenario("stuck", ("compute",)), lambda: time.sleep(3600))

def test_fine(bench):
    bench.run(Scenario("fine", ("compute",)), lambda: None)
''')
    res = bt.runpytest("--bench-timeout", "0.5", "--bench-repeats", "2", "--bench-warmup", "0")
    res.assert_outcomes(passed=1, failed=1)
    res.stdout.fnmatch_lines(["*scenario 'stuck': ran past its time limit of 0.5 s*"])


def test_a_profile_folder_that_is_a_file_stops_the_session_before_any_work(bt):
    bt.makepyfile(test_b=FAKE_BENCH.format(level=2.0))
    (bt.path / "prof").write_text("not a folder")
    res = bt.runpytest("--bench-profile", "prof")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*--bench-profile prof: is a file*"])


ISOLATED = '''
import torch
from bench_core import Scenario
from fakes import SHARED_CLOCK, work_on_shared_clock

# registered at import: a second copy of this module cannot be loaded into the same process
LIB = torch.library.Library("bench_isolated_test", "DEF")
LIB.define("noop(Tensor x) -> Tensor")
MS = {ms}

def test_isolated(bench):   # on the fake clock: the verdict never depends on the machine's load
    bench.run(Scenario("isolated", ("compute",)), work_on_shared_clock(MS), clock=SHARED_CLOCK)

def test_isolated_unchanged(bench):
    bench.run(Scenario("isolated_unchanged", ("compute",)), work_on_shared_clock(2.0), clock=SHARED_CLOCK)
'''


def test_code_that_cannot_load_twice_is_compared_with_each_side_in_its_own_process(pytester):
    import os

    from test_fidelity import CONFTEST

    pytester.makeconftest(CONFTEST)
    committed(pytester, test_isolated=ISOLATED.format(ms=2))
    pytester.makepyfile(test_isolated=ISOLATED.format(ms=6))      # three times slower
    res = pytester.runpytest("--bench-against", "HEAD", "--bench-quick", "--bench-threads", "1")
    res.assert_outcomes(failed=1, passed=1)
    res.stdout.fnmatch_lines(["*scenario 'isolated': slower against revision 'HEAD'*"])
    out = " ".join(res.stdout.str().split())     # notes wrap at 120 columns
    # malloc as-is (the default): one pair of servers, every round the test run afresh in a child of each
    assert "each side a pytest process of its own, every round the test run afresh in a freshly forked child" in out
    held = len(os.sched_getaffinity(0)) > 1    # one thread (the CPU default) leaves CPUs to draw from
    assert ("both of a round's children held to the same CPU(s), drawn per round" in out) == held
    assert "process mode: 2 scenario(s) served by 2 pytest process(es), each kept from scenario to scenario" in out
    (path,) = (pytester.path / ".bench" / "results").glob("session-*.json")
    rec = next(r for r in json.loads(path.read_text())["against"]["scenarios"] if r["scenario"] == "isolated")
    assert "register(s) torch operators" in rec["code"]["why_processes"]
    ran = rec["code"]["processes_ran"]      # each server's own word: which files it loaded, from which tree
    here = str(pytester.path / "test_isolated.py")
    assert here in ran["candidate"][0]["files"] and here not in ran["baseline"][0]["files"]
    (rev_file,) = [f for f in ran["baseline"][0]["files"] if f.endswith("test_isolated.py")]
    assert ran["baseline"][0]["files"][rev_file] != ran["candidate"][0]["files"][here]
    assert ran["baseline"][0]["forked_rounds"] and ran["baseline"][0]["torch"]
    assert 2.0 < rec["comparison"]["ratio"] < 3.5      # the candidate's 3x code ran, not REV's
    from helpers import orphaned_workers

    assert orphaned_workers() == [], "a server was left behind"


def test_the_gate_states_what_it_decided_and_strict_fails_what_it_could_not(bt):
    bt.makepyfile(test_b=FAKE_BENCH.format(level=2.0))
    bt.runpytest("--bench-save", "main", "--bench-repeats", "10").assert_outcomes(passed=2)
    res = bt.runpytest("--bench-compare", "main", "--bench-repeats", "10", "--bench-wide")   # too little to decide
    res.assert_outcomes(passed=2)
    res.stdout.fnmatch_lines(["gate: 0 of 2 scenario(s) decided: 0 slower, 0 faster, 0 unchanged; 2 inconclusive, "
                              "0 incomparable (nothing was decided*--bench-strict makes this fail)"])
    strict = bt.runpytest("--bench-compare", "main", "--bench-repeats", "10", "--bench-strict")
    strict.assert_outcomes(failed=2)
    strict.stdout.fnmatch_lines(["*scenario 'alpha': inconclusive against baseline 'main'*"])


def test_a_markdown_report_for_the_job_summary_says_the_verdicts_first_and_appends(bt):
    bt.makepyfile(test_b=FAKE_BENCH.format(level=2.0))
    bt.runpytest("--bench-save", "main", "--bench-repeats", "10").assert_outcomes(passed=2)
    bt.runpytest("--bench-save", "main", "--bench-append", "--bench-repeats", "10").assert_outcomes(passed=2)
    bt.makepyfile(test_b=FAKE_BENCH.format(level=4.0).replace("assert m.summary.median == LEVEL", "pass"))
    # this process decides (--bench-min-runs 1): the report is the subject here, replication is tested elsewhere,
    # and its fresh processes cost seconds
    res = bt.runpytest("--bench-compare", "main", "--bench-repeats", "10", "--bench-md", "summary.md",
                       "--bench-run-noise", "0.01", "--bench-min-runs", "1")
    res.assert_outcomes(passed=1, failed=1)
    text = (bt.path / "summary.md").read_text()
    lines = text.splitlines()
    assert lines[0] == "## bench_core: baseline 'main'"
    assert lines[2].startswith("**FAILED**: gate: 2 of 2 scenario(s) decided: 1 slower")
    assert "- :x: `alpha`: slower:" in text and "| alpha " in text and "<summary>Results</summary>" in text
    assert len(text.encode()) < 1_000_000
    bt.runpytest("--bench-compare", "main", "--bench-repeats", "10", "--bench-md", "summary.md",
                 "--bench-run-noise", "0.01", "--bench-min-runs", "1")
    assert (bt.path / "summary.md").read_text().startswith(text) and \
        (bt.path / "summary.md").read_text().count("## bench_core") == 2      # appended, nothing lost


def test_long_scenarios_say_how_far_they_are_in_pytests_output(bt, monkeypatch):
    import bench_core.output.progress

    monkeypatch.setattr(bench_core.output.progress, "EVERY_S", 0.0)    # every sample counts as "long" here
    bt.makepyfile(test_b=FAKE_BENCH.format(level=2.0))
    res = bt.runpytest("--bench-repeats", "4", "--bench-warmup", "1")   # output capture on, as usual
    res.assert_outcomes(passed=2)
    res.stdout.fnmatch_lines(["*bench_core: alpha: warmup 1/1*", "*bench_core: alpha: samples 4/4*",
                              "*bench_core: beta: samples 4/4*"])
    quiet = bt.runpytest("--bench-repeats", "4", "--bench-warmup", "1", "-qq", "--bench-no-out")
    assert "bench_core: alpha: samples" not in quiet.stdout.str()


def test_flops_are_counted_after_the_window_and_reported_with_utilization(bt):
    bt.makepyfile(test_f='''
import torch
from bench_core import Scenario

def test_mm(bench):
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    m = bench.run(Scenario("mm64", ("forward",), {"dtype": "float32"}), lambda: a @ b)
    assert m.work["flops"] == 2 * 64 ** 3
''')
    res = bt.runpytest("--bench-flops", "--bench-repeats", "5", "--bench-peak-tflops", "1")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["*bench_core work and utilization (counted FLOPs)*", "mm64*524 kFLOP*of 1 TFLOP/s*"])
    doc = json.loads(next((bt.path / ".bench" / "results").glob("session-*.json")).read_text())
    assert doc["results"][0]["work"]["flops"] == 2 * 64 ** 3 and len(doc["results"][0]["host_ms"]) == 5


DISTRIBUTED = '''
from bench_core import Scenario
from rank_builders import crashing, diverging, paced

def test_ab(bench):
    res = bench.ab_distributed("pace", paced, baseline={"base_ms": 20.0}, candidate={"base_ms": 10.0})
    assert res.speedup > 1.5

def test_crash(bench):
    bench.run_distributed(Scenario("crash", ("forward",)), crashing, nproc=2)

def test_drift(bench):
    bench.run_distributed(Scenario("drift", ("forward",)), diverging, nproc=2, items_per_rank=8)
'''


def _fake_rank_launches(monkeypatch):
    """The launcher replaced by what real ranks send back (tests/test_distributed.py launches them for real): the
    plugin's wiring is the subject here."""
    import bench_core.workflows.distributed.launch as dist_mod
    from bench_core.core.errors import ScenarioError

    def fake(name, spec, topology, timeout_s, launch=0):
        if spec["builder"] == "crashing":
            raise ScenarioError(name, "rank 1 failed during 'build':\nTraceback (most recent call last):\n"
                                      "RuntimeError: rank 1 cannot build: out of unicorns")
        ranks = []
        for r in range(topology.nproc):
            row = {"rank": r, "host": "h", "pid": 1, "threads": 1}
            if spec.get("ab"):
                for side in ("baseline", "candidate"):
                    level = spec["ab"][side]["base_ms"]
                    row[side] = {"cold_host_ms": 50.0, "cold_gpu_ms": None, "rounds": [
                        {"host_ms": [level * (1 + 0.01 * ((k * k + i + r + len(side)) % 5)) for i in range(spec["pairs"])],
                         "gpu_ms": None} for k in range(spec["rounds"])]}
            else:
                row.update(cold_host_ms=9.0, cold_gpu_ms=None, gpu_ms=None, local_host_ms=None,
                           local_gpu_ms=None, host_ms=[2.0 + 0.1 * r + 0.01 * i for i in range(spec["repeats"])])
            ranks.append(row)
        out = {"world_size": topology.nproc, "nnodes": 1, "backend": "gloo", "ranks": ranks}
        if spec.get("ab"):
            return {**out, "correctness": {"start_max_abs_diff": 0.0, "end_max_abs_diff": 0.0, "ok": True,
                                           "steps": 3, "rtol": 1e-4, "atol": 1e-5}}
        return {**out, "replicas_max_abs_diff": 1e-3, "reference": None}
    monkeypatch.setattr(dist_mod, "run_ranks", fake)


def test_distributed_scenarios_fail_their_own_tests_with_the_rank_and_its_cause(bt, monkeypatch):
    """A rank that raises fails its test with that rank's traceback; replicas that drift apart are measured and
    kept, and fail their test; the session reports the distributed table and stores every rank; an A/B of two
    configurations is decided and reported with the others."""
    _fake_rank_launches(monkeypatch)
    bt.makepyfile(test_d=DISTRIBUTED)
    res = bt.runpytest("--bench-repeats", "6", "--bench-warmup", "0")
    res.assert_outcomes(failed=2, passed=1)
    res.stdout.fnmatch_lines(["*rank 1 failed during 'build'*", "*RuntimeError: rank 1 cannot build: out of unicorns*",
                              "*'drift': the ranks' parameters differ after the steps*",
                              "*bench_core distributed scenarios (every rank)*", "drift*2 gloo*differ by*",
                              "*A/B decisions*", "pace*faster*"])
    (path,) = (bt.path / ".bench" / "results").glob("session-*.json")
    doc = json.loads(path.read_text())
    (drift,) = doc["results"]
    assert drift["ranks"]["world_size"] == 2 and len(drift["ranks"]["host_ms"]) == 2 and drift["items"] == 16
    assert drift["host_ms"] == drift["ranks"]["host_ms"][1]          # the slower rank, step by step
    assert any(e["scenario"] == "crash" for e in doc["errors"])


def test_placing_ranks_on_several_hosts_needs_the_ranks_per_host_and_a_rendezvous(bt):
    bt.makepyfile(test_b=FAKE_BENCH.format(level=2.0))
    res = bt.runpytest("--bench-nnodes", "2")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*--bench-nnodes, --bench-node-rank and --bench-rdzv-endpoint place ranks*give "
                              "--bench-nproc too*"])
    res = bt.runpytest("--bench-nproc", "1", "--bench-nnodes", "2")
    res.stderr.fnmatch_lines(["*2 hosts need a rendezvous both can reach: pass --bench-rdzv-endpoint HOST:PORT*"])


def test_on_a_runner_with_fewer_gpus_a_scenarios_own_world_size_is_skipped_and_an_asked_one_fails(bt, monkeypatch):
    import torch

    import bench_core.timing.devices

    monkeypatch.setattr(bench_core.timing.devices, "cuda_available", lambda: True)      # one fake GPU, NCCL "present"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    bt.makepyfile(test_d='''
from bench_core import Scenario
from rank_builders import plain

def test_ddp(bench):
    bench.run_distributed(Scenario("ddp", ("forward",)), plain, nproc=2)
''')
    res = bt.runpytest("--gpu", "-rs", "--bench-no-out")
    res.assert_outcomes(skipped=1)
    res.stdout.fnmatch_lines(["*ddp: 2 ranks on this host need one GPU each, and it has 1: pass --bench-nproc 1*"])
    res = bt.runpytest("--gpu", "--bench-nproc", "4", "--bench-no-out")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*4 ranks on this host need one GPU each, and it has 1*"])


FIXTURED = '''
import pytest
from bench_core import Scenario
from fakes import FakeClock, work


@pytest.fixture
def cost():
    print("number of parameters: 0.41M")     # a model that reports its size
    return {level}


@pytest.mark.parametrize("kind", [object])  # a parameter JSON cannot carry
def test_fixtured(bench, cost, kind):
    clock = FakeClock()
    bench.run(Scenario("fixtured", ("forward",)), work(clock, 50.0, cost), clock=clock)
'''


def test_replication_reruns_the_pytest_item_itself_so_fixtures_and_any_parameter_reach_slower(bt):
    """The gate's fresh processes run the test item again through pytest (its fixtures, its parameters, a model
    that prints): a 10x slowdown of a fixture-built scenario is called slower from two processes (one fresh: the
    default's two are tested in test_save_then_compare_fails_only_the_regressed_scenario)."""
    bt.makepyfile(test_f=FIXTURED.format(level=2.0))
    for i in range(3):
        bt.runpytest("--bench-save", "main", *(["--bench-append"] if i else []), "--bench-repeats", "6",
                     "--bench-no-out").assert_outcomes(passed=1)
    bt.makepyfile(test_f=FIXTURED.format(level=20.0))
    res = bt.runpytest("--bench-compare", "main", "--bench-repeats", "6", "--bench-min-runs", "2")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*scenario 'fixtured': slower against baseline 'main'*"])
    doc = json.loads(max((bt.path / ".bench" / "results").glob("session-*.json")).read_text())
    (c,) = doc["comparisons"]
    assert c["verdict"] == "slower" and c["candidate_runs"] == 2 and "1 fresh process(es)" in c["method"]
    assert [r["summary"]["median"] for r in doc["replicas"]["fixtured"]] == [20.0]


SLOW = '''
import time
from pathlib import Path
from bench_core import Scenario

def test_quick(bench):
    bench.run(Scenario("quick", ("compute",)), lambda: None)

def test_slow(bench):
    Path("started").write_text("yes")
    time.sleep(60)
'''


def test_sigterm_ends_the_session_cleanly_keeping_what_was_measured(pytester, tmp_path):
    """#28: SIGTERM (a cancelled CI job) left the revision's temporary tree behind and no word of what was measured.
    Now it is an interrupt: the tree is removed, the session file keeps the scenario measured before it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    committed(pytester, test_slow=SLOW)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--bench-against", "HEAD",
                             "--bench-quick", "-k", "quick or slow"], cwd=pytester.path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not (pytester.path / "started").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert list(tmp_path.glob("bench_core-rev-*")), "the revision's tree exists while the session runs"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert not list(tmp_path.glob("bench_core-rev-*")), "the revision's tree was left behind"
    (session,) = (pytester.path / ".bench" / "results").glob("session-*.json")
    assert [r["scenario"]["name"] for r in json.loads(session.read_text())["results"]] == ["quick"]


LEAKY = '''
import os
import subprocess
import torch
from bench_core import Scenario

def test_a_leaky(bench):
    torch.set_default_dtype(torch.float64)
    torch.backends.mkldnn.enabled = False
    os.environ["BENCH_LEAK"] = "1"
    subprocess.Popen(["sleep", "120"])
    bench.run(Scenario("leaky", ("compute",)), lambda: torch.ones(4).sum())

def test_b_after(bench):
    m = bench.run(Scenario("after", ("compute",)), lambda: torch.ones(4).sum())
    assert torch.get_default_dtype() == torch.float32 and torch.backends.mkldnn.enabled
    assert "BENCH_LEAK" not in os.environ
'''


def test_a_scenario_that_leaves_state_changed_or_a_process_running_is_named_and_undone(pytester):
    """#28: a scenario that set float64 as the default dtype made the next one measure float64 while its record
    said float32, and a process it started outlived the session: each scenario now starts from the session's
    state, and the one that changed it is named."""
    import os

    pytester.makepyfile(test_leaky=LEAKY)
    res = pytester.runpytest("-p", "no:cacheprovider", "--bench-quick", "--bench-no-out", "--bench-wide")
    res.assert_outcomes(passed=2)
    line = next(x for x in res.stdout.lines if "left behind" in x)
    assert line.startswith("test_a_leaky left behind") and "default dtype torch.float32 -> torch.float64" in line
    assert "mkldnn True -> False" in line and "BENCH_LEAK None -> '1'" in line and "1 process(es)" in line
    pid = int(line.split("still running (")[1].split(")")[0])
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_paths_resolve_in_the_project_even_when_an_absolute_argument_moves_pytests_rootdir(pytester, tmp_path):
    """#28: `--bench-md /abs/summary.md` (as $GITHUB_STEP_SUMMARY is) moved pytest's rootdir to a common ancestor
    and the baseline went to a baselines/ folder outside the repository."""
    committed(pytester, test_x="from bench_core import Scenario\n\ndef test_x(bench):\n"
                               "    bench.run(Scenario('x', ('compute',)), lambda: None)\n")
    summary = tmp_path / "elsewhere" / "summary.md"
    summary.parent.mkdir()
    summary.write_text("")
    res = pytester.runpytest("-p", "no:cacheprovider", "--bench-quick", "--bench-md", str(summary),
                             "--bench-save", "b")
    res.assert_outcomes(passed=1)
    assert (pytester.path / "baselines" / "b.json").exists() and "bench_core: results" in summary.read_text()


def test_storing_or_gating_a_share_of_the_suite_under_xdist_is_refused():
    """#28: `pytest -n 2 --bench-save x` stored a baseline holding one of two scenarios, without a word."""
    from types import SimpleNamespace

    from bench_core.shells.plugin import xdist_share

    plain = SimpleNamespace(getoption=lambda name, default=None: default)
    controller = SimpleNamespace(getoption=lambda name, default=None: 2 if name == "numprocesses" else default)
    worker = SimpleNamespace(getoption=plain.getoption, workerinput={"workerid": "gw1"})
    assert (xdist_share(plain), xdist_share(controller), xdist_share(worker)) == (None, "-n 2", "worker gw1")


def test_a_worker_of_xdist_refuses_to_store_its_share(pytester):
    pytester.makeconftest("import pytest\n\n@pytest.hookimpl(tryfirst=True)\ndef pytest_configure(config):\n"
                          "    config.workerinput = {'workerid': 'gw0'}\n")
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    res = pytester.runpytest("--bench-save", "b")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*under pytest-xdist (worker gw0) each process runs only its share*"])


def test_strict_fails_a_baseline_scenario_that_was_not_run_unless_it_was_left_out_on_purpose(bt):
    """#28: a skipped or renamed scenario under --bench-compare was one line, and with -k nothing was said; the
    outcome line now counts it, and --bench-strict fails the session unless -k or -m left it out."""
    bt.makepyfile(test_b=FAKE_BENCH.format(level=2.0))
    for i in range(3):
        bt.runpytest("--bench-save", "main", *(["--bench-append"] if i else []), "--bench-repeats", "6",
                     "--bench-no-out").assert_outcomes(passed=2)
    bt.makepyfile(test_b=FAKE_BENCH.format(level=2.0).replace('"beta"', '"beta_renamed"'))
    res = bt.runpytest("--bench-compare", "main", "--bench-repeats", "6", "--bench-no-out", "--bench-strict",
                       "--bench-min-runs", "1", "--bench-max-runs", "1")
    assert res.ret == 1
    out = " ".join(res.stdout.str().split())
    assert "1 in the baseline but not run now" in out and "--bench-strict: 1 scenario(s) of the baseline were " \
                                                           "not run now (beta)" in out
    res = bt.runpytest("--bench-compare", "main", "--bench-repeats", "6", "--bench-no-out", "--bench-strict",
                       "--bench-min-runs", "1", "--bench-max-runs", "1", "-k", "alpha")
    assert "were not run now" not in res.stdout.str()
