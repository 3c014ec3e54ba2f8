"""Correctness before speed: run baseline and candidate from the same saved state and compare everything.

Observed per run: every step's outputs (a tensor, or a mapping of named tensors; a "loss" entry is
just another name), and after the last step the parameters, their gradients and the optimizer state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from . import storage
from .errors import StorageError
from .state import StartingState, clone_tensors

# torch.testing.assert_close's defaults, per dtype: (rtol, atol)
DEFAULT_TOLERANCES = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


@dataclass(frozen=True)
class Tolerance:
    """rtol/atol for every compared tensor; a lower-precision candidate declares its own explicitly."""

    rtol: float
    atol: float

    def __post_init__(self):
        for k in ("rtol", "atol"):
            v = getattr(self, k)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"tolerance {k} must be a finite number >= 0, got {v!r}")


def tolerance_for(dtype: torch.dtype, declared: Tolerance | None) -> Tolerance:
    if declared is not None:
        return declared
    if not dtype.is_floating_point and not dtype.is_complex:
        return Tolerance(0.0, 0.0)  # integers and bools must match exactly
    return Tolerance(*DEFAULT_TOLERANCES.get(dtype, (1.3e-6, 1e-5)))


@dataclass(frozen=True)
class Variant:
    """One implementation of a step. `step(model, optimizer, batch)` returns a tensor or named tensors.

    `optimizer` builds this variant's optimizer from the parameters (e.g. a foreach/fused one); None
    uses the optimizer given to `validate`. Both load the same saved optimizer state.
    """

    step: Callable[[torch.nn.Module, Any, Any], Any]
    optimizer: Callable[[Any], torch.optim.Optimizer] | None = None
    name: str | None = None

    @property
    def label(self) -> str:
        return self.name or getattr(self.step, "__qualname__", repr(self.step))


def as_variant(v: Variant | Callable) -> Variant:
    return v if isinstance(v, Variant) else Variant(step=v)


@dataclass(frozen=True)
class TensorDiff:
    name: str
    step: int | None           # None for final parameters, gradients and optimizer state
    max_abs: float
    max_rel: float
    rtol: float
    atol: float
    problem: str               # "exceeds tolerance", "non-finite in candidate", "shape/dtype differs", "missing"

    def to_dict(self) -> dict:
        # JSON has no NaN or infinity: an error that could not be computed is None, the problem says why
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class ValidationReport:
    baseline: str
    candidate: str
    steps: int
    state_hash: str
    compared: int                       # tensors compared
    diffs: tuple[TensorDiff, ...] = ()
    mutations: tuple[str, ...] = ()     # what the candidate changed that it was handed
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.diffs and not self.mutations

    @property
    def first_divergent_step(self) -> int | None:
        steps = [d.step for d in self.diffs if d.step is not None]
        return min(steps) if steps else None

    def to_dict(self) -> dict:
        return {"ok": self.ok, "baseline": self.baseline, "candidate": self.candidate, "steps": self.steps,
                "state_hash": self.state_hash, "compared": self.compared,
                "first_divergent_step": self.first_divergent_step, "diffs": [d.to_dict() for d in self.diffs],
                "mutations": list(self.mutations), "notes": list(self.notes)}

    def table(self) -> str:
        from tabulate import tabulate

        head = (f"correctness: {self.candidate} vs {self.baseline}, {self.steps} steps from state "
                f"{self.state_hash[:12]}: {'PASS' if self.ok else 'FAIL'} ({self.compared} tensors compared)")
        if self.ok:
            return head
        rows = [[d.name, "-" if d.step is None else d.step, f"{d.max_abs:.3g}", f"{d.max_rel:.3g}",
                 f"rtol={d.rtol:g} atol={d.atol:g}", d.problem] for d in self.diffs]
        out = head + "\n" + tabulate(rows, headers=["tensor", "step", "max abs err", "max rel err", "tolerance",
                                                    "problem"], disable_numparse=True)
        if self.first_divergent_step is not None:
            out += f"\nfirst divergent step: {self.first_divergent_step}"
        for m in self.mutations:
            out += f"\nmutation: {m}"
        return out


def _named(out: Any, prefix: str) -> dict[str, torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return {prefix: out.detach().clone()}
    if isinstance(out, Mapping):
        res = {}
        for k, v in out.items():
            res.update(_named(v, f"{prefix}.{k}"))
        return res
    if isinstance(out, (list, tuple)):
        res = {}
        for i, v in enumerate(out):
            res.update(_named(v, f"{prefix}[{i}]"))
        return res
    if out is None:
        return {}
    return {prefix: torch.as_tensor(out)}


def run_variant(variant: Variant, state: StartingState, model: torch.nn.Module,
                optimizer: torch.optim.Optimizer | None, steps: int, device=None) -> tuple[dict, list[str]]:
    """Restore the state, run `steps` steps, observe every tensor. Returns (observed, mutations)."""
    opt = variant.optimizer(model.parameters()) if variant.optimizer is not None else optimizer
    batches = state.restore(model, opt, device=device)
    handed = clone_tensors(batches)
    observed: dict[str, tuple[int | None, torch.Tensor]] = {}
    for i in range(steps):
        out = variant.step(model, opt, batches[i % len(batches)])
        for name, t in _named(out, f"step[{i}].output").items():
            observed[name] = (i, t)
    for name, p in model.named_parameters():
        observed[f"final.param.{name}"] = (None, p.detach().clone())
        if p.grad is not None:
            observed[f"final.grad.{name}"] = (None, p.grad.detach().clone())
    for name, b in model.named_buffers():
        observed[f"final.buffer.{name}"] = (None, b.detach().clone())
    if opt is not None:
        for idx, st in opt.state_dict()["state"].items():
            for key, v in st.items():
                if isinstance(v, torch.Tensor):
                    observed[f"final.optimizer.state[{idx}].{key}"] = (None, v.detach().clone())
    mutations = []
    for j, (now, before) in enumerate(zip(_flat(batches), _flat(handed))):
        if now.shape != before.shape or not torch.equal(now, before):
            mutations.append(f"input batch tensor {j} was modified in place by {variant.label}")
    return observed, mutations


class BoundStep:
    """A zero-argument step for timing: one variant on its own model, restored from a state, cycling
    through the saved batches. Its `identity_parts` name the step and the optimizer factory, so an A/B
    record shows the source of each."""

    def __init__(self, variant: Variant, model: torch.nn.Module, optimizer, batches: list):
        self.variant, self.model, self.optimizer, self.batches = variant, model, optimizer, batches
        self.calls = 0
        self.__qualname__ = f"bound({variant.label})"

    def __call__(self):
        out = self.variant.step(self.model, self.optimizer, self.batches[self.calls % len(self.batches)])
        self.calls += 1
        return out

    def identity_parts(self) -> tuple[str, dict]:
        parts = {"step": self.variant.step}
        if self.variant.optimizer is not None:
            parts["optimizer"] = self.variant.optimizer
        return self.variant.label, parts


def bind(variant: Variant | Callable, state: StartingState, model: torch.nn.Module,
         optimizer: torch.optim.Optimizer | None = None, device=None) -> BoundStep:
    """`variant` on `model` (give each variant its own instance), restored from `state`, ready to time."""
    variant = as_variant(variant)
    opt = variant.optimizer(model.parameters()) if variant.optimizer is not None else optimizer
    return BoundStep(variant, model, opt, state.restore(model, opt, device=device))


def _flat(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, Mapping):
        return [t for v in obj.values() for t in _flat(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _flat(v)]
    return []


def compare_observed(base: Mapping[str, tuple], cand: Mapping[str, tuple],
                    tolerance: Tolerance | None) -> tuple[int, list[TensorDiff]]:
    diffs = []
    for name in sorted(set(base) | set(cand)):
        if name not in cand or name not in base:
            step = (base.get(name) or cand.get(name))[0]
            side = "candidate" if name not in cand else "baseline"
            diffs.append(TensorDiff(name, step, math.nan, math.nan, 0, 0, f"missing from the {side}"))
            continue
        step, a = base[name]
        _, b = cand[name]
        tol = tolerance_for(a.dtype, tolerance)
        if a.shape != b.shape or a.dtype != b.dtype:
            diffs.append(TensorDiff(name, step, math.nan, math.nan, tol.rtol, tol.atol,
                                    f"shape/dtype differs: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"))
            continue
        if a.numel() == 0:
            continue
        a64, b64 = a.detach().cpu().double(), b.detach().cpu().double()
        if (b.is_floating_point() or b.is_complex()) and not torch.isfinite(b64).all() and torch.isfinite(a64).all():
            diffs.append(TensorDiff(name, step, math.inf, math.inf, tol.rtol, tol.atol, "non-finite in candidate"))
            continue
        err = (a64 - b64).abs()
        err = torch.where(torch.isnan(a64) & torch.isnan(b64), torch.zeros_like(err), err)
        max_abs = float(err.max())
        max_rel = float((err / a64.abs().clamp_min(1e-30)).max())
        if not torch.isclose(b64, a64, rtol=tol.rtol, atol=tol.atol, equal_nan=True).all():
            diffs.append(TensorDiff(name, step, max_abs, max_rel, tol.rtol, tol.atol, "exceeds tolerance"))
    # step by step first, in the order they happened, then the final state
    diffs.sort(key=lambda d: (d.step is None, d.step if d.step is not None else 0, d.name))
    return len(set(base) & set(cand)), diffs


def validate(baseline: Variant | Callable, candidate: Variant | Callable, state: StartingState,
             model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *, steps: int = 3,
             tolerance: Tolerance | None = None, device=None) -> ValidationReport:
    """Restore `state`, run the baseline `steps` steps, restore again, run the candidate; compare all."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    baseline, candidate = as_variant(baseline), as_variant(candidate)
    base, base_mut = run_variant(baseline, state, model, optimizer, steps, device)
    cand, cand_mut = run_variant(candidate, state, model, optimizer, steps, device)
    compared, diffs = compare_observed(base, cand, tolerance)
    mutations = base_mut + cand_mut
    if not state.intact():  # the restore hands out copies, so this would be a bug of ours
        mutations.append("the saved starting state changed during validation")
    notes = (f"declared tolerance rtol={tolerance.rtol:g} atol={tolerance.atol:g}",) if tolerance else ()
    return ValidationReport(baseline.label, candidate.label, steps, state.hash, compared, tuple(diffs),
                            tuple(mutations), notes)


# -- across commits: a reference file holding the state and the baseline's observed tensors -----------
def save_reference(path: str | Path, baseline: Variant | Callable, state: StartingState, model: torch.nn.Module,
                   optimizer: torch.optim.Optimizer | None = None, *, steps: int = 3) -> Path:
    """Record what the baseline produces from `state`, to check later code against (never overwrites)."""
    baseline = as_variant(baseline)
    observed, mutations = run_variant(baseline, state, model, optimizer, steps)
    if mutations:
        raise ValueError(f"the baseline mutates its inputs, so its reference would not be reproducible: {mutations}")
    if Path(path).exists():  # checked first, so a refused save leaves no stray state file
        raise StorageError(path, "reference exists and is never overwritten", hint="remove it to record a new one")
    state.save(Path(path).with_suffix(".state.pt"), overwrite=True)
    return storage.write_reference(Path(path), baseline.label, steps, state.hash,
                                   {k: [-1 if s is None else s, t] for k, (s, t) in observed.items()})


def check_reference(path: str | Path, candidate: Variant | Callable, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, *,
                    tolerance: Tolerance | None = None) -> ValidationReport:
    """Run the candidate from the reference's saved state and compare it with the saved tensors."""
    path = Path(path)
    doc = storage.read_reference(path)
    state = StartingState.load(path.with_suffix(".state.pt"))
    if doc["state_hash"] != state.hash:
        raise StorageError(path, "the reference was recorded from another starting state", field="state_hash")
    base = {k: (None if s == -1 else s, t) for k, (s, t) in doc["records"].items()}
    candidate = as_variant(candidate)
    cand, mutations = run_variant(candidate, state, model, optimizer, doc["steps"])
    compared, diffs = compare_observed(base, cand, tolerance)
    return ValidationReport(f"reference {path.name} ({doc['baseline']})", candidate.label, doc["steps"], state.hash,
                            compared, tuple(diffs), tuple(mutations))
