"""Work signatures (#29): what a step does, counted exactly, and two of them compared as facts beside the timing."""
import json

import pytest
import torch

from bench_core.core.signature import Signature
from bench_core.deciding.signature_diff import differences, grown
from bench_core.timing.signature_count import record

A = torch.randn(64, 64)
BIG = torch.randn(512, 512)     # 1 MB of float32


def step():
    return (A @ A).relu()


def test_a_signature_counts_operators_and_is_the_same_on_every_call():
    first, again = record(step), record(step)
    assert first == again
    assert first.operators["aten.mm"] == 1 and first.operators["aten.relu"] == 1
    assert first.syncs == {} and first.allocations == 2 and first.allocated_bytes == 2 * 64 * 64 * 4


@pytest.mark.parametrize("changed, fact", [
    (lambda: (step(), float(A.sum().item())), "+1 synchronization(s) per step: aten._local_scalar_dense"),
    (lambda: (step(), A @ A), "+1 aten.mm per step"),
    (lambda: (step(), BIG.clone()), "+1 copies same device per step (+1.00 MB)"),
])
def test_each_change_of_what_a_step_does_is_named_exactly(changed, fact):
    facts = differences(record(step), record(changed))
    assert fact in facts
    assert differences(record(step), record(step)) == []


def test_an_extra_clone_is_an_allocation_and_counters_that_grew_are_named():
    base, cand = record(step), record(lambda: (step(), BIG.clone()))
    assert cand.allocations == base.allocations + 1 and cand.allocated_bytes - base.allocated_bytes == BIG.nbytes
    assert grown(base, cand, ("syncs", "copies", "allocations")) == ["copies: 0 -> 1 per step",
                                                                     f"allocations: {base.allocations} -> "
                                                                     f"{cand.allocations} per step"]
    assert grown(cand, base, ("copies",)) == []     # fewer is never growth


def test_a_backward_counts_its_operators_too():
    w = torch.randn(8, 8, requires_grad=True)
    sig = record(lambda: (w @ w).sum().backward())
    assert sig.operators["aten.mm"] >= 3     # the forward's, and the backward's two


def test_a_signature_refuses_what_cannot_be_counts_and_survives_its_file_format():
    with pytest.raises(ValueError, match="syncs must map names to non-negative integer counts"):
        Signature(syncs={"aten._local_scalar_dense": -1})
    with pytest.raises(ValueError, match="version 9 is not 1"):
        Signature.from_dict({"version": 9})
    sig = record(lambda: (step(), A.sum().item()))
    assert Signature.from_dict(json.loads(json.dumps(sig.to_dict()))) == sig


def test_a_stored_measurement_keeps_its_signature_and_a_bad_one_is_named(tmp_path):
    from bench_core.core.errors import InvalidRecord
    from bench_core.files import storage
    from helpers import meas

    m = meas([1.0, 1.1])
    from dataclasses import replace

    m = replace(m, signature=record(step))
    back = storage.measurement_from_doc(json.loads(json.dumps(storage.measurement_doc(m))))
    assert back.signature == m.signature
    doc = storage.measurement_doc(m)
    doc["signature"]["allocations"] = "two"
    with pytest.raises(InvalidRecord, match="signature: work signature: allocations must be a non-negative"):
        storage.measurement_from_doc(doc)


SIDES = '''
import torch
from bench_core import Scenario

A = torch.randn(64, 64)


def test_step(bench):
    def step():
        y = (A @ A).relu()
        {extra}
    bench.run(Scenario("step", ("forward",)), step)
'''


def test_side_by_side_names_an_extra_sync_as_a_fact_and_no_growth_fails_it(pytester):
    from test_plugin import committed

    committed(pytester, test_s=SIDES.format(extra="pass"))
    pytester.makepyfile(test_s=SIDES.format(extra="float(y.sum().item())"))
    args = ("--bench-against", "HEAD", "--bench-quick", "--bench-no-out")
    res = pytester.runpytest(*args, "--bench-no-growth", "syncs")
    out = " ".join(res.stdout.str().split())
    assert "step: work signature: +1 synchronization(s) per step: aten._local_scalar_dense" in out
    assert "step: work signature: +1 aten.sum per step" in out
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*scenario 'step': its work grew (syncs: 0 -> 1 per step); timing *"])


def test_the_stored_gate_and_the_cli_name_the_same_facts(pytester, capsys):
    from bench_core.shells.cli import main

    pytester.makepyfile(test_s=SIDES.format(extra="pass"))
    pytester.runpytest("--bench-save", "main", "--bench-signature", "--bench-quick",
                       "--bench-no-out").assert_outcomes(passed=1)
    pytester.makepyfile(test_s=SIDES.format(extra="A @ A"))
    # one run decides, whatever it says: the facts are the subject (an undecided verdict on this machine's clock
    # would otherwise start fresh processes)
    res = pytester.runpytest("--bench-compare", "main", "--bench-signature", "--bench-quick", "--bench-min-runs", "1",
                             "--bench-max-runs", "1")
    out = " ".join(res.stdout.str().split())
    assert "step: work signature: +1 aten.mm per step" in out
    (path,) = (pytester.path / ".bench" / "results").glob("session-*.json")
    capsys.readouterr()
    code = main(["compare", str(pytester.path / "baselines" / "main.json"), str(path), "--json",
                 "--no-growth", "operators"])
    (c,) = json.loads(capsys.readouterr().out)
    assert "+1 aten.mm per step" in c["facts"] and c["grown"] and code == 1


def test_process_mode_counts_each_side_in_its_own_server(pytester):
    """Each side's server counts its own step, so a scenario compared in processes gets its facts too."""
    from test_plugin import committed

    committed(pytester, test_s=SIDES.format(extra="pass"))
    pytester.makepyfile(test_s=SIDES.format(extra="float(y.sum().item())"))
    res = pytester.runpytest("--bench-against", "HEAD", "--bench-against-processes", "--bench-quick",
                             "--bench-malloc", "pinned",   # one pair of servers: each side's signature counted once
                             "--bench-out", "out", "--bench-no-growth", "syncs")
    res.assert_outcomes(failed=1)
    out = " ".join(res.stdout.str().split())
    assert "step: work signature: +1 synchronization(s) per step: aten._local_scalar_dense" in out
    assert "each side a pytest process of its own" in out
    (path,) = (pytester.path / "out").glob("session-*.json")
    (rec,) = json.loads(path.read_text())["against"]["scenarios"]
    assert rec["comparison"]["grown"] == ["syncs: 0 -> 1 per step"]
    ran = rec["code"]["processes_ran"]
    assert ran["candidate"][0]["signature"]["syncs"] == {"aten._local_scalar_dense": 1}
    assert ran["baseline"][0]["signature"]["syncs"] == {}


DECLARED = SIDES.replace('Scenario("step", ("forward",))', 'Scenario("step", ("forward",), no_growth=("syncs",))')


def test_a_scenario_that_declares_its_own_no_growth_counters_is_held_to_them_without_an_option(pytester):
    """no_growth on the Scenario: its signature is counted in every run, a baseline saved without any option has
    one, and an extra sync fails the item against that baseline and against a revision, in one process and in
    process mode (each side's server counts because the scenario asks)."""
    from test_plugin import committed

    committed(pytester, test_s=DECLARED.format(extra="pass"))
    res = pytester.runpytest("--bench-save", "main", "--bench-quick", "--bench-no-out")
    res.assert_outcomes(passed=1)
    saved = json.loads((pytester.path / "baselines" / "main.json").read_text())
    assert saved["runs"][0]["results"][0]["signature"]["syncs"] == {}
    assert saved["runs"][0]["results"][0]["scenario"]["no_growth"] == ["syncs"]
    pytester.makepyfile(test_s=DECLARED.format(extra="float(y.sum().item())"))
    for args in (("--bench-compare", "main", "--bench-min-runs", "1", "--bench-max-runs", "1"),   # no fresh process
                 ("--bench-against", "HEAD"),
                 ("--bench-against", "HEAD", "--bench-against-processes", "--bench-malloc", "pinned")):
        res = pytester.runpytest(*args, "--bench-quick", "--bench-no-out")
        res.assert_outcomes(failed=1)
        res.stdout.fnmatch_lines(["*scenario 'step': its work grew (syncs: 0 -> 1 per step)*"])


def test_a_declared_no_growth_counter_is_checked_by_name():
    from bench_core import Scenario
    from bench_core.core.errors import InvalidRecord
    from bench_core.files.storage import scenario_doc, scenario_from_doc

    s = Scenario("decode", ("forward",), no_growth="syncs")
    assert s.no_growth == ("syncs",) and scenario_from_doc(scenario_doc(s)) == s
    assert s.with_metadata(batch=4).no_growth == ("syncs",)
    with pytest.raises(InvalidRecord, match="scenario 'decode': unknown counter.*'sync'.*graph_breaks"):
        Scenario("decode", ("forward",), no_growth=("sync",))
    with pytest.raises(InvalidRecord, match="no_growth must be a list"):
        scenario_from_doc({**scenario_doc(s), "no_growth": "syncs"})


def _compiled_step(body):
    """A step compiled by torch.compile (the eager backend: dynamo's own graphs, no code generation)."""
    x = torch.randn(16)

    def f(x):
        y = x.sin()
        body(y)
        return y.cos()
    g = torch.compile(f, backend="eager")
    return lambda: g(x)


def test_a_warm_compiled_steps_graphs_are_counted_and_a_break_added_to_it_is_a_difference():
    """Compiled before the counted call (a warmed-up step, as a scenario's warmup leaves it): the graphs one call
    runs come from the profiler's compiled regions, and its breaks, known only when it compiled, are not observed
    (never written as 0). A break added to the warm step is one graph more: a difference."""
    from bench_core.output.tables import signature_table
    from helpers import meas

    x = torch.randn(16)

    def plain_step(x):
        return x.sin().cos()

    def broken_step(x):
        y = x.sin()
        print("", end="")   # a graph break: the step runs as two graphs
        return y.cos()
    plain, broken = (lambda f=torch.compile(plain_step, backend="eager"): f(x),
                     lambda f=torch.compile(broken_step, backend="eager"): f(x))
    plain(), broken()   # warm: compiled before the counted call
    a, b = record(plain), record(broken)
    assert (a.graphs, a.graph_breaks, b.graphs, b.graph_breaks) == (1, None, 2, None)
    assert differences(a, b) == ["torch.compile graphs 1 -> 2"]
    assert Signature.from_dict(b.to_dict()) == b
    from dataclasses import replace

    text = signature_table([replace(meas([1.0, 1.1]), signature=b)], wide=True)
    assert "n/o" in text


def test_a_graph_break_and_a_recompilation_per_call_are_named():
    import torch._dynamo

    torch._dynamo.reset()
    plain = record(_compiled_step(lambda y: None))
    assert plain.graphs == 1 and plain.graph_breaks == 0 and plain.recompiles == 0
    torch._dynamo.reset()
    broken = record(_compiled_step(lambda y: print("in forward")))
    assert broken.graphs == 2 and broken.graph_breaks == 1 and broken.break_reasons
    (fact,) = [f for f in differences(plain, broken) if f.startswith("graph breaks")]
    assert fact.startswith("graph breaks 0 -> 1: ") and "print" in fact
    assert grown(plain, broken, ("graph_breaks",)) == ["graph_breaks: 0 -> 1 per step"]

    calls = [0]      # a Python int the graph specializes on (dynamic=False): its guard fails on every call
    torch._dynamo.reset()
    x = torch.randn(16)
    g = torch.compile(lambda x, n: x * n, backend="eager", dynamic=False)

    def step():
        calls[0] += 1
        return g(x, calls[0])
    again = record(step)
    assert again.recompiles == 1
    assert any(d.startswith("recompilations per call 0 -> 1, the guard that failed: ")
               for d in differences(plain, again))
    torch._dynamo.reset()


def test_a_profiler_pass_counts_each_operators_calls_and_passes_alternate_sides():
    from bench_core.workflows.diagnose.moved import alternated, op_times

    times = op_times(lambda: [(A @ A).relu() for _ in range(4)], calls=3)
    assert times["aten::mm"][1] == 4 and times["aten::mm"][0] >= 0     # calls per step are counted exactly
    order = []
    got = alternated({"baseline": lambda: order.append("b") or 1, "candidate": lambda: order.append("c") or 2},
                     passes=3)
    assert order == ["b", "c", "c", "b", "b", "c"] and got == {"baseline": [1, 1, 1], "candidate": [2, 2, 2]}


def test_a_profiler_pass_in_a_fresh_fork_warms_its_step_as_a_round_does_before_profiling():
    from types import SimpleNamespace

    from bench_core.workflows.diagnose.moved import PASSES, op_times
    from bench_core.workflows.side_server import SERVED_PROFILE_CALLS, _profiled

    ran = []
    op_times(lambda: ran.append(1), calls=2)
    assert len(ran) == 1 + 2                           # one unprofiled call, then the profiled ones
    ran.clear()
    out = _profiled(SimpleNamespace(step=(lambda: ran.append(1), None), device="cpu", requested="s"))
    assert len(out["op_times"]) == PASSES, out         # the passes, each a sample of every operator's time
    # the served passes warm first (`warm_for`: at least one call, more while under ROUND_WARM_MS), then op_times
    assert len(ran) >= 1 + PASSES * (1 + SERVED_PROFILE_CALLS)


def test_self_times_from_the_profilers_raw_events_are_what_key_averages_gives():
    """#27: key_averages() took 0.43-0.66 s a side for two calls of a small CNN training step, in each profiler pass
    of a slower verdict; the raw events give the same figures in 0.04 s."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from bench_core.workflows.diagnose.moved import cpu_self_times

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(144, 2))
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    x = torch.randn(2, 3, 8, 8)

    def step():
        with record_function("my_step"):   # a user annotation around operators
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()                       # AdamW's div_ redispatches to itself: torch counts such a pair once
    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
        step()
    fast = cpu_self_times(prof)
    slow = {e.key: (e.self_cpu_time_total, e.count) for e in prof.key_averages()}
    assert set(fast) == set(slow) and "my_step" in fast and "aten::convolution_backward" in fast
    assert {k: n for k, (_, n) in fast.items()} == {k: n for k, (_, n) in slow.items()}
    assert all(abs(fast[k][0] - slow[k][0]) <= 1e-6 * max(1.0, abs(slow[k][0])) for k in slow)


@pytest.fixture(scope="module")
def fresh_process_imports():
    """One fresh process (torch imported once for both tests below): a signature recorded where the compiler is
    not loaded, then a profiler pass, then the compiler imported and the signature recorded again. Each check
    reads `sys.modules` right after the call it is about, so neither hides the other."""
    import subprocess
    import sys

    code = ("import sys, torch\n"
            "from bench_core.timing.signature_count import record\n"
            "from bench_core.workflows.diagnose.moved import op_times\n"
            "a = torch.ones(8, 8)\n"
            "def step():\n"
            "    (a @ a).relu().sum().item()\n"
            "before = record(step).to_dict()\n"
            "print('dynamo after record:', 'torch._dynamo' in sys.modules)\n"
            "t = op_times(lambda: torch.ones(8, 8) @ torch.ones(8, 8), calls=2)\n"
            "print('profiled:', t['aten::mm'][1], 'torch._inductor' in sys.modules)\n"
            "import torch._dynamo\n"
            "print('again:', record(step).to_dict() == before, before['operators'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return dict(line.split(": ", 1) for line in out.stdout.strip().splitlines())


def test_a_profiler_pass_does_not_import_the_compiler(fresh_process_imports):
    """torch.profiler's wrapper asks `hasattr(torch, "_inductor")`, which imports it: 0.79 s of a process's first pass
    here, in each side's server for its first slower verdict (#27)."""
    assert fresh_process_imports["profiled"].split() == ["1", "False"]


def test_recording_a_signature_does_not_import_the_compiler_and_counts_the_same_with_it(fresh_process_imports):
    """torch wraps a dispatch mode's handler so that the compiler stays out of it, and the wrapper imports
    torch._dynamo at its first call: most of a second of each side's server for its first scenario (#27). Where the
    compiler is not loaded there is nothing to keep out; where it is, the wrapper stays, and the counts are the same."""
    assert fresh_process_imports["dynamo after record"] == "False"
    again = fresh_process_imports["again"]
    assert again.startswith("True") and "aten.mm" in again and "aten._local_scalar_dense" in again


def test_an_ab_names_how_the_two_steps_differ(pytester):
    pytester.makepyfile(test_ab_signature_inner='''
import torch

A = torch.randn(32, 32)


def plain():
    A @ A


def reading():
    A @ A
    A.sum().item()


def test_two_ways(bench):
    res = bench.ab("two_ways", plain, reading)
    assert res.facts
''')
    # quick: fewer pairs, and no profiler pass after a slower or faster verdict (this machine's clock decides which;
    # the passes are tested below): the facts, counted after the A/B either way, are the subject
    res = pytester.runpytest("--bench-signature", "--bench-no-out", "--bench-quick")
    res.assert_outcomes(passed=1)
    out = " ".join(res.stdout.str().split())
    assert "two_ways: work signature: +1 synchronization(s) per step: aten._local_scalar_dense" in out


def test_an_ab_called_slower_or_faster_gets_a_profiler_pass_of_each_side(monkeypatch):
    """The A/B's decision (replaced here: the wiring is under test, not the timing) is slower: one profiler pass of
    each side follows, and where time moved is in the record and under the decisions table; an unchanged verdict
    gets none."""
    import importlib

    from bench_core.deciding.verdicts import SLOWER, UNCHANGED
    from bench_core.output.comparison_tables import decisions_table
    from bench_core.session import BenchSession, SessionConfig
    from helpers import ENV

    # the module objects the session will use (its own binding; sys.modules at call time): a pytester run in this
    # process may have replaced a module in sys.modules, and a patch of a stale object would miss
    ab_module = BenchSession.ab.__globals__["ab_workflow"]
    moved_module = importlib.import_module("bench_core.workflows.diagnose.moved")

    def one():
        A @ A

    def four():
        for _ in range(4):
            A @ A
    times = {one: {"aten::mm": (0.1, 1)}, four: {"aten::mm": (0.4, 4)}}
    monkeypatch.setattr(moved_module, "op_times", lambda fn, setup=None, device="cpu": times[fn])
    verdict = [SLOWER]
    monkeypatch.setattr(ab_module, "ab", lambda b, c, **kw: ab_module.ABResult(verdict[0], "decided", 0.25, 0.2, 0.3,
                                                                                1e-6))
    s = BenchSession(SessionConfig(results_dir=None), ENV)
    res = s.ab("mm", one, four)
    assert res.moved == ("aten::mm +0.3 ms per step [+0.3, +0.3] (0.1 -> 0.4 ms; calls 1 -> 4)",)
    assert res.to_dict()["moved"] == list(res.moved)
    text = " ".join(decisions_table(s.decisions, wide=True).split())
    assert "mm: time moved (profiler passes after measuring, a hypothesis): aten::mm +0.3 ms per step" in text
    verdict[0] = UNCHANGED
    assert s.ab("mm2", one, four).moved == ()


def test_instruction_counts_are_facts_beyond_their_tolerance_and_survive_the_file():
    from bench_core.core.signature import INSTRUCTION_TOLERANCE

    base = Signature(instructions=1_000_000)
    same = Signature(instructions=int(1_000_000 * (1 + INSTRUCTION_TOLERANCE / 2)))
    more = Signature(instructions=1_100_000)
    assert differences(base, same) == [] and grown(base, same, ["instructions"]) == []
    assert differences(base, more) == ["host instructions per step 1,000,000 -> 1,100,000 (+10.0%, callgrind)"]
    assert grown(base, more, ["instructions"]) == ["instructions: 1,000,000 -> 1,100,000 per step (+10.0%)"]
    assert grown(more, base, ["instructions"]) == [] and differences(more, base)   # fewer: a fact, not growth
    assert differences(Signature(), more) == []                                    # not counted: no fact
    assert Signature.from_dict(more.to_dict()) == more and "instructions" not in Signature().to_dict()
    with pytest.raises(ValueError, match="instructions must be a non-negative integer"):
        Signature(instructions=-1)


def test_one_steps_instructions_are_read_from_the_dump_callgrind_writes(tmp_path, monkeypatch):
    """`instructions` toggles collection around one call and reads the totals of the dump it asked for (callgrind's
    client requests replaced: they do nothing outside valgrind)."""
    import os

    import torch
    from bench_core.timing.signature_count import instructions

    calls = []

    def dump():
        (tmp_path / f"cg.{os.getpid()}.out.2").write_text("events: Ir\nsummary: 0\ntotals: 4321\n")
        (tmp_path / f"cg.{os.getpid()}.out.10").write_text("events: Ir\nsummary: 1234\ntotals: 1234\n")
    monkeypatch.setattr(torch._C, "_valgrind_supported_platform", lambda: True)
    monkeypatch.setattr(torch._C, "_valgrind_toggle", lambda: calls.append("on"))
    monkeypatch.setattr(torch._C, "_valgrind_toggle_and_dump_stats", dump)
    assert instructions(lambda: calls.append("step"), None, str(tmp_path)) == 1234   # the latest dump, by number
    assert calls == ["step", "step", "on", "step"]                                    # two warm calls, one counted
    assert not (tmp_path / f"cg.{os.getpid()}.out.10").exists()
    with pytest.raises(RuntimeError, match="running under valgrind"):
        instructions(lambda: None, None, str(tmp_path / "empty"))


# A stand-in for valgrind on PATH, for the wiring: it runs the server's command with callgrind's client requests
# replaced by a count of the Python calls between the toggles, written where callgrind writes its dumps.
FAKE_VALGRIND = '''#!/bin/sh
for a in "$@"; do
  case "$a" in
    --callgrind-out-file=*) export FAKE_CG_OUT="${a#--callgrind-out-file=}"; shift;;
    --*) shift;;
    *) break;;
  esac
done
export PYTHONPATH="{site}:$PYTHONPATH"
exec "$@"
'''

FAKE_SITE = '''
import os, sys
import torch

_n = [0, 0]


def _count(frame, event, arg):
    if event == "call":
        _n[0] += 1


def _on():
    sys.setprofile(_count)


def _dump():
    sys.setprofile(None)
    _n[1] += 1
    path = os.environ["FAKE_CG_OUT"].replace("%p", str(os.getpid())) + f".{_n[1]}"
    with open(path, "w") as f:
        f.write(f"totals: {_n[0] * 100}\\n")
    _n[0] = 0


torch._C._valgrind_supported_platform = lambda: True
torch._C._valgrind_toggle = _on
torch._C._valgrind_toggle_and_dump_stats = _dump
'''

CALLS = '''
from bench_core import Scenario


def helper():
    return 1


def test_step(bench):
    def step():
        for _ in range({n}):
            helper()
    bench.run(Scenario("step", ("forward",)), step)
'''


def test_side_by_side_counts_each_sides_instructions_in_a_process_of_its_own(pytester, tmp_path, monkeypatch):
    """--bench-instructions: each side's server runs under (a stand-in for) valgrind, counts one step, and the
    difference is a fact; --bench-no-growth instructions fails the item. Without valgrind: not counted, said."""
    import os

    from test_plugin import committed

    bin_dir, site = tmp_path / "bin", tmp_path / "site"
    bin_dir.mkdir()
    site.mkdir()
    (site / "sitecustomize.py").write_text(FAKE_SITE)
    (bin_dir / "valgrind").write_text(FAKE_VALGRIND.replace("{site}", str(site)))
    (bin_dir / "valgrind").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    committed(pytester, test_s=CALLS.format(n=10))
    pytester.makepyfile(test_s=CALLS.format(n=20))
    args = ("--bench-against", "HEAD", "--bench-quick", "--bench-no-out", "--bench-instructions",
            "--bench-malloc", "pinned")   # one pair of servers a side: cheaper, same point
    res = pytester.runpytest(*args, "--bench-no-growth", "instructions")   # the facts, and the growth failing it
    out = " ".join(res.stdout.str().split())
    assert "step: work signature: host instructions per step" in out and "callgrind)" in out
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*its work grew (instructions: * -> * per step (+*%))*"])

    import shutil

    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "valgrind" else which(name, *a, **k))
    res = pytester.runpytest(*args)
    assert "instructions not counted: valgrind is not installed" in " ".join(res.stdout.str().split())


def test_a_compiled_steps_cold_start_is_split_into_tracing_and_compilation():
    """torch.compile's own phase totals around the first call: tracing (dynamo) and the backend's compilation,
    both inside the cold start, reported under the results; a step that compiles nothing has no split (n/o)."""
    import torch._dynamo
    from bench_core import Scenario, measure
    from bench_core.output.tables import session_table

    torch._dynamo.reset()
    x = torch.randn(16)
    g = torch.compile(lambda x: x.sin().cos(), backend="eager")
    m = measure(lambda: g(x), scenario=Scenario("compiled", ("forward",)), warmup=0, repeats=3)
    c = m.cold_start
    assert c.tracing_ms > 0 and c.compiling_ms >= 0 and c.tracing_ms + c.compiling_ms <= c.first_call_ms
    assert "compiled: its cold start" in " ".join(session_table([m], wide=True).split())
    plain = measure(lambda: x.sin(), scenario=Scenario("plain", ("forward",)), warmup=0, repeats=3)
    assert plain.cold_start.tracing_ms is None and plain.cold_start.compiling_ms is None
    from bench_core.files.storage import measurement_doc, measurement_from_doc

    assert measurement_from_doc(measurement_doc(m)).cold_start == c


def test_a_stored_baselines_slower_verdict_says_where_the_time_moved(pytester):
    """With the work signature, each result keeps one profiler pass's time per operator, so a later run called
    slower against that baseline (on the fake clock) names the operators whose time moved, with their calls."""
    from test_fidelity import COUNTED_OP_TIMES
    from test_processes import MATMULS as body   # 1 or 16 matmuls a step, its time on the fake clock

    pytester.makeconftest(COUNTED_OP_TIMES)
    pytester.makepyfile(test_s=body.format(ms=1.0, n=1))
    for extra in ([], ["--bench-append"], ["--bench-append"]):   # each run keeps its profiler pass
        pytester.runpytest("--bench-save", "main", "--bench-signature", "--bench-no-out",
                           "--bench-repeats", "5", *extra).assert_outcomes(passed=1)
    saved = json.loads((pytester.path / "baselines" / "main.json").read_text())
    assert saved["runs"][0]["results"][0]["op_times"]["aten::mm"][1] == 1
    # sixteen matmuls against one: a move no slow pass hides, and a fake step that moves by more than they take
    pytester.makepyfile(test_s=body.format(ms=150.0, n=16))
    res = pytester.runpytest("--bench-compare", "main", "--bench-signature", "--bench-no-out", "--bench-repeats", "5",
                             "--bench-min-runs", "1")
    res.assert_outcomes(failed=1)
    out = " ".join(res.stdout.str().split())
    assert "step: time moved (profiler passes after measuring, a hypothesis): aten::mm +" in out
    assert "calls 1 -> 16)" in out


CHANGES = '''
import torch
import torch._dynamo
from bench_core import Scenario

A, BIG, X = torch.randn(64, 64), torch.randn(512, 512), torch.randn(16)
CHANGE = {change!r}
calls = [0]


def f(x):
    y = x.sin()
    if CHANGE == "graph break":
        print("", end="")          # a graph break under torch.compile
    if CHANGE == "recompile":
        calls[0] += 1
        y = y + calls[0]           # a new constant on every call: dynamo recompiles (a guard on it fails)
    return y.cos()


def test_step(bench):
    torch._dynamo.reset()
    g = torch.compile(f, backend="eager", dynamic=False)

    def step():
        (A @ A).relu()
        g(X)
        if CHANGE == "item":
            float(A.sum().item())
        if CHANGE == "matmul":
            A @ A
        if CHANGE == "clone":
            BIG.clone()
    bench.run(Scenario("step", ("forward",)), step)
'''


@pytest.fixture(scope="module")
def compiler_loaded():
    """torch.compile's modules imported before any pytester snapshot: pytester forgets the modules imported while
    a test ran, and torch's compiler registers its caches once per process (importing them again raises)."""
    torch.compile(lambda x: x.sin(), backend="eager")(torch.ones(2))


@pytest.mark.parametrize("change, fact", [
    ("item", "+1 synchronization(s) per step: aten._local_scalar_dense"),
    ("matmul", "+1 aten.mm per step"),
    ("clone", "+1 copies same device per step (+1.00 MB)"),
    ("graph break", "graph breaks 0 -> 1"),
    ("recompile", "recompilations per call 0 -> 1"),
])
def test_side_by_side_names_each_change_of_what_a_step_does(compiler_loaded, pytester, change, fact):
    """Each of the five changes, made in the working tree against a revision without it, named exactly by
    --bench-against (one process, the signature counted after the rounds)."""
    from test_plugin import committed

    committed(pytester, test_s=CHANGES.format(change="none"))
    pytester.makepyfile(test_s=CHANGES.format(change=change))
    res = pytester.runpytest("--bench-against", "HEAD", "--bench-quick", "--bench-no-out", "--bench-signature")
    out = " ".join(res.stdout.str().split())
    assert f"step: work signature: {fact}" in out, out[-3000:]


def test_a_recompilation_names_the_guard_that_failed_and_signatures_have_a_table():
    import torch._dynamo
    from bench_core import Scenario, measure
    from bench_core.output.tables import signature_table

    torch._dynamo.reset()
    calls = [0]
    x = torch.randn(8)

    def f(x):
        calls[0] += 1
        return x.sin() + calls[0]
    g = torch.compile(f, backend="eager", dynamic=False)
    sig = record(lambda: g(x))
    assert sig.recompiles == 1 and any("calls" in r for r in sig.recompile_reasons)
    (fact,) = [d for d in differences(Signature(), sig) if d.startswith("recompilations")]
    assert fact.startswith("recompilations per call 0 -> 1, the guard that failed: ") and "calls" in fact
    assert Signature.from_dict(sig.to_dict()) == sig
    from dataclasses import replace

    m = replace(measure(lambda: x.cos(), scenario=Scenario("step", ("forward",)), warmup=0, repeats=3), signature=sig)
    text = " ".join(signature_table([m], wide=True).split())
    assert text.startswith("scenario operators syncs copies allocations graphs breaks recompiles instructions")
    assert "step" in text and "n/o" in text


def test_transfers_count_only_the_copies_between_host_and_device():
    base = Signature(copies={"same device": 3}, copy_bytes={"same device": 300})
    more = Signature(copies={"same device": 3, "device to host": 1}, copy_bytes={"same device": 300,
                                                                                 "device to host": 4})
    assert base.total("transfers") == 0 and more.total("transfers") == 1 and more.total("copies") == 4
    assert grown(base, more, ["transfers"]) == ["transfers: 0 -> 1 per step"]
    assert grown(more, Signature(copies={"same device": 9}, copy_bytes={"same device": 900}), ["transfers"]) == []
