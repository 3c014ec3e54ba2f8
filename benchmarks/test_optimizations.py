"""Three optimizations validated end to end: same saved start, correct before and after, then faster?

Each: a baseline and a candidate step, a declared tolerance (the dtype default unless the candidate
runs in lower precision), `bench.validate` from one StartingState, then `bench.ab` (interleaved,
paired). The speed verdicts are reported in the A/B table, never asserted: no test asserts a timing.
"""
import pytest
import torch
from torch import nn

from bench_core import StartingState
from bench_core import Tolerance, Variant, bind
from models import MLP


def _mlp_state(bench, d_in, hidden, layers, batch, optimizer=torch.optim.AdamW):
    torch.manual_seed(0)
    model = MLP(d_in, hidden, layers=layers).to(bench.device)
    opt = optimizer(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(batch, d_in, generator=g).to(bench.device),
                torch.randint(0, 10, (batch,), generator=g).to(bench.device)) for _ in range(2)]
    return model, opt, StartingState.capture(model, opt, batches)


def _fresh(bench, d_in, hidden, layers, optimizer=torch.optim.AdamW):
    m = MLP(d_in, hidden, layers=layers).to(bench.device)
    return m, optimizer(m.parameters(), lr=1e-3)


# -- 1. a constant re-created and copied to the device every step, versus created once --------------
CLASS_WEIGHTS = [1.0, 2.0, 1.0, 0.5, 1.0, 1.5, 1.0, 1.0, 3.0, 1.0]


def _weighted_step(model, opt, batch, weight):
    x, y = batch
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y, weight=weight)
    loss.backward()
    opt.step()
    return {"loss": loss}


def step_recreates_constant(model, opt, batch):
    # a host tensor built and copied to the device, every step
    return _weighted_step(model, opt, batch, torch.tensor(CLASS_WEIGHTS, device=batch[0].device))


_WEIGHTS = {}


def step_constant_once(model, opt, batch):
    dev = batch[0].device
    if dev not in _WEIGHTS:
        _WEIGHTS[dev] = torch.tensor(CLASS_WEIGHTS, device=dev)
    return _weighted_step(model, opt, batch, _WEIGHTS[dev])


def test_constant_created_once(bench):
    d, h, layers, batch = bench.size(cpu=(64, 128, 2, 32), gpu=(1024, 2048, 4, 256), quick=(16, 32, 1, 8))
    model, opt, state = _mlp_state(bench, d, h, layers, batch)
    rep = bench.validate(step_recreates_constant, step_constant_once, state, model, opt, steps=3)
    assert rep.ok, rep.table()   # bitwise the same program: default float32 tolerance
    # In isolation: only the constant's creation and its use.
    x = state.batches[0][0]
    logits = torch.randn(x.shape[0], 10, device=bench.device)
    once = torch.tensor(CLASS_WEIGHTS, device=bench.device)
    bench.ab("constant: in isolation",
             lambda: logits * torch.tensor(CLASS_WEIGHTS, device=bench.device), lambda: logits * once,
             validation=rep)
    # Inside the full training step, where the same saving may vanish into the step's cost.
    ma, oa = _fresh(bench, d, h, layers)
    mb, ob = _fresh(bench, d, h, layers)
    res = bench.ab("constant: full train step", bind(step_recreates_constant, state, ma, oa),
                   bind(step_constant_once, state, mb, ob), validation=rep)
    assert res.correctness["ok"] and len(res.baseline_ms) == len(res.candidate_ms)


# -- 2. a per-parameter Python loop update, versus the foreach path --------------------------------
def plain_step(model, opt, batch):
    return _weighted_step(model, opt, batch, None)


def test_foreach_optimizer(bench):
    # Many small layers: the optimizer's per-parameter overhead is what foreach removes.
    d, h, layers, batch = bench.size(cpu=(32, 32, 12, 16), gpu=(256, 256, 24, 128), quick=(8, 8, 3, 4))
    model, opt, state = _mlp_state(bench, d, h, layers, batch)
    loop = Variant(plain_step, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=False), name="adamw_loop")
    fast = Variant(plain_step, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True), name="adamw_foreach")
    rep = bench.validate(loop, fast, state, model, steps=3)
    assert rep.ok, rep.table()
    assert "group 0: foreach False -> True" in rep.optimizer_changes   # the candidate's own flag survived restore
    ma, _ = _fresh(bench, d, h, layers)
    mb, _ = _fresh(bench, d, h, layers)
    res = bench.ab("optimizer: loop vs foreach", bind(loop, state, ma), bind(fast, state, mb), validation=rep)
    ran = {side: res.identities[side]["optimizer_settings"]["group 0"]["foreach"] for side in ("baseline", "candidate")}
    assert ran == {"baseline": "False", "candidate": "True"}, ran   # the record shows which path each side ran


# -- 3. only correct within a looser, declared tolerance: bfloat16 autocast ---------------------------
def step_autocast_bf16(model, opt, batch):
    x, y = batch
    opt.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        logits = model(x)
    loss = nn.functional.cross_entropy(logits.float(), y)
    loss.backward()
    opt.step()
    return {"loss": loss}


BF16_TOLERANCE = Tolerance(rtol=5e-2, atol=5e-2)  # declared: bfloat16 keeps 8 bits of mantissa


def test_bf16_autocast_needs_its_declared_tolerance(bench):
    d, h, layers, batch = bench.size(cpu=(128, 256, 2, 64), gpu=(2048, 4096, 4, 512), quick=(16, 32, 1, 8))
    model, opt, state = _mlp_state(bench, d, h, layers, batch)
    strict = bench.validate(plain_step, step_autocast_bf16, state, model, opt, steps=2)
    assert not strict.ok, "bf16 matched float32 exactly: the example no longer shows a tolerance at work"
    rep = bench.validate(plain_step, step_autocast_bf16, state, model, opt, steps=2, tolerance=BF16_TOLERANCE)
    assert rep.ok, rep.table()
    ma, oa = _fresh(bench, d, h, layers)
    mb, ob = _fresh(bench, d, h, layers)
    bench.ab("bf16 autocast (declared tolerance)", bind(plain_step, state, ma, oa),
             bind(step_autocast_bf16, state, mb, ob), validation=rep)


def test_incorrect_candidate_is_rejected_without_timing(bench):
    d, h, layers, batch = 16, 32, 1, 8
    model, opt, state = _mlp_state(bench, d, h, layers, batch)

    def wrong_lr(model, opt, batch):
        for g in opt.param_groups:
            g["lr"] = 1e-2      # a "faster converging" change that is not the same computation
        return plain_step(model, opt, batch)

    rep = bench.validate(plain_step, wrong_lr, state, model, opt, steps=2)
    assert not rep.ok and rep.first_divergent_step == 1
    with pytest.raises(pytest.fail.Exception, match="rejected as incorrect"):
        bench.ab("wrong lr", lambda: None, lambda: None, validation=rep)
