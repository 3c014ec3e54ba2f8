import random

import numpy as np
import pytest
import torch
from torch import nn

from bench_core import StorageError
from bench_core.state import StartingState
from bench_core.correctness import (Tolerance, Variant, check_reference, save_reference, tolerance_for, validate)


def _setup(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.3), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
    model(x).sum().backward()
    opt.step()  # a non-trivial optimizer state to save
    opt.zero_grad()
    return model, opt, [(x, y), (x * 2, y)]


def _captured():
    model, opt, batches = _setup()
    return model, opt, StartingState.capture(model, opt, batches)


def train_step(model, opt, batch):
    x, y = batch
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)   # dropout draws from the RNG
    loss.backward()
    opt.step()
    return {"loss": loss, "noise": torch.rand(2)}


def test_restore_is_bitwise_reproducible_including_rng():
    model, opt, state = _captured()

    def run():
        b = state.restore(model, opt)
        outs = [train_step(model, opt, b[i % 2])["loss"] for i in range(4)]
        return torch.stack(outs), random.random(), np.random.rand(), [p.clone() for p in model.parameters()]

    l1, r1, n1, p1 = run()
    l2, r2, n2, p2 = run()
    assert torch.equal(l1, l2) and r1 == r2 and n1 == n2
    assert all(torch.equal(a, b) for a, b in zip(p1, p2))


def test_capture_is_a_deep_copy_not_a_live_reference():
    model, opt, batches = _setup()
    state = StartingState.capture(model, opt, batches)
    h = state.hash
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    batches[0][0].add_(5.0)
    assert state.intact() and state.hash == h
    fresh = state.batches
    fresh[0][0].zero_()
    assert state.intact()


def test_flags_are_captured_and_restored():
    model, opt, batches = _setup()
    before = torch.get_float32_matmul_precision()
    state = StartingState.capture(model, opt, batches)
    try:
        torch.set_float32_matmul_precision("medium")
        torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark
        state.restore(model, opt)
        assert torch.get_float32_matmul_precision() == before
        assert torch.backends.cudnn.benchmark == state.metadata()["flags"]["cudnn_benchmark"]
    finally:
        torch.set_float32_matmul_precision(before)


def test_save_load_round_trip_and_refusals(tmp_path):
    model, opt, state = _captured()
    path = state.save(tmp_path / "s.pt")
    with pytest.raises(StorageError, match="never overwritten"):
        state.save(tmp_path / "s.pt")
    back = StartingState.load(path)
    assert back.hash == state.hash
    assert back.metadata()["batches"]["batches[0][0]"] == {"shape": [5, 6], "dtype": "torch.float32", "device": "cpu"}
    data = path.read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(StorageError, match="cannot read the starting state"):
        StartingState.load(tmp_path / "cut.pt")
    torch.save({"format": "bench_core.state", "schema_version": 1, "hash": "0" * 64,
                "payload": {"model": {}, "batches": [torch.ones(1)]}}, tmp_path / "forged.pt")
    with pytest.raises(StorageError, match="content hash does not match"):
        StartingState.load(tmp_path / "forged.pt")
    torch.save({"format": "other"}, tmp_path / "other.pt")
    with pytest.raises(StorageError, match="not a bench_core starting state"):
        StartingState.load(tmp_path / "other.pt")
    with pytest.raises(StorageError, match="does not exist"):
        StartingState.load(tmp_path / "nope.pt")


def test_load_can_move_the_state_to_another_device(tmp_path):
    model, opt, batches = _setup()
    path = StartingState.capture(model, opt, batches).save(tmp_path / "s.pt")
    back = StartingState.load(path, map_location="meta")   # any device: meta stands in for cuda here
    assert back.metadata()["batches"]["batches[0][0]"]["device"] == "meta"


def test_identical_variants_pass_and_compare_everything():
    model, opt, state = _captured()
    rep = validate(train_step, train_step, state, model, opt, steps=3)
    assert rep.ok, rep.table()
    assert rep.compared >= 3 * 2 + 4 + 4 + 8   # outputs, params, grads, optimizer state tensors
    assert "PASS" in rep.table()


def test_a_wrong_candidate_names_every_tensor_and_the_first_divergent_step():
    model, opt, state = _captured()

    def wrong(model, opt, batch):
        out = train_step(model, opt, batch)
        return out if opt.state_dict()["state"][0]["step"] < 3 else {**out, "loss": out["loss"] * 1.01}

    rep = validate(train_step, wrong, state, model, opt, steps=3)
    assert not rep.ok
    # the step counter is 1 after setup, so the change starts at step index 1 and stays
    assert [d.name for d in rep.diffs] == ["step[1].output.loss", "step[2].output.loss"]
    assert rep.first_divergent_step == 1
    d = rep.diffs[0]
    assert d.max_rel == pytest.approx(0.01, rel=1e-3) and d.problem == "exceeds tolerance"
    assert (d.rtol, d.atol) == (1.3e-6, 1e-5)
    assert "first divergent step: 1" in rep.table()


def test_nan_in_candidate_fails():
    model, opt, state = _captured()

    def nan_step(model, opt, batch):
        out = train_step(model, opt, batch)
        return {**out, "loss": out["loss"] * float("nan")}

    rep = validate(train_step, nan_step, state, model, opt, steps=1, tolerance=Tolerance(1.0, 1.0))
    assert [d.problem for d in rep.diffs] == ["non-finite in candidate"]


def test_mutating_the_batch_is_detected_and_the_state_survives():
    model, opt, state = _captured()
    h = state.hash

    def vandal(model, opt, batch):
        out = train_step(model, opt, batch)
        batch[0].mul_(0)
        return out

    rep = validate(train_step, vandal, state, model, opt, steps=2)
    assert not rep.ok and any("modified in place by" in m for m in rep.mutations)
    assert state.intact() and state.hash == h
    assert validate(train_step, train_step, state, model, opt, steps=2).ok   # next run still clean


def test_lower_precision_candidate_needs_its_declared_tolerance():
    model, opt, state = _captured()

    def bf16_forward(model, opt, batch):
        x, y = batch
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        loss = nn.functional.cross_entropy(logits.float(), y)
        loss.backward()
        opt.step()
        return {"loss": loss, "noise": torch.rand(2)}

    assert not validate(train_step, bf16_forward, state, model, opt, steps=2).ok
    rep = validate(train_step, bf16_forward, state, model, opt, steps=2, tolerance=Tolerance(rtol=5e-2, atol=5e-2))
    assert rep.ok, rep.table()
    assert "declared tolerance" in rep.notes[0]


def test_variant_with_its_own_optimizer_loads_the_same_state():
    model, opt, state = _captured()
    loop = Variant(train_step, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=False), name="loop")
    fused = Variant(train_step, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=True), name="foreach")
    rep = validate(loop, fused, state, model, steps=3)
    assert rep.ok, rep.table()
    assert (rep.baseline, rep.candidate) == ("loop", "foreach")


def test_default_tolerances_follow_dtype():
    assert tolerance_for(torch.float32, None) == Tolerance(1.3e-6, 1e-5)
    assert tolerance_for(torch.bfloat16, None) == Tolerance(1.6e-2, 1e-5)
    assert tolerance_for(torch.int64, None) == Tolerance(0.0, 0.0)
    assert tolerance_for(torch.float32, Tolerance(1, 2)) == Tolerance(1, 2)
    with pytest.raises(ValueError):
        Tolerance(-1, 0)


def test_reference_file_across_commits(tmp_path):
    model, opt, state = _captured()
    ref = save_reference(tmp_path / "ref.pt", train_step, state, model, opt, steps=2)
    with pytest.raises(StorageError, match="never overwritten"):
        save_reference(tmp_path / "ref.pt", train_step, state, model, opt, steps=2)
    assert check_reference(ref, train_step, model, opt).ok

    def changed(model, opt, batch):
        out = train_step(model, opt, batch)
        return {**out, "loss": out["loss"] + 1e-3}

    rep = check_reference(ref, changed, model, opt)
    assert not rep.ok and rep.first_divergent_step == 0

