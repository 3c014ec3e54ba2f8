"""Fragmented work, allocator churn, host-to-device transfer (GPU only), mixed precision and compile."""
from collections import deque

import pytest
import torch

from bench_core import Scenario


# -- fragmented: many small operations launched one by one, versus the same work batched ---------------
@pytest.mark.parametrize("style", ["one_by_one", "foreach", "batched"])
def test_fragmented_work(bench, style):
    dev = bench.device
    n, size = bench.size(cpu=(200, 64), gpu=(1000, 4096), quick=(20, 16))
    torch.manual_seed(0)
    xs = [torch.randn(size, device=dev) for _ in range(n)]
    stacked = torch.stack(xs)
    expected = torch.stack([x * 1.5 + 0.5 for x in xs])
    out = {}
    if style == "one_by_one":
        def fn():
            out["y"] = [x * 1.5 + 0.5 for x in xs]        # 2n small kernels
    elif style == "foreach":
        def fn():
            ys = torch._foreach_mul(xs, 1.5)
            torch._foreach_add_(ys, 0.5)
            out["y"] = ys                                   # a few multi-tensor kernels
    else:
        def fn():
            out["y"] = torch.addcmul(torch.full_like(stacked, 0.5), stacked, torch.full_like(stacked, 1.5))
    scenario = Scenario(f"fragmented[{style}]", ("compute",),
                        {"shapes": {"xs": [n, size]}, "batch_size": n, "dtype": "float32", "mode": "n/a",
                         "compiled": False, "data_source": "synthetic, on device", "ops": 2 * n})
    bench.run(scenario, fn, items=n)
    y = out["y"] if isinstance(out["y"], torch.Tensor) else torch.stack(out["y"])
    torch.testing.assert_close(y, expected)


# -- allocator churn: variable input shapes versus padded fixed shapes --------------------------------
@pytest.mark.parametrize("shapes", ["variable", "padded"])
def test_allocator_churn(bench, shapes):
    dev = bench.device
    max_len, d, batch = bench.size(cpu=(128, 64, 8), gpu=(2048, 1024, 32), quick=(16, 8, 2))
    torch.manual_seed(0)
    lengths = torch.randint(max_len // 4, max_len + 1, (64,)).tolist()
    w = torch.randn(d, d, device=dev)
    state = {"i": 0, "sums": deque(maxlen=3)}  # the last few only, not one per timed call

    def fn():
        length = lengths[state["i"] % len(lengths)]
        state["i"] += 1
        rows = length if shapes == "variable" else max_len
        x = torch.randn(batch, rows, d, device=dev)
        if shapes == "padded":
            x[:, length:] = 0                            # a fixed shape, masked padding
        state["sums"].append((x @ w).relu().sum())

    scenario = Scenario(f"allocator_churn[{shapes}]", ("compute",),
                        {"shapes": {"x": [batch, f"{max_len // 4}..{max_len}" if shapes == "variable" else max_len, d]},
                         "batch_size": batch, "dtype": "float32", "mode": "n/a", "compiled": False,
                         "data_source": "synthetic, on device"})
    m = bench.run(scenario, fn, items=batch)
    assert all(torch.isfinite(s) for s in state["sums"])
    if bench.on_gpu:
        assert m.memory.device_allocs is not None     # observed on CUDA
    else:
        assert not m.memory.observed                  # not observed on the CPU: reported as n/o, not 0


# -- host-to-device transfer: pageable vs pinned, blocking vs non_blocking, overlap with compute ---------
@pytest.mark.gpu
@pytest.mark.parametrize("memory", ["pageable", "pinned"])
@pytest.mark.parametrize("blocking", ["blocking", "non_blocking"])
def test_h2d_transfer(bench, memory, blocking):
    mb = bench.size(cpu=1, gpu=64, quick=8)
    host = torch.randn(mb * 1024 * 1024 // 4)
    if memory == "pinned":
        host = host.pin_memory()
    dev_buf = torch.empty_like(host, device="cuda")

    def fn():
        dev_buf.copy_(host, non_blocking=blocking == "non_blocking")

    scenario = Scenario(f"h2d[{memory}-{blocking}]", ("transfer",),
                        {"shapes": {"bytes": host.numel() * 4}, "dtype": "float32", "mode": "n/a", "compiled": False,
                         "data_source": f"{memory} host memory", "timing": "block of 8 copies, one sync"})
    # Block mode: per call, a synchronize after every copy would make non_blocking and blocking the same
    # program; 8 back-to-back copies with one synchronize let queued copies hide their launches.
    bench.run(scenario, fn, items=host.numel() * 4, mode="block", block_size=8)
    assert torch.equal(dev_buf[:16].cpu(), host[:16])


@pytest.mark.gpu
@pytest.mark.parametrize("overlap", ["serial", "overlapped"])
def test_transfer_overlaps_compute(bench, overlap):
    mb = bench.size(cpu=1, gpu=64, quick=8)
    host = torch.randn(mb * 1024 * 1024 // 4).pin_memory()
    dev_buf = torch.empty_like(host, device="cuda")
    a = torch.randn(4096, 4096, device="cuda")
    copy_stream = torch.cuda.Stream()

    def fn():
        if overlap == "overlapped":
            with torch.cuda.stream(copy_stream):
                dev_buf.copy_(host, non_blocking=True)
            out = a @ a
            torch.cuda.current_stream().wait_stream(copy_stream)
        else:
            dev_buf.copy_(host, non_blocking=True)
            out = a @ a
        return out

    scenario = Scenario(f"h2d_overlap[{overlap}]", ("transfer", "compute"),
                        {"shapes": {"bytes": host.numel() * 4, "matmul": [4096, 4096]}, "dtype": "float32",
                         "mode": "n/a", "compiled": False, "data_source": "pinned host memory"})
    bench.run(scenario, fn)
    torch.cuda.synchronize()
    assert torch.equal(dev_buf[:16].cpu(), host[:16])


# -- mixed precision and torch.compile ---------------------------------------------------------------
@pytest.mark.parametrize("precision", ["float32", "bfloat16_autocast"])
def test_mlp_forward_precision(bench, precision):
    dev = bench.device
    d, batch = bench.size(cpu=(512, 64), gpu=(8192, 1024), quick=(32, 8))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.GELU(), torch.nn.Linear(d, d)).to(dev).eval()
    x = torch.randn(batch, d, device=dev)
    outs = deque(maxlen=1)  # last output only: a list makes each call allocate anew

    def fn():
        with torch.inference_mode(), torch.autocast(dev, dtype=torch.bfloat16, enabled=precision != "float32"):
            outs.append(model(x))

    scenario = Scenario(f"mlp_forward[{precision}]", ("forward",),
                        {"shapes": {"x": [batch, d]}, "batch_size": batch, "dtype": precision, "mode": "eval",
                         "compiled": False, "data_source": "synthetic, on device"})
    bench.run(scenario, fn, items=batch)
    with torch.inference_mode():
        ref = model(x)
    torch.testing.assert_close(outs[-1].float(), ref, rtol=5e-2, atol=5e-2)


@pytest.mark.gpu
def test_compiled_mlp_forward(bench):
    """torch.compile: compilation is the cold start, the steady state is timed apart (GPU-sized only)."""
    d, batch = 4096, 1024
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.GELU(), torch.nn.Linear(d, d)).cuda().eval()
    x = torch.randn(batch, d, device="cuda")
    compiled = torch.compile(model)
    outs = deque(maxlen=1)  # last output only: a list makes each call allocate anew

    def fn():
        with torch.inference_mode():
            outs.append(compiled(x))

    scenario = Scenario("mlp_forward[compiled]", ("forward",),
                        {"shapes": {"x": [batch, d]}, "batch_size": batch, "dtype": "float32", "mode": "eval",
                         "compiled": True, "data_source": "synthetic, on device"})
    m = bench.run(scenario, fn, items=batch)
    # compilation happens on the host in the first call: host time against host time, never against GPU time
    assert m.cold_start.first_call_ms > m.host_summary.median
    with torch.inference_mode():
        torch.testing.assert_close(outs[-1], model(x), rtol=1e-3, atol=1e-3)
