"""Files made for people and other tools to open: a diagnose pass's Chrome traces (with TensorBoard's copy),
the facts and hypotheses beside them, and PNG distribution plots; each under a new name, never replacing one.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Mapping

from bench_core.files.atomic import dump_json, safe_stem, write_new, write_unused


def profiler_json(export) -> Any:
    """Run `export(path)` (a profiler's Chrome-trace export) into a private temporary folder and return
    the parsed JSON; the raw, unredacted file never stays on disk."""
    with tempfile.TemporaryDirectory(prefix="bench_core-trace-") as tmp:
        path = Path(tmp) / "trace.json"
        export(str(path))
        return json.loads(path.read_text())


def write_trace(folder: Path, scenario: str, doc: Any, tensorboard: bool = False) -> Path:
    """A (redacted) Chrome trace under a new name in `folder`; optionally a copy where TensorBoard's
    profiler plugin looks for it. Returns the trace's path."""
    data = json.dumps(doc).encode()
    path = write_unused(Path(folder), safe_stem(scenario, "scenario"), data, suffix=".trace.json", stamped=False)
    if tensorboard:
        tb = Path(folder) / "tensorboard" / "plugins" / "profile" / path.name.removesuffix(".trace.json")
        write_new(tb / "host.pt.trace.json", data)
    return path


def write_plot(folder: Path, name: str, data: bytes) -> Path:
    """A PNG distribution plot under a new name in `folder` (NAME.png, then NAME-1.png...)."""
    return write_unused(Path(folder), safe_stem(name, "scenario"), data, suffix=".png", stamped=False)


def write_hypotheses(trace: Path, doc: Mapping[str, Any]) -> Path:
    """The diagnose pass's facts and hypotheses beside their trace (`NAME.trace.json` ->
    `NAME.hypotheses.json`), never replacing a file."""
    trace = Path(trace)
    return write_new(trace.with_name(trace.name.removesuffix(".trace.json") + ".hypotheses.json"),
                     dump_json(dict(doc)))


def write_rank_hypotheses(folder: Path, scenario: str, doc: Mapping[str, Any]) -> Path:
    """What a distributed scenario's traces say together (`NAME.ranks.hypotheses.json`), under a new name."""
    return write_unused(Path(folder), safe_stem(scenario, "scenario"), dump_json(dict(doc)),
                        suffix=".ranks.hypotheses.json", stamped=False)
