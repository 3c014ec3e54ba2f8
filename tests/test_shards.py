"""A suite split over runners (`--bench-shard K/N`), merged (`bench-core merge`) and gated as one family. The
synthetic suite's scenarios run on the shared fake clock: no decision here depends on this machine's speed."""
import json
import time
from pathlib import Path

import numpy as np
import pytest

from bench_core.workflows import shards
from test_fidelity import CONFTEST

SUITE = '''
import pytest
from bench_core import Scenario
from fakes import SHARED_CLOCK, work_on_shared_clock

SLOW = {slow}


@pytest.mark.parametrize("i", range({n}))
def test_tiny(bench, i):
    ms = 1.0 + (i % 7) * 0.1
    bench.run(Scenario(f"tiny[{{i}}]", ("forward",)), work_on_shared_clock(ms * (2 if i in SLOW else 1)),
              clock=SHARED_CLOCK, warmup=0, repeats=20)
'''


def test_the_shards_of_a_split_are_disjoint_cover_it_and_balance_known_durations():
    ids = [f"tests/test_zoo.py::test_tiny[{i}]" for i in range(2000)]
    parts = shards.assign(ids, 4)
    assert set(parts.values()) == {1, 2, 3, 4} and sorted(parts) == sorted(ids)   # every test in exactly one
    assert sorted(np.bincount(list(parts.values()))[1:]) == [500] * 4
    assert shards.assign(list(reversed(ids)), 4) == parts               # collection order does not matter
    durations = {t: (100.0 if i < 4 else 1.0) for i, t in enumerate(ids)}   # four long tests
    timed = shards.assign(ids, 4, durations)
    load = np.bincount(list(timed.values()), weights=[durations[t] for t in timed])[1:]
    assert {timed[t] for t in ids[:4]} == {1, 2, 3, 4} and load.max() - load.min() <= 1.0
    for bad in ("0/4", "5/4", "2", "a/b"):
        with pytest.raises(ValueError, match="K/N with 1 <= K <= N"):
            shards.parse(bad)


def _run_shards(pytester, n, tag, slow=(), args=(), sizes=None):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_zoo=SUITE.format(n=24, slow=set(slow) or "set()"))
    files = []
    for k in range(1, n + 1):
        res = pytester.runpytest("--bench-shard", f"{k}/{n}", "--bench-out", f"{tag}{k}", "-p", "no:randomly", *args)
        mine = sizes[k - 1] if sizes else len([i for i in range(24) if i % n == k - 1])
        failed = len([i for i in slow if i % n == k - 1]) if args else 0   # a gated shard fails what it calls slower
        res.assert_outcomes(passed=mine - failed, failed=failed)
        (f,) = (pytester.path / f"{tag}{k}").glob("session-*.json")
        files.append(f)
    return files


def test_shards_merge_into_one_session_that_one_gate_decides_and_a_missing_shard_fails_the_merge(pytester, capsys):
    """Three shards of a 24-scenario suite, merged, against a merged baseline of the same split: the A/A decides
    no scenario slower; one scenario made 2x slower in one shard, confirmed there in fresh processes, fails the
    merged gate; a missing shard, a shard given twice and a shard of another split fail the merge, naming them."""
    from bench_core.shells.cli import main

    bases = []
    for r in range(3):   # the baseline: three merged runs of the same split, stored as three runs of "main"
        files = _run_shards(pytester, 3, f"base{r}")
        assert main(["merge", *map(str, files), "--out", str(pytester.path / f"base{r}.json")]) == 0
        bases.append(str(pytester.path / f"base{r}.json"))
    merged = json.loads((pytester.path / "base0.json").read_text())
    assert len(merged["results"]) == 24 and merged["merged"]["count"] == 3
    assert main(["merge", *map(str, files), "--out", bases[-1]]) == 2   # never written over
    assert main(["baseline", "add", "main", *bases, "--baselines", str(pytester.path / "baselines")]) == 0
    assert main(["baseline", "add", "main", str(files[0]), "--baselines", str(pytester.path / "baselines")]) == 2
    assert "one shard of a run (merge the shards first" in capsys.readouterr().err
    assert main(["merge", *map(str, files), "--out", str(pytester.path / "again.json")]) == 0   # the same run twice
    assert json.loads((pytester.path / "again.json").read_text())["run_id"] == \
        json.loads(Path(bases[-1]).read_text())["run_id"]
    gate = ["--baselines", str(pytester.path / "baselines")]
    # each shard gates against the merged baseline, over its whole family, and confirms in fresh processes what it
    # would call (the workflow's shards do the same); the merged gate reads those processes' runs
    shard_gate = ("--bench-compare", "main", "--bench-baselines", str(pytester.path / "baselines"),
                  "--bench-replicate", "confirm")

    again = _run_shards(pytester, 3, "again", args=shard_gate)
    started = time.perf_counter()
    assert main(["merge", *map(str, again), "--out", str(pytester.path / "same.json")]) == 0
    assert time.perf_counter() - started < 30
    capsys.readouterr()
    assert main(["compare", "main", str(pytester.path / "same.json"), *gate]) == 0
    err = capsys.readouterr().err
    assert "0 slower" in err and "of 24 scenario(s) decided" in err
    # an undecided merged run is advised what stores merged runs (a shard refuses --bench-save)
    from bench_core.deciding.gate import gate_advice
    from bench_core.files import storage

    assert storage.is_merged(pytester.path / "same.json") and not storage.is_merged(again[0])
    advice = gate_advice("main", candidate="merged")
    assert "bench-core baseline add main MERGED.json" in advice(None) and "--bench-save" not in advice(None) + advice(5)
    assert not json.loads((pytester.path / "same.json").read_text()).get("replicas")   # nothing to confirm

    slow = _run_shards(pytester, 3, "slow", slow={17}, args=shard_gate)
    assert main(["merge", *map(str, slow), "--out", str(pytester.path / "slow.json")]) == 0
    assert list(json.loads((pytester.path / "slow.json").read_text())["replicas"]) == ["tiny[17]"]
    capsys.readouterr()
    assert main(["compare", "main", str(pytester.path / "slow.json"), *gate]) == 1
    assert "1 slower" in capsys.readouterr().err

    for files, said in ((again[:2], "shard(s) 3 of 3 missing"),
                        ([again[0], again[0], again[2]], "shard 1 given twice")):
        assert main(["merge", *map(str, files), "--out", str(pytester.path / "x.json")]) == 2
        assert said in capsys.readouterr().err
    other = _run_shards(pytester, 2, "other")
    assert main(["merge", str(other[0]), str(again[1]), str(again[2]), "--out", str(pytester.path / "x.json")]) == 2
    assert "shards of different splits" in capsys.readouterr().err


def test_a_shard_stores_nothing_alone_and_an_empty_shard_still_writes_its_file(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_zoo=SUITE.format(n=4, slow="set()"))
    empty = pytester.runpytest("--bench-shard", "5/5", "--bench-out", "empty")   # 4 tests, 5 runners
    empty.assert_outcomes()
    (f,) = (pytester.path / "empty").glob("session-*.json")
    assert json.loads(f.read_text())["shard"]["tests"] == 0
    res = pytester.runpytest("--bench-shard", "1/2", "--bench-save", "main")
    assert res.ret == 4
    res.stderr.fnmatch_lines(["*--bench-shard 1/2 runs a part of the suite*without --bench-save*bench-core merge*"])


def test_shards_dealt_by_the_durations_a_merge_writes_and_shards_of_other_durations_are_another_split(pytester):
    """Every shard times its tests; `bench-core merge --durations FILE` writes them; a run given FILE deals its
    tests by it (here three long tests that round robin puts in one shard: one a shard) and says so, and a shard
    dealt by other durations is of another split, which the merge refuses; a FILE that is not one is named."""
    from bench_core.shells.cli import main

    files = _run_shards(pytester, 3, "rr")
    docs = [json.loads(f.read_text()) for f in files]
    assert {d["shard"]["balanced"] for d in docs} == {"round robin"}
    timed = {t: v for d in docs for t, v in d["shard"]["durations"].items()}
    assert len(timed) == 24 and min(timed.values()) > 0
    durations = pytester.path / "durations.json"
    assert main(["merge", *map(str, files), "--out", str(pytester.path / "m.json"), "--durations",
                 str(durations)]) == 0
    assert json.loads(durations.read_text()) == pytest.approx(timed, abs=1e-4)

    ids = sorted(timed)
    rr = shards.assign(ids, 3)
    long = [t for t in ids if rr[t] == 1][:3]
    durations.write_text(json.dumps({t: 100.0 if t in long else 1.0 for t in ids}))
    dealt = shards.assign(ids, 3, json.loads(durations.read_text()))
    by = _run_shards(pytester, 3, "by", args=("--bench-shard-durations", "durations.json"),
                     sizes=[sum(1 for t in ids if dealt[t] == k) for k in (1, 2, 3)])
    ran = [json.loads(f.read_text())["shard"] for f in by]
    assert sorted(sum(t in long for t in r["durations"]) for r in ran) == [1, 1, 1]
    assert ran[0]["balanced"] == "by the durations in " + str(durations) + " (24 of 24 tests known)"
    assert len({r["split"] for r in ran}) == 1 and ran[0]["split"] != docs[0]["shard"]["split"]
    assert main(["merge", str(by[0]), str(by[1]), str(files[2]), "--out", str(pytester.path / "x.json")]) == 2

    durations.write_text("[1, 2]")
    res = pytester.runpytest("--bench-shard", "1/3", "--bench-shard-durations", "durations.json", "--bench-no-out")
    assert res.ret == 4
    res.stderr.fnmatch_lines([f"*--bench-shard-durations: {durations}: the shards' durations file must map test ids "
                              f"to seconds*"])
