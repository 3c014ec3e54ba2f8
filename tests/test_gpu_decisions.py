"""scripts/gpu_decisions.py on the CPU: its plan (pure), its cycle-space decisions against fake samples and fake
clocks (tests/fakes.py), and one smallest run end to end. Nothing here asserts a real timing verdict: the machine's
speed decides those, so the end-to-end run is checked for its structure only."""
import importlib.util
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from bench_core import Scenario, measure
from bench_core.files import storage
from bench_core.timing.backends import CudaBackend
from bench_core.timing.protocol import Rounds
from bench_core.timing.sampling import Sample
from bench_core.timing.telemetry import ClockReading, Telemetry
from fakes import FakeClock, FakeGPU, FakeNVML
from helpers import ENV

SCRIPT = Path(__file__).parent.parent / "scripts" / "gpu_decisions.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_decisions", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_decisions"] = module      # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


gd = _load()
GPU_ENV = {**ENV, "device": "cuda", "gpu_name": "Fake GPU", "cuda_version": "13.0"}


# -- the plan --------------------------------------------------------------------------------------------------
def _spent(text: str) -> tuple[float, float]:
    head = text.splitlines()[0]      # "plan for cuda: 205 s of the 240 s budget (...)"
    used, budget = head.split(": ", 1)[1].split(" s of the ")
    return float(used), float(budget.split(" s budget")[0])


def test_the_dry_run_prints_the_plan_with_each_steps_time_within_the_budget():
    # as the issue asks it: the script itself, on the CPU, with no argument but --dry-run
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    used, budget = _spent(text)
    assert text.startswith("plan for cuda") and budget == 240 and 0 < used <= budget
    for key in ("against-matmul", "against-memory", "against-launch", "stored", "pb-matmul"):
        row = next(line for line in text.splitlines() if line.startswith(f"| {key} "))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[-1].endswith(" s") and cells[-2].endswith(" s") and "(up to" in cells[-3]
    assert "cold" in next(line for line in text.splitlines() if line.startswith("| stored "))


def test_a_tiny_budget_drops_steps_and_says_which(capsys):
    assert gd.main(["--dry-run", "--budget-s", "30"]) == 0
    text = capsys.readouterr().out
    used, budget = _spent(text)
    assert budget == 30 and used <= 30
    dropped = [line for line in text.splitlines() if line.startswith("dropped ")]
    assert any("dropped stored:" in line for line in dropped) and all(" s left of 30 s" in x for x in dropped)


def _step(key, setup, each, least=1, want=1):
    return gd.Step(key, "against", key, "unstated (hot)", ("same",), "g", "s", setup, each, least=least, want=want)


def test_the_planner_fits_each_least_in_order_then_grows_round_robin():
    steps = [_step("a", 5, 10, want=4), _step("b", 50, 20, want=3), _step("c", 0, 10, least=2, want=2)]
    plan = gd.fit(steps, 100)
    got = {s.key: s.repeats for s in plan.steps}
    # least: a 15 s, b 70 s (85 in all), c (20 s) does not fit; then a grows by one (95 s), b's next (20) does not
    assert got == {"a": 2, "b": 1} and plan.seconds == 95
    assert any(n.startswith("dropped c: its least (2 trial(s) and its setup) needs 20 s, 15 s left")
               for n in plan.notes)
    assert "shortened a: 2 of 4 trials fit the estimates" in " ".join(plan.notes)
    assert "shortened b: 1 of 3" in " ".join(plan.notes)
    # every trial up to each one's want, in the order a run takes them: the leasts first, then round-robin
    assert plan.order == (("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3))


def test_the_planner_is_pure_and_a_budget_that_holds_everything_shortens_nothing():
    steps = [_step("a", 5, 10, want=2), _step("b", 5, 10, want=2)]
    assert gd.fit(steps, 1000) == gd.fit(steps, 1000)
    plan = gd.fit(steps, 1000)
    assert [s.repeats for s in plan.steps] == [2, 2] and plan.notes == () and plan.seconds == 50
    assert gd.fit(steps, 1).steps == ()


def test_cold_cache_is_planned_on_the_gpu_only_and_said_on_the_cpu():
    args = (["matmul", "memory"], ["same", "plus5"], ["stored"])
    gpu, _ = gd.build_steps("cuda", *args, gd.COSTS["cuda"])
    cpu, notes = gd.build_steps("cpu", *args, gd.COSTS["cpu"])
    assert "test_memory_cold.py" in gpu[0].files and gpu[0].cache == "unstated (hot), cold"
    assert "test_memory_cold.py" not in cpu[0].files and any("GPU only" in n for n in notes)
    # the estimate of a stored trial: its candidate processes, each measuring every stored scenario
    c = gd.COSTS["cuda"]
    assert gpu[0].each_s == pytest.approx(3 * (c.process_s + 2 * 3 * c.measure_s))


def test_bad_arguments_are_refused_naming_what_is_wrong(capsys):
    with pytest.raises(SystemExit):
        gd.parse(["--workloads", "matmul,conv"])
    assert "--workloads 'matmul,conv': choose from matmul, memory, launch" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gd.parse(["--baseline-runs", "1"])
    assert "at least 2" in capsys.readouterr().err


def test_scenario_names_give_workload_cache_and_change():
    assert gd.label("memory-cold[plus5]") == ("memory", "cold", "plus5")
    assert gd.label("matmul[same]") == ("matmul", "unstated (hot)", "same")
    assert gd.label("test_pb[plus5]") == ("matmul (benchmark fixture)", "unstated (hot)", "plus5")


# -- cycle space, side by side ------------------------------------------------------------------------------------
def _rounds(base_ms, cand_ms, base_mhz, cand_mhz, rounds=12, pairs=2):
    """bench_core's Rounds with GPU time jittering by a few tenths of a percent, each sample's clock read."""
    def side(ms, mhz, shift):
        return tuple(tuple(Sample(ms * 1.01, ms * (1 + 0.002 * (((i * 7 + j * 3 + shift) % 5) - 2)),
                                  None if mhz is None else (ClockReading(mhz, ()), ClockReading(mhz, ())))
                           for j in range(pairs)) for i in range(rounds))
    return Rounds(side(base_ms, base_mhz, 0), side(cand_ms, cand_mhz, 2))


def _record(rounds_doc, verdict):
    return {"scenario": "matmul[same]", "method": "side by side", "rounds": rounds_doc,
            "comparison": {"verdict": verdict, "ratio": 1.1, "ci_low": 1.08, "ci_high": 1.12, "confidence": 0.98,
                           "threshold": 0.02, "looks": 1, "adjustment": "none (one scenario)"}}


def test_the_conftest_keeps_each_round_samples_clock_and_cycles_undo_a_clock_that_fell(monkeypatch, tmp_path):
    monkeypatch.setattr(Rounds, "to_dict", Rounds.to_dict)     # restored after the test, whatever the conftest does
    monkeypatch.setattr(sys, "path", list(sys.path))
    exec(compile(gd.CONFTEST, "conftest.py", "exec"), {"__file__": str(tmp_path / "conftest.py")})
    # unchanged code whose clock fell from 1980 to 1800 MHz on the current side: 10% more time, the same cycles
    doc = _rounds(1.0, 1.1, 1980, 1800).to_dict()
    assert doc["gpu_decisions_sm_mhz"]["candidate"][0] == [1800, 1800]
    (d,) = gd.side_by_side_decisions({"against": {"scenarios": [_record(doc, "slower")]}})
    assert d["recomputed"]["verdict"] == "slower" and d["recomputed"]["ratio"] == pytest.approx(1.1, rel=0.01)
    assert d["cycles"]["verdict"] == "unchanged" and d["cycles"]["ratio"] == pytest.approx(1.0, abs=0.01)
    assert d["sm_mhz"] == [1800, 1980] and d["rounds"] == 12 and d["unit"] == "rounds"
    assert (d["workload"], d["cache"], d["change"]) == ("matmul", "unstated (hot)", "same")


def test_without_clocks_cycle_space_is_not_observed_never_zero():
    doc = _rounds(1.0, 1.0, None, None).to_dict()           # bench_core's own record: no clock field at all
    (d,) = gd.side_by_side_decisions({"against": {"scenarios": [_record(doc, "unchanged")]}})
    assert d["cycles"] == {"not_observed": "no SM clock was read for every sample"} and d["sm_mhz"] is None
    assert d["recomputed"]["verdict"] == "unchanged"


# -- cycle space, the stored gate (fake GPU, fake NVML) ------------------------------------------------------------
def _run(name, work_ms, mhz, level=1.0, nvml=None):
    """One process's measurement of a fake kernel of `work_ms` with the SM clock at `mhz`."""
    nvml = nvml or FakeNVML()
    nvml.sm = mhz
    clock = FakeClock()
    gpu = FakeGPU(clock)
    backend = CudaBackend(gpu, telemetry=Telemetry(nvml, 0, own_pid=100), alloc=gpu.buffer)
    return measure(lambda: gpu.launch(work_ms * level), scenario=Scenario(name, ("compute",), {"workload": "w"}),
                   device="cuda", warmup=1, repeats=6, environment=GPU_ENV, clock=clock, backend=backend)


LEVELS = (1.0, 1.004, 0.997, 1.002, 0.998)      # each process's own level: the run-to-run spread the prior learns


def test_the_stored_gate_in_cycles_sees_a_fallen_clock_as_no_change(tmp_path):
    work = {"matmul[same]": 1.0, "memory[same]": 2.0, "launch[same]": 0.5}
    for i, level in enumerate(LEVELS):
        storage.save_baseline(tmp_path, "b", [_run(n, ms, 1980, level) for n, ms in work.items()], GPU_ENV,
                              append=i > 0)
    candidate = {}
    for level in LEVELS[:3]:    # launch's clock fell to 1800 MHz in every candidate process: 10% more time
        runs = [_run(n, ms * (1.1 if n.startswith("launch") else 1.0), 1800 if n.startswith("launch") else 1980,
                     level) for n, ms in work.items()]
        (tmp_path / "c").mkdir(exist_ok=True)
        for n, ms in storage.load_candidate(storage.write_session(tmp_path / "c", runs, GPU_ENV)).items():
            candidate.setdefault(n, []).extend(ms)
    baseline = storage.by_scenario(storage.load_baseline(tmp_path, "b"))   # the clocks survive the files
    got = {d["scenario"]: d for d in gd.stored_decisions(baseline, candidate, 0.02)}
    assert got["launch[same]"]["verdict"] == "slower" and got["launch[same]"]["cycles"]["verdict"] == "unchanged"
    assert got["launch[same]"]["sm_mhz"] == [1800, 1980] and got["launch[same]"]["rounds"] == 3
    for name in ("matmul[same]", "memory[same]"):
        assert got[name]["verdict"] == got[name]["cycles"]["verdict"] == "unchanged"


def test_in_cycles_keeps_the_samples_set_aside_as_throttled_aside():
    nvml, clock = FakeNVML(), FakeClock()
    gpu = FakeGPU(clock)
    backend = CudaBackend(gpu, telemetry=Telemetry(nvml, 0, own_pid=100), alloc=gpu.buffer)
    calls = {"n": 0}

    def step():   # samples 2 and 5 end with the clock below 75% of the default: set aside by bench_core
        calls["n"] += 1
        gpu.launch(1.0)
        nvml.sm = 1200 if calls["n"] - 3 in (2, 5) else 1980     # the cold start and 1 warmup call come first
    m = measure(step, scenario="s", device="cuda", warmup=1, repeats=8, environment=GPU_ENV, clock=clock,
                backend=backend)
    assert len(m.gpu_ms) == 6 and sorted(m.gpu_timing["clocks"]["flagged"]) == ["2", "5"]
    cyc = gd.in_cycles(m)
    assert cyc.gpu_ms == pytest.approx([g * 1980 for g in m.gpu_ms]) and cyc.repeats == 6
    assert gd.in_cycles(replace(m, gpu_timing=None, repeats=6)) is None     # no clocks read: no cycles, never 0


# -- the summary ---------------------------------------------------------------------------------------------------
def _decision(change, verdict, cycles, sm=None, gate="side by side"):
    return {"gate": gate, "workload": "matmul", "cache": "unstated (hot)", "change": change, "verdict": verdict,
            "ratio": 1.05, "ci": [1.02, 1.08], "rounds": 12, "unit": "rounds", "wall_s": 10.0, "cost": 2.0,
            "sm_mhz": sm, "cycles": cycles}


def test_the_table_counts_verdicts_in_time_and_cycles_and_says_what_was_not_observed():
    ds = [_decision("plus5", "slower", {"verdict": "slower"}, [1755, 1980]),
          _decision("plus5", "slower", {"verdict": "unchanged"}, [1980, 1980]),
          _decision("same", "unchanged", {"not_observed": "no clock"})]
    rows = gd.summary_rows(ds)
    assert [r["change"] for r in rows] == ["+5%", "A/A"]
    assert rows[0]["verdicts"] == "slower 2" and rows[0]["cycle-space verdicts"] == "slower 1, unchanged 1"
    assert rows[0]["SM clock"] == "1755-1980 MHz" and rows[0]["median interval width"] == "5.9%"
    assert rows[0]["wall per trial"] == "10.0 s (2.0x plain)" and rows[0]["rounds"] == "12 rounds"
    assert rows[1]["SM clock"] == "not observed" and rows[1]["cycle-space verdicts"] == "not observed"
    (line,) = gd.targets(ds)
    assert "A/A called slower or faster in 0 of 1; +2% called slower in 0 of 0; +5% in 2 of 2" in line


# -- end to end on the CPU -----------------------------------------------------------------------------------------
def test_the_smallest_plan_runs_end_to_end_on_the_cpu_and_writes_the_table_and_the_raw_json(tmp_path, capsys):
    rc = gd.main(["--device", "cpu", "--workloads", "matmul", "--gates", "against", "--changes", "same,plus5",
                  "--trials", "1", "--quick", "--pytest-args=--bench-pairs 1 --bench-threads 1", "--budget-s", "300",
                  "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert printed.startswith("plan for cpu") and rc == 0, printed
    (raw,) = tmp_path.glob("gpu_decisions-*.json")
    (md,) = tmp_path.glob("gpu_decisions-*.md")
    assert md.stem == raw.stem
    doc = json.loads(raw.read_text())
    assert [(t["step"], t["index"], t["error"]) for t in doc["trials"]] == [("against-matmul", -1, None),
                                                                           ("against-matmul", 0, None)]
    assert sorted(d["change"] for d in doc["decisions"]) == ["plus5", "same"]
    for d in doc["decisions"]:
        assert d["verdict"] in gd.VERDICTS and d["rounds"] == 3 and d["unit"] == "rounds"
        assert d["recomputed"]["verdict"] == d["verdict"]      # read from the file as bench_core decided it
        assert d["cycles"] == {"not_observed": "no SM clock was read for every sample"} and d["sm_mhz"] is None
        assert d["wall_s"] > 0 and d["cost"] > 0 and d["gate"] == "side by side (HEAD~1, one process)"
    table = md.read_text().splitlines()
    header = next(line for line in table if line.startswith("| workload"))
    assert [c.strip() for c in header.strip("|").split("|")] == list(gd.COLUMNS)
    rows = [line for line in table if line.startswith("| matmul ")]
    assert len(rows) == 2 and all("not observed" in r for r in rows)
    (own,) = tmp_path.glob("run-*")         # this run's own folder: its logs and session files, raw samples kept
    assert doc["run_folder"] == str(own) and (own / "logs" / "against-matmul-0.log").exists()
    (session,) = (own / "sessions" / "against-matmul-0").glob("session-*.json")
    # the repository's conftest was loaded and kept a clock per round sample: none read on the CPU, never a zero
    clocks = json.loads(session.read_text())["against"]["scenarios"][0]["rounds"]["gpu_decisions_sm_mhz"]
    assert {f for side in clocks.values() for r in side for f in r} == {None}
