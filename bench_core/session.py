"""One benchmark session, without pytest: its configuration, its ledger of results, and the routing of each
request to its workflow (`workflows/`). The pytest plugin and scripts drive it the same way.

What a session may be asked, and where it goes:

| request | workflow |
|---|---|
| `run` a scenario (measured here; gated when there is a stored baseline) | `workflows.stored_gate` |
| `run_against` / `run_against_processes` (side by side with a revision) | `workflows.side_by_side.compare` |
| `run_distributed`, `ab_distributed` | `workflows.distributed.launched` |
| `ab` (A/B of two callables, or of two factories of steps) | `workflows.ab` |
| `reference` (correctness across commits) | `workflows.validation.correctness` |
| `summary_sections`, `finish` (what people read, what is written) | `output.summary`, `output.reporters` |
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from bench_core.core.errors import ScenarioError, StorageError
from bench_core.core.modes import GATE, GATED, PLAIN, REPLICA, SAVE, SERVE, SIDE_BY_SIDE
from bench_core.core.records import Measurement
from bench_core.core.scenario import Scenario
from bench_core.deciding.comparison import Comparison, GateConfig, tally
from bench_core.deciding.verdicts import NEW
from bench_core.files import storage
from bench_core.output import reporters, summary
from bench_core.timing.sampling import time_limit
from bench_core.workflows import ab as ab_workflow, stored_gate
from bench_core.workflows.distributed import launched as distributed
from bench_core.workflows.outcome import NotCounted, Outcome, SideBySide
from bench_core.workflows.replicas import Replica
from bench_core.workflows.side_by_side import compare as side_by_side


@dataclass(frozen=True)
class SessionConfig:
    device: str = "cpu"
    warmup: int | None = None          # None: the scenario's own choice, else the default
    repeats: int | None = None
    default_warmup: int | None = None  # the project's default counts ([tool.bench_core]), below a scenario's own
    default_repeats: int | None = None
    quick: bool = False
    threads: int | None = None
    results_dir: Path | None = Path(".bench/results")
    history: Path | str | None = None  # the history store this run is added to: SQLite's file, a PostgreSQL URL
    baselines_dir: Path = Path("baselines")
    save: str | None = None
    append: bool = False
    save_incomplete: bool = False      # store an interrupted or failing session as a baseline run all the same
    strict: bool = False               # inconclusive and incomparable fail their items too
    markdown: Path | None = None       # a Markdown report appended here (e.g. $GITHUB_STEP_SUMMARY)
    wide: bool = False                 # tables with every column and unwrapped notes, however wide
    plots: Path | None = None          # a distribution plot per scenario written here (matplotlib, optional)
    count_flops: bool = False          # count each step's FLOPs once, after its window (torch's FLOP counter)
    signature: bool = False            # count each step's work signature once, after its window; compared exactly
    no_growth: tuple[str, ...] = ()    # signature counters that must not grow against the baseline or revision
    instructions: bool = False         # side by side: each side's host instructions per step, under callgrind
    peak_tflops: float | None = None   # the device's peak for utilization (else a known GPU's, or the CPU's measured)
    timeout_s: float | None = 600.0    # per scenario, everything included; None or 0: no limit
    compare: str | None = None
    pb_json: Path | None = None
    pb_json_replaces: bool = False     # pb_json is pytest-benchmark's --benchmark-json, replaced each run as there
    gate: GateConfig = field(default_factory=GateConfig)
    profile: Any = None                # a diagnose ProfileConfig: one profiler pass after each measurement
    references_dir: Path = Path("references")
    save_references: bool = False      # record references instead of checking against them
    against: side_by_side.AgainstConfig | None = None
    topology: Any = None               # a distributed Topology given on the command line (--bench-nproc...), or None
    replica: Path | None = None        # a fresh process of the gate's replication: its measurements go here
    serve: tuple[int, int] | None = None   # a side's server of --bench-against's process mode: its channel
    cache: str | None = None           # GPU: every sample's L2 "cold" (flushed) or "hot"; beats the scenario's
    graph: bool = False                # GPU: every step timed as a CUDA graph beside eagerly; or the scenario's
    malloc: str = "as-is"              # glibc malloc's thresholds in the processes that measure: "as-is" or "pinned"
    pb_fixture: str = "adopt"          # pytest-benchmark's `benchmark` fixture: "adopt" (measured here) or "leave"
    group_by: str | None = None        # pytest-benchmark's --benchmark-group-by: a results table per group
    concurrent: str | None = None      # why this process shares its cores with other tests (pytest-xdist): refused
    shard: tuple[int, int] | None = None   # this runner's part K of N of the suite (--bench-shard), merged later
    shard_durations: Path | None = None    # the test durations the shards are dealt by (--bench-shard-durations)

    def __post_init__(self):
        self.mode   # an impossible combination is refused now, before anything runs

    @property
    def mode(self) -> str:
        """What this run does, as one value (a stored gate may also save the run it gates). Every combination
        that cannot be run is refused here, and nowhere else."""
        own = [flag for flag, on in (("--bench-serve", self.serve), ("--bench-replica", self.replica)) if on]
        given = [flag for flag, on in (("--bench-against", self.against), ("--bench-compare", self.compare),
                                       ("--bench-save", self.save is not None)) if on]
        if own:   # bench_core's own process: what a project's ini addopts also say does not make its mode
            return SERVE if self.serve else REPLICA
        if self.against is not None and (self.compare is not None or self.save is not None):
            raise ValueError("--bench-against compares two revisions in this run: it does not mix with a stored "
                             "baseline (--bench-compare / --bench-save); use one or the other")
        alone = [flag for flag in given if flag != "--bench-compare"]
        if self.shard and alone:
            # a shard may gate against a baseline of merged runs (its family is the baseline's, the whole suite,
            # and what looks changed is measured again in fresh processes the merge keeps), never store or pair alone
            raise ValueError(f"--bench-shard {self.shard[0]}/{self.shard[1]} runs a part of the suite, which stores "
                             f"nothing and compares with no revision alone: run every shard without "
                             f"{', '.join(alone)}, join their session files with bench-core merge, and store or gate "
                             f"the merged session (bench-core baseline add, bench-core compare; docs/ci.md)")
        if self.concurrent and given:
            raise ValueError(f"under pytest-xdist ({self.concurrent}) each process runs only its share of the "
                             f"scenarios, so a baseline would be stored, or a gate decided, from a part of the suite: "
                             f"run the benchmarks without -n when storing or gating")
        if self.cache or self.graph:
            flag = "--bench-cache" if self.cache else "--bench-graph"
            if self.device == "cpu":
                raise ValueError(f"{flag} is a GPU timing mode (the L2, CUDA graphs): add --gpu")
            if self.against is not None:
                raise ValueError(f"{flag} is taken by plain runs and the stored-baseline gate (--bench-compare); side "
                                 f"by side (--bench-against) does not apply it")
        return (SERVE if self.serve else REPLICA if self.replica else SIDE_BY_SIDE if self.against is not None else
                GATE if self.compare is not None else SAVE if self.save is not None else PLAIN)

    @property
    def gated(self) -> bool:
        """Whether this run stores or decides anything against another run (a part of the suite never may)."""
        return self.mode in GATED


class Ledger:
    """What a session measured, decided and could not do, for the reports. Each scenario's `Outcome` enters
    through `record`, once, when its workflow returns it to the session; what could not be done (counted,
    compared, measured), errors and leaks are the session's notes, through their own methods; everyone else reads
    the views (tuples: nothing outside appends to them)."""

    def __init__(self):
        self._results: list[Measurement] = []
        self._errors: list[tuple[str, str]] = []
        self._comparisons: list[Comparison] = []
        self._decisions: list[tuple[str, Any]] = []     # (name, workflows.ab.ABResult)
        self._profiles: list[Any] = []                  # workflows.diagnose ProfileResults, never mixed into results
        self._replicas: dict[str, list[Measurement]] = {}   # the gate's fresh-process runs, by scenario
        self._not_counted: list[NotCounted] = []
        self._side_by_side: list[SideBySide] = []
        self._one_side: list[tuple[str, str]] = []      # scenarios measured on one side only, and why
        self._new: set[str] = set()                     # of those, the ones the other side never had
        self._unmeasured: list[tuple[str, str]] = []    # tests that timed something bench_core did not, and why
        self._leaks: list[tuple[str, list[str]]] = []   # (test, what it left changed or running), undone since

    # -- the views ------------------------------------------------------------------------------
    results = property(lambda self: tuple(self._results))
    errors = property(lambda self: tuple(self._errors))
    comparisons = property(lambda self: tuple(self._comparisons))
    decisions = property(lambda self: tuple(self._decisions))
    profiles = property(lambda self: tuple(self._profiles))
    replicas = property(lambda self: dict(self._replicas))
    one_side = property(lambda self: tuple(self._one_side))
    new = property(lambda self: frozenset(self._new))
    unmeasured = property(lambda self: tuple(self._unmeasured))
    leaks = property(lambda self: tuple(self._leaks))
    side_by_side = property(lambda self: tuple(self._side_by_side))

    @property
    def uncounted(self) -> list[str]:
        return [n.said() for n in self._not_counted]

    # -- recording ------------------------------------------------------------------------------
    def record(self, o: Outcome) -> None:
        """A scenario's outcome, kept whole: the one way a result, a comparison, a side-by-side record or a
        decision enters the ledger."""
        if o.result is not None:
            self._results.append(o.result)
        if o.comparison is not None:
            self._comparisons.append(o.comparison)
        if o.replicas:
            self._replicas[o.scenario] = list(o.replicas)
        if o.side_by_side is not None:
            self._side_by_side.append(o.side_by_side)
        if o.not_compared is not None:
            self.not_compared(o.scenario, o.not_compared, new=o.new)
        if o.decision is not None:
            self._decisions.append((o.scenario, o.decision))

    def record_profile(self, profile: Any) -> None:
        self._profiles.append(profile)

    def not_counted(self, scenario: str, what: str, why: str = "", side: str | None = None) -> None:
        self._not_counted.append(NotCounted(scenario, what, why, side))

    def not_compared(self, name: str, why: str, new: bool = False) -> None:
        """A scenario measured on one side only: said in the report and counted in the outcome, never passed
        over. `new`: the other side never had it (not a failure, even under --bench-strict)."""
        self._one_side.append((name, why))
        if new:
            self._new.add(name)

    def not_measured(self, test: str, why: str) -> None:
        """A test that timed something outside bench_core (pytest-benchmark left to itself, a fixture it never
        called): counted in the outcome, and failed under --bench-strict, never passed over as measured."""
        self._unmeasured.append((test, why))

    def annotate(self, name: str, **metadata: Any) -> None:
        """What a test said about its scenario after measuring it (pytest-benchmark's `extra_info`), added to
        its result's informational metadata."""
        from dataclasses import replace

        self._results[:] = [replace(m, scenario=m.scenario.with_metadata(**metadata)) if m.name == name else m
                            for m in self._results]

    def failed_to_compare(self, name: str) -> str | None:
        """Why scenario `name` was measured here but not compared, when it should have been (None: it was
        compared, or it is new)."""
        return next((why for n, why in self.one_side if n == name and n not in self.new), None)

    def left_changed(self, test: str, what: list[str]) -> None:
        """A test that left process-wide state changed or a process running (undone since): named in the report."""
        self._leaks.append((test, what))

    def record_error(self, name: str, problem: str) -> None:
        """A scenario's failure, once, however many layers saw it."""
        if not any(n == name for n, _ in self.errors):
            self._errors.append((name, problem))


class BenchSession(Ledger):
    def __init__(self, config: SessionConfig, environment: Mapping[str, Any]):
        if config.save is not None:  # a name given empty (an unset $BASELINE in CI) is an error, not "no save"
            path = storage.baseline_path(config.baselines_dir, config.save)
            if path.exists() and not config.append:  # fail before the run, not after minutes of it
                raise StorageError(path, f"baseline {config.save!r} already exists and is never silently overwritten",
                                   hint="pass --bench-append to add this session as another run, or pick a new name")
        self.config = config
        self.environment = dict(environment)
        self.progress = None                          # a progress.Progress, when someone is watching
        self.family_size: int | None = None           # scenarios in this session, once collection knows
        self.test_files: tuple[Path, ...] = ()        # the files those scenarios' tests are in
        self.shard: dict | None = None                # which part of which split this session ran (--bench-shard)
        Ledger.__init__(self)
        self.cache_checked = False                    # the cold-cache self-check ran (on the first cold scenario)
        # what the comparisons are against: a stored baseline, or another revision (and its worker processes)
        self.baseline: dict[str, list[Measurement]] | None = None
        self.prior = None                             # the run-to-run variance prior fitted from the baseline
        self.baseline_notes: list[str] = []           # what makes the baseline hard to trust
        self.revision = None                          # revisions.LoadedRevision under --bench-against
        self.workers = None                           # worker.WorkerPool, once a scenario needs process mode
        self.serving = None                           # side_server.ServeState, in a side's server
        if config.compare is not None:
            self.baseline, self.prior, self.baseline_notes = stored_gate.load_baseline(config)

    # -- the session's state -----------------------------------------------------------------------
    def limited(self, scenario: Scenario):
        """The scenario's time limit, as a context: a hang fails that scenario, by name."""
        return time_limit(self.config.timeout_s, scenario.name)

    def watch(self, say: Callable[[str], None]) -> None:
        """Progress lines for long runs from now on, each handed to `say` (between samples, never inside them)."""
        from bench_core.output.progress import Progress

        self.progress = Progress(say)

    def collected(self, scenarios: int, files: tuple[Path, ...] = ()) -> None:
        """How many scenarios this session will decide: the family each decision is adjusted for, known
        before any is taken; and the test files they are in (where a revision's tests are looked for)."""
        self.family_size = scenarios
        self.test_files = tuple(files)

    def nothing_compared(self) -> bool:
        """A gated session in which no scenario at all was compared: it fails, whatever else it did (every test
        skipped, deselected or left to another plugin included): a gate is never green over nothing."""
        return self.compared_with is not None and not any(c.verdict != NEW for c in self.comparisons)

    # -- routing to the workflows ------------------------------------------------------------------
    @contextmanager
    def _named(self, name: str):
        """A workflow's failure for scenario `name` recorded once, by name, and raised on."""
        try:
            yield
        except ScenarioError as exc:
            self.record_error(name, exc.problem)
            raise

    def _recorded(self, name: str, work: Callable[[], Outcome]) -> Outcome:
        """A workflow's outcome for scenario `name`, recorded whole (its failure by name)."""
        with self._named(name):
            outcome = work()
        self.record(outcome)
        return outcome

    def run(self, scenario: Scenario, fn: Callable[[], Any], *, replica: Replica | None = None,
            **kwargs) -> tuple[Measurement, Comparison | None]:
        """Measure, gate, record; then the diagnose pass, after the measurement and never inside it; all within the
        time limit. `replica`: how to measure the scenario once more in a fresh process, for a possible change the
        gate cannot decide on one run."""
        return self._here(scenario, fn, kwargs, replica=replica)

    def run_alone(self, scenario: Scenario, fn: Callable[[], Any], why: str, *, new: bool = False,
                  **kwargs) -> tuple[Measurement, Comparison | None]:
        """Side by side, a scenario the revision cannot run: measured here only, as `run` measures, and said not
        compared (`new`: the revision never had it)."""
        return self._here(scenario, fn, kwargs, why=why, new=new)

    def _here(self, scenario: Scenario, fn: Callable[[], Any], kwargs: Mapping[str, Any], *,
              replica: Replica | None = None, why: str | None = None, new: bool = False
              ) -> tuple[Measurement, Comparison | None]:
        with self._named(scenario.name), self.limited(scenario):
            o = stored_gate.run(self, scenario, fn, replica, **kwargs)
            self.record(o if why is None else o.alone(why, new))
            if self.config.profile is not None:
                from bench_core.workflows.diagnose.passes import diagnose_after

                diagnose_after(self, o.result, fn, kwargs.get("setup"))
        return o.result, o.comparison

    def run_against(self, scenario: Scenario, live, rebuild, rev_build, **kwargs):
        o = self._recorded(scenario.name,
                           lambda: side_by_side.run_against(self, scenario, live, rebuild, rev_build, **kwargs))
        return o.result, o.comparison

    def run_against_processes(self, scenario: Scenario, live, sides, **kwargs):
        o = self._recorded(scenario.name, lambda: side_by_side.run_against_processes(self, scenario, live, sides,
                                                                                     **kwargs))
        return o.result, o.comparison

    def run_distributed(self, scenario: Scenario, build: Callable, **kwargs) -> tuple[Measurement, Comparison | None]:
        if self.revision is not None:   # side by side: each side's ranks from its own tree
            from bench_core.workflows.side_by_side.distributed import against_distributed

            o = self._recorded(scenario.name, lambda: against_distributed(self, scenario, build, **kwargs))
        else:
            o = self._recorded(scenario.name, lambda: distributed.run_distributed(self, scenario, build, **kwargs))
        if self.config.profile is not None and o.side_by_side is None:   # measured as a plain run: its pass too
            with self._named(scenario.name):   # after the measurement, in a launch of its own
                distributed.diagnose_distributed(self, scenario, build, **kwargs)
        return o.result, o.comparison

    def ab_distributed(self, name: str, build: Callable, baseline: Mapping[str, Any], candidate: Mapping[str, Any],
                       **kwargs):
        return self._recorded(name, lambda: distributed.ab_distributed(self, name, build, baseline, candidate,
                                                                       **kwargs)).decision

    def open_revision(self, root: Path, project: Path | None = None) -> None:
        side_by_side.open_revision(self, root, project)

    def close_revision(self) -> None:
        side_by_side.close_revision(self)

    def ab(self, name: str, baseline: Callable[[], Any], candidate: Callable[[], Any], **kwargs):
        if self.config.cache or self.config.graph:   # never a decision taken otherwise than the run asked for
            raise ScenarioError(name, "an A/B decision does not apply the GPU timing modes (--bench-cache, "
                                      "--bench-graph): run it without them")
        return self._recorded(name, lambda: ab_workflow.run_ab(self, name, baseline, candidate, **kwargs)).decision

    def reference(self, name: str, variant, state, model, optimizer=None, *, steps: int = 3, tolerance=None):
        """Record reference NAME (when saving references; returns None) or check `variant` against it."""
        from bench_core.workflows.validation.correctness import record_or_check

        return record_or_check(self.config.references_dir, self.config.save_references, name, variant, state,
                               model, optimizer, steps=steps, tolerance=tolerance)

    # -- what the session says -------------------------------------------------------------------
    def fails(self, c: Comparison | None) -> bool:
        """Slower, incomparable, or input that can never be decided: never green by accident. Strict: any
        comparison that decided nothing fails as well."""
        return c is not None and c.fails(self.config.strict)

    def outcome(self) -> str:
        """One line: how many comparisons decided what, and what was not compared. Said even when nothing was
        decided."""
        counted, decided, compared = tally(self.comparisons)
        line = f"gate: {counted}"
        n = Counter(c.verdict for c in self.comparisons)
        new, missed = n[NEW] + len(self.new), len({name for name, _ in self.one_side} - self.new)
        line += f"; {missed} not compared (--bench-strict fails them)" if missed else ""
        gone = len(self.missing_from_run())
        line += f"; {gone} in {self.compared_side} but not run now (--bench-strict fails them)" if gone else ""
        line += f"; {new} new (nothing to compare with)" if new else ""
        unmeasured = len(self.unmeasured)
        line += f"; {unmeasured} not measured by bench_core (--bench-strict fails them)" if unmeasured else ""
        if self.nothing_compared():
            line += " (nothing was compared: the session fails)"
        elif compared and not decided:
            line += " (nothing was decided: see the reasons above; --bench-strict makes this fail)"
        return line

    def changed_program(self) -> str | None:
        """The changes to the measured program the user asked for (they lower noise, but users do not run the
        program so), in words for every report's first screen; None: the program as it runs."""
        changes = (["glibc malloc's thresholds pinned (--bench-malloc pinned)"] * (self.environment.get("malloc")
                                                                                    == "pinned")
                   + [f"torch CPU threads set to {self.config.threads} (--bench-threads {self.config.threads})"]
                   * (self.config.threads is not None))
        return None if not changes else (f"measuring a changed program, as asked: {'; '.join(changes)}: times "
                                         f"differ from the program as users run it")

    @property
    def compared_with(self) -> str | None:
        """What the comparisons are against, in words: a stored baseline or another revision."""
        if self.config.against is not None:
            return f"revision {self.config.against.label!r}"
        return f"baseline {self.config.compare!r}" if self.config.compare else None

    def missing_from_run(self) -> list[str]:
        """What the comparisons are against has and this run did not measure: the baseline's scenarios not run
        now, or the revision's benchmark tests this tree no longer defines (renamed or removed: `file::test`)."""
        seen = {m.name for m in self.results} | {n for n, _ in self.errors}
        if self.revision is not None and self.revision.revision.commit:
            return self.revision.not_here(self.test_files, seen)
        if self.baseline is None or self.config.shard:   # a shard's others are the other shards': the merge checks
            return []
        return [n for n in self.baseline if n not in seen]

    @property
    def compared_side(self) -> str:
        """Where missing scenarios were looked for, in words: "the baseline", or the revision's label."""
        return f"{self.revision.revision.label}" if self.revision is not None else "the baseline"

    def shown(self, text: str) -> str:
        return summary.shown(self, text)

    def summary_sections(self) -> list[tuple[str, str]]:
        return summary.summary_sections(self)

    def plot_groups(self):
        return summary.plot_groups(self)

    def finish(self, incomplete: str | None = None) -> tuple[list[str], list[str]]:
        """Write what the session produced: (lines to show, failures); see `output.reporters`."""
        return reporters.finish(self, incomplete)
