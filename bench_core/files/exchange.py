"""Files a parent and its child processes exchange: a distributed scenario's private folder (the spec the
parent writes, each rank's status and traceback, each node's gathered result). A child's log is
`children.run_logged`'s.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Mapping

from bench_core.files.atomic import atomic_write, dump_json, write_new
from bench_core.files.storage import read_json

# Files in a private temporary folder the parent removes afterwards: the spec the parent writes, each rank's
# status (pid and phase, rewritten at each phase) and traceback, and the gathered result of each node.
RANK_SPEC, RANK_RESULT = "spec.json", "node{node}.result.json"


def rank_exchange():
    """A private temporary folder for one launch, removed with everything in it when the context ends."""
    return tempfile.TemporaryDirectory(prefix="bench_core-ranks-")


def write_rank_spec(folder: Path, spec: Mapping[str, Any]) -> Path:
    return write_new(Path(folder) / RANK_SPEC, dump_json(dict(spec)))


def read_rank_spec(path: Path) -> dict:
    return read_json(path)


def write_rank_status(folder: Path, rank: int, doc: Mapping[str, Any]) -> Path:
    return atomic_write(Path(folder) / f"rank{rank}.status.json", dump_json(dict(doc)), overwrite=True)


def write_rank_error(folder: Path, rank: int, phase: str, trace: str, peer: int | None = None) -> Path:
    """A rank's failure: its phase and traceback, or (`peer`) the peer whose end made it fail."""
    doc = {"rank": rank, "phase": phase, "traceback": trace, **({"peer": peer} if peer is not None else {})}
    return atomic_write(Path(folder) / f"rank{rank}.error.json", dump_json(doc), overwrite=True)


def write_rank_result(folder: Path, node: int, doc: Mapping[str, Any]) -> Path:
    return write_new(Path(folder) / RANK_RESULT.format(node=node), dump_json(dict(doc)))


def read_rank_files(folder: Path) -> dict[str, Any]:
    """What the ranks left: {"status": {rank: doc}, "errors": {rank: doc}, "results": [doc, ...]}; a file
    cut short by a killed rank is skipped (the status of a rank that died mid-write is simply unknown)."""
    out: dict[str, Any] = {"status": {}, "errors": {}, "results": []}
    for path in sorted(Path(folder).glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if path.name.endswith(".status.json"):
            out["status"][int(path.name[4:].split(".")[0])] = doc
        elif path.name.endswith(".error.json"):
            out["errors"][int(doc["rank"])] = doc
        elif path.name.endswith(".result.json"):
            out["results"].append(doc)
    return out
