#!/usr/bin/env bash
# First contact with a lent GPU: every check that needs real hardware, in a few minutes. CI has no GPU.
# Each step runs under its own time limit, its output and exit status are kept under $OUT, and a failing step
# does not stop the ones after it: one crash must not hide what the rest would have shown.
# GPU_CHECK_PACK=1 leaves $OUT holding two files, summary.txt and gpu_check.tar.gz (every log and artifact): for a
# machine that returns only a few files from $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
dest="${OUT:-$(mktemp -d)}"
mkdir -p "$dest"
if [[ "${GPU_CHECK_PACK:-0}" == 1 ]]; then out=$(mktemp -d); else out=$dest; fi
summary="$out/summary.txt"
: > "$summary"
# a machine with its own torch and no network: bench_core itself, without touching what is installed
python -c "import bench_core.shells.plugin" 2>/dev/null \
  || python -m pip install -q --no-deps --no-build-isolation -e . > "$out/install.log" 2>&1 \
  || echo "bench_core could not be installed: see install.log"

budget=${GPU_CHECK_BUDGET_S:-290}   # the whole check within 5 minutes of device time: later steps get what is left

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  local left=$((budget - SECONDS))
  if (( left < 15 )); then   # said, never silently dropped: the summary's rc column shows it
    printf '%-22s rc=%-3s %4ss (skipped: the %ss budget is spent)\n' "$name" "skip" 0 "$budget" | tee -a "$summary"
    return
  fi
  (( limit > left )) && limit=$left
  echo "== $name (limit ${limit}s) =="
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  tail -n 15 "$out/$name.log"
  printf '%-22s rc=%-3s %4ss\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$summary"
}

step environment 30 bash -c 'nvidia-smi; python -c "
import torch
print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())
print(torch.cuda.get_device_properties(0))
print(torch.profiler.supported_activities())
x = torch.ones(1, device=\"cuda\"); print(sorted(torch.cuda.memory_stats()))
"'
# per-sample clocks need NVML: a wheel carried in .cache/wheels (run with carry=[".cache"]: the device machine has
# no network; `pip download nvidia-ml-py --no-deps -d .cache/wheels` fetches it) is installed if it is missing
python -c "import pynvml" 2>/dev/null || pip install -q --no-index --find-links .cache/wheels nvidia-ml-py 2>/dev/null \
  || echo "nvidia-ml-py not installed: the clocks check will say so"
for truth in timers memory state trace cache graph clocks kernel; do   # the hardware against what the fakes assume
  step "truth_$truth" 60 python scripts/gpu_ground_truth.py "$truth" "$out/truth"
done
step tests_gpu 120 python -m pytest tests --gpu -q -m gpu
step benchmarks_gpu 120 python -m pytest benchmarks --gpu --bench-quick -q --bench-out "$out/results"
step overlap_and_bandwidth 60 python -m pytest benchmarks --gpu -q -rA --bench-no-out -k "h2d"
step diagnose_gpu 90 python -m pytest benchmarks --gpu --bench-quick -q --bench-no-out -k "train_step and cnn" \
  --bench-profile "$out/prof"
# side by side on a GPU, where servers cannot fork (CUDA): pairs of processes are the unit. A/A, this tree against
# itself in the same interpreter, so no git history is needed on the machine
step against_gpu 120 python -m pytest benchmarks --gpu --bench-quick -q -rA --bench-no-out \
  -k "mlp_forward_precision and float32" --bench-against-python python
# decisions on the GPU (scripts/gpu_decisions.py, docs/gpu.md): planned to fill an allowance of its own, added to
# the budget so that the checks above keep theirs; it stops itself 20 s inside its limit to write what it decided
decisions_s=${GPU_DECISIONS_BUDGET_S:-240}
budget=$((budget + decisions_s))
decisions_left=$(( budget - SECONDS < decisions_s ? budget - SECONDS : decisions_s ))
step decisions "$decisions_s" python scripts/gpu_decisions.py --device cuda --budget-s "$((decisions_left - 20))" \
  --out "$out/decisions"
echo "== summary =="
cat "$summary"
if [[ "$out" != "$dest" ]]; then
  tar czf "$dest/gpu_check.tar.gz" -C "$out" . && cp "$summary" "$dest/summary.txt"
fi
! grep -qv " rc=0 " "$summary"
