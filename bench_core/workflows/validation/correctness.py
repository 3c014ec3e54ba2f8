"""Correctness before speed: run baseline and candidate from the same saved state and compare everything.

Observed per run: every step's outputs (a tensor, or a mapping of named tensors; a "loss" entry is
just another name), and after the last step the parameters, their gradients, the buffers and the
optimizer state. Each kind can carry its own tolerance (`Tolerances`), because a lower-precision
forward moves the logits far more than the parameters. A variant that builds its own optimizer runs
with the settings it built (lr, foreach, fused...), and every setting that differs from the
baseline's is listed in the report.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import torch

from bench_core.files import torch_files
from bench_core.core.errors import StorageError
from bench_core.workflows.validation.state import StartingState, optimizer_settings, settings_differences, tensor_leaves

# torch.testing.assert_close's defaults, per dtype: (rtol, atol)
DEFAULT_TOLERANCES = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}

KINDS = ("outputs", "params", "grads", "buffers", "optimizer")   # what a run is observed on


@dataclass(frozen=True)
class Tolerance:
    """rtol/atol for a compared tensor; a lower-precision candidate declares its own explicitly."""

    rtol: float
    atol: float

    def __post_init__(self):
        for k in ("rtol", "atol"):
            v = getattr(self, k)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"tolerance {k} must be a finite number >= 0, got {v!r}")


@dataclass(frozen=True)
class Tolerances:
    """A tolerance per kind of tensor; a kind left None gets `default`, and without one the dtype's.

    E.g. bfloat16 autocast: `Tolerances(outputs=Tolerance(5e-2, 5e-2), params=Tolerance(1e-3, 1e-4))`,
    which passes the honest candidate and still fails a wrong learning rate.
    """

    outputs: Tolerance | None = None
    params: Tolerance | None = None
    grads: Tolerance | None = None
    buffers: Tolerance | None = None
    optimizer: Tolerance | None = None
    default: Tolerance | None = None

    def of(self, kind: str) -> Tolerance | None:
        own = getattr(self, kind)
        return own if own is not None else self.default


def _declared(tolerance: Tolerance | Tolerances | None, kind: str) -> Tolerance | None:
    if isinstance(tolerance, Tolerances):
        return tolerance.of(kind)
    return tolerance


def tolerance_for(dtype: torch.dtype, declared: Tolerance | None) -> Tolerance:
    if declared is not None:
        return declared
    if not dtype.is_floating_point and not dtype.is_complex:
        return Tolerance(0.0, 0.0)  # integers and bools must match exactly
    return Tolerance(*DEFAULT_TOLERANCES.get(dtype, (1.3e-6, 1e-5)))


class Params:
    """What an optimizer factory receives: iterable as the model's parameters (`AdamW(params)` works),
    with the model and its named parameters at hand for building parameter groups."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def __iter__(self) -> Iterator[torch.nn.Parameter]:
        return iter(self.model.parameters())

    def named(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        return self.model.named_parameters()


@dataclass(frozen=True)
class Variant:
    """One implementation of a step: `step(model, optimizer, batch)` returns a tensor or named tensors. A
    step that declares a `step_index` parameter is told which step (0, 1, ...) it is taking.

    `optimizer` builds this variant's own optimizer from a `Params` (e.g. `lambda ps: AdamW(ps, fused=True)`,
    or groups built from `ps.named()`); it runs with the settings it was built with and the saved
    per-parameter state. None uses the optimizer given to `validate`, with the saved settings.
    """

    step: Callable[..., Any]
    optimizer: Callable[[Params], torch.optim.Optimizer] | None = None
    name: str | None = None

    @property
    def label(self) -> str:
        return self.name or getattr(self.step, "__qualname__", repr(self.step))

    def build_optimizer(self, model: torch.nn.Module, shared: torch.optim.Optimizer | None):
        return self.optimizer(Params(model)) if self.optimizer is not None else shared

    def call(self, model, optimizer, batch, index: int):
        if _wants_index(self.step):
            return self.step(model, optimizer, batch, step_index=index)
        return self.step(model, optimizer, batch)


def _wants_index(fn: Callable) -> bool:
    try:
        return "step_index" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


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
class KindSummary:
    """How one kind of tensor compared: bitwise equal, within tolerance (how close to it), or not."""

    kind: str
    compared: int
    bitwise: bool
    max_abs: float
    worst_share: float         # largest |error| / (atol + rtol |baseline|): 1.0 is at the tolerance
    ok: bool

    def text(self) -> str:
        if not self.compared:
            return f"{self.kind}: none compared"
        if self.bitwise:
            return f"{self.kind}: bitwise equal ({self.compared})"
        state = "within tolerance" if self.ok else "FAIL"
        return (f"{self.kind}: {state} ({self.compared}; max abs err {self.max_abs:.3g}, "
                f"{self.worst_share:.0%} of its tolerance at the worst)")

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


@dataclass(frozen=True)
class ValidationReport:
    baseline: str
    candidate: str
    steps: int
    state_hash: str
    compared: int                       # tensors compared
    diffs: tuple[TensorDiff, ...] = ()
    mutations: tuple[str, ...] = ()     # what a run changed that it was handed
    notes: tuple[str, ...] = field(default_factory=tuple)
    kinds: tuple[KindSummary, ...] = ()
    optimizer_changes: tuple[str, ...] = ()   # settings that differ: "group 0: lr 0.001 -> 0.00101"

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
                "mutations": list(self.mutations), "notes": list(self.notes),
                "kinds": [k.to_dict() for k in self.kinds], "optimizer_changes": list(self.optimizer_changes)}

    def table(self) -> str:
        from tabulate import tabulate

        head = (f"correctness: {self.candidate} vs {self.baseline}, {self.steps} steps from state "
                f"{self.state_hash[:12]}: {'PASS' if self.ok else 'FAIL'} ({self.compared} tensors compared)")
        lines = [head] + [f"  {k.text()}" for k in self.kinds]
        lines += [f"  optimizer setting: {c}" for c in self.optimizer_changes]
        lines += [f"  note: {n}" for n in self.notes]
        if self.diffs:
            rows = [[d.name, "-" if d.step is None else d.step, f"{d.max_abs:.3g}", f"{d.max_rel:.3g}",
                     f"rtol={d.rtol:g} atol={d.atol:g}", d.problem] for d in self.diffs]
            lines.append(tabulate(rows, headers=["tensor", "step", "max abs err", "max rel err", "tolerance",
                                                 "problem"], disable_numparse=True))
        if self.first_divergent_step is not None:
            lines.append(f"first divergent step: {self.first_divergent_step}")
        lines += [f"mutation: {m}" for m in self.mutations]
        return "\n".join(lines)


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


def _inputs(batches: list) -> dict[str, torch.Tensor]:
    """Every tensor handed to the steps, by where it sits: 'batch 0[1]', "batch 1['x']"."""
    return {where: t for j, b in enumerate(batches)
            for where, t in tensor_leaves(b, f"batch {j}", lambda p, k: f"{p}[{k!r}]")}


@dataclass(frozen=True)
class Run:
    """What one variant did from the starting state: observed tensors by name (step, tensor), the inputs it
    changed, and the optimizer settings it ran with."""

    observed: Mapping[str, tuple[int | None, torch.Tensor]]
    mutations: tuple[str, ...]
    settings: tuple[dict, ...]


def run_variant(variant: Variant, state: StartingState, model: torch.nn.Module,
                optimizer: torch.optim.Optimizer | None, steps: int, device=None) -> Run:
    """Restore the state, run `steps` steps, observe every tensor."""
    opt = variant.build_optimizer(model, optimizer)
    batches = state.restore(model, opt, device=device, keep_optimizer_settings=variant.optimizer is not None)
    settings = tuple(optimizer_settings(opt))
    inputs = _inputs(batches)
    values = {k: t.detach().clone() for k, t in inputs.items()}
    versions = {k: t._version for k, t in inputs.items()}   # an in-place write bumps it, even with equal values
    observed: dict[str, tuple[int | None, torch.Tensor]] = {}
    for i in range(steps):
        out = variant.call(model, opt, batches[i % len(batches)], i)
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
    for where, t in inputs.items():
        before = values[where]
        if t.shape != before.shape or not torch.equal(t, before):
            mutations.append(f"{where} was modified in place by {variant.label} (values changed)")
        elif t._version != versions[where]:
            mutations.append(f"{where} was written in place by {variant.label} (same values; its version counter moved)")
    return Run(observed, tuple(mutations), settings)


class BoundStep:
    """A zero-argument step for timing: one variant on its own model, restored from a state, cycling
    through the saved batches. Its `identity_parts` name the step, the optimizer factory and the
    optimizer's settings as built, so an A/B record shows what each side really ran."""

    def __init__(self, variant: Variant, model: torch.nn.Module, optimizer, batches: list):
        self.variant, self.model, self.optimizer, self.batches = variant, model, optimizer, batches
        self.calls = 0
        self.__qualname__ = f"bound({variant.label})"

    def __call__(self):
        out = self.variant.call(self.model, self.optimizer, self.batches[self.calls % len(self.batches)], self.calls)
        self.calls += 1
        return out

    def identity_parts(self) -> tuple[str, dict]:
        parts: dict[str, Any] = {"step": self.variant.step}
        if self.variant.optimizer is not None:
            parts["optimizer"] = self.variant.optimizer
        if self.optimizer is not None:
            parts["optimizer_settings"] = {f"group {i}": {k: repr(v) for k, v in g.items()}
                                           for i, g in enumerate(optimizer_settings(self.optimizer))}
        return self.variant.label, parts


def bind(variant: Variant | Callable, state: StartingState, model: torch.nn.Module,
         optimizer: torch.optim.Optimizer | None = None, device=None) -> BoundStep:
    """`variant` on `model` (give each variant its own instance), restored from `state`, ready to time."""
    variant = as_variant(variant)
    opt = variant.build_optimizer(model, optimizer)
    batches = state.restore(model, opt, device=device, keep_optimizer_settings=variant.optimizer is not None)
    return BoundStep(variant, model, opt, batches)


def _kind(name: str) -> str:
    if name.startswith("step["):
        return "outputs"
    return {"param": "params", "grad": "grads", "buffer": "buffers", "optimizer": "optimizer"}[name.split(".")[1]]


@dataclass(frozen=True)
class TensorComparison:
    compared: int
    diffs: tuple[TensorDiff, ...]
    kinds: tuple[KindSummary, ...]
    notes: tuple[str, ...]


def compare_observed(base: Mapping[str, tuple], cand: Mapping[str, tuple],
                     tolerance: Tolerance | Tolerances | None) -> TensorComparison:
    """Every tensor of both runs compared, with a summary per kind."""
    diffs, notes = [], []
    per_kind = {k: {"n": 0, "bitwise": True, "max_abs": 0.0, "share": 0.0, "ok": True} for k in KINDS}
    one_sided_grads = sorted(n for n in set(base) ^ set(cand) if n.startswith("final.grad."))
    if one_sided_grads:
        # zero_grad at the end of a step instead of its start leaves no gradient: the same computation
        side = "baseline" if one_sided_grads[0] in base else "candidate"
        notes.append(f"{len(one_sided_grads)} final gradient(s) exist in the {side} only (gradients cleared at "
                     f"the end of a step?): not compared; outputs and parameters decide")
    for name in sorted((set(base) | set(cand)) - set(one_sided_grads)):
        acc = per_kind[_kind(name)]
        if name not in cand or name not in base:
            step = (base.get(name) or cand.get(name))[0]
            side = "candidate" if name not in cand else "baseline"
            diffs.append(TensorDiff(name, step, math.nan, math.nan, 0, 0, f"missing from the {side}"))
            acc.update(bitwise=False, ok=False)
            continue
        step, a = base[name]
        _, b = cand[name]
        tol = tolerance_for(a.dtype, _declared(tolerance, _kind(name)))
        acc["n"] += 1
        if a.shape != b.shape or a.dtype != b.dtype:
            diffs.append(TensorDiff(name, step, math.nan, math.nan, tol.rtol, tol.atol,
                                    f"shape/dtype differs: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"))
            acc.update(bitwise=False, ok=False)
            continue
        if a.numel() == 0 or torch.equal(a, b):
            continue
        acc["bitwise"] = False
        a64, b64 = a.detach().cpu().double(), b.detach().cpu().double()
        if (b.is_floating_point() or b.is_complex()) and not torch.isfinite(b64).all() and torch.isfinite(a64).all():
            diffs.append(TensorDiff(name, step, math.inf, math.inf, tol.rtol, tol.atol, "non-finite in candidate"))
            acc.update(ok=False, max_abs=math.inf, share=math.inf)
            continue
        err = (a64 - b64).abs()
        err = torch.where(torch.isnan(a64) & torch.isnan(b64), torch.zeros_like(err), err)
        max_abs = float(err.max())
        max_rel = float((err / a64.abs().clamp_min(1e-30)).max())
        allowed = tol.atol + tol.rtol * a64.abs()
        share = float((err / allowed.clamp_min(1e-300)).max())
        acc.update(max_abs=max(acc["max_abs"], max_abs), share=max(acc["share"], share))
        if not torch.isclose(b64, a64, rtol=tol.rtol, atol=tol.atol, equal_nan=True).all():
            diffs.append(TensorDiff(name, step, max_abs, max_rel, tol.rtol, tol.atol, "exceeds tolerance"))
            acc["ok"] = False
    # step by step first, in the order they happened, then the final state
    diffs.sort(key=lambda d: (d.step is None, d.step if d.step is not None else 0, d.name))
    kinds = tuple(KindSummary(k, v["n"], v["bitwise"], v["max_abs"], v["share"], v["ok"]) for k, v in per_kind.items())
    return TensorComparison(len(set(base) & set(cand)), tuple(diffs), kinds, tuple(notes))


def _tolerance_notes(tolerance: Tolerance | Tolerances | None) -> tuple[str, ...]:
    if isinstance(tolerance, Tolerance):
        return (f"declared tolerance rtol={tolerance.rtol:g} atol={tolerance.atol:g}",)
    if isinstance(tolerance, Tolerances):
        return tuple(f"declared tolerance for {k}: rtol={t.rtol:g} atol={t.atol:g}"
                     for k in KINDS if (t := tolerance.of(k)) is not None)
    return ()


def validate(baseline: Variant | Callable, candidate: Variant | Callable, state: StartingState,
             model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *, steps: int = 3,
             tolerance: Tolerance | Tolerances | None = None, device=None) -> ValidationReport:
    """Restore `state`, run the baseline `steps` steps, restore again, run the candidate; compare all.

    Returns the report: PASS only when every observed tensor matches within its tolerance and neither run
    wrote to its inputs. Differing optimizer settings are listed whatever the outcome.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    baseline, candidate = as_variant(baseline), as_variant(candidate)
    base = run_variant(baseline, state, model, optimizer, steps, device)
    cand = run_variant(candidate, state, model, optimizer, steps, device)
    cmp = compare_observed(base.observed, cand.observed, tolerance)
    mutations = list(base.mutations + cand.mutations)
    if not state.intact():  # the restore hands out copies, so this would be a bug of ours
        mutations.append("the saved starting state changed during validation")
    return ValidationReport(baseline.label, candidate.label, steps, state.hash, cmp.compared, cmp.diffs,
                            tuple(mutations), _tolerance_notes(tolerance) + cmp.notes, cmp.kinds,
                            tuple(settings_differences(list(base.settings), list(cand.settings))))


# -- across commits: a reference file holding the state and the baseline's observed tensors -----------
def save_reference(path: str | Path, baseline: Variant | Callable, state: StartingState, model: torch.nn.Module,
                   optimizer: torch.optim.Optimizer | None = None, *, steps: int = 3) -> Path:
    """Record what the baseline produces from `state`, to check later code against (never overwrites)."""
    baseline = as_variant(baseline)
    run = run_variant(baseline, state, model, optimizer, steps)
    if run.mutations:
        raise ValueError(f"the baseline mutates its inputs, so its reference would not be reproducible: "
                         f"{list(run.mutations)}")
    if Path(path).exists():  # checked first, so a refused save leaves no stray state file
        raise StorageError(path, "reference exists and is never overwritten", hint="remove it to record a new one")
    state.save(Path(path).with_suffix(".state.pt"), overwrite=True)
    device = next((str(p.device) for p in model.parameters()), "cpu")
    return torch_files.write_reference(Path(path), baseline.label, steps, state.hash,
                                       {k: [-1 if s is None else s, t.cpu()] for k, (s, t) in run.observed.items()},
                                       device)


def check_reference(path: str | Path, candidate: Variant | Callable, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, *,
                    tolerance: Tolerance | Tolerances | None = None, device=None) -> ValidationReport:
    """Run the candidate from the reference's saved state and compare it with the saved tensors. The state
    and its batches go to `device`, by default the model's: a CUDA model is never fed CPU batches."""
    path = Path(path)
    doc = torch_files.read_reference(path)
    state = StartingState.load(path.with_suffix(".state.pt"))
    if doc["state_hash"] != state.hash:
        raise StorageError(path, "the reference was recorded from another starting state", field="state_hash")
    base = {k: (None if s == -1 else s, t) for k, (s, t) in doc["records"].items()}
    candidate = as_variant(candidate)
    if device is None:
        device = next((p.device for p in model.parameters()), None)
    run = run_variant(candidate, state, model, optimizer, doc["steps"], device)
    cmp = compare_observed(base, run.observed, tolerance)
    return ValidationReport(f"reference {path.name} ({doc['baseline']})", candidate.label, doc["steps"], state.hash,
                            cmp.compared, cmp.diffs, run.mutations, _tolerance_notes(tolerance) + cmp.notes,
                            cmp.kinds)


def record_or_check(folder: Path, save: bool, name: str, variant, state, model, optimizer=None, *, steps: int = 3,
                    tolerance=None):
    """Record reference NAME under `folder` (when `save`; returns None) or check `variant` against it (returns
    the report). A missing reference is a StorageError whose problem starts "no reference"."""
    path = Path(folder) / f"{name}.pt"
    if save:
        save_reference(path, variant, state, model, optimizer, steps=steps)
        return None
    if not path.exists():
        raise StorageError(path, f"no reference {name!r} recorded yet")
    return check_reference(path, variant, model, optimizer, tolerance=tolerance)
