"""Diagnose mode: rules on small synthetic traces, redaction, and one real CPU profiler pass."""
import json
from collections import Counter

import pytest

from bench_core.core.redact import describe, redact
from bench_core.output.tables import hypotheses_table
from bench_core.workflows.diagnose.trace_analysis import analyze, facts, self_times, top_level


def X(name, ts, dur, cat="cpu_op", tid=1, **args):
    e = {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "tid": tid}
    if args:
        e["args"] = args
    return e


def steps(n, length=1000):
    return [X(f"ProfilerStep#{i}", i * length, length, cat="user_annotation") for i in range(n)]


def test_input_bound_when_the_gpu_idles_during_batch_read():
    ev = steps(3)
    for i in range(3):
        t = i * 1000
        ev.append(X("stage::batch_read", t, 600, cat="user_annotation"))
        ev.append(X("gemm_kernel", t + 650, 300, cat="kernel", tid=7))
    f, rows = analyze(ev)
    assert f.gpu_observed and f.steps == 3 and f.gpu_busy_us == pytest.approx(300)
    (r,) = [r for r in rows if r.rule == "input_bound"]
    assert "idle for 600 us per step" in r.observation and "100%" in r.observation
    # the next check speaks of the user's project, never of this repository's benchmark files
    assert "batch already prepared on the device" in r.next_check and "benchmarks/" not in r.next_check


def test_no_input_bound_row_when_the_gpu_is_busy_while_reading():
    ev = steps(2)
    for i in range(2):
        ev.append(X("stage::batch_read", i * 1000, 500, cat="user_annotation"))
        ev.append(X("k", i * 1000, 900, cat="kernel", tid=7))
    assert not [r for r in analyze(ev)[1] if r.rule == "input_bound"]


def test_cpu_only_trace_reports_gpu_as_not_observed():
    ev = steps(2) + [X("stage::batch_read", i * 1000, 400, cat="user_annotation") for i in range(2)]
    f, rows = analyze(ev)
    assert not f.gpu_observed and f.gpu_busy_us is None
    assert "GPU activity not observed in this trace" in f.notes
    (r,) = [r for r in rows if r.rule == "input_bound"]
    assert "device idle time not observed" in r.observation
    assert "GPU busy not observed" in hypotheses_table(rows, f)


def test_repeated_same_size_h2d_copy():
    ev = steps(4)
    for i in range(4):
        ev.append(X("Memcpy HtoD (Pageable -> Device)", i * 1000 + 10, 5, cat="gpu_memcpy", tid=7, bytes=40))
    ev.append(X("Memcpy HtoD (Pageable -> Device)", 3500, 50, cat="gpu_memcpy", tid=7, bytes=4096))
    rows = [r for r in analyze(ev)[1] if r.rule == "repeated_h2d"]
    assert len(rows) == 1 and "40-byte host-to-device copy happens 4 times in 4 steps" in rows[0].observation
    assert "create it once" in rows[0].next_check and "bench.ab" in rows[0].next_check


def test_fragmented_kernels():
    ev = steps(2, length=10000)
    ev += [X("add_kernel", i * 20, 4, cat="kernel", tid=7) for i in range(400)]
    (r,) = [r for r in analyze(ev)[1] if r.rule == "fragmented"]
    assert r.observation.startswith("200 kernels per step, 100% of them shorter than 10 us")
    assert "fuse the work" in r.next_check and "bench.ab" in r.next_check and "benchmarks/" not in r.next_check


def test_fragmented_cpu_ops_count_only_top_level():
    ev = steps(1, length=100000)
    for i in range(150):
        ev.append(X("aten::add", i * 100, 5))
        ev.append(X("aten::empty", i * 100 + 1, 1))   # nested inside the add: not a separate call
    assert len(top_level([e for e in ev if e["cat"] == "cpu_op"])) == 150
    (r,) = [r for r in analyze(ev)[1] if r.rule == "fragmented"]
    assert r.observation.startswith("150 top-level operators per step")


def test_dominant_operator_by_self_time():
    ev = steps(1, length=10000) + [X("aten::linear", 0, 1000), X("aten::mm", 10, 900), X("aten::relu", 2000, 100)]
    st = self_times(ev)
    assert st == pytest.approx({"aten::linear": 100, "aten::mm": 900, "aten::relu": 100})
    (r,) = [r for r in analyze(ev)[1] if r.rule == "dominant_op"]
    assert "aten::mm takes 82% of self CPU time" in r.observation
    assert "bench_core.ab" in r.next_check


def test_a_leading_operator_is_named_with_its_share_calls_and_the_runner_up():
    # one matmul at 41% of the time: below "dominant", but the clear leader (the next is 15%)
    ev = steps(2, length=10000)
    for i in range(2):
        t = i * 10000
        ev += [X("aten::mm", t, 410), X("aten::add", t + 500, 150), X("aten::relu", t + 700, 150),
               X("aten::mul", t + 900, 145), X("aten::sum", t + 1100, 145)]
    rows = analyze(ev)[1]
    (r,) = [r for r in rows if r.rule == "leading_op"]
    assert "aten::mm takes 41% of self CPU time (410 us per step, 1 calls per step; the next, aten::add, 15%)" \
        in r.observation
    assert not [r for r in rows if r.rule == "dominant_op"]


def test_no_rule_matches_a_balanced_trace():
    ev = steps(1) + [X(f"op{i}", i * 100, 90) for i in range(5)]
    f, rows = analyze(ev)
    assert rows == [] and "no rule matched" in hypotheses_table(rows, f)


def test_trace_without_step_markers_says_so():
    f = facts([X("aten::mm", 0, 10)])
    assert f.steps == 0 and f.step_us is None
    assert any("no ProfilerStep markers" in n for n in f.notes)


@pytest.mark.parametrize("planted, kind", [
    ("contact jane.doe@example.com now", "email"),
    ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "token"),
    ("sk-proj-ABCDEFGHIJKLMNOPQRST", "token"),
    ("password=hunter2", "secret"),
    ("/home/alice/data/train.bin", "home_path"),
    ("/Users/bob/models/x.pt", "home_path"),
    ("C:\\Users\\carol\\x.pt", "home_path"),
])
def test_redaction_finds_and_replaces(planted, kind):
    doc = {"traceEvents": [{"name": f"label {planted}", "args": {"File": planted}}], planted: 1}
    clean, found = redact(doc)
    text = json.dumps(clean)
    assert f"<redacted:{kind}>" in text and found[kind] >= 3   # value, arg and key
    for secret_part in ("jane.doe", "ghp_abc", "hunter2", "alice", "bob", "carol", "ABCDEFGHIJKLMNOP"):
        assert secret_part not in text
    assert describe(found).startswith("redacted")


def test_redaction_leaves_ordinary_names_alone():
    doc = {"traceEvents": [{"name": "aten::mm", "args": {"Input Dims": [[2, 3]]}}, {"name": "stage::forward"}]}
    clean, found = redact(doc)
    assert clean == doc and found == Counter() and describe(found) == "nothing sensitive found"


PROFILED = '''
import torch
from bench_core import Scenario, stage

def test_p(bench):
    a = torch.randn(64, 64)
    def step():
        with stage("batch_read"):
            b = torch.randn(64, 64)
        with stage("forward"):
            with torch.profiler.record_function("user jane.doe@example.com /home/alice/x"):
                (a @ b).relu()
    bench.run(Scenario("p", ("batch_read", "forward")), step)
'''


def test_profile_pass_writes_a_redacted_trace_and_keeps_results_clean(pytester):
    pytester.makepyfile(test_p=PROFILED)
    res = pytester.runpytest("--bench-profile", "prof", "--bench-repeats", "3")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["*bench_core diagnose: p (profiled separately; not in any result)*",
                              "*Self CPU time total*", "*3 profiled steps*stages (us/step): batch_read*forward*",
                              "*trace: *p.trace.json (redacted * email, * home_path)*"])
    (trace,) = (pytester.path / "prof").glob("*.trace.json")
    text = trace.read_text()
    assert "jane.doe" not in text and "alice" not in text and "<redacted:email>" in text
    assert "stage::forward" in text
    # the hypotheses are kept beside their trace, redacted as the trace is
    kept = json.loads(trace.with_name(trace.name.replace(".trace.json", ".hypotheses.json")).read_text())
    assert kept["trace"] == trace.name and kept["facts"]["steps"] == 3 and "forward" in kept["facts"]["stage_us"]
    assert isinstance(kept["hypotheses"], list) and "jane.doe" not in json.dumps(kept)
    (session,) = (pytester.path / ".bench" / "results").glob("session-*.json")
    doc = json.loads(session.read_text())
    assert len(doc["results"][0]["host_ms"]) == 3          # the profiled steps never became samples
    assert "profile" not in json.dumps(doc).lower()
    # a second pass never overwrites the first trace (the writer a pass uses, called as a second pass would)
    from bench_core.files import artifacts

    again = artifacts.write_trace(pytester.path / "prof", "p", {"traceEvents": []})
    artifacts.write_hypotheses(again, {"scenario": "p"})
    assert again != trace and trace.read_text() == text
    assert len(list((pytester.path / "prof").glob("*.trace.json"))) == 2
    assert len(list((pytester.path / "prof").glob("*.hypotheses.json"))) == 2


def test_gpu_profiling_without_cuda_activity_is_refused(pytester, monkeypatch):
    import torch

    import bench_core.timing.devices

    monkeypatch.setattr(bench_core.timing.devices, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.profiler, "supported_activities", lambda: {torch.profiler.ProfilerActivity.CPU})
    pytester.makepyfile(test_p=PROFILED)
    res = pytester.runpytest("--gpu", "--bench-profile", "prof")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*cannot collect CUDA activity*refusing to present a CPU-only trace*"])


def test_stage_is_inert_outside_the_profile_pass():
    from bench_core.workflows.diagnose.profile import _ACTIVE, stage

    assert not _ACTIVE["on"]
    with stage("forward") as s:
        assert s._rf is None


# Planted where a user's secrets end up: the scenario's name, a stage label, a record_function label, an
# operator's argument. Kept broad on purpose: the forms an issue names are examples, not the whole set.
SECRETS = {
    "email": "jane.doe@example.com",
    "github token after an underscore": "cfg_ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "bearer": "Bearer abcdef0123456789qwerty",
    "authorization header": "Authorization: Basic dXNlcjpwYXNzd29yZA==",
    "url credentials": "https://bob:hunter2@example.com/data",
    "password assignment": "db_password=s3cr3tpass",
    "aws key": "AKIAABCDEFGHIJKLMNOP",
    "openai-style key": "sk-proj-ABCDEFGHIJKLMNOPQRSTUV",
    "huggingface token": "hf_abcdefghijklmnopqrstuvwxyz",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "home path": "/home/alice/private/data.bin",
}
# the part of each that must never be seen
NEEDLES = ["jane.doe", "ghp_abcdefghij", "abcdef0123456789qwerty", "dXNlcjpwYXNzd29yZA", "hunter2", "s3cr3tpass",
           "AKIAABCDEFGHIJKLMNOP", "sk-proj-ABCDEF", "hf_abcdefghij", "eyJhbGciOiJIUzI1NiJ9", "alice"]

PLANTED = '''
import torch
from bench_core import Scenario, stage

SECRETS = {secrets!r}

def test_planted(bench):
    a = torch.randn(32, 32)
    def step():
        for kind, secret in SECRETS.items():
            with stage("load " + secret):
                with torch.profiler.record_function(kind + " " + secret):
                    (a @ a).relu()
    bench.run(Scenario("run by jane.doe@example.com", ("compute",)), step)
'''


@pytest.fixture(scope="module")
def planted_passes(tmp_path_factory):
    """Both diagnose passes of the test below, redacting and refusing, started at once: each a pytest process of its
    own in a folder of its own, as `pytester.runpytest_subprocess` starts one (its environment, --basetemp, stdin
    closed; a process of its own, so what reaches the file descriptors is seen too). On 2 cores the pair takes about
    the time of one; each test reads only its own pass."""
    import os
    import subprocess
    import sys

    started = {}
    for refuse in (False, True):
        path = tmp_path_factory.mktemp("refuse" if refuse else "redact")
        (path / "test_planted.py").write_text(PLANTED.format(secrets=SECRETS))
        env = {**os.environ, "HOME": str(path), "USERPROFILE": str(path), "PY_COLORS": "0",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(path), os.environ.get("PYTHONPATH", "")]))}
        for name in ("PYTEST_ADDOPTS", "TOX_ENV_DIR"):
            env.pop(name, None)
        args = [sys.executable, "-mpytest", f"--basetemp={path / 'runpytest-0'}", "--bench-profile", "prof",
                "--bench-repeats", "2", "--bench-profile-tensorboard", "-rA",
                *(["--bench-profile-refuse-sensitive"] if refuse else [])]
        out, err = (path / "stdout").open("w+", encoding="utf8"), (path / "stderr").open("w+", encoding="utf8")
        started[refuse] = (path, subprocess.Popen(args, cwd=path, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                                  stderr=err), out, err)
    yield started
    for _, proc, out, err in started.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
        err.close()


@pytest.mark.parametrize("refuse", [False, True], ids=["redact", "refuse"])
def test_no_planted_secret_reaches_any_file_or_line_a_diagnose_pass_produces(planted_passes, refuse):
    path, proc, out, err = planted_passes[refuse]
    ret = proc.wait(timeout=300)
    lines = []
    for f in (out, err):
        f.seek(0)
        lines.append(f.read().splitlines())
    res = pytest.RunResult(ret, *lines, duration=0.0)
    res.assert_outcomes(passed=1)
    shown = res.stdout.str() + res.stderr.str()
    written = {p: p.read_text(errors="replace") for p in (path / "prof").rglob("*") if p.is_file()}
    names = [str(p) for p in (path / "prof").rglob("*")]
    for needle in NEEDLES:
        assert needle not in shown, f"{needle!r} printed"
        assert not [p for p, text in written.items() if needle in text], f"{needle!r} written"
        assert not [n for n in names if needle in n], f"{needle!r} in a file name"
    if refuse:   # a refusal refuses everywhere: no file (not even TensorBoard's copy), and nothing of the trace shown
        assert not written and "nothing of it shown" in shown
        res.stdout.fnmatch_lines(["*trace: not written (redacted *(refused: no trace written, nothing of it shown))*"])
    else:
        assert written and "<redacted:token>" in "".join(written.values())



def test_gpu_copies_of_step_markers_are_not_counted_twice():
    # GPU traces carry a gpu_user_annotation copy of each ProfilerStep (issue 15)
    ev = steps(3) + [X(f"ProfilerStep#{i}", i * 1000 + 5, 990, cat="gpu_user_annotation", tid=7) for i in range(3)]
    f = facts(ev)
    assert f.steps == 3 and f.step_us == pytest.approx(1000)


def test_the_batch_copied_in_a_transfer_stage_is_not_a_re_created_constant():
    ev = steps(3)
    for i in range(3):
        t = i * 1000
        ev.append(X("stage::transfer", t, 100, cat="user_annotation"))
        ev.append(X("cudaMemcpyAsync", t + 10, 5, cat="cuda_runtime", correlation=2 * i))
        ev.append(X("Memcpy HtoD (Pinned -> Device)", t + 50, 40, cat="gpu_memcpy", tid=7, bytes=4096,
                    correlation=2 * i))
        # and a constant built and copied every step, outside the transfer stage
        ev.append(X("cudaMemcpyAsync", t + 500, 5, cat="cuda_runtime", correlation=2 * i + 1))
        ev.append(X("Memcpy HtoD (Pageable -> Device)", t + 520, 2, cat="gpu_memcpy", tid=7, bytes=40,
                    correlation=2 * i + 1))
    (r,) = [r for r in analyze(ev)[1] if r.rule == "repeated_h2d"]
    assert "a 40-byte host-to-device copy" in r.observation   # the 4096-byte batch copy is not reported


def test_the_profile_can_add_a_flops_sorted_table_of_the_profilers_estimates(pytester):
    pytester.makepyfile(test_f='''
import torch
from bench_core import Scenario

def test_f(bench):
    a, b = torch.randn(128, 128), torch.randn(128, 128)
    bench.run(Scenario("mm128", ("forward",)), lambda: (a @ b).relu())
''')
    res = pytester.runpytest("--bench-profile", "prof", "--bench-repeats", "3", "--bench-profile-flops")
    res.assert_outcomes(passed=1)
    # 3 profiled calls of a 128^3 matmul: 3 x 2 x 128^3 = 12.6 MFLOP; relu has no estimate and is left out
    res.stdout.fnmatch_lines(["*MFLOP (estimate)*", "aten::mm*12.6*"])
    text = res.stdout.str()
    flops_table = text[text.index("MFLOP (estimate)"):]
    assert "aten::relu" not in flops_table.split("Self CPU time total")[0]


# -- collectives in a trace, and what the ranks' traces say together -------------------------------------------
def _x(name, ts, dur, tid, cat="cpu_op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "cat": cat}


def test_collective_time_and_its_overlap_with_computation_on_the_cpu():
    from bench_core.workflows.diagnose.trace_analysis import facts

    ev = [_x("ProfilerStep#1", 0, 1000, 1, "user_annotation"), _x("aten::mm", 0, 400, 1),
          _x("gloo:all_reduce", 300, 400, 7, "user_annotation"),     # on gloo's own thread
          _x("aten::mm", 500, 50, 9)]                                 # another thread's op is not the step's compute
    f = facts(ev)
    assert (f.comm_us, f.comm_overlap_us) == (400.0, 100.0)


def test_collective_time_on_the_gpu_is_nccl_kernels_beside_other_kernels():
    from bench_core.workflows.diagnose.trace_analysis import facts

    ev = [_x("ProfilerStep#1", 0, 1000, 1, "user_annotation"),
          _x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 300, 400, 8, "kernel"), _x("sgemm_128x64", 0, 400, 7, "kernel")]
    f = facts(ev)
    assert (f.comm_us, f.comm_overlap_us) == (400.0, 100.0)
    assert facts([_x("ProfilerStep#1", 0, 1000, 1, "user_annotation")]).comm_us is None   # no collective: not 0


def test_the_ranks_traces_together_say_communication_is_exposed_and_who_waits():
    from bench_core.workflows.diagnose.trace_analysis import TraceFacts, rank_hypotheses

    def f(comm, overlap):
        return TraceFacts(3, 10000.0, False, None, {}, (), comm, overlap)
    rows = rank_hypotheses([f(5000.0, 500.0), f(1000.0, 500.0)])
    assert [r.rule for r in rows] == ["comm_not_overlapped", "rank_waits"]
    assert "5000 us of it" not in rows[0].observation and "25%" in rows[0].observation
    assert rows[1].observation.startswith("rank 0 spends 5000 us") and "rank 1 arrives last" in rows[1].hypothesis
    hidden = rank_hypotheses([f(1000.0, 900.0), f(1000.0, 950.0)])
    assert hidden == []                                   # overlapped, and nobody waits
    assert rank_hypotheses([TraceFacts(3, 10000.0, False, None, {})] * 2) == []


def _golden_trace(name):
    import gzip
    from pathlib import Path

    path = Path(__file__).parent / "golden" / name
    with (gzip.open(path, "rt") if name.endswith(".gz") else open(path)) as f:
        return json.load(f)


def test_the_rules_on_real_h200_traces():
    """Two traces the profile pass wrote on an NVIDIA H200 (scripts/gpu_check.sh, 2026-12-04; docs/gpu.md): the
    synthetic traces above stand in for these, so the rules are held to what a real GPU trace looks like."""
    mm = _golden_trace("h200_trace_matmul_relu.json")
    assert mm["deviceProperties"][0]["name"] == "NVIDIA H200"
    f, found = analyze(mm["traceEvents"])
    # the GPU copies of the step markers are in the trace, and not counted
    markers = [e for e in mm["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert len(markers) == 6 and f.steps == 3
    assert f.gpu_observed and f.kernel_us == pytest.approx(58.06, abs=0.01)
    assert f.gpu_busy_us == pytest.approx(f.kernel_us, rel=1e-3)   # one stream, kernels back to back
    assert [h.rule for h in found] == ["dominant_op"] and "gemm" in found[0].observation

    cnn = _golden_trace("h200_trace_cnn_dataloader.json.gz")
    f, found = analyze(cnn["traceEvents"])
    assert f.steps == 3 and set(f.stage_us) == {"batch_read", "transfer", "forward", "backward", "optimizer_step"}
    assert sum(f.stage_us.values()) <= f.step_us           # stages lie inside their step
    assert f.kernel_us <= f.step_us and f.gpu_busy_us == pytest.approx(123.1, abs=0.1)
    assert [h.rule for h in found] == ["input_bound"]
    assert "372 us per step while a batch is read" in found[0].observation
    _, secrets = redact(cnn)
    assert not secrets      # what the profile pass kept of a real trace has nothing to redact
