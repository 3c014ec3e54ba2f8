import random

import numpy as np
import pytest
import torch
from torch import nn

from bench_core import StorageError
from bench_core.workflows.validation.state import StartingState
from bench_core.workflows.validation.correctness import (Tolerance, Variant, check_reference, save_reference, tolerance_for, validate)


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
    with pytest.raises(StorageError, match="is not a readable starting state"):
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



# -- a wrong candidate cannot pass: optimizer settings, gradients, modes, in-place writes (issue 9) ------------
def _plain(model, opt, batch):
    x, y = batch
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return {"loss": loss}


def test_a_candidates_own_optimizer_settings_are_kept_and_a_changed_lr_fails_by_name():
    model, opt, state = _captured()
    cand = Variant(_plain, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1.01e-2), name="lr+1%")
    rep = validate(_plain, cand, state, model, opt, steps=2)
    assert not rep.ok
    assert "group 0: lr 0.01 -> 0.0101" in rep.optimizer_changes
    assert "optimizer setting: group 0: lr 0.01 -> 0.0101" in rep.table()


@pytest.mark.parametrize("flag", ["foreach", "fused"])
def test_a_real_change_of_implementation_passes_and_really_runs(flag):
    model, opt, state = _captured()
    built = []

    def factory(ps):
        built.append(torch.optim.AdamW(ps, lr=1e-2, **{flag: True}))
        return built[-1]

    loop = Variant(_plain, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=False), name="loop")
    rep = validate(loop, Variant(_plain, optimizer=factory, name=flag), state, model, steps=3,
                   tolerance=Tolerance(1e-5, 1e-6))
    assert rep.ok, rep.table()
    assert built[-1].param_groups[0][flag] is True             # restore kept the flag it was built with
    assert any(c.startswith(f"group 0: {flag} ") for c in rep.optimizer_changes)


def test_a_group_count_mismatch_names_both_sides():
    model, opt, state = _captured()
    two = Variant(_plain, optimizer=lambda ps: torch.optim.AdamW(
        [{"params": [p for n, p in ps.named() if n.startswith("0.")]},
         {"params": [p for n, p in ps.named() if not n.startswith("0.")], "lr": 1e-3}], lr=1e-2))
    with pytest.raises(ValueError, match="saved optimizer has 1 parameter group.*this optimizer 2"):
        validate(_plain, two, state, model, opt)


def _end_zero(model, opt, batch):
    x, y = batch
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()          # reordered: gradients cleared at the end, not the start
    return {"loss": loss}


def test_gradients_are_part_of_the_state_so_a_reordered_zero_grad_passes():
    model, opt, state = _captured()
    for p in model.parameters():
        p.grad = torch.full_like(p, 7.0)   # whatever a previous run left behind
    rep = validate(_plain, _end_zero, state, model, opt, steps=3)
    assert rep.ok, rep.table()       # before gradients were part of the state, it diverged at step 0
    assert any("final gradient(s) exist in the baseline only" in n for n in rep.notes)


def test_two_runs_of_any_step_from_one_state_are_bitwise_equal_whatever_ran_before():
    model, opt, state = _captured()
    validate(_end_zero, _end_zero, state, model, opt, steps=2)      # leaves gradients as None
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    rep = validate(_end_zero, _end_zero, state, model, opt, steps=2)
    assert rep.ok and all(k.bitwise for k in rep.kinds), rep.table()


def test_train_eval_modes_are_restored_so_a_candidate_that_sets_eval_cannot_leak():
    model, opt, state = _captured()
    seen = []

    def sets_eval(model, opt, batch):
        out = _plain(model, opt, batch)
        model.eval()
        return out

    def records_mode(model, opt, batch):
        seen.append(all(m.training for m in model.modules()))
        return _plain(model, opt, batch)

    bad = validate(_plain, sets_eval, state, model, opt, steps=3)
    assert not bad.ok and bad.first_divergent_step == 1   # dropout off from step 1: caught
    validate(records_mode, records_mode, state, model, opt, steps=2)
    assert seen == [True] * 4


@pytest.mark.parametrize("write", ["add_zero", "copy_self"])
def test_an_in_place_write_that_keeps_the_values_is_seen_and_located(write):
    model, opt, state = _captured()

    def sneaky(model, opt, batch):
        x, y = batch
        if write == "add_zero":
            x.add_(0)
        else:
            x.copy_(x)
        return _plain(model, opt, batch)

    rep = validate(_plain, sneaky, state, model, opt, steps=1)
    assert not rep.ok
    assert rep.mutations == (f"batch 0[0] was written in place by {sneaky.__qualname__} (same values; its version "
                             f"counter moved)",)


def test_a_step_can_learn_its_index():
    model, opt, state = _captured()

    def nan_at_two(model, opt, batch, step_index):
        out = _plain(model, opt, batch)
        if step_index == 2:
            out["loss"] = out["loss"] * float("nan")
        return out

    rep = validate(_plain, nan_at_two, state, model, opt, steps=4)
    assert rep.first_divergent_step == 2
    assert [d.problem for d in rep.diffs if d.step == 2] == ["non-finite in candidate"]


def test_tolerances_per_kind_pass_a_noisy_output_and_still_fail_a_wrong_lr():
    from bench_core.workflows.validation.correctness import Tolerances

    model, opt, state = _captured()

    def noisy_logits(model, opt, batch):
        out = _plain(model, opt, batch)
        return {"loss": out["loss"] * (1 + 3e-3)}     # the forward moved, the update did not

    loose_outputs = Tolerances(outputs=Tolerance(1e-2, 1e-2))
    rep = validate(_plain, noisy_logits, state, model, opt, steps=2, tolerance=loose_outputs)
    assert rep.ok, rep.table()
    kinds = {k.kind: k for k in rep.kinds}
    assert not kinds["outputs"].bitwise and 0 < kinds["outputs"].worst_share < 1
    assert kinds["params"].bitwise and "params: bitwise equal" in rep.table()
    wrong = Variant(_plain, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1.01e-2))
    assert not validate(_plain, wrong, state, model, opt, steps=2, tolerance=loose_outputs).ok


def test_the_state_hash_ignores_unseeded_python_and_numpy_generators():
    model, opt, batches = _setup()
    a = StartingState.capture(model, opt, batches)
    random.random()
    np.random.rand()
    b = StartingState.capture(model, opt, batches)
    assert a.hash == b.hash
    assert a.metadata()["hash_excludes"] == ["rng.python", "rng.numpy"]
    torch.rand(1)                                  # the torch generator is part of the identity
    assert StartingState.capture(model, opt, batches).hash != a.hash


def test_a_saved_state_keeps_grads_and_modes_across_the_file(tmp_path):
    model, opt, batches = _setup()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    model[1].eval()
    state = StartingState.capture(model, opt, batches)
    back = StartingState.load(state.save(tmp_path / "s.pt"))
    assert back.hash == state.hash
    fresh = _setup(1)[0]
    back.restore(fresh)
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in fresh.parameters())
    assert fresh.training and not fresh[1].training


def test_cuda_rng_states_for_another_device_count_are_restored_as_far_as_they_go_and_said(monkeypatch):
    # issue 15: this used to be skipped without a word
    model, opt, batches = _setup()
    state = StartingState.capture(model, opt, batches)
    state._payload["rng"]["cuda"] = [torch.zeros(8, dtype=torch.uint8), torch.ones(8, dtype=torch.uint8)]
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, i: restored.append((i, s.tolist())))
    with pytest.warns(UserWarning, match="2 device.*1 are visible now: restored for the first 1"):
        state.restore(model, opt)
    assert restored == [(0, [0] * 8)]


def test_a_state_moved_to_another_device_keeps_its_rng_states_on_the_cpu(tmp_path):
    # issue 15: load(map_location="cuda") moved the NumPy keys to the GPU and restore crashed on .numpy()
    from bench_core.workflows.validation.state import _restore_rng

    model, opt, batches = _setup()
    path = StartingState.capture(model, opt, batches).save(tmp_path / "s.pt")
    moved = StartingState.load(path, map_location="meta")       # "meta": a device other than the CPU, here
    assert moved.batches[0][0].device.type == "meta"
    rng = moved._payload["rng"]
    assert rng["torch"].device.type == "cpu" and rng["numpy"][1].device.type == "cpu"
    _restore_rng(rng)                                             # what restore does first: no crash


def test_a_reference_check_feeds_the_models_own_device(tmp_path, monkeypatch):
    # issue 15: a CUDA model was fed the reference's CPU batches
    import bench_core.workflows.validation.correctness as correctness

    model, opt, state = _captured()
    path = save_reference(tmp_path / "ref.pt", train_step, state, model, opt, steps=1)
    assert torch.load(path, weights_only=True)["device"] == "cpu"
    seen = []
    real = correctness.run_variant
    monkeypatch.setattr(correctness, "run_variant", lambda *a, **k: seen.append(a[5]) or real(*a, **k))
    assert check_reference(path, train_step, model, opt).ok
    assert [str(d) for d in seen] == ["cpu"]          # the model's device, handed on to the restore


def test_the_state_file_keeps_its_format_name(tmp_path):
    """Files written before the package was reorganized say "bench_core.state": the name is the format's, not a
    module path, and must never move with the code."""
    from bench_core.files import storage, torch_files

    assert torch_files.STATE_FORMAT == "bench_core.state" and torch_files.REFERENCE_FORMAT == "bench_core.reference"
    assert (storage.SESSION_FORMAT, storage.BASELINE_FORMAT, storage.DECISION_FORMAT) == (
        "bench_core.session", "bench_core.baseline", "bench_core.decision")
