"""A saved starting state: model, optimizer, RNG, numeric flags and input batches, restorable exactly.

Training steps change weights, so two candidates are comparable only from the same start. Capture
takes deep copies (never live references); restore loads copies back, so the saved state survives a
candidate that mutates what it is given.
"""
from __future__ import annotations

import copy
import hashlib
import os
import random
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch

from bench_core.files import torch_files
from bench_core.core.errors import StorageError


def clone_tensors(obj: Any) -> Any:
    """Deep copy with tensors detached and cloned (deepcopy refuses non-leaf tensors)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, Mapping):
        return {k: clone_tensors(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(clone_tensors(v) for v in obj)
    if isinstance(obj, list):
        return [clone_tensors(v) for v in obj]
    return copy.deepcopy(obj)


def _to(obj: Any, device: str | torch.device | None) -> Any:
    if device is None:
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, Mapping):
        return {k: _to(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(v, device) for v in obj)
    return obj


def _feed(h, obj: Any) -> None:
    """Hash content, not pickle bytes: the same state hashes the same across processes and saves."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(obj, Mapping):
        h.update(b"{")
        for k in sorted(obj, key=str):
            h.update(repr(k).encode())
            _feed(h, obj[k])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for v in obj:
            _feed(h, v)
        h.update(b"]")
    else:
        h.update(repr(obj).encode())


def content_hash(obj: Any) -> str:
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


# Python's and NumPy's global generators are seeded from the OS at start-up unless a program seeds them, so
# the same model and batches would hash differently in every process. They are restored, not hashed.
UNHASHED_RNG = ("python", "numpy")


def state_hash(payload: Mapping[str, Any], version: int) -> str:
    """The identity of a starting state: its content, minus what differs between processes by chance."""
    if version < 2:  # version 1 files hashed everything
        return content_hash(payload)
    rng = {k: v for k, v in payload["rng"].items() if k not in UNHASHED_RNG}
    return content_hash({**payload, "rng": rng})


def optimizer_settings(optimizer: torch.optim.Optimizer | None) -> list[dict]:
    """Every parameter group's settings (lr, betas, foreach, fused...), without its parameters."""
    if optimizer is None:
        return []
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


def settings_differences(base: list[dict], cand: list[dict]) -> list[str]:
    """'group 0: lr 0.001 -> 0.00101' for every setting that differs, in group order."""
    out = []
    if len(base) != len(cand):
        out.append(f"parameter groups: {len(base)} -> {len(cand)}")
    for i, (a, b) in enumerate(zip(base, cand)):
        for key in sorted(set(a) | set(b)):
            if a.get(key, "<unset>") != b.get(key, "<unset>"):
                out.append(f"group {i}: {key} {a.get(key, '<unset>')!r} -> {b.get(key, '<unset>')!r}")
    return out


def _capture_rng() -> dict:
    rng = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        name, keys, pos, has_gauss, gauss = np.random.get_state()
        rng["numpy"] = (name, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(gauss))
    except ImportError:  # pragma: no cover - numpy comes with scipy
        pass
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def _restore_rng(rng: Mapping) -> None:
    # a state moved to a device (load(map_location=...)) keeps its RNG states on the CPU, where they belong
    random.setstate(_python_state(rng["python"]))
    torch.set_rng_state(rng["torch"].cpu())
    if "numpy" in rng:
        import numpy as np

        name, keys, pos, has_gauss, gauss = rng["numpy"]
        np.random.set_state((name, keys.numpy().astype("uint32"), pos, has_gauss, gauss))
    if "cuda" in rng and torch.cuda.is_available():
        states, visible = rng["cuda"], torch.cuda.device_count()
        if len(states) != visible:  # never silently: draws on the devices without a state would differ
            import warnings

            warnings.warn(f"the starting state holds CUDA RNG states for {len(states)} device(s) and {visible} are "
                          f"visible now: restored for the first {min(len(states), visible)}; random draws on the "
                          f"others are not reproduced (set CUDA_VISIBLE_DEVICES as at capture)", stacklevel=3)
        for i, state in enumerate(states[:visible]):
            torch.cuda.set_rng_state(state.cpu(), i)


def _python_state(state):
    # a file round trip turns the inner tuple into a list; random.setstate wants tuples
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


def _capture_flags() -> dict:
    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "allow_tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "allow_tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def _restore_flags(flags: Mapping) -> None:
    torch.use_deterministic_algorithms(flags["deterministic_algorithms"])
    torch.backends.cuda.matmul.allow_tf32 = flags["allow_tf32_matmul"]
    torch.backends.cudnn.allow_tf32 = flags["allow_tf32_cudnn"]
    torch.backends.cudnn.benchmark = flags["cudnn_benchmark"]
    torch.backends.cudnn.deterministic = flags["cudnn_deterministic"]
    torch.set_float32_matmul_precision(flags["float32_matmul_precision"])


def tensor_leaves(obj: Any, prefix: str, key: Callable[[str, Any], str]) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor inside mappings, lists and tuples, with its place: `key(prefix, k)` names a mapping's
    entry, `[i]` a sequence's."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from tensor_leaves(v, key(prefix, k), key)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from tensor_leaves(v, f"{prefix}[{i}]", key)


def _describe(obj: Any, prefix: str, out: dict) -> dict:
    for where, t in tensor_leaves(obj, prefix, lambda p, k: f"{p}.{k}" if p else str(k)):
        out[where] = {"shape": list(t.shape), "dtype": str(t.dtype), "device": str(t.device)}
    return out


STATE_VERSION = 2  # what `capture` makes: see storage's history of the starting-state file


class StartingState:
    """Model and optimizer state, gradients, train/eval modes, RNG states, numeric flags and input batches,
    as deep copies. Two runs of any step from one state are bitwise equal on the CPU."""

    __slots__ = ("_payload", "_hash", "_version")

    def __init__(self, payload: Mapping[str, Any], _known_hash: str | None = None, _version: int = STATE_VERSION):
        self._payload = payload
        self._version = _version
        self._hash = _known_hash or state_hash(payload, _version)

    # -- capture and restore ---------------------------------------------------------------------
    @classmethod
    def capture(cls, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                batches: Iterable[Any] = ()) -> "StartingState":
        batches = list(batches)
        if not batches:
            raise ValueError("a starting state needs at least one input batch")
        return cls({
            "model": clone_tensors(model.state_dict()),
            "grads": {n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()},
            "modes": {n: m.training for n, m in model.named_modules()},
            "optimizer": clone_tensors(optimizer.state_dict()) if optimizer is not None else None,
            "rng": clone_tensors(_capture_rng()),
            "flags": _capture_flags(),
            "batches": clone_tensors(batches),
        })

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                device: str | torch.device | None = None, *, keep_optimizer_settings: bool = False) -> list[Any]:
        """Put model, gradients, train/eval modes, optimizer state, RNG and flags back; return fresh copies
        of the batches (on `device`).

        The optimizer gets the saved per-parameter state (moments, step counts). Its settings (lr, betas,
        foreach, fused...) are the saved ones, unless `keep_optimizer_settings`: then the optimizer keeps
        the settings it was built with, as a candidate that builds its own optimizer must.
        """
        p = self._payload
        model.load_state_dict(clone_tensors(p["model"]))
        if device is not None:
            model.to(device)
        self._restore_grads_and_modes(model)
        if optimizer is not None:
            if p["optimizer"] is None:
                raise ValueError("this starting state holds no optimizer state")
            saved = clone_tensors(p["optimizer"])
            if keep_optimizer_settings:
                saved["param_groups"] = _own_settings(saved["param_groups"], optimizer.param_groups)
            # Handed over on the CPU: load_state_dict moves each state tensor to its parameter's device
            # and keeps `step` where the optimizer wants it (on the CPU unless capturable or fused).
            optimizer.load_state_dict(_to(saved, "cpu"))
        _restore_rng(p["rng"])
        _restore_flags(p["flags"])
        return _to(clone_tensors(p["batches"]), device)

    def _restore_grads_and_modes(self, model: torch.nn.Module) -> None:
        p = self._payload
        grads = p.get("grads")  # version 1 files have none: every gradient starts empty
        for name, param in model.named_parameters():
            g = (grads or {}).get(name)
            param.grad = None if g is None else g.detach().clone().to(param.device)
        for name, module in model.named_modules():
            if name in p.get("modes", {}):
                module.training = p["modes"][name]   # this module alone: train() would recurse

    # -- identity --------------------------------------------------------------------------------
    @property
    def hash(self) -> str:
        return self._hash

    @property
    def batches(self) -> list[Any]:
        """Copies: the saved batches themselves are never handed out."""
        return clone_tensors(self._payload["batches"])

    def intact(self) -> bool:
        """True when nothing has changed the saved tensors since capture."""
        return state_hash(self._payload, self._version) == self._hash

    def metadata(self) -> dict:
        p = self._payload
        return {
            "torch": str(torch.__version__),
            "hash": self._hash,
            "model": _describe(p["model"], "", {}),
            "batches": _describe(p["batches"], "batches", {}),
            "has_optimizer": p["optimizer"] is not None,
            "hash_excludes": [f"rng.{k}" for k in UNHASHED_RNG] if self._version >= 2 else [],
            "flags": dict(p["flags"]),
        }

    # -- files -----------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        return torch_files.write_state(Path(path), self._payload, self.metadata(), self._hash, self._version,
                                       overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike, map_location: str | torch.device | None = None) -> "StartingState":
        """Read a saved state; a damaged or foreign file is refused. `map_location` moves it to a device."""
        path = Path(path)
        doc = torch_files.read_state(path)
        version = doc["schema_version"]
        checked = state_hash(doc["payload"], version)  # verified on the CPU, before any move
        if checked != doc.get("hash"):
            raise StorageError(path, "content hash does not match: the file was changed or damaged", field="hash")
        payload = {k: v if k == "rng" else _to(v, map_location) for k, v in doc["payload"].items()}
        state = cls(payload, _known_hash=checked, _version=version)
        saved_torch = doc.get("meta", {}).get("torch")
        if saved_torch and saved_torch.split(".")[:2] != torch.__version__.split(".")[:2]:
            raise StorageError(path, f"saved with torch {saved_torch}, running {torch.__version__}",
                               field="meta.torch", hint="results across torch versions are not comparable")
        return state


def _own_settings(saved_groups: list[dict], own_groups: list[dict]) -> list[dict]:
    """The saved groups' parameter indices with the optimizer's own settings."""
    if len(saved_groups) != len(own_groups):
        raise ValueError(f"the saved optimizer has {len(saved_groups)} parameter group(s), this optimizer "
                         f"{len(own_groups)}: build the candidate's optimizer with the same groups, in the same order")
    return [{**{k: v for k, v in own.items() if k != "params"}, "params": saved["params"]}
            for saved, own in zip(saved_groups, own_groups)]
