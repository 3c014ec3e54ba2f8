"""A distributed scenario's ranks watching each other: each rank's sign of life in the process group's store, read
back by each node's first rank, so that a rank or a node that goes away (its process, its launcher, its host) is
named by the ranks left waiting for it, instead of a time limit that names nothing."""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any, Callable, Mapping

NODE_ENV = "BENCH_CORE_NODE_RANK"   # the node's index as the user gave it (the rendezvous numbers nodes its own way)

BEAT_S = 0.5      # how often a rank gives its sign of life
SILENT_S = 15.0   # a peer without one for this long has ended (its process, its launcher or its host)


class PeerWatch:
    """A thread in every rank: its sign of life (a counter, its phase, host and node) in the process group's store
    every BEAT_S; and in each node's local rank 0, every peer's read back. A peer silent for SILENT_S ended (its
    process, its node's launcher or its host: a collective would wait for it until the time limit and name
    nothing): `on_silent` gets what it last said, once; a peer that failed (it says so as it ends) at once. A rank
    that finishes says so, and is never judged silent. The counter, not a clock, tells life: hosts' clocks
    differ."""

    def __init__(self, store, rank: int, world: int, watching: bool, phase: Callable[[], str],
                 on_silent: Callable[[int, Mapping[str, Any]], None], clock: Callable[[], float] | None = None,
                 silent_s: float = SILENT_S):
        self.store, self.rank, self.world, self.watching = store, rank, world, watching
        self.phase, self.on_silent, self.silent_s = phase, on_silent, silent_s
        self.clock = clock or time.monotonic
        self.me = {"host": socket.gethostname(), "node": int(os.environ.get(NODE_ENV, 0)),
                   "group": int(os.environ.get("GROUP_RANK", 0))}
        self.count, self.seen = 0, {}          # peer -> (its last counter, when it changed, what it said)
        self.ended = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-peer-watch", daemon=True)

    def start(self, barrier: Callable[[], Any] = lambda: None) -> "PeerWatch":
        """Its first sign of life, then (behind `barrier`, once every rank gave one) every peer's read, so that a
        peer that ends at once is named with what it said, then the thread."""
        self.beat()
        barrier()
        self.look()
        self.thread.start()
        return self

    def stop(self, failed: bool = False) -> None:
        self.ended.set()
        self.thread.join(timeout=5)
        self.beat(ended=not failed, failed=failed)

    def beat(self, ended: bool = False, failed: bool = False) -> None:
        self.count += 1
        self.store.set(f"bench_peer/{self.rank}", json.dumps({**self.me, "count": self.count, "phase": self.phase(),
                                                               "ended": ended, "failed": failed}))

    def look(self) -> tuple[int, dict] | None:
        """The first peer silent for SILENT_S, with what it last said; None while every peer lives."""
        now = self.clock()
        for peer in range(self.world):
            if peer == self.rank:
                continue
            key = f"bench_peer/{peer}"
            said = json.loads(self.store.get(key)) if self.store.check([key]) else {"count": 0, "phase": "starting"}
            if said.get("failed"):
                return peer, said
            last = self.seen.get(peer)
            if last is None or last[0] != said["count"]:
                self.seen[peer] = (said["count"], now, said)
            elif not said.get("ended") and now - last[1] > self.silent_s:
                return peer, said
        return None

    def store_gone(self, exc: BaseException) -> tuple[int, Mapping[str, Any]]:
        """The store stopped answering: it lives in the launcher of the node the rendezvous numbered 0, so that
        node ended; named by a rank of it, as last seen, where one was."""
        why = f"{type(exc).__name__}: {str(exc).strip()[:160]}"
        for peer, (_, _, said) in sorted(self.seen.items()):
            if said.get("group") == 0 and said.get("node") != self.me["node"]:
                return peer, {**said, "store": why}
        return -1, {"phase": "unknown", "store": why, "host": os.environ.get("MASTER_ADDR")}

    def culprit(self) -> tuple[int, Mapping[str, Any]] | None:
        """After a collective of this rank failed: the peer whose end made it fail, looked for up to the silence
        that judges one (it goes silent, or says it failed); None where every peer lives on (the failure is this
        rank's own)."""
        self.ended.set()
        self.thread.join(timeout=5)
        deadline = self.clock() + self.silent_s + 2 * BEAT_S
        while self.clock() < deadline:
            try:
                self.beat()
                found = self.look()
            except Exception as exc:  # noqa: BLE001 - the store itself is gone, with the launcher that held it
                return self.store_gone(exc)
            if found is not None:
                return found
            time.sleep(BEAT_S)
        return None

    def _run(self) -> None:
        while not self.ended.wait(BEAT_S):
            try:
                self.beat()
                silent = self.look() if self.watching else None
            except Exception as exc:  # noqa: BLE001 - the store itself is gone, with the launcher that held it
                self.on_silent(*self.store_gone(exc))
                return
            if silent is not None:
                self.on_silent(*silent)
                return


def between_ranks(exc: BaseException) -> bool:
    """A failure of the communication between ranks (a collective whose peer went away), not of this rank's code."""
    import torch.distributed as dist

    text = str(exc)
    return isinstance(exc, getattr(dist, "DistError", RuntimeError)) or isinstance(exc, RuntimeError) and any(
        mark in text for mark in ("Connection closed", "Connection reset", "remote worker", "gloo", "NCCL"))


def default_store():
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:  # noqa: BLE001 - no store to watch peers through: the time limit names what it can
        return None


def peer_ended(peer: int, said: Mapping[str, Any], silent_s: float) -> str:
    """Why this rank stops, in words: the peer (`PeerWatch`; -1: the store, its holder unknown) and what it said."""
    who = (f"rank {peer} (node {said.get('node')}, host {said.get('host')})" if peer >= 0 else
           f"the node the rendezvous numbered 0 (host {said.get('host')})")
    if said.get("failed"):
        text = f"{who} failed in '{said.get('phase')}' (its traceback is in its own node's report)"
    elif said.get("store"):
        last = f", last in '{said.get('phase')}'," if peer >= 0 else ""
        text = (f"{who}{last} stopped answering: its launcher, which held the process group's store, is gone "
                f"({said['store']})")
    else:
        text = (f"{who} stopped answering in '{said.get('phase')}': no sign of life for {silent_s:g} s, so its "
                f"process, its node's launcher or its host ended")
    return text + (f"; this rank's collective ended with {said['cause']}" if said.get("cause") else "") + "\n"
