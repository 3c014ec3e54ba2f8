"""A step's work signature, the record: the aten operators one step dispatches, by name and count; its host reads
of computed values (each a synchronization on a GPU); its copies by direction, with their bytes; the tensors it
allocates, with their bytes; under `torch.compile`, its graphs, graph breaks (by reason) and recompilations per call.
Counted by `timing.signature_count.record`, compared by `deciding.signature_diff`.

A signature is a fact about the code, not a sample: two calls of the same code on the same inputs give the same
one, whatever the machine's load. Version 1; the history is in docs/formats.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

SIGNATURE_VERSION = 1

# what a session may declare must not grow (--bench-no-growth)
COUNTERS = ("syncs", "copies", "transfers", "allocations", "operators", "graph_breaks", "recompiles", "instructions")
# copies between host and device (both directions), the ones a step on a GPU pays for most
TRANSFERS = ("device to host", "host to device")

# host instruction counts under callgrind are nearly, not exactly, the same run to run (the interpreter's own
# bookkeeping): a change smaller than this is no fact and no growth
INSTRUCTION_TOLERANCE = 0.005


@dataclass(frozen=True)
class Signature:
    operators: Mapping[str, int] = field(default_factory=dict)    # aten operator -> calls in one step
    syncs: Mapping[str, int] = field(default_factory=dict)        # operator -> host reads of computed values
    copies: Mapping[str, int] = field(default_factory=dict)       # direction -> copies
    copy_bytes: Mapping[str, int] = field(default_factory=dict)   # direction -> bytes copied
    allocations: int = 0                                          # tensors with storage of their own
    allocated_bytes: int = 0
    graphs: int = 0                                               # torch.compile: graphs a call runs
    graph_breaks: int | None = 0                                  # torch.compile: breaks in the first call; None:
                                                                  # not observed (compiled before the counted call)
    break_reasons: tuple[str, ...] = ()                           # their reasons, one line each, distinct
    recompiles: int = 0                                           # compilations in a call after the first
    recompile_reasons: tuple[str, ...] = ()                       # the guards that failed, one line each, distinct
    instructions: int | None = None                               # host instructions of one step (callgrind);
                                                                  # None: not counted

    def __post_init__(self):
        for name in ("operators", "syncs", "copies", "copy_bytes"):
            value = getattr(self, name)
            if not isinstance(value, Mapping) or any(
                    not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int) or v < 0
                    for k, v in value.items()):
                raise ValueError(f"work signature: {name} must map names to non-negative integer counts")
        for name in ("allocations", "allocated_bytes", "graphs", "graph_breaks", "recompiles"):
            value = getattr(self, name)
            if name == "graph_breaks" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"work signature: {name} must be a non-negative integer")
        if self.instructions is not None and (isinstance(self.instructions, bool) or
                                              not isinstance(self.instructions, int) or self.instructions < 0):
            raise ValueError("work signature: instructions must be a non-negative integer, or absent")
        for name in ("break_reasons", "recompile_reasons"):
            value = getattr(self, name)
            if not isinstance(value, (tuple, list)) or not all(isinstance(r, str) for r in value):
                raise ValueError(f"work signature: {name} must be a list of strings")
            object.__setattr__(self, name, tuple(value))

    def total(self, counter: str) -> int:
        if counter == "operators":
            return sum(self.operators.values())
        if counter == "transfers":
            return sum(n for way, n in self.copies.items() if way in TRANSFERS)
        if counter in ("allocations", "recompiles", "graphs", "graph_breaks"):
            return getattr(self, counter) or 0
        if counter == "instructions":
            return self.instructions or 0
        return sum(getattr(self, counter).values())

    def to_dict(self) -> dict:
        return {"version": SIGNATURE_VERSION, "operators": dict(sorted(self.operators.items())),
                "syncs": dict(self.syncs), "copies": dict(self.copies), "copy_bytes": dict(self.copy_bytes),
                "allocations": self.allocations, "allocated_bytes": self.allocated_bytes, "graphs": self.graphs,
                "graph_breaks": self.graph_breaks, "break_reasons": list(self.break_reasons),
                "recompiles": self.recompiles,
                **({"recompile_reasons": list(self.recompile_reasons)} if self.recompile_reasons else {}),
                **({"instructions": self.instructions} if self.instructions is not None else {})}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "Signature":
        if not isinstance(doc, Mapping) or doc.get("version") != SIGNATURE_VERSION:
            raise ValueError(f"work signature: version {doc.get('version') if isinstance(doc, Mapping) else doc!r} "
                             f"is not {SIGNATURE_VERSION}")
        return cls(**{k: doc[k] for k in ("operators", "syncs", "copies", "copy_bytes", "allocations",
                                          "allocated_bytes", "graphs", "graph_breaks", "break_reasons",
                                          "recompiles", "recompile_reasons", "instructions") if k in doc})
