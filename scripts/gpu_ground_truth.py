"""Ground truth on a real GPU: what the fakes stand in for, checked against the hardware. Run by gpu_check.sh.

    python scripts/gpu_ground_truth.py timers|memory|state|trace OUT_DIR

Each check prints its numbers and PASS or FAIL; the exit status is the number of FAILs.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from bench_core import StartingState, measure, validate

FAILS = []


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


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("FAIL no CUDA device: these checks need a real GPU")
        sys.exit(1)
    which, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    {"timers": timers, "memory": memory, "state": state, "trace": trace}[which](out)
    sys.exit(len(FAILS))
