"""How good are the distributed figures and decisions on this machine? Measured, not assumed.

Each trial launches real ranks (gloo, world size 2, one thread each) on the DDP MLP step of
benchmarks/test_distributed.py:
  straggler A/A   one measurement launch of identical ranks: a named straggler is a false call
  A/B  A/A        bench.ab_distributed with the same settings on both sides: "faster" or "slower"
                  is a false call
  A/B  slower     the candidate runs one wasted forward pass (no_grad) per step: the same result, more work;
                  "slower" is a detection, and the candidate must pass correctness
Usage: python quality/distributed_quality.py --trials 10 [--rounds 8 --pairs 4] [--no-straggler]
Writes the verdicts to .bench/distributed_quality-<time>.json (never overwriting).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))   # the scenario library's models

from test_distributed import _mlp_shard, _mlp_sizes  # noqa: E402 - the library scenario's own sizes and data

from bench_core import Scenario  # noqa: E402
from bench_core import RankStep, ddp_training  # noqa: E402


def wasteful_mlp(ctx) -> RankStep:
    """The library's DDP MLP step; with `waste`, one more forward pass without gradients, whose output is dropped."""
    from models import MLP

    d, h, batch = _mlp_sizes(ctx)
    made = {}

    def make():
        made["model"] = MLP(d, h)
        return made["model"]
    inner = ddp_training(ctx, make, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), _mlp_shard(d, batch),
                         torch.nn.functional.cross_entropy, reference=False)
    if not ctx.params.get("waste"):
        return inner
    x = _mlp_shard(d, batch)(ctx.rank, ctx.world_size)[0].to(ctx.device)
    model = made["model"]

    def step():
        with torch.no_grad():
            model(x)
        return inner.step()
    return RankStep(step, replicated=inner.replicated)


def main() -> None:
    from bench_core.files import atomic
    from bench_core.files.machine import fingerprint
    from bench_core.core.ranks import straggler
    from bench_core.session import BenchSession, SessionConfig

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=8, help="the A/B's rounds of fresh instances (its default: 8)")
    ap.add_argument("--pairs", type=int, default=4, help="pairs per round (its default: 4)")
    ap.add_argument("--no-straggler", action="store_true", help="skip the straggler launches")
    args = ap.parse_args()
    env = fingerprint("cpu")
    out = {"trials": args.trials, "rounds": args.rounds, "pairs": args.pairs, "straggler_aa": [], "ab_aa": [],
           "ab_slower": []}
    t0 = time.time()
    for t in range(args.trials):
        s = BenchSession(SessionConfig(results_dir=None, threads=1), env)
        seen = "-"
        if not args.no_straggler:
            m, _ = s.run_distributed(Scenario("ddp_train_step[mlp]", ("forward", "backward", "optimizer_step")),
                                     wasteful_mlp, nproc=2, validate=False)
            st = straggler(m.ranks)
            out["straggler_aa"].append({"named": st.named, "rank": st.rank, "excess": st.excess,
                                        "ci": [st.ci_low, st.ci_high], "p": st.p_value})
            seen = f"{'rank %d' % st.rank if st.named else 'none'} ({st.excess:+.1%})"
        for key, cand in (("ab_aa", {}), ("ab_slower", {"waste": True})):
            res = s.ab_distributed(key, wasteful_mlp, {}, cand, nproc=2, rounds=args.rounds, pairs=args.pairs)
            out[key].append({"verdict": res.verdict, "speedup": res.speedup, "ci": [res.ci_low, res.ci_high],
                             "p": res.p_value, "correct": bool(res.correctness.get("ok")),
                             "baseline_ms": list(res.baseline_ms), "candidate_ms": list(res.candidate_ms)})
        print(f"trial {t + 1}/{args.trials}: straggler {seen}; A/A {out['ab_aa'][-1]['verdict']} {out['ab_aa'][-1]['speedup']:.3f}; "
              f"wasteful {out['ab_slower'][-1]['verdict']} {out['ab_slower'][-1]['speedup']:.3f} "
              f"[{time.time() - t0:.0f} s]", flush=True)
    named = sum(r["named"] for r in out["straggler_aa"])
    widths = sorted(r["ci"][1] / r["ci"][0] for r in out["ab_aa"] if r["ci"][0])
    aa = sum(r["verdict"] in ("faster", "slower") for r in out["ab_aa"])
    slower = sum(r["verdict"] == "slower" for r in out["ab_slower"])
    correct = sum(r["correct"] for r in out["ab_slower"])
    speedups = sorted(r["speedup"] for r in out["ab_slower"])
    print(f"straggler named among identical ranks: {named}/{len(out['straggler_aa'])}")
    print(f"A/B A/A: median width of the 99% interval (high/low): {widths[len(widths) // 2]:.3f}" if widths else "")
    print(f"A/B A/A false calls: {aa}/{args.trials}")
    print(f"A/B one wasted forward: called slower {slower}/{args.trials}, correct {correct}/{args.trials}, "
          f"median speedup {speedups[len(speedups) // 2]:.3f}")
    print(f"wall: {time.time() - t0:.0f} s")
    path = atomic.write_stamped_json(Path(".bench"), "distributed_quality", out)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
