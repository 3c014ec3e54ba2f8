"""The history store: every run's results, keyed by commit, branch, machine and scenario, in one SQLite file (the
standard library's sqlite3, the default) or one PostgreSQL database (`--bench-history postgresql://...`, for runners
on several machines; `history_db` connects and says how the two differ). Both hold the same plain tables.

A run is a session (or one run of a baseline), named by its own `run_id`: a run imported twice, or recorded and
then imported, is one run. Each scenario keeps its run-level summary (the median, and the mean and spread of the
log of its samples, what change points are found on), its work signature where counted, and the file it came
from. A run is written in one transaction, its row inserted only where its `run_id` is not held yet: runners
writing one store at once each see a run whole or not at all, and never twice (SQLite: the file's write lock,
waited for up to `history_db.BUSY_S`; PostgreSQL: the primary key, which holds a second writer of the same run until
the first commits). Schema version 2; the history is in docs/formats.md.
"""
from __future__ import annotations

import hashlib
import json
import math
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from bench_core.files.history_db import HistoryError, connect, is_url, shown

HISTORY_FORMAT, HISTORY_VERSION = "bench_core.history", 2

# {text} and {real}: the column types, which differ between the databases (`history_db.Dialect`)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key {text} PRIMARY KEY, value {text} NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id {text} PRIMARY KEY,      -- the session's own id: what makes a run the same run wherever it is copied
    created {text} NOT NULL,        -- when it was measured (ISO 8601, UTC)
    git_commit {text},              -- NULL: not observed
    branch {text},
    dirty INTEGER,                  -- 1: measured on a tree with uncommitted changes
    machine {text} NOT NULL,        -- a short key of the hardware's class (see `machine_key`)
    machine_doc {text} NOT NULL,    -- the fields the key was made from, and the hostname (JSON)
    device {text},
    torch {text},
    python {text},
    source {text}                   -- the session or baseline file it came from
);
CREATE TABLE IF NOT EXISTS results (
    run_id {text} NOT NULL REFERENCES runs(run_id),
    scenario {text} NOT NULL,
    timer {text} NOT NULL,          -- what the samples are: host end-to-end, or CUDA events
    n INTEGER NOT NULL,
    median_ms {real} NOT NULL,
    mean_log {real} NOT NULL,       -- mean of ln(ms) over the run's samples
    sd_log {real},                  -- their spread (NULL: one sample)
    signature {text},               -- the work signature (JSON), where counted
    PRIMARY KEY (run_id, scenario)
);
CREATE INDEX IF NOT EXISTS results_by_scenario ON results (scenario);
"""

# what a machine is, for its history: the hardware, not the software running on it (a torch upgrade is a change
# the history should show, not a new machine)
# a machine's class, not its name: the runners of one instance type (hosted CI gives each job a new hostname) share
# one series and its change points; the hostname is kept beside it (`machine_doc`), to be read, not to key on
MACHINE_FIELDS = ("cpu_model", "cpu_count", "device", "gpu_name", "gpu_memory_bytes")
KEPT_FIELDS = ("hostname", *MACHINE_FIELDS)


def machine_key(environment: Mapping[str, Any]) -> str:
    doc = {k: environment.get(k) for k in MACHINE_FIELDS}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Point:
    """One run of one scenario in the history."""

    run_id: str
    created: str
    commit: str | None
    branch: str | None
    dirty: bool | None
    machine: str
    median_ms: float
    mean_log: float
    sd_log: float | None
    n: int
    signature: Mapping[str, Any] | None = None


class History:
    """One history store, opened for reading and appending (`with History(where) as h:`): a file's Path, or a
    PostgreSQL URL (`history_db.target` tells which from what a user typed)."""

    def __init__(self, where: Path | str, create: bool = True):
        self.where = where if is_url(where) else Path(where)
        self.con, self.dialect = connect(self.where, create)
        try:
            self._check_or_create(create)
        except self.dialect.errors as exc:
            self.close()
            raise HistoryError(f"{shown(self.where)}: {self.dialect.what} that bench_core cannot read or set up as "
                               f"a history ({' '.join(str(exc).split())})") from None
        except HistoryError:
            self.close()
            raise

    def _run(self, query: str, args: Sequence[Any] = ()):
        return self.con.execute(self.dialect.sql(query), args)

    def _check_or_create(self, create: bool) -> None:
        where = shown(self.where)
        with self._transaction():
            if self.dialect.lock:   # one creator at a time: another runner may be creating the tables right now
                self._run(self.dialect.lock)
            tables = {r[0] for r in self._run(self.dialect.tables)}
            if "meta" in tables:
                meta = dict(self._run("SELECT key, value FROM meta"))
                if meta.get("format") != HISTORY_FORMAT:
                    raise HistoryError(f"{where}: format {meta.get('format')!r} is not {HISTORY_FORMAT!r}")
                if int(meta.get("version", 0)) > HISTORY_VERSION:
                    raise HistoryError(f"{where}: history version {meta['version']} is newer than this "
                                       f"bench_core reads ({HISTORY_VERSION}); upgrade bench_core")
                if int(meta.get("version", 0)) < HISTORY_VERSION:
                    self._upgrade(int(meta.get("version", 0)))
                return
            if tables:
                raise HistoryError(f"{where}: {self.dialect.what} that is not a bench_core history (tables: "
                                   f"{', '.join(sorted(tables))}); {self.dialect.instead}")
            if not create:
                raise HistoryError(f"{where}: no history here yet (a session's run creates it unless --bench-history "
                                   f"none; or `bench-core history import FILES`)")
            ddl = _SCHEMA.format(text=self.dialect.text, real=self.dialect.real)
            for statement in ddl.split(";"):   # one by one: sqlite3's executescript would end this transaction
                if statement.strip():
                    self._run(statement)
            for row in (("format", HISTORY_FORMAT), ("version", str(HISTORY_VERSION))):
                self._run("INSERT INTO meta VALUES (?, ?)", row)

    def _upgrade(self, version: int) -> None:
        """Version 1 keyed a machine on its hostname too: its runs are keyed again by their class, from the fields
        each kept (`machine_doc`), in the transaction that opened the history."""
        if version == 1:
            for run_id, doc in list(self._run("SELECT run_id, machine_doc FROM runs")):
                self._run("UPDATE runs SET machine = ? WHERE run_id = ?", (machine_key(json.loads(doc)), run_id))
        self._run("UPDATE meta SET value = ? WHERE key = 'version'", (str(HISTORY_VERSION),))

    def _transaction(self):
        con, begin = self.con, self.dialect.begin

        class _Tx:
            def __enter__(self):
                con.execute(begin)

            def __exit__(self, kind, exc, tb):
                con.execute("ROLLBACK" if kind else "COMMIT")
        return _Tx()

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> "History":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- writing ----------------------------------------------------------------------------------------------

    def add_run(self, run: Mapping[str, Any], source: str | None = None, branch: str | None = None) -> bool:
        """One run (a session file's document, or one run of a baseline: `run_id`, `created`, `environment`,
        `results`); False where the history holds it already (the same run_id)."""
        from bench_core.files.storage import measurement_from_doc

        env = run.get("environment") or {}
        run_id = run.get("run_id") or hashlib.sha256(json.dumps(run, sort_keys=True, default=str).encode()
                                                     ).hexdigest()[:32]   # a version 1 run had no id
        results = [measurement_from_doc(d, env) for d in run.get("results", [])]
        rows = []
        for m in results:
            xs = [x for x in m.primary_ms if x > 0]
            if not xs:
                continue
            logs = [math.log(x) for x in xs]
            mean = sum(logs) / len(logs)
            sd = (math.sqrt(sum((v - mean) ** 2 for v in logs) / (len(logs) - 1)) if len(logs) > 1 else None)
            rows.append((run_id, m.name, m.timer, len(xs), m.summary.median, mean, sd,
                         None if m.signature is None else json.dumps(m.signature.to_dict(), sort_keys=True)))
        with self._transaction():   # the run's row first: a second writer of the same run finds it held, or waits
            added = self._run(
                "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING",
                (run_id, run.get("created") or "", env.get("git_commit"), branch or env.get("git_branch"),
                 None if env.get("git_dirty") is None else int(bool(env.get("git_dirty"))), machine_key(env),
                 json.dumps({k: env.get(k) for k in KEPT_FIELDS}, sort_keys=True), env.get("device"),
                 env.get("torch"), env.get("python"), source)).rowcount
            if added:
                self.con.cursor().executemany(self.dialect.sql("INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?)"),
                                              rows)
        return bool(added)

    def import_file(self, path: Path) -> tuple[int, int]:
        """A session file's run, or every run of a baseline file: (runs added, runs already held)."""
        from bench_core.files import storage

        runs = storage.load_run_docs(path)
        added = sum(self.add_run(r, source=str(path)) for r in runs)
        return added, len(runs) - added

    # --- reading ----------------------------------------------------------------------------------------------

    def scenarios(self) -> list[tuple[str, int, str]]:
        """(scenario, runs, latest run's time), by name."""
        return list(self._run(
            "SELECT r.scenario, COUNT(*), MAX(u.created) FROM results r JOIN runs u USING (run_id) "
            "GROUP BY r.scenario ORDER BY r.scenario"))

    def machines(self) -> list[tuple[str, str, int, int]]:
        """(machine key, its class's fields as JSON, hosts, runs), the most runs first."""
        seen: dict[str, list] = {}
        for key, doc, n in self._run("SELECT machine, machine_doc, COUNT(*) FROM runs GROUP BY machine, machine_doc"):
            fields = json.loads(doc)
            row = seen.setdefault(key, [json.dumps({k: fields.get(k) for k in MACHINE_FIELDS}, sort_keys=True),
                                        set(), 0])
            row[1].add(fields.get("hostname"))
            row[2] += n
        return sorted(((key, doc, len(hosts), n) for key, (doc, hosts, n) in seen.items()),
                      key=lambda r: (-r[3], r[0]))

    def series(self, scenario: str, machine: str | None = None, branch: str | None = None) -> list[Point]:
        """Every run of `scenario` (on `machine`, on `branch`, where given), oldest first."""
        sql = ("SELECT u.run_id, u.created, u.git_commit, u.branch, u.dirty, u.machine, r.median_ms, r.mean_log, "
               "r.sd_log, r.n, r.signature FROM results r JOIN runs u USING (run_id) WHERE r.scenario = ?")
        args: list[Any] = [scenario]
        for column, value in (("u.machine", machine), ("u.branch", branch)):
            if value is not None:
                sql += f" AND {column} = ?"
                args.append(value)
        out = []
        for row in self._run(sql + " ORDER BY u.created, u.run_id", args):
            *head, dirty, machine_, median, mean, sd, n, sig = row
            out.append(Point(*head, None if dirty is None else bool(dirty), machine_, median, mean, sd, n,
                             None if sig is None else json.loads(sig)))
        return out

    def source_of(self, run_id: str) -> str | None:
        row = self._run("SELECT source FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return row[0] if row else None

    def rows(self) -> Iterator[dict]:
        """Every result with its run's fields, for export."""
        cur = self._run(
            "SELECT u.created, u.git_commit, u.branch, u.dirty, u.machine, u.device, u.torch, u.python, "
            "r.scenario, r.timer, r.n, r.median_ms, r.mean_log, r.sd_log, u.run_id, u.source "
            "FROM results r JOIN runs u USING (run_id) ORDER BY u.created, r.scenario, u.run_id")
        names = [d[0] for d in cur.description]
        for row in cur:
            yield dict(zip(names, row))


def record_session(where: Path | str, session_doc: Mapping[str, Any], source: str | None,
                   branch: str | None) -> bool:
    """A finished session's run appended to the history at `where` (created if new)."""
    with closing(History(where)) as h:
        return h.add_run(session_doc, source=source, branch=branch)


def export(rows: Sequence[Mapping[str, Any]], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(list(rows), indent=1)
    import csv
    import io

    out = io.StringIO()
    if rows:
        w = csv.DictWriter(out, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return out.getvalue()
