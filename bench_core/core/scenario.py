"""What a measurement measures: the scenario record every result carries."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

from bench_core.core.errors import InvalidRecord

# The stages a timed window may hold. Keeping the vocabulary closed makes two results comparable only
# when they say the same thing about their boundaries.
STAGES = (
    "batch_read",      # a batch comes out of a DataLoader / dataset
    "transfer",        # host-to-device (or device-to-host) copy
    "forward",
    "backward",
    "optimizer_step",
    "request",         # one inference request (model already loaded)
    "compute",         # a kernel or op sequence that is not a model step
    "model_load",      # construction + state load + move to device; never inside a request
    "call",            # one call of a pytest-benchmark test's function: what it holds is the test's, not stated
)

# Metadata a scenario says about itself that never decides whether two results are comparable: what a
# pytest-benchmark test puts in `extra_info` (often figures it computed), the table it is shown in (`group`), notes
# on how its calls were taken, and the pytest test that measured it (tests get renamed and moved).
INFORMATIONAL = ("extra_info", "group", "notes", "test")


def freeze(value: Any) -> Any:
    """Mappings and sequences made read-only, all the way down (records hold them; `thaw` undoes it)."""
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Turn frozen metadata back into plain JSON-able containers."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class Scenario:
    """One question a benchmark answers, with the boundaries of its timed window.

    `window` lists the stages inside the timed window, in order. `metadata` records what the
    number depends on (shapes, batch size, dtype, train/eval mode, compiled, data source, device).
    `noise_threshold` is the smallest relative change the regression gate may call a change for
    this scenario (None: the gate's default). `no_growth` names the work-signature counters (of
    `core.signature.COUNTERS`: syncs, copies, graph breaks, ...) that must not grow against the
    baseline or revision: the scenario's signature is then counted, and growth fails its item, as
    `--bench-no-growth` does for every scenario. On a GPU, `cache` says whether each sample starts with the
    L2 flushed ("cold") or warm from the one before ("hot"; None: not stated), and `graph` times the step
    captured as a CUDA graph beside it eagerly (`--bench-cache` and `--bench-graph` beat both); the result
    records each in its metadata. On the CPU they are not applied, and the metadata says so.
    """

    name: str
    window: tuple[str, ...]
    metadata: Mapping[str, Any] = field(default_factory=dict)
    noise_threshold: float | None = None
    description: str = ""
    no_growth: tuple[str, ...] = ()
    cache: str | None = None
    graph: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            raise InvalidRecord("scenario name must be a non-empty string")
        window = tuple(self.window) if not isinstance(self.window, str) else (self.window,)
        if not window:
            raise InvalidRecord(f"scenario {self.name!r}: window must name at least one stage of {STAGES}")
        unknown = [s for s in window if s not in STAGES]
        if unknown:
            raise InvalidRecord(
                f"scenario {self.name!r}: unknown stage(s) {unknown} in window; use stages from {STAGES}"
            )
        if "request" in window and "model_load" in window:
            raise InvalidRecord(
                f"scenario {self.name!r}: model loading is never inside a request; time it as the cold start"
            )
        if not isinstance(self.metadata, Mapping):
            raise InvalidRecord(f"scenario {self.name!r}: metadata must be a mapping")
        if self.noise_threshold is not None:
            t = self.noise_threshold
            if not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 <= t < 1:
                raise InvalidRecord(
                    f"scenario {self.name!r}: noise_threshold must be a fraction in [0, 1), got {t!r}"
                )
        from bench_core.core.signature import COUNTERS

        counters = (self.no_growth,) if isinstance(self.no_growth, str) else tuple(self.no_growth)
        unknown = [c for c in counters if c not in COUNTERS]
        if unknown:
            raise InvalidRecord(f"scenario {self.name!r}: unknown counter(s) {unknown} in no_growth; use counters "
                                f"from {COUNTERS}")
        if self.cache not in (None, "cold", "hot"):
            raise InvalidRecord(f"scenario {self.name!r}: cache must be 'cold', 'hot' or None, got {self.cache!r}")
        if not isinstance(self.graph, bool):
            raise InvalidRecord(f"scenario {self.name!r}: graph must be True or False, got {self.graph!r}")
        object.__setattr__(self, "window", window)
        object.__setattr__(self, "metadata", freeze(dict(self.metadata)))
        object.__setattr__(self, "no_growth", counters)

    def with_metadata(self, **extra: Any) -> "Scenario":
        merged = thaw(self.metadata)
        merged.update(extra)
        return replace(self, metadata=merged)
