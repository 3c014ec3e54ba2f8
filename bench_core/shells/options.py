"""Every command-line option of bench_core, declared once.

The pytest plugin adds them all; the CLI adds the ones it shares (`Option.cli`), under its own shorter names,
with the same help, type and meaning. Where a setting has a default in a config object (`GateConfig`,
`AgainstConfig`), the option's default is None ("not given") and its help quotes the config's own default, so
the two shells cannot drift apart. The config objects are built from them in `shells.configs`.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any, Callable

from bench_core.deciding.comparison import CHASES, DEFAULT_MAX_RUNS, GateConfig

GATE = GateConfig()


def _against_default(name: str) -> Any:
    from bench_core.workflows.side_by_side.compare import AgainstConfig

    return {f.name: f.default for f in dataclasses.fields(AgainstConfig)}[name]


@dataclass(frozen=True)
class Option:
    flag: str                           # the pytest flag
    help: str
    type: Callable[[str], Any] | None = None   # None: a switch
    default: Any = None
    metavar: str | None = None
    cli: str | None = None              # the CLI's flag, for an option the CLI shares
    choices: tuple[str, ...] | None = None
    setting: bool = False               # a team sets it once: a key of pyproject.toml's [tool.bench_core]
    internal: bool = False              # bench_core's own plumbing between its processes: not in --help
    tuning: bool = False                # a knob with a measured default: in docs/running.md, not in pytest's --help
    group: str = "running"              # where pytest's --help shows it (GROUPS)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def key(self) -> str:
        """Its key in [tool.bench_core]: the flag without --bench- (underscores read the same)."""
        return self.flag.removeprefix("--bench-").removeprefix("--")

    def kwargs(self, given_only: bool = False, shown: bool = True) -> dict:
        """argparse's arguments; `given_only`: no default (None: not given), so a setting can fill it; `shown`:
        listed by --help (internal plumbing never is)."""
        text = self.help.replace("%", "%%") if shown and not self.internal else argparse.SUPPRESS   # help uses %
        if self.type is None:
            return {"action": "store_true", "default": False, "help": text, "dest": self.dest}
        kw = {"type": self.type, "default": None if given_only else self.default, "help": text, "dest": self.dest}
        if self.choices is not None:
            kw["choices"] = self.choices
        else:   # the value's name, not the destination's: NAME rather than BENCH_SAVE
            kw["metavar"] = self.metavar or self.dest.removeprefix("bench_").upper()
        return kw


HISTORY = "--bench-history"
GPU, QUICK, WARMUP, REPEATS, THREADS = "--gpu", "--bench-quick", "--bench-warmup", "--bench-repeats", "--bench-threads"
OUT, NO_OUT, SAVE, APPEND, SAVE_INCOMPLETE = ("--bench-out", "--bench-no-out", "--bench-save", "--bench-append",
                                              "--bench-save-incomplete")
COMPARE, BASELINES, THRESHOLD, ALPHA, RUN_NOISE = ("--bench-compare", "--bench-baselines", "--bench-threshold",
                                                   "--bench-alpha", "--bench-run-noise")
MIN_RUNS, MAX_RUNS, WINDOW, ALLOW_ENV, ADJUST = ("--bench-min-runs", "--bench-max-runs", "--bench-baseline-window",
                                                 "--bench-allow-env-mismatch", "--bench-adjust")
REPLICATE = "--bench-replicate"
SIGNATURE, NO_GROWTH, INSTRUCTIONS = "--bench-signature", "--bench-no-growth", "--bench-instructions"
MD, WIDE, PLOTS, FLOPS, PEAK, STRICT, TIMEOUT = ("--bench-md", "--bench-wide", "--bench-plots", "--bench-flops",
                                                 "--bench-peak-tflops", "--bench-strict", "--bench-timeout")
AGAINST, ROUNDS, PAIRS, WORKER_PAIRS, MAX_ROUNDS = ("--bench-against", "--bench-rounds", "--bench-pairs",
                                                    "--bench-worker-pairs", "--bench-max-rounds")
NPROC, NNODES, NODE_RANK, RDZV = "--bench-nproc", "--bench-nnodes", "--bench-node-rank", "--bench-rdzv-endpoint"
PB_JSON, REF_SAVE, REFS, REPLICA = "--bench-pb-json", "--bench-ref-save", "--bench-references", "--bench-replica"
AGAINST_PROCESSES, AGAINST_PYTHON, SERVE = "--bench-against-processes", "--bench-against-python", "--bench-serve"
BUILD, SHARD, SHARD_DURATIONS = "--bench-build", "--bench-shard", "--bench-shard-durations"
MALLOC, PB_FIXTURE = "--bench-malloc", "--bench-pb-fixture"
CACHE, GRAPH = "--bench-cache", "--bench-graph"
PROFILE, PROFILE_SHAPES, PROFILE_MEMORY, PROFILE_STACK = ("--bench-profile", "--bench-profile-shapes",
                                                          "--bench-profile-memory", "--bench-profile-stack")
PROFILE_FLOPS, PROFILE_TB, PROFILE_REFUSE = ("--bench-profile-flops", "--bench-profile-tensorboard",
                                             "--bench-profile-refuse-sensitive")


def _against_options() -> tuple[Option, ...]:
    a = _against_default
    return (
        Option(AGAINST, "measure every scenario side by side with git revision REV in this run, and decide each",
               str, metavar="REV"),
        Option(ROUNDS, f"with --bench-against: rounds of fresh instances ({a('rounds')})", int),
        Option(PAIRS, f"with --bench-against: alternated pairs per round, at least ({a('pairs')}; a step whose "
                      f"pairs would take under {a('pairs_ms')} ms gets more, up to 8)", int),
        Option(WORKER_PAIRS, f"with --bench-against, for code that cannot be loaded twice into one process: pairs of "
                             f"worker processes, the unit of evidence there ({a('processes')}; {a('quick_processes')} "
                             f"under --bench-quick); each pair serves every such scenario in turn", int, metavar="N"),
        Option(AGAINST_PROCESSES, "with --bench-against: every scenario's sides in pytest processes of their own, each "
                                  "in its own tree (otherwise only where one process cannot hold both faithfully)"),
        Option(AGAINST_PYTHON, "run the revision's side in this interpreter (another virtual environment: did the "
                               "torch upgrade slow my model?); alone, without --bench-against, the revision is this "
                               "tree, so the two sides differ only in their environments", str, metavar="PYTHON"),
        Option(BUILD, "with --bench-against, for a project with compiled code whose sources differ in the revision: "
                      "the command that builds it in place (e.g. 'python setup.py build_ext --inplace'), run in the "
                      "revision's tree once and cached", str, metavar="CMD", setting=True, cli="--build"),
        Option(SHARD, "run only this runner's part K of N of the collected tests (stable, disjoint; each shard's "
                      "session file says which part it is); join the shards with bench-core merge and gate the "
                      "merged session as one (docs/ci.md)", str, metavar="K/N"),
        Option(SHARD_DURATIONS, "with --bench-shard: deal the tests by the durations in FILE (test id -> seconds, as "
                                "bench-core merge --durations writes it; kept in the repository, so every runner "
                                "reads the same), the longest first, each to the least loaded shard; round robin "
                                "while FILE is not there", str, metavar="FILE"),
        Option(SERVE, "(used by --bench-against's process mode) serve test items to the process that started this "
                      "one, over pipe descriptors R,W", str, metavar="R,W"),
        Option(MAX_ROUNDS, "with --bench-against: a possible change the first look leaves undecided runs on, a look "
                           "every --bench-rounds rounds, up to this many (3 x --bench-rounds; equal to it: one look)",
               int),
    )


def _options() -> tuple[Option, ...]:
    a = _against_default
    return (
        Option(GPU, "run scenarios on CUDA; stop at once if CUDA is not available"),
        Option(MALLOC, "'as-is' (the default) leaves glibc malloc's thresholds as the program has them; 'pinned' "
                       "fixes them in every process that measures (this one, the gate's fresh processes, both sides' "
                       "servers, ranks): less spread on a memory-bound step, but a program users do not run, which "
                       "every report then says first (docs/running.md). Recorded with every result",
               str, choices=("pinned", "as-is")),
        Option(PB_FIXTURE, "tests that use pytest-benchmark's `benchmark` fixture: 'adopt' (the default) measures and "
                           "gates them as bench_core scenarios; 'leave' leaves them to pytest-benchmark, and a gate "
                           "counts them as not measured", str, choices=("adopt", "leave")),
        Option(WARMUP, "untimed warmup calls per scenario (overrides scenarios)", int),
        Option(REPEATS, "timed samples per scenario (overrides scenarios)", int),
        Option(QUICK, "smoke run: smallest sizes, 1 warmup, 5 samples"),
        Option(THREADS, "torch CPU threads: 'auto' (the default) keeps torch's own, as the program runs; N sets them "
                        "(1 on a loaded runner, where more threads than free cores split the samples into clusters), "
                        "which every report then says first; recorded in every result", str, metavar="N|auto"),
        Option(OUT, "folder for the session's JSON results (never overwritten)", str, ".bench/results"),
        Option(NO_OUT, "write no session JSON (and add nothing to the history)"),
        Option(SAVE, "store this session as baseline NAME", str, metavar="NAME"),
        Option(APPEND, "with --bench-save: add this session as another run of NAME"),
        Option(SAVE_INCOMPLETE, "with --bench-save: store the session even when it was interrupted or a test failed"),
        Option(COMPARE, "gate every scenario against baseline NAME", str, metavar="NAME"),
        Option(BASELINES, "folder of stored baselines", str, "baselines", cli="--baselines"),
        Option(THRESHOLD, f"default noise threshold, a fraction ({GATE.threshold}; --bench-against: "
                          f"{a('threshold')})", float, cli="--threshold"),
        Option(MD, "append a Markdown report here (e.g. \"$GITHUB_STEP_SUMMARY\"): verdicts first, then tables", str,
               metavar="PATH"),
        Option(WIDE, "tables with every column and notes unwrapped (by default they fit 120 columns)", cli="--wide"),
        Option(PLOTS, "write a distribution plot per scenario (this run, baseline runs, A and B) to DIR (needs "
                      "matplotlib: pip install -e \".[plots]\")", str, metavar="DIR"),
        Option(FLOPS, "count each step's FLOPs once after its window (torch's FLOP counter) and report achieved "
                      "FLOP/s and the share of the peak"),
        Option(PEAK, "the device's peak for utilization (default: a known GPU's for the dtype, or on the CPU a matmul "
                     "peak measured once)", float, metavar="TFLOPS"),
        Option(STRICT, "with a comparison: inconclusive and incomparable fail their test items too (the CLI: exit 1)",
               cli="--strict"),
        Option(TIMEOUT, "seconds a scenario may take, everything included; a hang fails it by name (0: no limit)",
               float, 600.0),
        Option(NPROC, "distributed scenarios: ranks on this host (default: each scenario's own, 2); under --gpu one "
                      "GPU per rank", int, metavar="N"),
        Option(NNODES, f"distributed scenarios over N hosts: run the same suite on each, with the same {RDZV}; needs "
                       f"{NPROC}", int, 1, metavar="N"),
        Option(NODE_RANK, "this host's index among --bench-nnodes (0: hosts the rendezvous)", int, 0, metavar="K"),
        Option(RDZV, "where the hosts of a multi-host run meet (node 0's address and a free port)", str,
               metavar="HOST:PORT"),
        Option(PB_JSON, "also write the results in pytest-benchmark's JSON format here", str),
        Option(REPLICA, "(used by the gate's replication) write this process's measurements to PATH for the process "
                        "that started it, and nothing else", str, metavar="PATH"),
        Option(REF_SAVE, "save reference files (starting state + baseline outputs) for bench.reference checks"),
        Option(REFS, "folder of reference files", str, "references"),
        Option(PROFILE, "diagnose: after each measurement, one profiler pass; traces and hypotheses go to DIR", str,
               metavar="DIR"),
        Option(PROFILE_SHAPES, "diagnose: record input shapes (adds cost)"),
        Option(PROFILE_MEMORY, "diagnose: profile memory, and show memory by op"),
        Option(PROFILE_STACK, "diagnose: record Python stacks (adds cost)"),
        Option(PROFILE_FLOPS, "diagnose: the profiler's FLOP estimates (matmuls, 2D convolutions), a FLOPs-sorted "
                              "table"),
        Option(PROFILE_TB, "diagnose: also write for the TensorBoard profiler plugin"),
        Option(PROFILE_REFUSE, "diagnose: refuse to write a trace holding sensitive strings, instead of redacting "
                               "them"),
    ) + _gate_options() + _against_options() + _signature_options() + _history_options() + _gpu_options()


def _gate_options() -> tuple[Option, ...]:
    """The stored-baseline gate's knobs (GateConfig's), shared with the CLI's compare."""
    return (
        Option(ALPHA, f"family-wise significance level of the gate ({GATE.alpha})", float, cli="--alpha"),
        Option(RUN_NOISE, f"fallback run-to-run spread, a fraction, for a baseline too small to fit its own "
                          f"({GATE.run_noise})", float, cli="--run-noise"),
        Option(MIN_RUNS, f"processes (this one + fresh ones, or the runs of a session file) before the gate says "
                         f"slower or faster ({GATE.min_runs}; 1: one run decides)", int, cli="--min-runs"),
        Option(MAX_RUNS, f"the gate's replication budget: a possible change is measured in fresh processes up to "
                         f"this many runs in all, and alpha is split over the looks it plans ({DEFAULT_MAX_RUNS}, or "
                         f"the min-runs if more)", int, cli="--max-runs"),
        Option(REPLICATE, f"which possible changes the stored gate measures again in fresh processes: 'possible' "
                          f"(every one that looks changed at one-sided p < {GATE.chase_p}, for power) or 'confirm' "
                          f"(only those past the threshold whose p adjusted over the whole family is under "
                          f"{GATE.chase_p}: suites of thousands of scenarios, such as shards) ({GATE.chase})", str,
               choices=CHASES),
        Option(WINDOW, "compare with the latest N runs of the baseline (a rolling window; the noise prior uses all)",
               int, metavar="N", cli="--window"),
        Option(ALLOW_ENV, "compare even when the environments differ", cli="--allow-env-mismatch"),
        Option(ADJUST, f"how p-values are adjusted over the scenarios compared together, where all are at hand: "
                       f"the CLI, when given ({GATE.adjust}); pytest decides each scenario as its test ends, "
                       f"Bonferroni over the baseline's scenarios, and so does the CLI unless this is given", str,
               choices=("holm", "bonferroni", "bh"), cli="--adjust"),
    )


def _signature_options() -> tuple[Option, ...]:
    return (
        Option(SIGNATURE, "count each step's work signature once after its window (operators, host reads that "
                          "synchronize, copies, allocations) and compare it exactly with the baseline's or the "
                          "revision's: every difference is reported as a fact"),
        Option(INSTRUCTIONS, "with --bench-against: count the host instructions of one step of each side under "
                             "valgrind's callgrind, in a pytest process of each side's own (slow: a minute or more "
                             "to start one), as part of the work signature; implies --bench-signature"),
        Option(NO_GROWTH, "work-signature counters that must not grow (syncs, copies, allocations, operators, "
                          "transfers (host-device copies), graph_breaks, recompiles, instructions (by more than 0.5%); "
                          "comma-separated): growth fails the scenario's item, no "
                          "statistics needed; implies --bench-signature", str,
               metavar="COUNTERS", cli="--no-growth"),
    )


def _history_options() -> tuple[Option, ...]:
    return (Option(HISTORY, "the history store every run is added to: an SQLite file, or a PostgreSQL database's "
                            "postgresql:// URL for runners on several machines (the postgres extra); 'none': none; "
                            "--bench-quick runs are not added (their sizes are not the scenario's); `bench-core "
                            "history` reads it", str, ".bench/history.sqlite", metavar="PATH|URL", cli="--history"),)


def _gpu_options() -> tuple[Option, ...]:
    return (
        Option(CACHE, "with --gpu: every sample starts with the L2 flushed ('cold': a buffer twice the L2 written "
                      "outside the window; the session's first cold scenario checks that a flush leaves it cold) or "
                      "warm from the sample before ('hot'); beats a scenario's own cache", str,
               choices=("cold", "hot")),
        Option(GRAPH, "with --gpu: time each step captured as a CUDA graph (10 replays per sample) beside the same "
                      "10 calls eagerly, and report launch overhead per step (eager minus graph GPU time); a step "
                      "that cannot be captured is refused, naming why"),
    )


# what a team sets once, in pyproject.toml's [tool.bench_core] (the command line wins)
SETTINGS = (WARMUP, REPEATS, THREADS, MALLOC, PB_FIXTURE, OUT, BASELINES, HISTORY, REFS, TIMEOUT, STRICT, WIDE,
            THRESHOLD, ALPHA, RUN_NOISE, MIN_RUNS, MAX_RUNS, REPLICATE, WINDOW, ADJUST, ROUNDS, PAIRS, WORKER_PAIRS,
            MAX_ROUNDS, SIGNATURE, NO_GROWTH, FLOPS, PEAK, BUILD, SHARD_DURATIONS)
INTERNAL = (SERVE, REPLICA)   # how bench_core starts its own processes: never typed by a user
# knobs whose defaults were measured (docs/gate.md, docs/side-by-side.md): accepted and documented in
# docs/running.md, settable in [tool.bench_core], and left out of pytest's --help, which shows what a user meets
TUNING = (ALPHA, RUN_NOISE, MIN_RUNS, MAX_RUNS, REPLICATE, WINDOW, ADJUST, ROUNDS, PAIRS, WORKER_PAIRS, MAX_ROUNDS,
          PEAK, PROFILE_SHAPES, PROFILE_MEMORY, PROFILE_STACK, PROFILE_FLOPS, PROFILE_TB, PROFILE_REFUSE, BUILD,
          SHARD_DURATIONS)

# pytest's --help, a group each, in the order a user meets them: (name, title, the options in it)
GROUPS = (
    ("running", "bench_core: running the scenarios",
     (GPU, QUICK, WARMUP, REPEATS, THREADS, MALLOC, TIMEOUT, PB_FIXTURE, CACHE, GRAPH)),
    ("results", "bench_core: results and reports", (OUT, NO_OUT, HISTORY, MD, WIDE, PLOTS, PB_JSON, FLOPS, PEAK)),
    ("baseline", "bench_core: stored baselines (tuning: --bench-alpha, --bench-min-runs, --bench-max-runs, "
                 "--bench-replicate, --bench-run-noise, --bench-baseline-window, --bench-adjust; docs/running.md)",
     (SAVE, APPEND, SAVE_INCOMPLETE, COMPARE, BASELINES, THRESHOLD, STRICT, ALLOW_ENV, ALPHA, RUN_NOISE, MIN_RUNS,
      MAX_RUNS, REPLICATE, WINDOW, ADJUST)),
    ("against", "bench_core: side by side with a revision (tuning: --bench-rounds, --bench-pairs, "
                "--bench-max-rounds, --bench-worker-pairs; docs/running.md)",
     (AGAINST, AGAINST_PROCESSES, AGAINST_PYTHON, BUILD, SHARD, SHARD_DURATIONS, ROUNDS, PAIRS, MAX_ROUNDS,
      WORKER_PAIRS, SERVE, REPLICA)),
    ("work", "bench_core: what a step does, counted", (SIGNATURE, NO_GROWTH, INSTRUCTIONS)),
    ("diagnose", "bench_core: diagnose and validation (--bench-profile-shapes, -memory, -stack, -flops, "
                 "-tensorboard, -refuse-sensitive: docs/diagnose.md)",
     (PROFILE, PROFILE_SHAPES, PROFILE_MEMORY, PROFILE_STACK, PROFILE_FLOPS, PROFILE_TB, PROFILE_REFUSE, REF_SAVE,
      REFS)),
    ("distributed", "bench_core: distributed scenarios", (NPROC, NNODES, NODE_RANK, RDZV)),
)
_GROUP_OF = {flag: name for name, _, flags in GROUPS for flag in flags}

OPTIONS = tuple(dataclasses.replace(o, setting=o.flag in SETTINGS, internal=o.flag in INTERNAL,
                                    tuning=o.flag in TUNING, group=_GROUP_OF[o.flag]) for o in _options())
BY_FLAG = {o.flag: o for o in OPTIONS}
BY_KEY = {o.key: o for o in OPTIONS if o.setting}


def add_to_pytest(parser) -> None:
    """Every option, in its group, none with a default of its own: `values` fills what was not given, from the
    project's settings and then the option's default. Tuning knobs are accepted and left out of --help."""
    for name, title, flags in GROUPS:
        group = parser.getgroup(f"bench_core_{name}", title)
        for flag in flags:
            o = BY_FLAG[flag]
            group.addoption(o.flag, **o.kwargs(given_only=True, shown=not o.tuning))


def settings(table: dict, where: str) -> dict[str, Any]:
    """A [tool.bench_core] table checked, by option flag: every key an option a team sets once, every value of
    its type; a wrong one is a ValueError naming the file and the key."""
    out = {}
    for raw, value in table.items():
        key = str(raw).replace("_", "-")
        o = BY_KEY.get(key)
        if o is None:
            near = difflib.get_close_matches(key, list(BY_KEY), n=1)
            known = BY_FLAG.get(f"--bench-{key}") or BY_FLAG.get(f"--{key}")
            why = (f"{known.flag} is given per run, on the command line, not in a project file" if known else
                   f"not a setting (did you mean {near[0]!r}?)" if near else
                   f"not a setting; the settings are {', '.join(sorted(BY_KEY))}")
            raise ValueError(f"{where}: [tool.bench_core] {raw}: {why}")
        out[o.flag] = _setting_value(o, value, f"{where}: [tool.bench_core] {raw} = {value!r}")
    return out


def _setting_value(o: Option, value: Any, where: str) -> Any:
    if o.type is None:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: give true or false")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float, str)) or (
            o.type is int and not isinstance(value, int)):
        raise ValueError(f"{where}: give {'an integer' if o.type is int else 'a number' if o.type is float else 'text'}"
                         f" (as {o.flag} takes)")
    try:
        converted = o.type(value) if o.type is not str else str(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    if o.choices is not None and converted not in o.choices:
        raise ValueError(f"{where}: choose from {', '.join(o.choices)}")
    return converted


# settings that are a project's defaults, below --bench-quick and a scenario's own choice (the command line's
# beat both): `configs.session_config` takes them apart as the session's default counts
PROJECT_DEFAULTS = (WARMUP, REPEATS)


def values(given: Callable[[str], Any], project: dict[str, Any]) -> "Values":
    """An option's value by its flag: as given on the command line, else the project's setting (`settings`; not
    for PROJECT_DEFAULTS, which `project_defaults` gives), else the option's default."""
    def value(flag: str) -> Any:
        o = BY_FLAG[flag]
        got = given(o.dest)
        if got is not None and got is not False:
            return got
        if flag in project and flag not in PROJECT_DEFAULTS:
            return project[flag]
        return o.default if o.type is not None else False
    return value


def project_defaults(project: dict[str, Any]) -> dict[str, Any]:
    """The session's default counts from the project's settings (a scenario's own choice and --bench-quick beat
    them)."""
    return {"default_warmup": project.get(WARMUP), "default_repeats": project.get(REPEATS)}


def add_to_cli(parser, *flags: str) -> None:
    """The shared options `flags` (pytest names), under their CLI names, with no default of their own: `fill`
    gives what was not given, from the project's settings and then the option's default, as the plugin does."""
    for flag in flags:
        o = BY_FLAG[flag]
        parser.add_argument(o.cli, **o.kwargs(given_only=True))


def fill(ns, project: dict[str, Any]) -> None:
    """A parsed CLI namespace completed as the plugin completes its options: each shared option the command line
    did not give takes the project's setting, else its default."""
    value = values(lambda dest: getattr(ns, dest, None), project)
    for o in OPTIONS:
        if o.cli and hasattr(ns, o.dest):
            setattr(ns, o.dest, value(o.flag))


Values = Callable[[str], Any]   # an option's value by its pytest flag, from either shell
