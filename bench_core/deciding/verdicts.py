"""Every verdict bench_core says, and what each means: written once, read by every workflow and report.

Two kinds of decision use them. A *comparison* (the stored-baseline gate, side by side with a revision)
asks whether the current code is slower than its baseline by more than a noise threshold. A *paired
decision* (A/B of two callables or two configurations, validation) asks whether the candidate is faster
than the baseline by more than a minimum effect. Both decide only on a significant result whose whole
interval lies beyond the threshold; neither calls anything "unchanged" that it did not measure.
"""

SLOWER, FASTER, UNCHANGED, INCONCLUSIVE, INCOMPARABLE = (
    "slower", "faster", "unchanged", "inconclusive", "incomparable",
)
NO_DIFFERENCE, REJECTED = "no significant difference", "rejected: incorrect"

MEANINGS = {
    SLOWER: "significant, and the whole interval of the change lies above the threshold",
    FASTER: "significant, and the whole interval of the change lies below the threshold (faster by more than it)",
    UNCHANGED: "the whole interval lies within the threshold: any change is smaller than the noise allowance",
    INCONCLUSIVE: "neither: the interval is too wide to rule out a change; the reason says what would narrow it",
    INCOMPARABLE: "the two sides measure different things (environment, scenario metadata): never compared",
    NO_DIFFERENCE: "A/B: not significant, or the interval reaches inside the minimum effect",
    REJECTED: "A/B: the candidate failed its correctness check, so it was never timed and gets no speed verdict",
}

SPEEDUP_MEANS = "speedup: baseline time / candidate time (>1 = candidate faster)"
