"""Command line without pytest: `python -m bench_core compare BASELINE NEW`, `show FILE`, `baseline list|drop NAME`,
`history list|show|import|export`.

Exit status: 0 nothing regressed, 1 something regressed, is incomparable, or failed in the new session,
2 unusable input (a damaged file, or samples that can never give a decision).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

from bench_core.deciding.comparison import tally
from bench_core.deciding.gate import compare_sets, gate_advice
from bench_core.deciding.signature_diff import attach, latest
from bench_core.deciding.verdicts import INCONCLUSIVE, NEW
from bench_core.core.errors import BenchError
from bench_core.output.comparison_tables import comparison_table
from bench_core.output.tables import session_table
from bench_core.files import atomic, storage
from bench_core.shells import configs, options as opt

EXIT_OK, EXIT_REGRESSED, EXIT_BAD_INPUT = 0, 1, 2


def _candidate(arg: str, baselines: Path):
    """The new side: a session file with every process its gate started, or a baseline's runs."""
    p = Path(arg)
    return storage.load_candidate(p if p.suffix == ".json" or p.exists() else storage.baseline_path(baselines, arg))


def _load(arg: str, baselines: Path):
    p = Path(arg)
    if p.suffix == ".json" or p.exists():
        return storage.load_runs(p)
    return storage.load_baseline(baselines, arg)  # a bare name means a stored baseline


def _project_settings(start: Path) -> dict:
    """The [tool.bench_core] settings of the nearest pyproject.toml at or above `start` (the project the command
    is run in), as the plugin reads them; {} where there is none."""
    from bench_core.files.project_config import read_table

    for folder in (start, *start.parents):
        path = folder / "pyproject.toml"
        if path.is_file():
            return opt.settings(read_table(path), str(path))
    return {}


def _value(ns):
    """An option's value by its pytest flag (the shared declaration's key); a CLI-less option was not given."""
    return lambda flag: getattr(ns, opt.BY_FLAG[flag].dest, None)


def cmd_compare(ns) -> int:
    try:
        gate = configs.gate_config(_value(ns))
        base = storage.by_scenario(_load(ns.baseline, Path(ns.bench_baselines)))
        new = _candidate(ns.new, Path(ns.bench_baselines))
        failed = storage.load_errors(Path(ns.new)) if Path(ns.new).exists() else []
        merged = Path(ns.new).exists() and storage.is_merged(Path(ns.new))
    except (BenchError, ValueError) as exc:
        print(f"bench_core compare: unusable input: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    # the session's own rule unless another is asked for: one file, one answer, whichever shell reads it
    named = None if Path(ns.baseline).suffix == ".json" else ns.baseline
    comps = compare_sets(base, new, gate, as_session=ns.bench_adjust is None,
                         advice=gate_advice(named, candidate="merged" if merged else "files"))
    try:
        fixed = configs.no_growth(ns.bench_no_growth)
    except ValueError as exc:
        print(f"bench_core compare: unusable input: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    comps = [attach(c, latest(base.get(c.name, ())), latest(new.get(c.name, ())), fixed) for c in comps]
    if ns.json:
        print(json.dumps([c.to_dict() for c in comps], indent=1))
    else:
        print(comparison_table(comps, gate.alpha, wide=ns.bench_wide))
    for e in failed:  # a scenario that errored in the new session is not "missing": it failed
        print(f"bench_core compare: {e.get('scenario')!r} failed in the new session: {e.get('problem')}",
              file=sys.stderr)
    unusable = [c for c in comps if c.unusable]
    for c in unusable:
        print(f"bench_core compare: unusable input for {c.name!r}: {c.reason}", file=sys.stderr)
    if unusable:
        return EXIT_BAD_INPUT
    if not any(c.baseline_runs and c.candidate_runs for c in comps):   # a gate that compared nothing never passes
        print("bench_core compare: no scenario is in both files: nothing was compared", file=sys.stderr)
        return EXIT_REGRESSED
    print(outcome(comps, gate), file=sys.stderr)
    bad = [c for c in comps if c.fails(ns.bench_strict)]
    return EXIT_REGRESSED if bad or failed else EXIT_OK


def outcome(comps, gate) -> str:
    """How many scenarios were decided, and what an undecided one lacked: the runs a verdict needs."""
    n = Counter(c.verdict for c in comps)
    runs = sorted({c.candidate_runs for c in comps if c.candidate_runs})
    line = f"bench_core compare: {tally(comps)[0]}" + (f"; {n[NEW]} new" if n[NEW] else "")
    if n[INCONCLUSIVE] and runs and max(runs) < gate.min_runs:
        line += (f" (a verdict needs {gate.min_runs} candidate runs, fresh processes, and these files hold "
                 f"{'/'.join(map(str, runs))}: gate in pytest, which starts them, or pass --min-runs)")
    return line


def cmd_show(ns) -> int:
    try:
        runs = _load(ns.file, Path(ns.bench_baselines))
    except (BenchError, ValueError) as exc:
        print(f"bench_core show: unusable input: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for i, run in enumerate(runs):
        if len(runs) > 1:
            print(f"run {i + 1} of {len(runs)}")
        print(session_table(run, wide=ns.bench_wide))
    return EXIT_OK


def cmd_baseline(ns) -> int:
    from tabulate import tabulate

    try:
        if ns.action == "list":
            rows = storage.baseline_runs(Path(ns.bench_baselines), ns.name)
            print(tabulate(rows, headers="keys", disable_numparse=True))
        elif ns.action == "add":
            for session in ns.sessions:
                doc = storage.session_doc(Path(session))
                why = ("one shard of a run (merge the shards first: bench-core merge)" if doc.get("shard") else
                       f"{len(doc['errors'])} scenario(s) failed in it" if doc.get("errors") else None)
                if why:   # a part of a run, or a run that is not whole
                    raise ValueError(f"{session}: {why}: not a whole run, not stored")
                results = storage.session_results(doc, Path(session))
                path, n = storage.save_baseline(Path(ns.bench_baselines), ns.name, results, doc["environment"],
                                                append=True, run_id=doc.get("run_id"))
                print(f"{session}: added to {path} as run {n}")
        else:
            path, left = storage.drop_run(Path(ns.bench_baselines), ns.name, ns.run)
            print(f"run {ns.run} dropped from {path}; {left} run(s) left")
    except (BenchError, ValueError) as exc:
        print(f"bench_core baseline: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


def cmd_history(ns) -> int:
    from tabulate import tabulate

    from bench_core.files.history import History, export
    from bench_core.files.history_db import shown, target
    from bench_core.output.tables import history_table
    from bench_core.workflows.scenario_history import scenario_history

    try:
        with History(target(ns.bench_history), create=ns.action == "import") as h:
            if ns.action == "import":
                for f in ns.files:
                    added, held = h.import_file(Path(f))
                    print(f"{f}: {added} run(s) added, {held} already held")
            elif ns.action == "list":
                print(tabulate(h.scenarios(), headers=["scenario", "runs", "latest"], disable_numparse=True))
                print()
                print(tabulate(h.machines(), headers=["machine", "what", "hosts", "runs"], disable_numparse=True))
            elif ns.action == "export":
                sys.stdout.write(export(list(h.rows()), ns.format))
            else:
                found = scenario_history(h, ns.scenario, machine=ns.machine, branch=ns.branch, alpha=ns.alpha)
                if not found:
                    print(f"bench_core history: no run of scenario {ns.scenario!r} in {shown(ns.bench_history)}"
                          f"{' on that machine/branch' if ns.machine or ns.branch else ''}", file=sys.stderr)
                    return EXIT_BAD_INPUT
                for mh in found:
                    print(f"{ns.scenario} on machine {mh.machine}:")
                    print(history_table(mh, wide=ns.bench_wide, scenario=ns.scenario))
                    print()
    except (BenchError, ValueError) as exc:
        print(f"bench_core history: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


def cmd_report(ns) -> int:
    from bench_core.files.history import History
    from bench_core.files.history_db import target
    from bench_core.workflows.scenario_history import commit_url, report_page

    out = Path(ns.html) / "index.html"
    where = target(ns.bench_history)
    try:
        with History(where, create=False) as h:   # commits link to the repository the history sits in, or this one
            repo = where.resolve().parent if isinstance(where, Path) else Path.cwd()
            text = report_page(h, Path(ns.results), commit_url(repo), storage.now_iso())
        atomic.atomic_write(out, text.encode(), overwrite=ns.force)
    except (BenchError, ValueError) as exc:
        hint = " (--force replaces it)" if out.exists() and not ns.force else ""
        print(f"bench_core report: {exc}{hint}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"report written to {out} (open it from the file; it needs no network)")
    return EXIT_OK


def cmd_bisect(ns) -> int:
    from bench_core.workflows import bisect

    root = Path(ns.repo).resolve()
    try:
        good, bad = bisect.resolve(root, ns.good), bisect.resolve(root, ns.bad)
        commits = bisect.commits_between(root, good, bad)
        decide = bisect.pytest_step(root, good, ns.scenario, ns.select or ns.scenario, ns.pytest_args,
                                    build=ns.bench_build)
        found = bisect.search(good, commits, ns.scenario, decide, alpha=ns.alpha, min_change=ns.min_change)
        if ns.bench_build:   # the plan says what each step costs besides its measuring
            found = replace(found, notes=found.notes + (
                f"each commit tested was first built with {ns.bench_build!r} in its worktree, outside every timed "
                f"window (cached in {root / '.bench' / 'builds'}: a commit built once is never built again)",))
    except (BenchError, ValueError) as exc:
        print(f"bench_core bisect: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print("\n".join(found.lines()))
    path = atomic.write_stamped_json(root / ".bench", "bisect", found.to_dict())
    print(f"record written to {path}")
    return EXIT_OK if found.outcome != "undecided" else EXIT_REGRESSED


def cmd_merge(ns) -> int:
    """The shards of one run (`--bench-shard K/N`) joined into one session file, for one gate over all of them."""
    from bench_core.workflows import shards

    try:
        doc = shards.merge([Path(p) for p in ns.sessions])
        if ns.durations:   # read before anything is written: a file that is not one stops the merge whole
            shards.read_durations(Path(ns.durations))
        path = shards.write_merged(doc, Path(ns.out))
        timed = shards.write_durations(doc, Path(ns.durations)) if ns.durations else None
    except (BenchError, ValueError, OSError) as exc:
        print(f"bench_core merge: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"{doc['merged']['count']} shards, {len(doc['results'])} scenario(s) ({len(doc['errors'])} failed) merged "
          f"into {path}; gate it as one: bench-core compare BASELINE {path}")
    if timed is not None:
        print(f"{timed} test durations written into {ns.durations}: commit it, and the next runs deal their shards "
              f"by it ({opt.SHARD_DURATIONS} {ns.durations}, or shard_durations in [tool.bench_core])")
    return EXIT_OK


def _merge_parser(sub) -> None:
    mg = sub.add_parser("merge", help="join the session files of every shard of one run (--bench-shard K/N) into "
                                      "one session, which a gate decides as one family")
    mg.add_argument("sessions", nargs="+", help="the shards' session files")
    mg.add_argument("--out", required=True, help="the merged session file to write (never over one that is there)")
    mg.add_argument("--durations", metavar="FILE", help="also write each test's duration into FILE (updated in "
                                                        "place), for the next runs' --bench-shard-durations")
    mg.set_defaults(func=cmd_merge)


def build_parser() -> argparse.ArgumentParser:
    called = Path(sys.argv[0]).name
    ap = argparse.ArgumentParser(prog=called if called.startswith("bench-core") else "python -m bench_core",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare", help="compare NEW against BASELINE (files, or names under --baselines)")
    c.add_argument("baseline", help="a stored baseline's name (in --baselines) or the path of a baseline or session "
                                     "JSON file")
    c.add_argument("new", help="the session JSON file to gate (pytest writes one per run under .bench/results), or "
                               "a baseline's name or file")
    opt.add_to_cli(c, opt.BASELINES, opt.ALPHA, opt.THRESHOLD, opt.RUN_NOISE, opt.MIN_RUNS, opt.MAX_RUNS, opt.WINDOW,
                   opt.ADJUST, opt.ALLOW_ENV)
    c.add_argument("--json", action="store_true", help="print the comparisons as JSON")
    opt.add_to_cli(c, opt.WIDE, opt.STRICT, opt.NO_GROWTH)
    c.set_defaults(func=cmd_compare)
    s = sub.add_parser("show", help="print the results table of a session file or a baseline (every run)")
    s.add_argument("file", help="a session or baseline JSON file, or a baseline's name (in --baselines)")
    opt.add_to_cli(s, opt.BASELINES, opt.WIDE)
    s.set_defaults(func=cmd_show)
    b = sub.add_parser("baseline", help="a stored baseline's runs: list them, or drop one (rewritten atomically)")
    bsub = b.add_subparsers(dest="action", required=True)
    bl = bsub.add_parser("list", help="every run of baseline NAME: date, commit, device, scenarios")
    bl.add_argument("name", help="the baseline's name (in --baselines)")
    ba = bsub.add_parser("add", help="store session files (a merged run of shards, say) as runs of baseline NAME, "
                                     "created or grown, one run a file")
    ba.add_argument("name", help="the baseline's name (in --baselines)")
    ba.add_argument("sessions", nargs="+", help="session JSON files, each one run")
    bd = bsub.add_parser("drop", help="remove run RUN (as numbered by list) from baseline NAME")
    bd.add_argument("name", help="the baseline's name (in --baselines)")
    bd.add_argument("run", type=int, help="the run's number, as `baseline list NAME` shows it")
    for parser in (bl, ba, bd):
        opt.add_to_cli(parser, opt.BASELINES)
    b.set_defaults(func=cmd_baseline)
    h = sub.add_parser("history", help="the history store: every run by commit, branch and machine; change points")
    hsub = h.add_subparsers(dest="action", required=True)
    hl = hsub.add_parser("list", help="the scenarios held, with their runs, and the machines")
    hs = hsub.add_parser("show", help="one scenario's runs per machine, oldest first, with its change points")
    hs.add_argument("scenario", help="the scenario's name, as `history list` shows it")
    hs.add_argument("--machine", help="only this machine's runs (its key, as `history list` shows it)")
    hs.add_argument("--branch", help="only this branch's runs")
    hs.add_argument("--alpha", type=float, default=0.01,
                    help="each change point's permutation test level (0.01; docs/history.md has the error rates)")
    hi = hsub.add_parser("import", help="add session files and baseline files (every run); a run held already is "
                                       "not added twice")
    hi.add_argument("files", nargs="+", help="session JSON files (.bench/results) and baseline JSON files")
    he = hsub.add_parser("export", help="every result with its run's commit, branch and machine, to stdout")
    he.add_argument("--format", choices=("csv", "json"), default="csv", help="csv (the default) or json")
    for parser in (hl, hs, hi, he):
        opt.add_to_cli(parser, opt.HISTORY, opt.WIDE)
    h.set_defaults(func=cmd_history)
    rp = sub.add_parser("report", help="a self-contained static page of the history: charts with change points, "
                                       "the latest comparison, sample distributions")
    rp.add_argument("--html", required=True, help="the folder to write index.html into")
    rp.add_argument("--results", default=".bench/results", help="where session files are, for the latest "
                                                               "comparison (.bench/results)")
    rp.add_argument("--force", action="store_true", help="replace an index.html that is there")
    opt.add_to_cli(rp, opt.HISTORY)
    rp.set_defaults(func=cmd_report)
    _merge_parser(sub)
    bi = sub.add_parser("bisect", help="the first commit between GOOD and BAD where a scenario got slower: a binary "
                                       "search, each step a side-by-side decision in a temporary worktree")
    bi.add_argument("good", help="a commit where the scenario was fast")
    bi.add_argument("bad", help="a later commit where it is slow")
    bi.add_argument("-k", "--scenario", required=True, help="the scenario whose verdict decides each step")
    bi.add_argument("--select", help="pytest's -k expression for the tests to run at each step (the scenario's "
                                     "name, unless given)")
    bi.add_argument("--alpha", type=float, default=0.01, help="the whole search's error rate, split over its planned "
                                                              "decisions (0.01)")
    bi.add_argument("--min-change", type=float, default=0.05,
                    help="the smallest slowdown worth searching for, a fraction (0.05): BAD undecided, but with an "
                         "interval below it, is no change in range")
    bi.add_argument("--repo", default=".", help="the git repository (the current folder)")
    opt.add_to_cli(bi, opt.BUILD)
    bi.set_defaults(func=cmd_bisect, pytest_args=[])
    bi.epilog = "pytest's own arguments for each step follow a --, e.g. -- benchmarks --bench-threads 1"
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    passed = argv[argv.index("--") + 1:] if "--" in argv else []   # pytest's own, for bisect's steps
    try:
        ns = ap.parse_args(argv[:len(argv) - len(passed) - 1] if "--" in argv else argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage, which is our "unusable input" too
        return int(exc.code or 0)
    if passed:
        ns.pytest_args = passed
    try:
        opt.fill(ns, _project_settings(Path.cwd()))
    except (BenchError, ValueError) as exc:
        print(f"bench_core: unusable input: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return ns.func(ns)
    except BrokenPipeError:   # `bench-core show main | head`: the reader had enough, which is no error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
