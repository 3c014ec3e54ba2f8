"""Ground truth on a real GPU: what the fakes stand in for, checked against the hardware. Run by gpu_check.sh.

    python scripts/gpu_ground_truth.py timers|memory|state|trace|cache|graph|clocks|kernel OUT_DIR

Each check prints its numbers and PASS or FAIL; the exit status is the number of FAILs.
"""
from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from bench_core import StartingState, measure, validate

FAILS = []


def dump(record) -> str:
    """JSON of a result's figures: its records keep their mappings read-only (mappingproxy), which json refuses."""
    return json.dumps(record, default=dict)


def check(name: str, ok: bool, detail: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        FAILS.append(name)


def timers(out: Path) -> None:
    """GPU time against a known amount of work; host time never below GPU time; block mode divides."""
    torch.cuda._sleep(1000)   # first call loads the kernel
    a = measure(lambda: torch.cuda._sleep(10_000_000), scenario="sleep10M", device="cuda", warmup=2, repeats=10)
    b = measure(lambda: torch.cuda._sleep(20_000_000), scenario="sleep20M", device="cuda", warmup=2, repeats=10)
    ratio = b.summary.median / a.summary.median
    check("sleep scales with its cycles", 1.8 < ratio < 2.2, f"20M/10M cycles = {ratio:.3f} (GPU time)")
    check("host time >= GPU time", all(h >= g * 0.999 for h, g in zip(a.host_ms, a.gpu_ms)),
          f"median host {a.host_summary.median:.4f} ms, GPU {a.summary.median:.4f} ms")
    n = 4096
    x = torch.randn(n, n, device="cuda")
    mm = measure(lambda: x @ x, scenario="mm", device="cuda", warmup=3, repeats=20)
    tflops = 2 * n ** 3 / (mm.summary.median / 1e3) / 1e12
    check("matmul throughput plausible", 1 < tflops < 1000, f"{tflops:.1f} TFLOP/s float32 (TF32 "
          f"{'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'}) for {n}^3")
    blk = measure(lambda: x @ x, scenario="mm", device="cuda", warmup=3, repeats=10, mode="block", block_size=4)
    r = blk.summary.median / mm.summary.median
    check("block mode divides by its size", 0.7 < r < 1.2, f"per call in blocks of 4 / per call alone = {r:.3f}")
    (out / "timers.json").write_text(json.dumps({"sleep_ratio": ratio, "tflops": tflops, "block_ratio": r}))


def memory(out: Path) -> None:
    """The window's own peak is what the step allocates, whatever is resident and whatever ran before."""
    resident = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")   # 1 GiB of "weights"
    temp = 256 << 20

    def step():
        t = torch.empty(temp, dtype=torch.uint8, device="cuda")
        t.fill_(1)

    first = measure(step, scenario="mem", device="cuda", warmup=1, repeats=5).memory
    big = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")        # another scenario ran before
    del big
    second = measure(step, scenario="mem", device="cuda", warmup=1, repeats=5).memory
    for label, m in (("first", first), ("after a larger one", second)):
        check(f"window peak = the step's allocation ({label})", abs(m.window_peak_bytes - temp) <= temp * 0.05,
              f"{m.window_peak_bytes / 2**20:.1f} MiB for a {temp / 2**20:.0f} MiB temporary; absolute "
              f"{m.peak_allocated_bytes / 2**20:.1f} MiB allocated, {m.peak_reserved_bytes / 2**20:.1f} MiB reserved")
    del resident
    print(json.dumps(sorted(torch.cuda.memory_stats())), file=open(out / "memory_stat_keys.json", "w"))


def state(out: Path) -> None:
    """A saved state loaded onto the GPU restores, its RNG reproduces draws, identical variants are equal."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(0.2), torch.nn.Linear(64, 8)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [(torch.randn(16, 64, device="cuda"), torch.randint(0, 8, (16,), device="cuda"))]
    st = StartingState.capture(model, opt, batches)
    path = st.save(Path(tempfile.mkdtemp()) / "s.pt")
    loaded = StartingState.load(path, map_location="cuda")

    def draws():
        loaded.restore(model, opt, device="cuda")
        return torch.rand(4, device="cuda").tolist(), float(torch.rand(1).item())

    d1, d2 = draws(), draws()
    check("RNG draws reproduce after a GPU restore", d1 == d2, f"{d1[0][:2]} == {d2[0][:2]}")

    def step(m, o, b):
        x, y = b
        o.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        o.step()
        return {"loss": loss}

    rep = validate(step, step, loaded, model, opt, steps=3, device="cuda")
    check("identical variants are bitwise equal on the GPU", rep.ok and all(k.bitwise for k in rep.kinds),
          rep.table().splitlines()[0])


def trace(out: Path) -> None:
    """One real CUDA trace, kept as a fixture for the CPU tests of the trace rules."""
    from bench_core.workflows.diagnose.profile import ProfileConfig, profile

    x = torch.randn(1024, 1024, device="cuda")
    res = profile("gpu_fixture", lambda: (x @ x).relu(), ProfileConfig(folder=out / "prof", device="cuda"))
    check("the trace has GPU activity and one count per step", res.facts.gpu_observed and res.facts.steps == 3,
          f"steps {res.facts.steps}, GPU busy {res.facts.gpu_busy_us} us/step")
    if res.trace_path is not None:
        shutil.copy(res.trace_path, out / "trace_fixture.json")


def cache(out: Path) -> None:
    """A flush makes an L2-resident probe slower: cold and hot scenarios alternated in rounds (one after the other,
    a process's drift decides), and the session's self-check three times; the SM clock beside each sample."""
    from bench_core.timing import cache as caching
    from bench_core.timing.backends import backend_for

    backend = backend_for("cuda")
    l2 = backend.cache_bytes()
    check("torch reports the L2 size", bool(l2), f"{(l2 or 0) / 2**20:.1f} MiB")
    probe = backend.buffer(int(caching.PROBE_SHARE * l2))   # the self-check's own probe: float32, read at memory speed
    rounds = []
    for _ in range(4):
        cold = measure(probe.sum, scenario="probe", device="cuda", warmup=3, repeats=10, cache="cold")
        hot = measure(probe.sum, scenario="probe", device="cuda", warmup=3, repeats=10, cache="hot")
        clocks = [(m.gpu_timing or {}).get("clocks") or {} for m in (cold, hot)]
        rounds.append({"cold_ms": list(cold.gpu_ms), "hot_ms": list(hot.gpu_ms),
                       "sm_mhz": [c.get("sm_mhz") for c in clocks]})
        print(f"  round: cold {cold.summary.median * 1e3:.1f} us, hot {hot.summary.median * 1e3:.1f} us (medians); "
              f"SM MHz cold {clocks[0].get('sm_mhz')}, hot {clocks[1].get('sm_mhz')}")
    pooled = [statistics.median(x for r in rounds for x in r[k]) for k in ("cold_ms", "hot_ms")]
    won = sum(statistics.median(r["cold_ms"]) > statistics.median(r["hot_ms"]) for r in rounds)
    check("a flush makes an L2-sized probe slower", pooled[0] > pooled[1] and won >= 3,
          f"{probe.nbytes / 2**20:.1f} MiB probe: cold {pooled[0] * 1e3:.2f} us, hot {pooled[1] * 1e3:.2f} us "
          f"(GPU event time, medians of 4 rounds of 10), cold/hot {pooled[0] / pooled[1]:.2f}; cold the slower in "
          f"{won} of 4 rounds")
    found = [caching.self_check(backend) for _ in range(3)]
    check("the self-check agrees, three times", all(f.colder for f in found),
          "; ".join(f"cold the slower in {f.colder_pairs}/{f.samples} pairs, fastest {f.cold_ms * 1e3:.1f} vs "
                    f"{f.hot_ms * 1e3:.1f} us" for f in found))
    (out / "cache.json").write_text(dump({"l2_bytes": l2, "rounds": rounds,
                                          "self_checks": [f.to_dict() for f in found]}))


def graph(out: Path) -> None:
    """A graph replay equals eager output and is faster for a launch-bound step; what cannot be captured is refused."""
    from bench_core.core.errors import ScenarioError

    x = torch.randn(256, device="cuda")

    def small():   # 64 tiny kernels: launch-bound
        z = x
        for _ in range(64):
            z = z * 1.0001 + 0.0001
        return z
    m = measure(small, scenario="launch_bound", device="cuda", warmup=3, repeats=20, graph=True)
    g = m.gpu_timing["graph"]
    check("replay output equals eager", g["output"] == "equal to an eager call's", g["output"])
    check("a graph is faster for a launch-bound step", g["graph_gpu_median_ms"] < g["eager_gpu_median_ms"],
          f"per step: eager {g['eager_gpu_median_ms'] * 1e3:.1f} us, graph {g['graph_gpu_median_ms'] * 1e3:.1f} us, "
          f"launch overhead {g['launch_overhead_ms'] * 1e3:.1f} us (GPU event time, {g['replays_per_sample']} per sample)")
    try:
        measure(lambda: (x * 2).sum().item(), scenario="syncs", device="cuda", warmup=1, repeats=2, graph=True)
        refused = "not refused"
    except ScenarioError as exc:
        refused = exc.problem
    check("a host sync inside the step is refused", "cannot be captured" in refused, refused[:200])
    torch.cuda.synchronize()   # the device is usable after a refused capture
    (out / "graph.json").write_text(dump(g))


def clocks(out: Path) -> None:
    """Clock readings per sample, with the telemetry extra (nvidia-ml-py)."""
    from bench_core.timing.telemetry import load_nvml

    if load_nvml() is None:
        check("NVML available (nvidia-ml-py)", False, "not installed: per-sample clocks cannot be read here")
        return
    x = torch.randn(4096, 4096, device="cuda")
    m = measure(lambda: x @ x, scenario="mm", device="cuda", warmup=3, repeats=30)
    c = (m.gpu_timing or {}).get("clocks")
    check("SM clock read around every sample", c is not None and None not in c["sm_mhz"],
          "none" if c is None else f"{min(c['sm_mhz'])}-{max(c['sm_mhz'])} MHz over {len(c['sm_mhz'])} samples, "
          f"default {c['default_sm_mhz']} MHz, flagged {len(c['flagged'])}, locked {c['locked']}, steady {c['steady']}")
    (out / "clocks.json").write_text(dump(c))


def kernel(out: Path) -> None:
    """Kernel time from a trace beside event time: kernels fit inside the events that bound them."""
    from bench_core.workflows.diagnose.profile import ProfileConfig, profile

    x = torch.randn(2048, 2048, device="cuda")
    step = lambda: (x @ x).relu()   # noqa: E731
    m = measure(step, scenario="mm_relu", device="cuda", warmup=3, repeats=20)
    res = profile("mm_relu", step, ProfileConfig(folder=out / "prof_kernel", device="cuda"))
    k, ev = res.facts.kernel_us, m.summary.median * 1e3
    check("kernel time observed and within event time", k is not None and 0 < k <= ev * 1.1,
          f"kernel {k} us, event {ev:.1f} us, end-to-end {m.host_summary.median * 1e3:.1f} us per step")


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("FAIL no CUDA device: these checks need a real GPU")
        sys.exit(1)
    which, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    {"timers": timers, "memory": memory, "state": state, "trace": trace, "cache": cache, "graph": graph,
     "clocks": clocks, "kernel": kernel}[which](out)
    sys.exit(len(FAILS))
