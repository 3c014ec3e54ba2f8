#!/usr/bin/env bash
# The commands of .github/workflows/bench-{cpu,gpu}.yml, run here, in the current environment, so a workflow can be
# tried before it is pushed. Usage: scripts/ci_local.sh cpu [BASE_REV]   |   scripts/ci_local.sh gpu
# The Markdown report goes where $GITHUB_STEP_SUMMARY would send it: a temporary file, printed at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
what="${1:-cpu}"
summary="$(mktemp -t bench-summary-XXXXXX.md)"
step() { echo; echo "== $* =="; "$@"; echo "(exit $?)"; }
case "$what" in
  cpu)
    base="${2:-HEAD~1}"
    step python -m pytest tests -q
    step python -m pytest benchmarks -q --bench-quick --bench-threads 1
    step python -m pytest benchmarks -q --bench-threads 1 --bench-against "$base" --bench-md "$summary"
    ;;
  gpu)
    baselines="$(mktemp -d -t bench-baselines-XXXXXX)"
    python -c "import torch; assert torch.cuda.is_available()" 2>/dev/null \
      || echo "note: no CUDA here: the --gpu steps below must refuse to run, saying why"
    step python -m pytest benchmarks -q --gpu --bench-baselines "$baselines" --bench-save main --bench-md "$summary"
    step python -m pytest benchmarks -q --gpu --bench-baselines "$baselines" --bench-compare main \
      --bench-baseline-window 20 --bench-md "$summary"
    rm -rf "$baselines"
    ;;
  *) echo "usage: $0 cpu [BASE_REV] | gpu" >&2; exit 2 ;;
esac
echo; echo "== the job summary ($summary) =="; cat "$summary" 2>/dev/null || echo "(none written)"
rm -f "$summary"
