"""Side by side on a package with compiled code: a small setuptools C extension built in place in a throwaway
repository (its binary ignored by git), compared through the real plugin. The step's cost on the fake clock is
what the loaded binary returns, so which build each side ran decides the verdict, never this machine's speed."""
import json
import shutil
import subprocess
import sys

import pytest

from test_fidelity import CONFTEST, commit_all

SETUP = '''
from setuptools import Extension, setup

setup(name="fastpkg", version="0", packages=["fastpkg"],
      ext_modules=[Extension("fastpkg._fast", ["fastpkg/_fast.c"])])
'''

# torch's own build of a C++ extension (its compiler flags, torch's libraries linked); the source includes only
# Python.h, so a build takes seconds where torch/extension.h would take most of a minute on 2 cores
TORCH_SETUP = '''
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(name="fastpkg", version="0", packages=["fastpkg"],
      ext_modules=[CppExtension("fastpkg._fast", ["fastpkg/_fast.c"])], cmdclass={"build_ext": BuildExtension})
'''

SOURCE = '''
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define COST {cost}

static PyObject *cost(PyObject *self, PyObject *args) {{ return PyFloat_FromDouble(COST); }}
static PyMethodDef methods[] = {{{{"cost", cost, METH_NOARGS, "ms a step takes"}}, {{NULL, NULL, 0, NULL}}}};
static struct PyModuleDef module = {{PyModuleDef_HEAD_INIT, "_fast", NULL, -1, methods}};
PyMODINIT_FUNC PyInit__fast(void) {{ return PyModule_Create(&module); }}
'''

PACKAGE = '''
from fastpkg._fast import cost

PY_FACTOR = {factor}


def step_ms():
    return cost() * PY_FACTOR
'''

TEST = '''
import fastpkg
from bench_core import Scenario
from fakes import SHARED_CLOCK, work_on_shared_clock


def test_fast(bench):
    bench.run(Scenario("fast", ("forward",)), work_on_shared_clock(fastpkg.step_ms()), clock=SHARED_CLOCK)
'''

BUILD = "python setup.py build_ext --inplace"


def _can_build():
    try:
        import setuptools  # noqa: F401
    except ImportError:
        return "setuptools is not installed"
    return None if shutil.which("cc") or shutil.which("gcc") else "no C compiler (cc)"


pytestmark = pytest.mark.skipif(_can_build() is not None, reason=f"cannot build a C extension: {_can_build()}")


def _write(path, cost=2.0, factor=1.0):
    (path / "fastpkg").mkdir(exist_ok=True)
    source = path / "fastpkg" / "_fast.c"
    if not source.exists() or source.read_text() != SOURCE.format(cost=cost):   # as an editor leaves it: unchanged
        source.write_text(SOURCE.format(cost=cost))
    (path / "fastpkg" / "__init__.py").write_text(PACKAGE.format(factor=factor))


def _build(path):
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=path, check=True,
                   capture_output=True)


@pytest.fixture(scope="module")
def built_package(tmp_path_factory):
    """The package at COST 2.0, built in place once per builder for every test here (a build is most of a test).
    torch's build is left to the one test that takes it, which changes the source and builds it there: a build at
    COST 2.0 would never be loaded (torch's BuildExtension takes seconds where setuptools takes a fraction of one)."""
    made = {}

    def get(builder):
        if builder not in made:
            folder = tmp_path_factory.mktemp(f"built-{builder}")
            (folder / "setup.py").write_text(SETUP if builder == "setuptools" else TORCH_SETUP)
            _write(folder)
            if builder == "setuptools":
                _build(folder)
            made[builder] = folder
        return made[builder]
    return get


@pytest.fixture
def repo(pytester, request, built_package):
    """The package at COST 2.0, built in place by setuptools (torch's BuildExtension: sources only, see
    `built_package`) and committed without its binary."""
    builder = getattr(request, "param", "setuptools")
    if builder == "torch" and shutil.which("c++") is None:
        pytest.skip("torch's BuildExtension needs a C++ compiler (c++)")
    shutil.copytree(built_package(builder), pytester.path, dirs_exist_ok=True)   # dates kept: built after source
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_fast=TEST)
    (pytester.path / ".gitignore").write_text("*.so\n*.pyd\nbuild/\n")
    commit_all(pytester.path)
    return pytester


def _record(pytester, out="out"):
    files = sorted((pytester.path / out).glob("session-*.json"))
    return json.loads(files[-1].read_text())["against"]["scenarios"][0] if files else None


SAME = TEST + '''

def test_same(bench):   # the extension's own cost: no Python change reaches it
    bench.run(Scenario("same", ("forward",)), work_on_shared_clock(fastpkg.cost()), clock=SHARED_CLOCK)
'''


def test_identical_compiled_sources_reuse_the_work_trees_binary_in_processes_of_their_own(repo):
    """A pure-Python 2x slowdown with the extension unchanged, beside an A/A scenario that runs the extension
    alone, in one session (one pair of servers for both): default options (no --bench-against-processes), each
    side in a process of its own, the revision's side running a copy of this tree's binary from its own tree."""
    repo.makepyfile(test_fast=SAME)
    commit_all(repo.path, "the A/A scenario")
    _write(repo.path, factor=2.0)
    res = repo.runpytest("--bench-against", "HEAD", "--bench-quick", "--bench-out", "out")
    res.assert_outcomes(failed=1, passed=1)
    res.stdout.fnmatch_lines(["bench_core: compiled code: every compiled source and build input is identical*"
                              "copies of this tree's built fastpkg/_fast*"])
    res.stdout.fnmatch_lines(["*scenario 'fast': slower against revision 'HEAD'*"])
    (path,) = (repo.path / "out").glob("session-*.json")
    recs = {r["scenario"]: r for r in json.loads(path.read_text())["against"]["scenarios"]}
    assert recs["same"]["comparison"]["verdict"] not in ("slower", "faster")     # A/A: never called a change
    assert 1.9 <= recs["fast"]["comparison"]["ratio"] <= 2.1
    for rec in recs.values():
        assert "the project has compiled code (fastpkg/_fast" in rec["code"]["why_processes"]
        assert rec["code"]["compiled"]["how"] == "reused"
        ran = {side: [f for f in rec["code"]["processes_ran"][side][0]["files"] if "_fast" in f]
               for side in ("baseline", "candidate")}
        assert ran["candidate"][0].startswith(str(repo.path)) and not ran["baseline"][0].startswith(str(repo.path))


@pytest.mark.parametrize("repo", ["setuptools", "torch"], indirect=True)
def test_a_changed_extension_source_is_refused_without_a_build_and_built_once_with_one(repo, tmp_path_factory):
    """The C source made 2x slower and rebuilt here: with no build declared the run stops before measuring,
    naming the file that differs and how to declare a build; with one, the revision's side gets its own build and
    the 2x is found; a second run of the same comparison builds nothing (the build counted from outside)."""
    _write(repo.path, cost=4.0)
    _build(repo.path)
    torch_build = "TORCH" in (repo.path / "setup.py").read_text().upper()
    res = repo.runpytest("--bench-against", "HEAD", "--bench-quick", "--bench-out", "out")
    assert res.ret != 0
    res.stderr.fnmatch_lines(["*compiled code differs between HEAD and this tree (fastpkg/_fast.c)*"
                              "[[]tool.bench_core[]] build = *"])

    counter = tmp_path_factory.mktemp("counted") / "builds.txt"
    build = f"echo built >> {counter} && {BUILD}"
    for run in range(1 if torch_build else 2):   # declared on the command line, then in pyproject.toml
        if run:
            (repo.path / "pyproject.toml").write_text(f"[tool.bench_core]\nbuild = {json.dumps(build)}\n")
        res = repo.runpytest("--bench-against", "HEAD", "--bench-quick", "--bench-out", "out",
                             "--bench-malloc", "pinned",   # one pair of servers a side: cheaper, same point
                             *(["--bench-build", build] if not run else []))
        res.assert_outcomes(failed=1)
        res.stdout.fnmatch_lines(["*scenario 'fast': slower against revision 'HEAD'*"])
        rec = _record(repo)
        assert 1.9 <= rec["comparison"]["ratio"] <= 2.1
        assert rec["code"]["compiled"]["how"] == ("built", "cached")[run]
    assert counter.read_text().split() == ["built"]
    if not torch_build:   # the cache is the same for either builder: tried once
        res.stdout.fnmatch_lines(["*its side runs its own build, made by an earlier run*nothing built*"])


def test_a_failing_build_fails_the_run_naming_the_revision_the_command_and_its_log(repo):
    _write(repo.path, cost=4.0)
    _build(repo.path)
    res = repo.runpytest("--bench-against", "HEAD", "--bench-quick", "--bench-no-out", "--bench-build",
                         "echo no compiler here >&2; exit 3")
    assert res.ret != 0
    res.stderr.fnmatch_lines(["*building HEAD (*) with 'echo no compiler here >&2; exit 3' failed (exit 3); "
                              "its log is *.log: no compiler here*"])


def test_a_revisions_build_never_writes_into_this_trees_build_folder(repo, tmp_path_factory):
    """setuptools keeps its objects in build/, which git ignores: linked into the revision's tree as data is, the
    revision's build would write its objects into this tree's folder (and could take this tree's for its own)."""
    from bench_core.workflows.side_by_side.revisions import link_untracked

    (repo.path / "weights.bin").write_bytes(b"data")
    tree = tmp_path_factory.mktemp("rev")
    linked = link_untracked(repo.path, tree)
    assert "weights.bin" in linked and not any(rel.startswith("build") or rel.endswith(".so") for rel in linked)


def test_bisect_builds_each_commit_it_tests_once_and_finds_the_commit_that_made_the_extension_slower(tmp_path, capsys):
    """Two commits after GOOD; the first makes the C function 2x slower. Each step's worktree is built with the
    declared build before its comparison (GOOD's side by the step's own --bench-build), every build cached: each
    commit is built at most once however many steps test it, and the plan says so."""
    from bench_core.shells.cli import main
    from test_fidelity import GIT_ENV

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True,
                              env={**GIT_ENV, "HOME": str(tmp_path)}).stdout.strip()
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "setup.py").write_text(SETUP)
    (tmp_path / "test_fast.py").write_text(TEST)
    (tmp_path / ".gitignore").write_text("*.so\nbuild/\n.bench/\nbuilt.txt\n")
    git("init", "-q")
    shas = []
    for i in range(3):
        _write(tmp_path, cost=4.0 if i >= 1 else 2.0)
        (tmp_path / "fastpkg" / "__init__.py").write_text(PACKAGE.format(factor=1.0) + f"# commit {i}\n")
        git("add", "-A")
        git("commit", "-qm", f"commit {i}")
        shas.append(git("rev-parse", "HEAD"))
    counter = tmp_path / "built.txt"
    build = f"tail -n 1 fastpkg/__init__.py >> {counter} && {BUILD}"   # "# commit i": which commit was built
    code = main(["bisect", shas[0], shas[-1], "-k", "fast", "--repo", str(tmp_path), "--build", build, "--",
                 "--bench-rounds", "3", "--bench-pairs", "2", "--bench-worker-pairs", "3",
                 "--bench-malloc", "pinned"])   # one pair of servers a side: cheaper, same point
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"first bad commit: {shas[1]}" in out and "was first built with" in out
    built = counter.read_text().splitlines()
    assert len(built) == len(set(built)) and "# commit 0" in built   # GOOD built too, no commit twice
    assert git("status", "--porcelain") == ""


JIT_PACKAGE = '''
import os

from torch.utils.cpp_extension import load

_fast = load(name="fast_jit", sources=[os.path.join(os.path.dirname(__file__), "_fast.c")])


def step_ms():
    return _fast.cost()
'''


@pytest.mark.skipif(shutil.which("c++") is None or shutil.which("ninja") is None,
                    reason="torch.utils.cpp_extension.load needs a C++ compiler and ninja")
def test_just_in_time_extensions_are_compiled_by_each_side_in_a_folder_of_its_own(pytester):
    """`cpp_extension.load` from sources in the tree, nothing built ahead of time: with one build folder for both
    (torch's default) the two sides' builds of one extension name would overwrite each other; each side's process
    compiles its own source in its own folder, and the 2x the changed source makes is found."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_fast=TEST)
    (pytester.path / ".gitignore").write_text(".cache/\n")
    (pytester.path / "fastpkg").mkdir()
    (pytester.path / "fastpkg" / "_fast.c").write_text(SOURCE.format(cost=2.0).replace("PyInit__fast", "PyInit_fast_jit")
                                                       .replace('"_fast"', '"fast_jit"'))
    (pytester.path / "fastpkg" / "__init__.py").write_text(JIT_PACKAGE)
    commit_all(pytester.path)
    source = pytester.path / "fastpkg" / "_fast.c"
    source.write_text(source.read_text().replace("#define COST 2.0", "#define COST 4.0"))
    res = pytester.runpytest("--bench-against", "HEAD", "--bench-quick", "--bench-out", "out",
                             "--bench-malloc", "pinned")   # one pair of servers a side: one build each
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["bench_core: compiled code: compiled sources differ, nothing built ahead of time*"])
    rec = _record(pytester)
    assert 1.9 <= rec["comparison"]["ratio"] <= 2.1 and rec["code"]["compiled"]["how"] == "own"
    loaded = {side: [f for f in rec["code"]["processes_ran"][side][0]["files"] if "fast_jit" in f]
              for side in ("baseline", "candidate")}
    assert "/torch_extensions/baseline-" in loaded["baseline"][0] and "/torch_extensions/candidate-" in \
        loaded["candidate"][0]


def test_a_source_edited_after_the_last_build_or_a_tree_never_built_is_refused_before_measuring(repo):
    """The work tree's binary older than its source: the current side would run a build of other sources (a
    helper's torchsort trial called an edited kernel 'unchanged' so); and a tree with a declared build but nothing
    built would fail at import. Both stop before any scenario, saying to build first."""
    import os

    so = next(repo.path.glob("fastpkg/_fast*.so"))
    source = repo.path / "fastpkg" / "_fast.c"
    source.write_text(SOURCE.format(cost=4.0))
    os.utime(so, (so.stat().st_mtime - 10, so.stat().st_mtime - 10))
    res = repo.runpytest("--bench-against", "HEAD", "--bench-quick", "--bench-no-out", "--bench-build", BUILD)
    assert res.ret != 0
    res.stderr.fnmatch_lines(["*this tree's built fastpkg/_fast*.so is older than its source fastpkg/_fast.c*"
                              "Build this tree first (python setup.py build_ext --inplace)*"])
    so.unlink()
    res = repo.runpytest("--bench-against", "HEAD", "--bench-quick", "--bench-no-out", "--bench-build", BUILD)
    assert res.ret != 0
    res.stderr.fnmatch_lines(["*this tree has compiled sources (fastpkg/_fast.c) but no extension module built*"])


def test_a_source_rewritten_with_the_content_it_was_built_from_is_not_stale(repo):
    """`git checkout other && git checkout -` rewrites a source with its old content, dated after the build: a
    sceptic's run stopped so, asking for a rebuild of what was built. A source seen older than the modules is
    recorded; the same content newer is not stale, other content is, and so is any source once the module changes."""
    import os

    so = next(repo.path.glob("fastpkg/_fast*.so"))
    source = repo.path / "fastpkg" / "_fast.c"
    args = ("--bench-against", "HEAD", "--bench-quick", "--bench-no-out", "--bench-build", BUILD)
    assert repo.runpytest(*args).ret == 0          # every source older than the module: recorded
    record = repo.path / ".bench" / "builds" / "fresh-sources.json"
    assert json.loads(record.read_text())["sources"]["fastpkg/_fast.c"]
    later = so.stat().st_mtime + 10
    source.write_text(source.read_text())          # as a checkout leaves it: the same bytes, dated now
    os.utime(source, (later, later))
    res = repo.runpytest(*args)
    assert res.ret == 0, res.stderr.str()
    source.write_text(SOURCE.format(cost=4.0))      # other content, dated after the build
    os.utime(source, (later, later))
    res = repo.runpytest(*args)
    assert res.ret != 0
    res.stderr.fnmatch_lines(["*this tree's built fastpkg/_fast*.so is older than its source fastpkg/_fast.c*"])
    source.write_text(SOURCE.format(cost=2.0))      # the old content back, but the module is not the one recorded
    os.utime(source, (later, later))
    os.utime(so, (so.stat().st_mtime - 1, so.stat().st_mtime - 1))
    assert repo.runpytest(*args).ret != 0


def test_an_environment_kept_in_the_tree_is_not_the_projects_compiled_code_and_a_copy_is_dated_now(tmp_path):
    """A virtual environment or conda prefix inside the repository (any name) holds extension modules that are not
    the project's; and a built module copied from the cache into a fresh tree must not read as older than that
    tree's sources (a bisect retry was refused as stale so)."""
    import os

    from bench_core.workflows.side_by_side.compiled import _copy, built_in

    for rel in ("pkg/_c.so", "tools-env/lib/python3.11/site-packages/x.so", "px/envs/default/lib/libz.so"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"\x7fELF")
    (tmp_path / "tools-env" / "pyvenv.cfg").write_text("home = /usr\n")
    (tmp_path / "px" / "envs" / "default" / "conda-meta").mkdir()
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    assert built_in(tmp_path) == ["pkg/_c.so"]
    os.utime(tmp_path / "pkg" / "_c.so", (1_000_000, 1_000_000))
    _copy(tmp_path / "pkg" / "_c.so", tmp_path / "copy" / "_c.so")
    assert (tmp_path / "copy" / "_c.so").stat().st_mtime > 1_000_000 + 3600


def test_a_submodule_moved_from_the_revisions_commit_counts_as_changed_compiled_input(tmp_path):
    """Kernels kept in a submodule are not listed by the parent's git: a submodule checked out at another commit
    than the revision records (or with changes of its own) is a compiled input that differs."""
    from bench_core.workflows.side_by_side.compiled import _submodules_moved
    from test_revisions import git, with_submodule, write

    root = with_submodule(tmp_path)
    git(root, "commit", "-qm", "v1")
    assert _submodules_moved(root, "HEAD") == []
    write(root, {"workload/work.py": "AMOUNT = 20\n"})
    assert _submodules_moved(root, "HEAD") == ["workload (submodule)"]    # changes of its own
    git(root / "workload", "commit", "-qam", "large")
    assert _submodules_moved(root, "HEAD") == ["workload (submodule)"]    # another commit


def test_a_build_past_its_limit_is_ended_with_everything_it_started(tmp_path):
    from bench_core.files.children import alive, end_group, run_logged

    # the shell waits for what it started once told to end (its trap): the compiler, ended beside it by the group's
    # signal, is then reaped by the shell at once, not left to init, which reaped orphans 1.5 s late here; a shell
    # ended alone would wait on the compiler, be killed, and leave it running
    ran = run_logged(["/bin/sh", "-c", "trap wait TERM; sleep 60 & echo $!; wait"], tmp_path / "log", 0.5,
                     start_new_session=True, ending=end_group)
    grandchild = int((tmp_path / "log").read_text().split()[0])
    assert ran.code is None and not alive(grandchild)   # the compiler a build's shell started, not only the shell


def test_a_builds_cache_key_changes_with_the_build_environment_and_nothing_else(tmp_path, monkeypatch):
    """#52: a binary cached under one CFLAGS (or compiler, or CUDA architectures) is never reused for a build under
    another; a variable no build tool reads leaves the key as it was."""
    from bench_core.workflows.side_by_side.compiled import BUILD_ENV, build_key

    (tmp_path / "setup.py").write_text("")
    commit_all(tmp_path)
    for name in BUILD_ENV:
        monkeypatch.delenv(name, raising=False)
    plain = build_key(tmp_path, "HEAD", "python setup.py build_ext --inplace")
    monkeypatch.setenv("BENCH_UNRELATED", "1")
    assert build_key(tmp_path, "HEAD", "python setup.py build_ext --inplace") == plain
    for name, value in (("CFLAGS", "-O0"), ("TORCH_CUDA_ARCH_LIST", "9.0"), ("CUDA_HOME", "/opt/cuda-12")):
        monkeypatch.setenv(name, value)
        assert build_key(tmp_path, "HEAD", "python setup.py build_ext --inplace") != plain, name
        monkeypatch.delenv(name)
    assert build_key(tmp_path, "HEAD", "python setup.py build_ext --inplace") == plain
    assert build_key(tmp_path, "HEAD", "make") != plain


def test_a_build_runs_in_the_projects_folder_of_the_revisions_tree_and_a_missing_one_is_named(tmp_path):
    """#52: a package in a subfolder of its repository (pytest's rootdir there, its pyproject.toml declaring the
    build) is built in that folder of the revision's tree, not at the repository's root; where the revision has no
    such folder, the error says so before running anything."""
    from bench_core.workflows.side_by_side.compiled import CompiledError, ensure_built

    repo, tree = tmp_path / "repo", tmp_path / "tree"
    for root in (repo, tree):
        (root / "python").mkdir(parents=True)
        (root / "python" / "setup.py").write_text("")
    commit_all(repo)
    build = "pwd > where.txt && touch _fast.so"
    built = ensure_built(repo, tree, "HEAD", "HEAD", build, tmp_path / "cache", where="python")
    assert built.files == ("python/_fast.so",) and not built.cached
    assert (tree / "python" / "where.txt").read_text().strip() == str(tree / "python")
    assert ensure_built(repo, tree, "HEAD", "HEAD", build, tmp_path / "cache", where="python").cached
    with pytest.raises(CompiledError, match="the project's folder lib is not in its tree"):
        ensure_built(repo, tree, "HEAD", "HEAD", build, tmp_path / "cache2", where="lib")


@pytest.fixture(scope="module")
def other_python(tmp_path_factory):
    """A second environment, as a user keeps one with another torch: a virtual environment of its own that reaches
    this one's packages (torch, pytest, bench_core) through its site folder, so it is another interpreter to a
    build (its prefix) while running the same code."""
    import sysconfig
    import venv
    from pathlib import Path

    folder = tmp_path_factory.mktemp("other-env")
    venv.create(folder, with_pip=False)
    python = folder / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "this_env.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    return python


def test_one_tree_in_another_interpreter_gets_a_build_made_by_that_interpreter_in_a_copy(repo, other_python,
                                                                                        tmp_path_factory):
    """--bench-against-python alone on a project with compiled code: this tree's binary was built for this
    interpreter, so with no build declared the run stops before measuring; with one, the other interpreter's side
    runs a copy of this tree built by that interpreter (never this tree's binary, never a build in this tree), and
    a second run builds nothing."""
    res = repo.runpytest("--bench-against-python", str(other_python), "--bench-quick", "--bench-no-out")
    assert res.ret != 0
    res.stderr.fnmatch_lines([f"*the other interpreter's side runs in {other_python} (Python 3*, torch *), and this "
                              f"tree runs extension modules built for this interpreter (fastpkg/_fast*"
                              f"[[]tool.bench_core[]] build = *"])
    counter = tmp_path_factory.mktemp("counted") / "builds.txt"
    build = f"echo $PYTHON >> {counter} && {BUILD}"
    mine = sorted(p.stat().st_mtime_ns for p in (repo.path / "fastpkg").glob("_fast*"))
    for run in range(2):
        res = repo.runpytest("--bench-against-python", str(other_python), "--bench-quick", "--bench-out", "out",
                             "--bench-malloc", "pinned", "--bench-build", build)
        res.assert_outcomes(passed=1)
        res.stdout.fnmatch_lines([f"*compiled code is built per interpreter, and the other interpreter's side runs "
                                  f"in {other_python}*"])
        rec = _record(repo)
        assert rec["code"]["compiled"]["how"] == ("built", "cached")[run]
        assert rec["comparison"]["ratio"] == pytest.approx(1.0, rel=0.05)
        ran = {side: [f for f in rec["code"]["processes_ran"][side][0]["files"] if "_fast" in f]
               for side in ("baseline", "candidate")}
        assert ran["candidate"][0].startswith(str(repo.path)) and not ran["baseline"][0].startswith(str(repo.path))
        assert rec["code"]["processes_ran"]["baseline"][0]["interpreter"] == str(other_python)
    # a revision in that interpreter: its tree built by it too (another tree, so another build)
    res = repo.runpytest("--bench-against", "HEAD", "--bench-against-python", str(other_python), "--bench-quick",
                         "--bench-out", "out", "--bench-malloc", "pinned", "--bench-build", build)
    res.assert_outcomes(passed=1)
    assert _record(repo)["code"]["compiled"]["how"] == "built"
    assert counter.read_text().split() == [str(other_python)] * 2
    assert sorted(p.stat().st_mtime_ns for p in (repo.path / "fastpkg").glob("_fast*")) == mine   # built elsewhere
