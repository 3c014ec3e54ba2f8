"""The history store in PostgreSQL (`--bench-history postgresql://...`): the same runs read back exactly as from
SQLite, the same CLI output and change points, eight runners writing at once, and what a user is told where the
driver or the server is missing. The server is a real throwaway cluster (tests/pg_cluster.py), started once for
the file; each test that needs it gets a database of its own, and skips, saying why, where no cluster can start."""
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import pg_cluster
from bench_core.core.signature import Signature
from bench_core.files import history_db, storage
from bench_core.files.history import History, HistoryError, machine_key
from bench_core.shells import configs, options as opt
from helpers import ENV, meas, runs

WHY_NOT = pg_cluster.why_not()
TESTS = Path(__file__).resolve().parent
CODE = {**os.environ, "PYTHONPATH": str(TESTS.parent)}   # runners import this tree's bench_core, not an installed one


@pytest.fixture(scope="session")
def pg_admin():
    """The cluster, for the whole session; stopped and removed at its end, also after a failure."""
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    with pg_cluster.cluster() as url:
        yield url


@pytest.fixture
def pg_url(pg_admin, request):
    """A fresh database of this test's own, named for it."""
    name = "t_" + "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:50]
    return pg_cluster.database(pg_admin, name)


def _run(level, commit, created, name="step", env=None, seed=0, dirty=False, n=10, run_id=None):
    env = {**ENV, "git_commit": commit, "git_dirty": dirty, **(env or {})}
    return storage.run_doc(runs([level], n=n, spread=0.01, seed=seed, name=name, env=env), env, created=created,
                           run_id=run_id)


def _both(tmp_path, pg_url):
    return History(tmp_path / "h.sqlite"), History(pg_url)


def _mixed_runs() -> list[dict]:
    """Runs that exercise every column: two machines, a dirty, a clean and an unknown tree, no commit, a branch
    of the environment's, a two-sample result, a work signature, names whose order differs between bytes and a
    language's collation, and two runs at the same time."""
    other = {**ENV, "hostname": "b", "cpu_model": "another CPU", "git_branch": "feature"}
    sig = Signature(operators={"aten::mm": 2, "aten::add": 1}, syncs={"aten::item": 1}, allocations=3)
    out = []
    for i in range(8):
        env = other if i % 3 == 2 else None
        names = ["B_step", "a-step", "a_step", "ab"][: 1 + i % 4]
        results = [m for k, name in enumerate(names)
                   for m in runs([1.0 + 0.1 * i + k], n=2 if (i, k) == (3, 1) else 12, seed=10 * i + k, name=name,
                                 env={**ENV, **(env or {})})]
        if i == 5:
            results[0] = replace(results[0], signature=sig)
        e = {**ENV, **(env or {}), "git_commit": None if i == 4 else f"{i:040d}",
             "git_dirty": [False, True, None][i % 3]}
        created = f"2026-12-0{1 + min(i, 6)}T10:00:00+00:00"   # runs 6 and 7 share their time: run_id decides
        out.append(storage.run_doc(results, e, created=created))
    return out


def _everything(h: History) -> dict:
    """All a reader can ask a history, every filter included."""
    scenarios = [s for s, _, _ in h.scenarios()]
    got = {"scenarios": h.scenarios(), "machines": h.machines(), "rows": list(h.rows())}
    for s in scenarios:
        got[s] = h.series(s)
        for key, *_ in h.machines():
            got[f"{s} on {key}"] = h.series(s, machine=key)
        got[f"{s} on feature"] = h.series(s, branch="feature")
        got[f"{s} on main"] = h.series(s, branch="main")
    got["sources"] = [h.source_of(r["run_id"]) for r in got["rows"]] + [h.source_of("no such run")]
    return got


def test_the_same_runs_read_back_the_same_from_sqlite_and_postgresql(tmp_path, pg_url):
    docs = _mixed_runs()
    session = storage.write_session(tmp_path / "res", [], ENV, run=_run(2.0, "e" * 40, "2026-12-09T10:00:00+00:00"))
    base = tmp_path / "baselines"
    for i in range(3):
        storage.save_baseline(base, "main", runs([1.5 + i], name="ab"), {**ENV, "git_commit": f"{i}" * 40},
                              append=i > 0)
    lite, pg = _both(tmp_path, pg_url)
    with lite, pg:
        said = {}
        for name, h in (("sqlite", lite), ("postgresql", pg)):
            said[name] = ([h.add_run(d, source=f"s{i}", branch="main" if i == 1 else None)
                           for i, d in enumerate(docs)] + [h.add_run(docs[0])]
                          + [h.import_file(session), h.import_file(session)]
                          + [h.import_file(storage.baseline_path(base, "main"))])
        assert said["sqlite"] == said["postgresql"] == [True] * 8 + [False, (1, 0), (0, 1), (3, 0)]
        a, b = _everything(lite), _everything(pg)
        assert a == b
    # what equality would not catch if both were wrong alike
    assert [s for s, _, _ in b["scenarios"]] == ["B_step", "a-step", "a_step", "ab", "step"]   # bytes, as SQLite
    assert [m for m, *_ in b["machines"]] == [machine_key(ENV), machine_key({**ENV, "cpu_model": "another CPU"})]
    p5 = next(p for p in b["B_step"] if p.signature is not None)
    assert p5.signature["operators"] == {"aten::add": 1, "aten::mm": 2} and p5.commit == f"{5:040d}"
    assert [p.dirty for p in b["B_step"][:3]] == [False, True, None]
    two = next(p for p in b["a-step"] if p.n == 2)
    assert two.sd_log > 0 and two.median_ms == pytest.approx(2.3, rel=0.05) and b["a-step"][0].n == 12
    assert [p.branch for p in b["B_step"][:3]] == [None, "main", "feature"]
    assert len(b["rows"]) == sum(1 + i % 4 for i in range(8)) + 1 + 3


def _stepped(tmp_path, pg_url):
    """A seeded history of 24 runs, 22% slower from run 15, a minute apart, in both stores."""
    levels = list(np.exp(np.random.default_rng(3).normal(0, 0.05, 24) + np.r_[np.zeros(14), np.full(10, 0.2)]))
    docs = [_run(level, f"c{i:02d}" + "0" * 38, f"2026-12-03T10:{i:02d}:00+00:00", seed=i)
            for i, level in enumerate(levels)]
    path = tmp_path / "h.sqlite"
    for where in (path, pg_url):
        with History(where) as h:
            for d in docs:
                h.add_run(d)
    return path


def test_history_show_list_export_and_the_page_are_the_same_and_find_the_same_change_points(tmp_path, pg_url, capsys):
    from bench_core.shells.cli import main
    from bench_core.workflows.scenario_history import report_page, scenario_history

    path = _stepped(tmp_path, pg_url)
    printed = {}
    for where in (str(path), pg_url):
        printed[where] = []
        for args in (["show", "step"], ["list"], ["export", "--format", "json"], ["show", "step", "--branch", "x"]):
            code = main(["history", *args, "--history", where])
            out, err = capsys.readouterr()
            printed[where].append((code, out, err.replace(where, "HISTORY")))
    assert printed[str(path)] == printed[pg_url]
    (show, _, export, missing) = printed[pg_url]
    assert show[0] == 0 and "change point at run 15" in " ".join(show[1].split())
    assert len(json.loads(export[1])) == 24 and missing[0] == 2 and "in HISTORY on that machine/branch" in missing[2]
    with History(path) as lite, History(pg_url) as pg:
        (a,), (b,) = scenario_history(lite, "step"), scenario_history(pg, "step")
        pages = [report_page(h, None, None, "now") for h in (lite, pg)]
    assert a == b and len(b.changes) == 1
    assert b.changes[0].point.first_low < b.changes[0].point.first_high   # a range of runs, bootstrapped alike
    assert pages[0] == pages[1] and "change point at run 15" in pages[1]
    assert main(["report", "--html", str(tmp_path / "page"), "--history", pg_url]) == 0
    assert "change point at run 15" in (tmp_path / "page" / "index.html").read_text()


WRITER = '''
import json, sys
from bench_core.files.history import History
docs, k = json.load(open(sys.argv[1])), sys.argv[2]
added = {"sqlite": 0, "postgresql": 0}
with History(sys.argv[3]) as lite, History(sys.argv[4]) as pg:   # both empty: eight runners create them at once
    for doc in docs[k] + docs["shared"]:
        added["postgresql"] += pg.add_run(doc, source=k)
        added["sqlite"] += lite.add_run(doc, source=k)
print(json.dumps(added))
'''
RUNNERS, EACH, SCENARIOS = 8, 6, ("alpha", "beta", "gamma")


def _partial_runs(h: History) -> list[str]:
    """Runs the store shows with fewer or more results than scenarios: none, if a run is whole or absent."""
    count: dict[str, int] = {}
    for row in h.rows():
        count[row["run_id"]] = count.get(row["run_id"], 0) + 1
    return [r for r, n in count.items() if n != len(SCENARIOS)]


def test_eight_runners_writing_both_stores_at_once_lose_no_run_and_store_none_twice(tmp_path, pg_url):
    """Each runner writes runs of its own and the same shared runs as every other runner (the same run_id: a run
    imported on two machines), into both stores at once; a reader watches the stores meanwhile."""
    def doc(tag, i):
        env = {**ENV, "git_commit": f"{i:040d}"}
        ms = [meas([1.0 + 0.01 * (i % 7), 1.1, 1.05], name=s, env=env) for s in SCENARIOS]
        return storage.run_doc(ms, env, created=f"2026-12-03T10:{i:02d}:00+00:00", run_id=f"{tag}-{i}")

    docs = {str(k): [doc(f"r{k}", i) for i in range(EACH)] for k in range(RUNNERS)}
    docs["shared"] = [doc("shared", i) for i in range(EACH)]
    (tmp_path / "docs.json").write_text(json.dumps(docs))
    path = tmp_path / "h.sqlite"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "docs.json"), str(k), str(path), pg_url],
                              cwd=TESTS, stdout=subprocess.PIPE, text=True, env=CODE) for k in range(RUNNERS)]
    partial = []
    try:
        while any(p.poll() is None for p in procs):
            for where in (path, pg_url):
                if where == path and not path.exists():
                    continue
                try:
                    with History(where, create=False) as h:
                        partial += _partial_runs(h)
                except HistoryError:   # no tables yet: the runners are still creating them
                    pass
            time.sleep(0.05)
        said = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0] * RUNNERS and partial == []
    expected = {f"r{k}-{i}" for k in range(RUNNERS) for i in range(EACH)} | {f"shared-{i}" for i in range(EACH)}
    for where, name in ((path, "sqlite"), (pg_url, "postgresql")):
        assert sum(s[name] for s in said) == len(expected)             # each run added once, by one runner
        with History(where) as h:
            ids = [r["run_id"] for r in h.rows()]
            assert _partial_runs(h) == [] and sorted(set(ids)) == sorted(expected)
            assert len(ids) == len(expected) * len(SCENARIOS)
            assert len(h.series("alpha")) == len(expected)


SESSION = '''
from bench_core import Scenario


def test_step(bench):
    bench.run(Scenario("step", ("compute",)), lambda: sum(range(100)))
'''


def test_a_session_with_a_postgresql_url_adds_its_run_there_and_never_shows_the_password(pytester, pg_url):
    pytester.makepyfile(test_h=SESSION)
    url = pg_url.replace("bench@", "bench:hunter2@")   # the cluster trusts its socket: the password goes unused
    res = pytester.runpytest("--bench-repeats", "5", "--bench-warmup", "0", "--bench-history", url)
    res.assert_outcomes(passed=1)
    text = "\n".join(res.outlines + res.errlines)
    assert "hunter2" not in text and f"history: this run added to {history_db.shown(url)}" in text
    assert "bench:***@" in history_db.shown(url)
    (session,) = (pytester.path / ".bench" / "results").glob("session-*.json")
    with History(pg_url) as h:
        (p,) = h.series("step")
        assert p.run_id == json.loads(session.read_text())["run_id"] and h.source_of(p.run_id) == str(session)
    assert not (pytester.path / ".bench" / "history.sqlite").exists()
    assert sorted(x.name for x in pytester.path.iterdir() if x.name.startswith("postgres")) == []


def test_a_url_stays_a_url_and_a_missing_driver_says_what_to_install(tmp_path, monkeypatch, capsys, pytester):
    from bench_core.shells.cli import main

    url = "postgresql://bench:s3cret@db.example:5432/history"
    assert history_db.target(url, tmp_path) == url and history_db.target("h.sqlite", tmp_path) == tmp_path / "h.sqlite"
    assert history_db.shown(url) == "postgresql://bench:***@db.example:5432/history"
    assert history_db.shown("postgres://u@h/db?password=x&sslmode=require") == \
        "postgres://u@h/db?password=***&sslmode=require"
    value = opt.values(lambda dest: {"bench_history": url}.get(dest), {})
    monkeypatch.setitem(sys.modules, "psycopg", None)          # as if psycopg were not installed
    with pytest.raises(ValueError) as refused:
        configs.session_config(value, tmp_path, "cpu")
    with pytest.raises(HistoryError) as opening:
        History(url)
    assert main(["history", "list", "--history", url]) == 2
    cli_said = capsys.readouterr().err
    pytester.makepyfile(test_h=SESSION)
    res = pytester.runpytest("--bench-history", url)            # stopped before anything is measured
    assert res.ret == pytest.ExitCode.USAGE_ERROR and not (pytester.path / ".bench").exists()
    for said in (str(refused.value), str(opening.value), cli_said, "\n".join(res.errlines)):
        assert "--bench-history postgresql://bench:***@db.example:5432/history" in said, said
        assert "pip install 'bench_core[postgres]'" in said and "s3cret" not in said


def test_an_unreachable_server_or_a_bad_url_names_the_url_without_its_password_and_what_to_do(capsys, pytester):
    from bench_core.shells.cli import main

    pytest.importorskip("psycopg", reason="psycopg 3 is not installed (pip install 'bench_core[postgres]')")
    with socket.socket() as s:   # a port nothing listens on: connection refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql://bench:s3cret@127.0.0.1:{port}/history"
    value = opt.values(lambda dest: {"bench_history": url}.get(dest), {})
    assert configs.session_config(value, Path("/nowhere"), "cpu").history == url    # kept a URL, checked when written
    with pytest.raises(HistoryError) as unreachable:
        History(url)
    said = str(unreachable.value)
    assert said.startswith(f"postgresql://bench:***@127.0.0.1:{port}/history: no connection to the PostgreSQL")
    assert "start the server" in said and "PGPASSWORD" in said and "s3cret" not in said
    assert main(["history", "show", "step", "--history", url]) == 2
    assert "no connection to the PostgreSQL history" in capsys.readouterr().err
    with pytest.raises(HistoryError, match=r"postgresql://h/db\?bogus=1: not a URL libpq reads"):
        History("postgresql://h/db?bogus=1")
    pytester.makepyfile(test_h=SESSION)   # a session measures, keeps its session file, and goes red, saying why
    res = pytester.runpytest("--bench-repeats", "5", "--bench-warmup", "0", "--bench-history", url)
    res.assert_outcomes(passed=1)
    text = "\n".join(res.outlines + res.errlines)
    assert res.ret == 1 and "s3cret" not in text and len(list((pytester.path / ".bench" / "results").iterdir())) == 1
    assert f"could not store: postgresql://bench:***@127.0.0.1:{port}/history: no connection" in " ".join(text.split())


def test_a_database_holding_other_tables_or_nothing_yet_is_refused_for_reading(pg_url):
    import psycopg

    with pytest.raises(HistoryError, match="no history here yet"):
        History(pg_url, create=False)
    with psycopg.connect(pg_url, autocommit=True) as con:
        con.execute("CREATE TABLE orders (id INTEGER)")
    with pytest.raises(HistoryError, match="a PostgreSQL database that is not a bench_core history .tables: orders"
                                           ".*CREATE SCHEMA bench"):
        History(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as con:   # the way out the refusal names
        con.execute("CREATE SCHEMA bench")
    with History(pg_url + "&options=-csearch_path%3Dbench") as h:
        assert h.add_run(_run(1.0, "a" * 40, "2026-12-03T10:00:00+00:00")) and len(h.series("step")) == 1
