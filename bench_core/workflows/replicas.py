"""The stored gate's replication: one test run again by pytest in a fresh process of this tree, with its own
fixtures, parameters and conftest files, measuring only; its measurement of the scenario read back.

The shell that knows the test (`shells.replay.replica`) says how to start it, as data (`Replica`); here it is run
to its end under a limit, and what it wrote is read through the replica file's owner (`files.storage`)."""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from bench_core.core.errors import ScenarioError
from bench_core.core.records import Measurement
from bench_core.files import children, storage


@dataclass(frozen=True)
class Replica:
    """How to run one test item again in a fresh process: its command (`argv`, to which the counts and the
    output file are added under the flags `flags` names: (output, warmup, repeats)), folder and environment."""

    nodeid: str
    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str] = field(repr=False)
    flags: tuple[str, str, str]

    def __post_init__(self):
        if not self.argv or len(self.flags) != 3:
            raise ValueError(f"{self.nodeid}: a replica needs a command and its three flags (output, warmup, repeats)")

    def command(self, out: Path, warmup: int, repeats: int) -> list[str]:
        out_flag, warmup_flag, repeats_flag = self.flags
        return [*self.argv, f"{out_flag}={out}", f"{warmup_flag}={warmup}", f"{repeats_flag}={repeats}"]

    def measure(self, name: str, environment: Mapping, warmup: int, repeats: int,
                timeout_s: float | None) -> Measurement:
        """Scenario `name` measured once more in a fresh process, with these counts; a process that runs past the
        scenario's limit (and its start-up), or that did not measure the scenario, is its ScenarioError."""
        limit = (timeout_s or children.LIMIT_S) + children.STARTUP_S
        with tempfile.TemporaryDirectory(prefix="bench_core-replica-") as tmp:
            out, log_path = Path(tmp) / "replica.json", Path(tmp) / "pytest.log"
            ran = children.run_logged(self.command(out, warmup, repeats), log_path, limit, tail_lines=3,
                                      cwd=self.cwd, env=dict(self.env))
            if ran.code is None:
                raise ScenarioError(name, f"the fresh process ran past {limit:g} s and was ended: {ran.tail}")
            m = storage.read_replica(out, name, environment) if out.exists() else None
            if m is None:
                raise ScenarioError(name, f"the fresh process (pytest {self.nodeid}, exit {ran.code}) did not "
                                          f"measure this scenario: {ran.tail}")
            return m
