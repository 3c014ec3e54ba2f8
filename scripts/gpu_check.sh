#!/usr/bin/env bash
# Every check that needs a real NVIDIA GPU, in a few minutes. CI has no GPU; run this on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$(mktemp -d)}"
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA'; print(torch.__version__, torch.cuda.get_device_name())"
echo "== tests marked gpu, and every CPU test, with --gpu =="
python -m pytest tests --gpu -q
echo "== benchmarks on CUDA, quick sizes =="
python -m pytest benchmarks --gpu --bench-quick -q --bench-out "$out/results"
echo "== diagnose pass on CUDA =="
python -m pytest benchmarks --gpu --bench-quick -q --bench-no-out -k "train_step and cnn" --bench-profile "$out/prof"
