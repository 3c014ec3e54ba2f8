"""Where a history store lives and how to talk to it: an SQLite file (the standard library's sqlite3, the default)
or a PostgreSQL database named by a URL (psycopg 3, the `postgres` extra), for runners on several machines.

Both hold the same tables (`history.History` owns them). What differs is said once, in a `Dialect`: the
placeholder, two column types, where the table names are listed, and how a writer takes its lock. A URL is never
shown with its password (`shown`).
"""
from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from bench_core.core.errors import BenchError

URL_SCHEMES = ("postgresql://", "postgres://")
NEEDS = "a PostgreSQL history needs psycopg 3, which is not installed here: pip install 'bench_core[postgres]'"
BUSY_S = 30.0             # how long an SQLite writer waits for another runner's transaction on the same file
CONNECT_TIMEOUT_S = 10    # libpq waits for a host that does not answer as long as TCP does (minutes) unless told
# any fixed number: the lock that serializes creating the tables, which concurrent CREATE TABLEs would not be
SCHEMA_LOCK = 0x62656E6368


class HistoryError(BenchError):
    pass


@dataclass(frozen=True)
class Dialect:
    what: str                      # what a store of this kind is, in an error
    instead: str                   # what to do where it holds tables of something else
    placeholder: str
    real: str                      # a float column: PostgreSQL's REAL is single precision, SQLite's is double
    text: str                      # a text column, sorted by bytes in both (PostgreSQL's default is the locale's)
    tables: str                    # the names of the tables in the history's schema
    begin: str                     # a writer's transaction; SQLite's takes the write lock at once
    lock: str | None               # taken before the tables are checked or created
    errors: tuple[type[BaseException], ...]

    def sql(self, query: str) -> str:
        """`query` written with `?` placeholders, for this database."""
        return query.replace("?", self.placeholder)


SQLITE = Dialect("an SQLite file", "give another path", "?", "REAL", "TEXT",
                 "SELECT name FROM sqlite_master WHERE type = 'table'", "BEGIN IMMEDIATE", None,
                 (sqlite3.DatabaseError,))


def _postgres(errors: tuple[type[BaseException], ...]) -> Dialect:
    return Dialect("a PostgreSQL database", "give another database, or the history a schema of its own (CREATE "
                   "SCHEMA bench; then ?options=-csearch_path%3Dbench in the URL)", "%s",
                   "DOUBLE PRECISION", 'TEXT COLLATE "C"',
                   "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()",
                   "BEGIN", f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK})", errors)


def is_url(target: Any) -> bool:
    return isinstance(target, str) and target.lower().startswith(URL_SCHEMES)


def target(text: str, root: Path | None = None) -> Path | str:
    """What `--bench-history` names: a database URL as given, else a file (relative to `root`, where given)."""
    if is_url(text):
        return text
    return Path(text) if root is None else root / text


def shown(where: Path | str) -> str:
    """A store's name for messages: a URL's password (in its user part or as `password=`) replaced by ***."""
    if not is_url(where):
        return str(where)
    parts = urlsplit(str(where))
    user, at, host = parts.netloc.rpartition("@")
    if at and ":" in user:
        user = user.split(":", 1)[0] + ":***"
    query = re.sub(r"(?i)(^|&)(password=)[^&]*", r"\1\2***", parts.query)
    return urlunsplit(parts._replace(netloc=f"{user}{at}{host}", query=query))


def available() -> bool:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return False
    return True


def connect(where: Path | str, create: bool) -> tuple[Any, Dialect]:
    """An open connection in autocommit (each transaction begun explicitly, `Dialect.begin`) and its dialect."""
    if is_url(where):
        return _connect_postgres(str(where)), _postgres(_psycopg_errors())
    path = Path(where)
    if not create and not path.exists():
        raise HistoryError(f"{path}: no history file here (a session writes one under .bench/ unless "
                           f"--bench-history none; or `bench-core history import FILES`)")
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(str(path), timeout=BUSY_S, isolation_level=None)
    con.execute("PRAGMA foreign_keys = ON")
    return con, SQLITE


def _psycopg_errors() -> tuple[type[BaseException], ...]:
    import psycopg

    return (psycopg.Error,)


def _connect_postgres(url: str):
    try:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        raise HistoryError(f"--bench-history {shown(url)}: {NEEDS}") from None
    try:
        given = conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise HistoryError(f"{shown(url)}: not a URL libpq reads ({_quoted(exc, url)}); its form: "
                           f"postgresql://USER@HOST:PORT/DATABASE") from None
    timeout = {} if "connect_timeout" in given else {"connect_timeout": CONNECT_TIMEOUT_S}
    try:
        return psycopg.connect(url, autocommit=True, **timeout)
    except psycopg.Error as exc:
        raise HistoryError(
            f"{shown(url)}: no connection to the PostgreSQL history ({_quoted(exc, url)}): start the server, or "
            f"correct the host, port, database or user in the URL (a password belongs in PGPASSWORD or ~/.pgpass, "
            f"not in the URL); a session's run stays in its session file, and `bench-core history import` adds it "
            f"later") from None


def _quoted(exc: BaseException, url: str) -> str:
    """libpq's message on one line, never with the URL's password in it (libpq does not quote one back; kept out
    all the same)."""
    said = " ".join(str(exc).split())
    parts = urlsplit(url)
    secrets = [parts.password or ""] + re.findall(r"(?i)(?:^|&)password=([^&]*)", parts.query)
    for secret in {s for raw in secrets for s in (raw, unquote(raw)) if s}:
        said = said.replace(secret, "***")
    return said
