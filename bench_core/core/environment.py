"""The environment model: which fields of a result's environment record decide whether two results are
comparable (reading the record off a machine is `files.machine`)."""
from __future__ import annotations

from typing import Any, Mapping

# Fields whose difference makes two results measure different things. Everything else (hostname,
# clock readings, free memory, git commit) is recorded for the reader but never blocks a comparison.
COMPARABILITY_FIELDS = (
    "device",
    "gpu_name",
    "gpu_sm_count",        # two MIG slices share a GPU name; their SM counts and memory differ
    "gpu_memory_bytes",
    "gpu_driver",
    "torch_major_minor",
    "cuda_version",        # the CUDA torch was built with; the driver's is gpu_driver
    "allow_tf32_matmul",
    "allow_tf32_cudnn",
    "deterministic_algorithms",
)


# On the CPU the processor itself is the device: another model or core count is another machine.
CPU_COMPARABILITY_FIELDS = ("cpu_model", "cpu_count")

# Recorded only by later versions: compared where both records have them, so older baselines stay comparable.
# `malloc`: glibc's thresholds pinned or left to move (`--bench-malloc`): a memory-bound step's runs spread several
# times wider left alone, where some runs draw the slow way of reusing memory (docs/running.md, docs/history.md).
LATER_COMPARABILITY_FIELDS = ("malloc",)


def differences(a: Mapping[str, Any], b: Mapping[str, Any], fields=None) -> dict:
    """The comparability fields where a and b disagree, as {field: (a, b)}."""
    if fields is None:
        fields = COMPARABILITY_FIELDS + (CPU_COMPARABILITY_FIELDS if "cpu" in (a.get("device"), b.get("device")) else ())
        fields += tuple(f for f in LATER_COMPARABILITY_FIELDS if None not in (a.get(f), b.get(f)))
    return {f: (a.get(f), b.get(f)) for f in fields if a.get(f) != b.get(f)}
