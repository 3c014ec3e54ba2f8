"""A suite split over runners and gated as one: `--bench-shard K/N` picks a stable, disjoint part of the collected
tests, and `bench-core merge` joins the shards' session files into one session, which every gate then decides as
one family (`bench-core compare BASELINE MERGED`, its Markdown report, the pull-request comment).

The split is a function of the collected test ids alone (and, where given, the durations the history knows), so
every runner that collects the same suite computes the same split; each shard's session file records which shard
of which split it is (the split's hash over the sorted ids), and the merge refuses shards of different splits,
commits, machine classes or options, and a shard missing or given twice, naming them.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from bench_core.core.environment import differences
from bench_core.core.errors import BenchError
from bench_core.files import storage
from bench_core.files.atomic import atomic_write, dump_json, write_new

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


class ShardError(BenchError):
    pass


def parse(text: str) -> tuple[int, int]:
    """`K/N` (1 <= K <= N) as (K, N); a ValueError that says what to give."""
    m = _SPEC.match(str(text))
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"--bench-shard takes K/N with 1 <= K <= N (this runner's part of N), got {text!r}")
    return int(m.group(1)), int(m.group(2))


def split_id(ids: Iterable[str], durations: Mapping[str, float] | None = None) -> str:
    """The split's identity: a hash of the sorted test ids every shard collected and of the durations known for
    them (one suite, one balance, one split: shards that read different durations are of different splits)."""
    ids = sorted(set(ids))
    known = {t: float(durations[t]) for t in ids if durations and t in durations}
    return hashlib.sha256(("\n".join(ids) + (json.dumps(known, sort_keys=True) if known else "")).encode()
                          ).hexdigest()[:16]


def read_durations(path: Path) -> dict[str, float] | None:
    """The test durations a shard balances by (`bench-core merge --durations` writes them: test id -> seconds);
    None where the file is not there yet (every runner then deals round robin alike); a ShardError naming the
    file where it is not such a file."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ShardError(f"{path}: the shards' durations file cannot be read ({exc}); write it again with "
                         f"bench-core merge ... --durations {path}") from None
    if not isinstance(doc, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
                                            for v in doc.values()):
        raise ShardError(f"{path}: the shards' durations file must map test ids to seconds (0 or more); write it "
                         f"again with bench-core merge ... --durations {path}")
    return {str(k): float(v) for k, v in doc.items()}


def write_durations(merged: Mapping[str, Any], path: Path) -> int:
    """The merged run's test durations written into `path` (atomically), over the entries it had for those tests
    and beside the others; returns how many tests the run timed."""
    timed = dict((merged.get("merged") or {}).get("durations") or {})
    known = read_durations(path) or {}
    atomic_write(Path(path), dump_json({k: round(v, 4) for k, v in sorted({**known, **timed}.items())}),
                 overwrite=True)
    return len(timed)


def assign(ids: Sequence[str], n: int, durations: Mapping[str, float] | None = None) -> dict[str, int]:
    """Each test id's shard (1..N): the longest known first, each to the shard with the least time so far
    (durations from the history; a test it does not know counts as the median of those it does), ties broken by
    id; with no durations, round robin over the sorted ids. Deterministic, disjoint, covering."""
    ordered = sorted(set(ids))
    known = sorted(v for k, v in (durations or {}).items() if k in set(ordered) and v > 0)
    if not known:
        return {t: i % n + 1 for i, t in enumerate(ordered)}
    fill = known[len(known) // 2]
    cost = {t: durations[t] if t in durations else fill for t in ordered}
    load = [0.0] * n
    out = {}
    for t in sorted(ordered, key=lambda t: (-cost[t], t)):
        k = min(range(n), key=lambda i: (load[i], i))
        load[k] += cost[t]
        out[t] = k + 1
    return out


def record(k: int, n: int, split: str, selected: int, options: Mapping[str, Any], balanced: str = "round robin",
           durations: Mapping[str, float] | None = None) -> dict:
    """What a shard's session file says of it: which part of which split, how the split was balanced, the options
    its measurements took (every shard of one run must take the same), and how long each of its tests took (for
    the next run's balance)."""
    return {"index": k, "count": n, "split": split, "tests": selected, "options": dict(options),
            "balanced": balanced, "durations": dict(durations or {})}


# what must be the same in every shard of one run: the code, the machine class, what was asked
_SAME_RUN = ("git_commit", "git_dirty", "bench_core_version", "malloc")


def merge(paths: Sequence[Path]) -> dict:
    """The shards' session files joined into one session document, or a ShardError naming what does not fit."""
    docs = [(Path(p), storage.session_doc(Path(p))) for p in paths]
    if not docs:
        raise ShardError("give the session files of every shard to merge")
    shards = []
    for path, doc in docs:
        shard = doc.get("shard")
        if not isinstance(shard, dict):
            raise ShardError(f"{path}: not a shard's session file (run with --bench-shard K/N)")
        shards.append(shard)
    first_path, first = docs[0]
    splits = {(s["count"], s["split"]) for s in shards}
    if len(splits) > 1:
        raise ShardError("the files are shards of different splits (another suite, or another N): " + ", ".join(
            f"{p.name}: {s['index']}/{s['count']} of split {s['split']}" for (p, _), s in zip(docs, shards)))
    n = shards[0]["count"]
    seen: dict[int, list[str]] = {}
    for (path, _), s in zip(docs, shards):
        seen.setdefault(int(s["index"]), []).append(path.name)
    missing = [k for k in range(1, n + 1) if k not in seen]
    twice = {k: names for k, names in seen.items() if len(names) > 1}
    if missing or twice:
        raise ShardError("; ".join([f"shard(s) {', '.join(map(str, missing))} of {n} missing"] * bool(missing) + [
            f"shard {k} given twice ({', '.join(names)})" for k, names in sorted(twice.items())]))
    for path, doc in docs[1:]:
        _same_run(first_path, first, path, doc)
    return _joined([d for _, d in docs], shards[0])


def _same_run(first_path: Path, first: Mapping, path: Path, doc: Mapping) -> None:
    a, b = first["environment"], doc["environment"]
    wrong = {k: (a.get(k), b.get(k)) for k in _SAME_RUN if a.get(k) != b.get(k)}
    wrong.update(differences(a, b))
    if wrong:
        said = ", ".join(f"{k}: {x!r} in {first_path.name}, {y!r} in {path.name}" for k, (x, y) in wrong.items())
        raise ShardError(f"the shards are not one run of one suite on one machine class ({said})")
    theirs, ours = first["shard"].get("options"), doc["shard"].get("options")
    if theirs != ours:
        raise ShardError(f"the shards were run with different options: {first_path.name} {theirs}, {path.name} "
                         f"{ours}")


def _joined(docs: Sequence[Mapping[str, Any]], shard: Mapping[str, Any]) -> dict:
    names: dict[str, int] = {}
    results, errors, replicas = [], [], {}
    for i, doc in enumerate(docs):
        for r in doc["results"]:
            name = r["scenario"]["name"]
            if name in names:
                raise ShardError(f"scenario {name!r} was measured by shards {docs[names[name]]['shard']['index']} "
                                 f"and {doc['shard']['index']}: one scenario in two tests, each in another shard")
            names[name] = i
            results.append(r)
        errors += list(doc.get("errors") or [])
        replicas.update(doc.get("replicas") or {})
    out = {k: v for k, v in docs[0].items() if k not in ("results", "errors", "replicas", "comparisons", "against",
                                                           "shard", "created", "run_id")}
    # the same shards make the same run, however often merged: a history or baseline holds it once
    same = hashlib.sha256(" ".join(sorted(d["run_id"] for d in docs)).encode()).hexdigest()[:32]
    run = storage.run_doc([], docs[0]["environment"], errors, created=max(d["created"] for d in docs), run_id=same)
    durations = {t: v for d in docs for t, v in (d["shard"].get("durations") or {}).items()}
    out.update(run, results=results, merged={"count": shard["count"], "split": shard["split"],
                                             "runs": [d["run_id"] for d in docs], "durations": durations})
    if replicas:
        out["replicas"] = replicas
    return out


def write_merged(doc: Mapping[str, Any], out: Path) -> Path:
    """The merged session, written atomically to a new file (never over one that is there)."""
    return write_new(Path(out), dump_json(dict(doc)))
