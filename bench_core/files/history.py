"""The history store: every run's results, keyed by commit, branch, machine and scenario, in one SQLite file (the
standard library's sqlite3). The schema is plain tables and columns, so a server database could hold it later.

A run is a session (or one run of a baseline), named by its own `run_id`: a run imported twice, or recorded and
then imported, is one run. Each scenario keeps its run-level summary (the median, and the mean and spread of the
log of its samples, what change points are found on), its work signature where counted, and the file it came
from. Writes are transactions: two runners writing one file each see their run whole or not at all (SQLite's own
locking; a writer waits up to `BUSY_S` for the other). Schema version 1; the history is in docs/formats.md.
"""
from __future__ import annotations

import hashlib
import json
import math
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from bench_core.core.errors import BenchError

HISTORY_FORMAT, HISTORY_VERSION = "bench_core.history", 1
BUSY_S = 30.0   # how long a writer waits for another runner's transaction on the same file

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,        -- the session's own id: what makes a run the same run wherever it is copied
    created TEXT NOT NULL,          -- when it was measured (ISO 8601, UTC)
    git_commit TEXT,                -- NULL: not observed
    branch TEXT,
    dirty INTEGER,                  -- 1: measured on a tree with uncommitted changes
    machine TEXT NOT NULL,          -- a short key of the hardware (see `machine_key`)
    machine_doc TEXT NOT NULL,      -- the fields the key was made from (JSON)
    device TEXT,
    torch TEXT,
    python TEXT,
    source TEXT                     -- the session or baseline file it came from
);
CREATE TABLE IF NOT EXISTS results (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    scenario TEXT NOT NULL,
    timer TEXT NOT NULL,            -- what the samples are: host end-to-end, or CUDA events
    n INTEGER NOT NULL,
    median_ms REAL NOT NULL,
    mean_log REAL NOT NULL,         -- mean of ln(ms) over the run's samples
    sd_log REAL,                    -- their spread (NULL: one sample)
    signature TEXT,                 -- the work signature (JSON), where counted
    PRIMARY KEY (run_id, scenario)
);
CREATE INDEX IF NOT EXISTS results_by_scenario ON results (scenario);
"""

# what a machine is, for its history: the hardware, not the software running on it (a torch upgrade is a change
# the history should show, not a new machine)
MACHINE_FIELDS = ("hostname", "cpu_model", "cpu_count", "device", "gpu_name", "gpu_memory_bytes")


class HistoryError(BenchError):
    pass


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


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(str(path), timeout=BUSY_S, isolation_level=None)
    con.execute("PRAGMA foreign_keys = ON")
    return con


class History:
    """One history file, opened for reading and appending (`with History(path) as h:`)."""

    def __init__(self, path: Path, create: bool = True):
        self.path = Path(path)
        if not create and not self.path.exists():
            raise HistoryError(f"{self.path}: no history file here (a session writes one under .bench/ unless "
                               f"--bench-history none; or `bench-core history import FILES`)")
        self.con = _connect(self.path)
        try:
            self._check_or_create()
        except sqlite3.DatabaseError as exc:
            self.con.close()
            raise HistoryError(f"{self.path}: not a bench_core history file ({exc})") from None

    def _check_or_create(self) -> None:
        with self._transaction():
            tables = {r[0] for r in self.con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "meta" in tables:
                meta = dict(self.con.execute("SELECT key, value FROM meta"))
                if meta.get("format") != HISTORY_FORMAT:
                    raise HistoryError(f"{self.path}: format {meta.get('format')!r} is not {HISTORY_FORMAT!r}")
                if int(meta.get("version", 0)) > HISTORY_VERSION:
                    raise HistoryError(f"{self.path}: history version {meta['version']} is newer than this "
                                       f"bench_core reads ({HISTORY_VERSION}); upgrade bench_core")
                return
            if tables:
                raise HistoryError(f"{self.path}: an SQLite file that is not a bench_core history (tables: "
                                   f"{', '.join(sorted(tables))}); give another path")
            for statement in _SCHEMA.split(";"):   # one by one: executescript would end this transaction
                if statement.strip():
                    self.con.execute(statement)
            self.con.executemany("INSERT INTO meta VALUES (?, ?)",
                                 [("format", HISTORY_FORMAT), ("version", str(HISTORY_VERSION))])

    def _transaction(self):
        con = self.con

        class _Tx:
            def __enter__(self):
                con.execute("BEGIN IMMEDIATE")   # the write lock first: two runners never interleave a run

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
        with self._transaction():
            if self.con.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone():
                return False
            self.con.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, run.get("created") or "", env.get("git_commit"), branch or env.get("git_branch"),
                 None if env.get("git_dirty") is None else int(bool(env.get("git_dirty"))), machine_key(env),
                 json.dumps({k: env.get(k) for k in MACHINE_FIELDS}, sort_keys=True), env.get("device"),
                 env.get("torch"), env.get("python"), source))
            self.con.executemany("INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
        return True

    def import_file(self, path: Path) -> tuple[int, int]:
        """A session file's run, or every run of a baseline file: (runs added, runs already held)."""
        from bench_core.files import storage

        runs = storage.load_run_docs(path)
        added = sum(self.add_run(r, source=str(path)) for r in runs)
        return added, len(runs) - added

    # --- reading ----------------------------------------------------------------------------------------------

    def scenarios(self) -> list[tuple[str, int, str]]:
        """(scenario, runs, latest run's time), by name."""
        return list(self.con.execute(
            "SELECT r.scenario, COUNT(*), MAX(u.created) FROM results r JOIN runs u USING (run_id) "
            "GROUP BY r.scenario ORDER BY r.scenario"))

    def machines(self) -> list[tuple[str, str, int]]:
        """(machine key, its fields as JSON, runs)."""
        return list(self.con.execute("SELECT machine, machine_doc, COUNT(*) FROM runs GROUP BY machine "
                                     "ORDER BY COUNT(*) DESC"))

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
        for row in self.con.execute(sql + " ORDER BY u.created, u.run_id", args):
            *head, dirty, machine_, median, mean, sd, n, sig = row
            out.append(Point(*head, None if dirty is None else bool(dirty), machine_, median, mean, sd, n,
                             None if sig is None else json.loads(sig)))
        return out

    def source_of(self, run_id: str) -> str | None:
        row = self.con.execute("SELECT source FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return row[0] if row else None

    def rows(self) -> Iterator[dict]:
        """Every result with its run's fields, for export."""
        cur = self.con.execute(
            "SELECT u.created, u.git_commit, u.branch, u.dirty, u.machine, u.device, u.torch, u.python, "
            "r.scenario, r.timer, r.n, r.median_ms, r.mean_log, r.sd_log, u.run_id, u.source "
            "FROM results r JOIN runs u USING (run_id) ORDER BY u.created, r.scenario")
        names = [d[0] for d in cur.description]
        for row in cur:
            yield dict(zip(names, row))


def record_session(path: Path, session_doc: Mapping[str, Any], source: str | None, branch: str | None) -> bool:
    """A finished session's run appended to the history at `path` (created if new)."""
    with closing(History(path)) as h:
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
