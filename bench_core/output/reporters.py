"""What a session leaves behind, each behind one interface: a reporter is a function of the session that
writes one thing (the session file, the decision records, pytest-benchmark's JSON, the Markdown report, the
plots, the baseline run) and returns the line that says where. `finish` gives every reporter its chance:
one that fails (a read-only folder, a full disk) loses nothing else, and each failure names its file."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from bench_core.core.modes import GATE, OWN, SIDE_BY_SIDE
from bench_core.files import artifacts, atomic, history_db, storage
from bench_core.output.summary import plot_groups, shown

Reporter = Callable[..., str]
INTERRUPTED = "the session was interrupted"   # a part of a run: kept in its session file, never in the history


def session_file(s, run, written: dict) -> str:
    """The session file; its path kept in `written` for the history's record of where the run came from."""
    against = None
    if s.revision is not None:
        against = storage.against_section(s.revision.revision.to_dict(), s.revision.current.to_dict(),
                                          [r.to_dict() for r in s.side_by_side], s.one_side)
    p = storage.write_session(s.config.results_dir, s.results, s.environment, (),
                              [c.to_dict() for c in s.comparisons], against=against, replicas=s.replicas, run=run,
                              shard=s.shard)
    written["session"] = p
    return f"results written to {p}"


def history_record(s, run, source: Path | None) -> str:
    """This session's run appended to the history store (the same run_id as its session file, so importing the
    file later adds nothing)."""
    from bench_core.files import git, history

    where = s.config.history   # a file's own repository, else (a database's URL) the one the session runs in
    branch = git.output(where.parent if isinstance(where, Path) else Path.cwd(), "rev-parse", "--abbrev-ref", "HEAD")
    added = history.record_session(where, run, None if source is None else str(source), branch)
    return f"history: this run {'added to' if added else 'already in'} {history_db.shown(where)}"


def decision_record(name: str, res) -> Reporter:
    return lambda s: (f"decision record for {name!r} written to "
                      f"{storage.write_decision(s.config.results_dir, res.to_dict(), name)}")


def pytest_benchmark_json(s) -> str:
    from bench_core.files.pytest_benchmark import to_pytest_benchmark

    return "pytest-benchmark JSON written to " + str(storage.write_pytest_benchmark(
        s.config.pb_json, to_pytest_benchmark(s.results, s.environment, storage.now_iso()),
        replace=s.config.pb_json_replaces))


def markdown_report(s) -> str:
    from bench_core.output.comparison_tables import comparison_notes, markdown

    notes = [f"{n}: {t}" for n, t in s.one_side]
    notes += sorted({c.method for c in s.comparisons if c.method})
    notes += [f"warning: {n}" for n in s.baseline_notes]
    notes += comparison_notes(s.comparisons)
    text = markdown(f"bench_core: {s.compared_with or 'results'}", s.outcome() if s.compared_with else None,
                    s.comparisons, [c for c in s.comparisons if s.fails(c)], s.results, s.errors, s.decisions, notes,
                    first=s.changed_program())
    return f"Markdown report appended to {atomic.append_text(s.config.markdown, shown(s, text))}"


def plots(s) -> str:
    from bench_core.output.plots import png

    written = [artifacts.write_plot(s.config.plots, shown(s, name), png(shown(s, title), groups))
               for name, title, groups in plot_groups(s) if all(len(g) for _, g in groups)]
    return f"{len(written)} distribution plot(s) written to {s.config.plots}"


def replica_file(s) -> str:
    """A fresh process's measurements, for the process that started it (the gate's replication)."""
    path = storage.write_replica(s.config.replica, s.results)
    return f"replica measurements written to {path}"


def baseline_run(s) -> str:
    path, n = storage.save_baseline(s.config.baselines_dir, s.config.save, s.results, s.environment,
                                    append=s.config.append)
    return f"baseline {s.config.save!r} saved to {path} ({n} run{'s' if n != 1 else ''})"


def finish(s, incomplete: str | None = None) -> tuple[list[str], list[str]]:
    """Write what the session produced: (lines to show, failures). `incomplete` says why the session is not
    whole (interrupted, scenarios failed): such a session is never stored as a baseline run, unless the
    configuration says `save_incomplete`."""
    lines: list[str] = []
    failures: list[str] = []
    if s.config.save is not None and not s.results:   # never a green run that stored nothing
        unmeasured = f" ({len(s.unmeasured)} test(s) timed outside bench_core)" if s.unmeasured else ""
        failures.append(f"baseline {s.config.save!r} NOT saved: no scenario was measured by bench_core{unmeasured}")
    if not s.results and not s.errors and not s.decisions and s.shard is None:   # a shard's, even empty, is merged
        return lines, failures
    reporters: list[Reporter] = []
    written: dict[str, Path] = {}
    run = storage.run_doc(s.results, s.environment, [{"scenario": n, "problem": p} for n, p in s.errors])
    if s.config.results_dir is not None:
        reporters += [lambda s: session_file(s, run, written), *(decision_record(name, res) for name, res in s.decisions)]
    if s.config.history is not None and s.results and not s.config.quick:
        not_added = f"history: this run NOT added to {history_db.shown(s.config.history)}: {incomplete}"
        reporters.append((lambda s: not_added) if incomplete == INTERRUPTED
                         else lambda s: history_record(s, run, written.get("session")))
    if s.config.pb_json is not None:
        reporters.append(pytest_benchmark_json)
    if s.config.markdown is not None:
        reporters.append(markdown_report)
    if s.config.plots is not None:
        reporters.append(plots)
    if s.config.replica is not None:
        reporters.append(replica_file)
    if s.config.save is not None and s.results:
        if incomplete and not s.config.save_incomplete:
            reporters.append(lambda s: f"baseline {s.config.save!r} NOT saved: {incomplete}; a baseline run must be "
                                       f"a whole, passing session (--bench-save-incomplete stores it anyway)")
        else:
            reporters.append(baseline_run)
    for folder in (s.config.results_dir, s.config.history):
        if isinstance(folder, Path):   # not a database's URL
            atomic.ignored_by_git(folder if folder.suffix == "" else folder.parent)
    for report in reporters:
        try:
            lines.append(report(s))
        except Exception as exc:  # noqa: BLE001 - every write gets its chance, every failure is said
            failures.append(str(exc))
    saved = bool(s.config.save) and (not incomplete or s.config.save_incomplete) and not failures
    return lines + next_steps(s, saved=saved, failed=bool(failures)), failures


def failing_steps(s) -> list[str]:
    """After a gate that failed a scenario: how to look into it, and how to accept the change."""
    from bench_core.deciding.verdicts import INCOMPARABLE, SLOWER

    failing = [cmp for cmp in s.comparisons if s.fails(cmp)]
    if not failing:
        return []
    if not any(cmp.verdict == SLOWER or cmp.grown for cmp in failing):   # nothing got slower: nothing to look for
        if any(cmp.verdict == INCOMPARABLE for cmp in failing):
            return ["next: the two sides measure different things (the reasons are under the table): measure both "
                    "in one environment, or pass --bench-allow-env-mismatch where the difference is intended"]
        return []
    k = next(cmp.name for cmp in failing if cmp.verdict == SLOWER or cmp.grown)
    lines = ["next: where the time went: rerun with --bench-profile DIR (a profiler pass after each measurement, "
             "never inside it)"]
    if s.config.against is not None:
        here, there = s.revision.current, s.revision.revision   # a range of commits to search, or the diff itself
        if there.commit and here.commit and there.commit != here.commit and not s.config.against.python:
            lines.append(f"      which commit: bench-core bisect {s.config.against.rev} HEAD -k {k!r}"
                         + (" (after committing this tree's changes, which are part of the difference)"
                            if here.dirty else ""))
    elif s.config.shard:   # a shard stores nothing alone: the merged run is what becomes a baseline
        lines.append(f"      to accept the change: add the merged run to a baseline (bench-core baseline add NAME "
                     f"merged.json) and gate against that; bench-core baseline list {s.config.compare} shows the old "
                     f"one's runs")
    else:
        lines.append(f"      to accept the change: store this code as a new baseline (--bench-save NAME, more runs "
                     f"with --bench-append) and gate against that; bench-core baseline list {s.config.compare} shows "
                     f"the old one's runs")
    return lines


def next_steps(s, saved: bool, failed: bool) -> list[str]:
    """What a user can do with this run, for a session that was not gated: keep it, gate against it. Said only
    where it is true: nothing after a baseline that was not saved, or a write that failed."""
    c = s.config
    if c.mode in OWN:
        return []
    if c.mode in (GATE, SIDE_BY_SIDE):
        return failing_steps(s)
    if not s.results or failed or (c.save and not saved):
        return []
    if saved:
        return [f"next: gate a later run against it: pytest benchmarks --bench-compare {c.save}",
                f"      (runs recorded at different times make a better baseline: --bench-save {c.save} --bench-append)"]
    return ["next: keep this run as a baseline (--bench-save NAME), then gate later runs (--bench-compare NAME);",
            "      on a shared runner compare with a revision instead (--bench-against origin/main); docs/gate.md"]
