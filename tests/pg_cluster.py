"""A throwaway PostgreSQL cluster, for the history's tests and quality/history_fleet.py: initdb into a fresh folder,
the server listening only on a unix socket inside it (no TCP port to collide with another), stopped and the folder
removed at the end, also when what ran inside failed.

PostgreSQL refuses to run as root, and CI runs as root: there the server runs as `nobody`, in a folder of its own
under the system's temporary folder (pytest's are root's alone and closed to other users).
"""
from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

USER = "bench"          # the cluster's superuser: trusted on its own socket, so no password anywhere
RUN_AS = "nobody"       # who runs the server where we are root


def binaries() -> tuple[Path | None, str]:
    """The folder with initdb, pg_ctl and postgres, or None and why not."""
    found = shutil.which("initdb")
    candidates = [Path(found).resolve().parent] if found else []
    candidates += sorted((Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin")),   # Debian's, off PATH
                         key=lambda p: int(re.sub(r"\D", "", p.parent.name) or 0), reverse=True)
    for folder in candidates:
        if all((folder / name).exists() for name in ("initdb", "pg_ctl", "postgres")):
            return folder, ""
    return None, ("no PostgreSQL server binaries (initdb, pg_ctl, postgres) on PATH or in /usr/lib/postgresql/*/bin; "
                  ".ci/run installs them with apt-get where it runs as root")


def why_not() -> str:
    """Why no cluster can be started here ('' where one can): no server binaries, no psycopg, no user to run as."""
    folder, why = binaries()
    if folder is None:
        return why
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg 3 is not installed (pip install 'bench_core[postgres]')"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(RUN_AS)
        except KeyError:
            return f"running as root, and no user {RUN_AS!r} to run the PostgreSQL server as"
    return ""


@contextlib.contextmanager
def cluster(durable: bool = False) -> Iterator[str]:
    """A running server, as the URL of its `postgres` database; `durable`: the server's own defaults (fsync on),
    for measurements; else what a throwaway needs (no fsync), for tests."""
    folder, why = binaries()
    if folder is None:
        raise RuntimeError(why)
    top = Path(tempfile.mkdtemp(prefix="bench-pg-"))
    data, sock = top / "data", top / "sock"
    sock.mkdir()
    who: dict = {}
    if os.geteuid() == 0:
        nobody = pwd.getpwnam(RUN_AS)
        who = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
        for p in (top, sock):
            os.chown(p, nobody.pw_uid, nobody.pw_gid)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(folder / args[0]), *args[1:]], cwd=top, capture_output=True, text=True,
                              timeout=120, **who)

    try:
        # a default collation that sorts by language, where the server has ICU: text ordered by bytes is then the
        # history's own doing (COLLATE "C"), as it must be for both databases to list the same order
        base = ("initdb", "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync")
        made = run(*base, "--locale-provider=icu", "--icu-locale=en-US")
        if made.returncode != 0:
            made = run(*base)
        if made.returncode != 0:
            raise RuntimeError(f"initdb failed: {made.stderr[-2000:]}")
        options = f"-k {sock} -c listen_addresses='' -p 5432" + ("" if durable else " -c fsync=off")
        started = run("pg_ctl", "-D", str(data), "-l", str(top / "server.log"), "-w", "-t", "60", "-o", options,
                      "start")
        if started.returncode != 0:
            log = (top / "server.log").read_text() if (top / "server.log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {started.stderr[-1000:]} {log[-2000:]}")
        yield f"postgresql://{USER}@/postgres?host={sock}"
    finally:
        _stop(run, data)
        shutil.rmtree(top, ignore_errors=True)


def _stop(run, data: Path) -> None:
    """The server stopped: politely, and where that fails its postmaster killed (its children follow it)."""
    pid_file = data / "postmaster.pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text().split()[0])
    with contextlib.suppress(subprocess.TimeoutExpired):
        if run("pg_ctl", "-D", str(data), "-m", "fast", "-w", "-t", "30", "stop").returncode == 0:
            return
    for sig in (signal.SIGQUIT, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
            time.sleep(1)


def database(admin_url: str, name: str) -> str:
    """A new, empty database on the cluster; its URL."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as con:
        con.execute(f'CREATE DATABASE "{name}"')
    return admin_url.replace("/postgres?", f"/{name}?", 1)
