"""A project's own settings for bench_core: the `[tool.bench_core]` table of its `pyproject.toml`, read as TOML
(the standard library's reader, or `tomli` before Python 3.11). Which keys exist and what their values may be is
the options' business (`shells.options`); this module only finds and reads the table."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bench_core.core.errors import StorageError

TABLE = "tool.bench_core"


def _toml():
    try:
        import tomllib
    except ModuleNotFoundError:   # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            return None
    return tomllib


def read_table(path: Path) -> dict[str, Any]:
    """The `[tool.bench_core]` table of the pyproject.toml at `path` ({} where the file or the table is absent).
    A file that is not TOML, or a table that is not a table, is a StorageError naming the file."""
    path = Path(path)
    if not path.is_file():
        return {}
    text = path.read_text(encoding="utf-8", errors="replace")
    if "bench_core" not in text:   # no table: nothing to parse, and no TOML reader needed
        return {}
    toml = _toml()
    if toml is None:
        raise StorageError(path, "has a [tool.bench_core] table, and reading it needs Python 3.11 or the tomli "
                                 "package (pip install tomli)")
    try:
        doc = toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise StorageError(path, f"is not valid TOML ({exc})") from None
    table = doc.get("tool", {}).get("bench_core", {})
    if not isinstance(table, dict):
        raise StorageError(path, f"[{TABLE}] must be a table of settings, got {type(table).__name__}")
    return table
