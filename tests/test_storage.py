import json
import os
import re

import pytest

from bench_core import StorageError
from bench_core.files import atomic, storage
from helpers import ENV, meas, runs


def test_session_round_trip_and_never_overwrites(tmp_path):
    results = [meas([1.0, 2.0, 3.0], name="a"), meas([4.0, 5.0], name="b")]
    p1 = storage.write_session(tmp_path, results, ENV, [{"scenario": "c", "problem": "boom"}])
    p2 = storage.write_session(tmp_path, results, ENV)
    assert p1 != p2 and p1.exists() and p2.exists()   # same second, still two files
    env, back = storage.load_session(p1)
    assert env == ENV and back == results
    doc = json.loads(p1.read_text())
    assert doc["schema_version"] == storage.SCHEMA_VERSION and doc["errors"][0]["scenario"] == "c"
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_atomic_write_refuses_existing_file_and_leaves_it_intact(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("old")
    with pytest.raises(StorageError, match="never overwritten"):
        atomic.atomic_write(p, b"new", overwrite=False)
    assert p.read_text() == "old"
    assert os.listdir(tmp_path) == ["x.json"]


def test_atomic_write_failure_leaves_no_partial_file(tmp_path, monkeypatch):
    p = tmp_path / "x.json"
    p.write_text("old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "replace", broken_replace)
    with pytest.raises(StorageError, match=r"x\.json: could not be written: disk full"):   # names the file
        atomic.atomic_write(p, b"new", overwrite=True)
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["x.json"]


def test_baseline_save_refuses_overwrite_and_appends_when_asked(tmp_path):
    r1, r2 = [meas([1.0, 2.0], name="a")], [meas([3.0, 4.0], name="a")]
    path, n = storage.save_baseline(tmp_path, "main", r1, ENV)
    assert n == 1
    before = path.read_text()
    with pytest.raises(StorageError, match="already exists.*--bench-append"):
        storage.save_baseline(tmp_path, "main", r2, ENV)
    assert path.read_text() == before
    _, n = storage.save_baseline(tmp_path, "main", r2, ENV, append=True)
    assert n == 2
    loaded = storage.load_baseline(tmp_path, "main")
    assert [run[0].host_ms for run in loaded] == [(1.0, 2.0), (3.0, 4.0)]
    assert storage.by_scenario(loaded)["a"][1].host_ms == (3.0, 4.0)


def test_missing_baseline_names_the_known_ones(tmp_path):
    storage.save_baseline(tmp_path, "main", [meas([1.0, 2.0])], ENV)
    with pytest.raises(StorageError, match=r"'nightly' does not exist.*known baselines: main"):
        storage.load_baseline(tmp_path, "nightly")


def test_bad_baseline_name(tmp_path):
    with pytest.raises(StorageError, match="not valid"):
        storage.baseline_path(tmp_path, "../escape")


def _baseline_doc(tmp_path):
    path, _ = storage.save_baseline(tmp_path, "b", [meas([1.0, 2.0, 3.0], name="a")], ENV)
    return path, json.loads(path.read_text())


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.__setitem__("schema_version", 99), "schema version 99 is newer"),
    (lambda d: d.__setitem__("schema_version", "1"), "field 'schema_version': has type str"),
    (lambda d: d.pop("runs"), "field 'runs': missing"),
    (lambda d: d.__setitem__("runs", []), "holds no runs"),
    (lambda d: d["runs"][0]["results"][0].pop("host_ms"), "field 'runs[0].results[0].host_ms': missing"),
    (lambda d: d["runs"][0]["results"][0].__setitem__("repeats", "3"), "runs[0].results[0].repeats"),
    (lambda d: d["runs"][0]["results"][0]["host_ms"].__setitem__(1, -2.0), "cannot be negative"),
    (lambda d: d["runs"][0]["results"][0]["host_ms"].__setitem__(1, "fast"), "not a number"),
    (lambda d: d.__setitem__("format", "something.else"), "format is 'something.else'"),
])
def test_damaged_baseline_fields_are_named(tmp_path, mutate, needle):
    path, doc = _baseline_doc(tmp_path)
    mutate(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(StorageError) as err:
        storage.load_runs(path)
    assert str(path) in str(err.value) and needle in str(err.value)


def test_nan_in_file_is_refused(tmp_path):
    path, _ = _baseline_doc(tmp_path)
    path.write_text(path.read_text().replace("2.0", "NaN", 1))
    with pytest.raises(StorageError, match="NaN is not a valid timing"):
        storage.load_runs(path)


@pytest.mark.parametrize("text, needle", [
    ("", "file is empty"),
    ('{"format": "bench_core.baseline", "schema_', "not valid JSON"),
    ("<<<<<<< HEAD\n{}\n=======\n{}\n>>>>>>> other\n", "git conflict markers"),
    ("[1, 2]", "top level is not a JSON object"),
])
def test_unreadable_files_say_what_to_do(tmp_path, text, needle):
    p = tmp_path / "b.json"
    p.write_text(text)
    with pytest.raises(StorageError, match=needle):
        storage.load_runs(p)


def test_session_file_reads_as_one_run(tmp_path):
    p = storage.write_session(tmp_path, runs([1.0, 2.0]), ENV)
    assert len(storage.load_runs(p)) == 1 and len(storage.load_runs(p)[0]) == 2


def test_decision_record_with_non_finite_errors_is_written_as_json(tmp_path):
    import math

    from bench_core.workflows.validation.correctness import TensorDiff

    diff = TensorDiff("step[0].output", 0, math.inf, math.nan, 1e-5, 1e-5, "non-finite in candidate")
    p = storage.write_decision(tmp_path, {"correctness": {"diffs": [diff.to_dict()]}}, "nan case")
    doc = json.loads(p.read_text())
    assert doc["correctness"]["diffs"][0]["max_abs"] is None
    assert doc["correctness"]["diffs"][0]["problem"] == "non-finite in candidate"
    assert p.name.startswith("decision-nan_case-")


def test_a_baseline_holding_the_same_run_twice_is_refused(tmp_path):
    run = [meas([1.0, 2.0, 3.0], name="a")]
    path, _ = storage.save_baseline(tmp_path, "main", run, ENV)
    doc = json.loads(path.read_text())
    doc["runs"].append(doc["runs"][0])           # a merge conflict resolved by keeping both sides
    path.write_text(json.dumps(doc))
    with pytest.raises(StorageError, match=r"run 1 is run 0 again.*runs\[1\]"):
        storage.load_baseline(tmp_path, "main")
    storage.save_baseline(tmp_path, "other", run, ENV)
    storage.save_baseline(tmp_path, "other", run, ENV, append=True)   # equal samples, another run: kept
    assert len(storage.load_baseline(tmp_path, "other")) == 2


def _append_many(args):
    folder, worker, n = args
    from bench_core.files import storage as st
    from helpers import ENV as env, meas as m

    for i in range(n):
        st.save_baseline(folder, "shared", [m([1.0 + worker, 2.0 + i], name="a")], env, append=True)
    return n


def test_concurrent_appends_lose_no_run(tmp_path):
    import multiprocessing as mp

    storage.save_baseline(tmp_path, "shared", [meas([1.0, 2.0], name="a")], ENV)
    # spawn, not fork: forking this process, whose torch threads may hold a lock, can leave a child waiting on it
    with mp.get_context("spawn").Pool(4) as pool:         # joined and gone when the block ends
        done = sum(pool.map(_append_many, [(tmp_path, w, 5) for w in range(4)]))
    assert done == 20 and len(storage.load_baseline(tmp_path, "shared")) == 21


def test_writes_keep_the_umask_mode_and_clean_killed_writes(tmp_path):
    import time

    storage.save_baseline(tmp_path, "main", [meas([1.0, 2.0], name="a")], ENV)
    path = tmp_path / "main.json"
    old = os.umask(0)
    os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o666 & ~old
    path.chmod(0o640)
    stale = tmp_path / ".main.json.abc123.tmp"
    stale.write_text("left by a killed write")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    storage.save_baseline(tmp_path, "main", [meas([3.0, 4.0], name="a")], ENV, append=True)
    assert path.stat().st_mode & 0o777 == 0o640          # an append keeps the file's own mode
    assert not stale.exists()


def _edited(tmp_path, edit):
    """A baseline of three runs, its JSON text edited by `edit`."""
    path, _ = _baseline_doc(tmp_path)
    doc = json.loads(path.read_text())
    path.write_text(edit(json.dumps(doc)))
    return path


@pytest.mark.parametrize("edit, needle", [
    # every sample 1e308: every scenario would be "faster -100%" and any slowdown would pass against it
    (lambda t: re.sub(r'"host_ms": \[[^]]*\]', '"host_ms": [1e308, 1e308, 1e308]', t), "no timing is that long"),
    # the runs twice: json keeps the last, and three runs would be read as one
    (lambda t: t.replace('"runs": [', '"runs": [], "runs": [', 1), "the key 'runs' appears twice"),
    # wrong types: named with the field, not taken for an environment difference or split into letters
    (lambda t: re.sub(r'"threads": (null|\d+)', '"threads": "1"', t, count=1), "threads must be a whole number"),
    (lambda t: re.sub(r'"window": \[[^]]*\]', '"window": "compute"', t, count=1), "window must be a list of stage"),
])
def test_values_that_cannot_be_timings_or_records_are_refused_naming_the_field(tmp_path, edit, needle):
    path = _edited(tmp_path, edit)
    with pytest.raises(StorageError, match=needle):
        storage.load_runs(path)


def test_a_baseline_name_too_long_is_refused_for_its_length(tmp_path):
    """#28: a 300-character name was refused as if it held a wrong character."""
    with pytest.raises(StorageError, match="baseline name is 300 characters long.*at most 100"):
        storage.baseline_path(tmp_path, "a" * 300)
    assert storage.baseline_path(tmp_path, "a" * 100).name == "a" * 100 + ".json"
    with pytest.raises(StorageError, match="is not valid"):
        storage.baseline_path(tmp_path, "-bad")
