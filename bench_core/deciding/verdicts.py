"""Every verdict bench_core says, and what each means: written once, read by every workflow and report.

Two kinds of decision share them. A *comparison* (the stored-baseline gate, side by side with a revision)
asks whether the current code is slower than its baseline by more than a noise threshold. A *paired
decision* (A/B of two callables or two configurations) asks whether the candidate is faster than the
baseline by more than a minimum effect. Both say slower or faster only on a significant result whose whole
interval lies beyond the threshold, unchanged only when the whole interval lies within it, and inconclusive
otherwise: nothing is called unchanged that was not measured to be.
"""

SLOWER, FASTER, UNCHANGED, INCONCLUSIVE, INCOMPARABLE = (
    "slower", "faster", "unchanged", "inconclusive", "incomparable",
)
REJECTED = "rejected: incorrect"
NEW = "new"

MEANINGS = {
    SLOWER: "significant, and the whole interval of the change lies above the threshold",
    FASTER: "significant, and the whole interval of the change lies below the threshold (faster by more than it)",
    UNCHANGED: "the whole interval lies within the threshold (an A/B: within the minimum effect): any change is "
               "smaller than that",
    INCONCLUSIVE: "neither: the interval is too wide to rule out a change; the reason says what would narrow it",
    INCOMPARABLE: "the two sides measure different things (environment, scenario metadata): never compared",
    REJECTED: "A/B: the candidate failed its correctness check, so it was never timed and gets no speed verdict",
    NEW: "the scenario is not in the baseline (or the revision): nothing to compare with; said, never failed",
}

SPEEDUP_MEANS = "speedup: baseline time / candidate time (>1 = candidate faster)"
