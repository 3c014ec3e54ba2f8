"""Loading another git revision beside the current code: real throwaway repositories, real commits."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench_core.core.errors import RevisionError
from bench_core.workflows.side_by_side.revisions import LoadedRevision, resolve, working_tree


def git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@example.invalid", "HOME": str(root), "PATH": "/usr/bin:/bin"})


def write(root: Path, files: dict):
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))


def project(version: int) -> dict:
    """A small project whose every kind of import gives away which revision it came from."""
    return {
        "mypkg/__init__.py": f"VERSION = {version}\n",
        "mypkg/core.py": """
            from . import helpers              # relative import
            from .helpers import scale
            CACHE = {}                          # a module-level cache: one per revision

            def compute(x):
                CACHE[x] = scale(x)
                return CACHE[x]

            def lazy():
                import mypkg.late               # a lazy import inside a function, run later
                return mypkg.late.WHO
            """,
        "mypkg/helpers.py": f"def scale(x):\n    return x * {version}\n",
        "mypkg/late.py": f"WHO = 'v{version}'\n",
        "benchmarks/models.py": f"FACTOR = {version}\n",
        "benchmarks/test_thing.py": """
            import mypkg
            from mypkg.core import compute, lazy
            from models import FACTOR
            import bench_core

            def which():
                return mypkg.VERSION, compute(10), lazy(), FACTOR, bench_core
            """,
    }


@pytest.fixture
def repo(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    write(root, project(1))
    git(root, "add", "-A")
    git(root, "commit", "-qm", "v1")
    write(root, project(2))
    git(root, "commit", "-qam", "v2")
    # the current code imported the usual way, as pytest and a conftest would put it on sys.path
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.syspath_prepend(str(root / "benchmarks"))
    for name in ("mypkg", "mypkg.core", "mypkg.helpers", "mypkg.late", "models", "test_thing"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield root
    for name in [n for n in sys.modules if n.split(".")[0] in ("mypkg", "models", "test_thing")]:
        del sys.modules[name]


def test_each_kind_of_import_resolves_to_its_own_revision(repo):
    import test_thing

    loaded = LoadedRevision(repo, "HEAD~1")
    try:
        theirs = loaded.module_for(repo / "benchmarks" / "test_thing.py")
        v, computed, late, factor, engine = theirs.which()
        assert (v, computed, late, factor) == (1, 10, "v1", 1)
        mine = test_thing.which()
        assert mine[:4] == (2, 20, "v2", 2)
        assert engine is mine[4] is sys.modules["bench_core"]          # the engine is shared, never aliased
        caches = (sys.modules["mypkg.core"].CACHE, sys.modules[f"{loaded.importer.alias}.mypkg.core"].CACHE)
        assert caches == ({10: 20}, {10: 10})                            # one module-level cache per side
        assert loaded.ran_from_revision(theirs.which) and not loaded.ran_from_revision(test_thing.which)
        mods = loaded.loaded_modules()
        assert {"mypkg", "mypkg.core", "mypkg.helpers", "mypkg.late", "models"} <= set(mods)
        assert all(len(h) == 64 for h in mods.values())
    finally:
        loaded.close()
    assert not [n for n in sys.modules if n.startswith(loaded.importer.alias)]
    assert loaded.importer not in sys.meta_path and not loaded.root.exists()


def test_the_users_tree_and_git_state_are_untouched(repo):
    (repo / "mypkg" / "helpers.py").write_text("def scale(x):\n    return x * 3\n")   # uncommitted work
    before = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True, text=True).stdout
    loaded = LoadedRevision(repo, "HEAD~1")
    loaded.close()
    assert subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout == before
    assert subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True, text=True).stdout == worktrees
    assert (repo / "mypkg" / "helpers.py").read_text().endswith("* 3\n")
    cur = working_tree(repo)
    assert cur.dirty and len(cur.diff_sha256) == 64     # which uncommitted changes ran is recorded


@pytest.mark.parametrize("rev, needle", [("no-such-branch", "unknown here"), ("", "needs a git revision"),
                                         ("--all", "needs a git revision")])
def test_bad_revisions_say_what_to_do(repo, rev, needle):
    with pytest.raises(RevisionError, match=needle):
        resolve(repo, rev)


def test_a_shallow_clone_says_how_to_fetch_history(repo, tmp_path):
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow))
    with pytest.raises(RevisionError, match="shallow clone.*fetch-depth: 0"):
        resolve(shallow, "HEAD~1")


def test_outside_git_is_refused(tmp_path):
    with pytest.raises(RevisionError, match="not inside a git repository"):
        LoadedRevision(tmp_path, "HEAD")


def test_a_file_missing_from_the_revision_is_named(repo):
    write(repo, {"benchmarks/test_new.py": "X = 1\n"})
    loaded = LoadedRevision(repo, "HEAD~1")
    try:
        with pytest.raises(RevisionError, match="benchmarks/test_new.py does not exist in HEAD~1"):
            loaded.module_for(repo / "benchmarks" / "test_new.py")
    finally:
        loaded.close()


def test_a_compiled_extension_is_refused_with_the_reason(repo):
    write(repo, {"benchmarks/test_ext.py": "import fastext\n"})
    (repo / "fastext.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "ext")
    loaded = LoadedRevision(repo, "HEAD")
    try:
        loaded.importer.local.add("fastext")
        with pytest.raises(RevisionError, match="compiled extension.*cannot be loaded twice"):
            loaded.module_for(repo / "benchmarks" / "test_ext.py")
    finally:
        loaded.close()


def test_a_torch_library_registration_on_both_sides_fails_loudly(repo):
    import torch

    ns = f"bench_rev_test_{id(repo) % 100000}"
    write(repo, {"benchmarks/test_op.py": f"""
        import torch
        LIB = torch.library.Library("{ns}", "DEF")
        LIB.define("twice(Tensor x) -> Tensor")
        """})
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "op")
    import importlib

    sys.modules.pop("test_op", None)
    importlib.import_module("test_op")      # the current tree registers the operator
    loaded = LoadedRevision(repo, "HEAD")
    try:
        with pytest.raises(RuntimeError):
            loaded.module_for(repo / "benchmarks" / "test_op.py")   # the revision cannot register it again
        assert hasattr(torch.ops, ns)
    finally:
        loaded.close()
        sys.modules.pop("test_op", None)


def _tree(tmp_path, name):
    root = tmp_path / name
    root.mkdir()
    git(root, "init", "-q")
    return root


def with_submodule(tmp_path, files: dict | None = None) -> Path:
    """A repository `repo` holding `files` and the submodule `workload` (its work.py: AMOUNT = 2), added but not
    yet committed in the repository; returns its root."""
    sub = _tree(tmp_path, "workload")
    write(sub, {"work.py": "AMOUNT = 2\n"})
    git(sub, "add", "-A")
    git(sub, "commit", "-qm", "small")
    root = _tree(tmp_path, "repo")
    write(root, files or {})
    git(root, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub), "workload")
    return root


def test_the_revision_is_its_real_tree_export_ignore_and_submodules_included(tmp_path):
    """`git archive` left out an export-ignore'd module and every submodule, so REV's side imported the
    current tree's copies (#27): the revision's tree is now checked out as it is, each submodule at REV's commit."""
    root = with_submodule(tmp_path, {"helpers.py": "V = 1\n", ".gitattributes": "helpers.py export-ignore\n"})
    git(root, "add", "-A")
    git(root, "commit", "-qm", "v1")
    write(root, {"helpers.py": "V = 2\n", "workload/work.py": "AMOUNT = 20\n"})   # the workload bumped 10x
    git(root / "workload", "commit", "-qam", "large")
    git(root, "commit", "-qam", "v2")
    loaded = LoadedRevision(root, "HEAD~1")
    try:
        assert (loaded.root / "helpers.py").read_text() == "V = 1\n"
        assert (loaded.root / "workload" / "work.py").read_text() == "AMOUNT = 2\n"
        assert (root / "workload" / "work.py").read_text() == "AMOUNT = 20\n"        # the user's tree untouched
        assert subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout == ""
    finally:
        loaded.close()


def test_a_submodule_commit_the_clone_lacks_is_named(tmp_path):
    root = with_submodule(tmp_path)
    git(root, "update-index", "--cacheinfo", f"160000,{'1' * 40},workload")   # REV records a commit never fetched
    git(root, "commit", "-qm", "v1")
    git(root, "add", "workload")
    git(root, "commit", "-qm", "v2")
    with pytest.raises(RevisionError, match="records the submodule workload at 111111111111, a commit this clone"):
        LoadedRevision(root, "HEAD~1")


def test_untracked_data_is_shared_and_untracked_code_is_not(repo):
    """One policy for what git does not track: data and weights are visible to both sides; a Python file
    that REV never had is not (REV's side must not run the current tree's code)."""
    (repo / ".gitignore").write_text("data/\n")
    write(repo, {"data/train.bin": "bytes", "weights.pt": "w", "benchmarks/scratch.py": "X = 1\n"})
    loaded = LoadedRevision(repo, "HEAD~1")
    try:
        assert (loaded.root / "data" / "train.bin").read_text() == "bytes"
        assert (loaded.root / "weights.pt").read_text() == "w"
        assert not (loaded.root / "benchmarks" / "scratch.py").exists()
        assert (loaded.root / "mypkg" / "helpers.py").read_text().endswith("x * 1\n")   # tracked: REV's own
    finally:
        loaded.close()


def test_changed_operator_code_is_found_before_anything_is_loaded(repo):
    """torch 2.13 lets a custom_op be registered twice without a word, and both sides would then run the last
    kernel (#27): code that registers operators and differs between the trees is named before loading."""
    write(repo, {"ops.py": "import torch\n@torch.library.custom_op('t::f', mutates_args=())\n"
                           "def f(x: torch.Tensor) -> torch.Tensor:\n    return x * 1\n",
                 "same_ops.py": "# torch.library registrations that did not change\n"})
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "ops")
    write(repo, {"ops.py": "import torch\n@torch.library.custom_op('t::f', mutates_args=())\n"
                           "def f(x: torch.Tensor) -> torch.Tensor:\n    return x * 2\n"})
    loaded = LoadedRevision(repo, "HEAD")
    try:
        assert loaded.operator_code() == ["ops.py"]
    finally:
        loaded.close()
    loaded = LoadedRevision(repo, "HEAD~1")   # before either existed
    try:
        assert loaded.operator_code() == ["ops.py", "same_ops.py"]   # both added since
    finally:
        loaded.close()


def test_an_untracked_file_makes_the_tree_dirty_and_enters_its_hash(repo):
    """#28: an untracked new benchmark file was recorded as 'clean'."""
    clean = working_tree(repo)
    write(repo, {".bench/results/session-x.json": "{}"})          # bench_core's own output: not code
    assert not working_tree(repo).dirty and not clean.dirty
    write(repo, {"benchmarks/test_new.py": "X = 1\n"})
    one = working_tree(repo)
    write(repo, {"benchmarks/test_new.py": "X = 2\n"})
    two = working_tree(repo)
    assert one.dirty and two.dirty and one.diff_sha256 != two.diff_sha256


def test_a_name_that_is_both_a_branch_and_a_tag_is_refused(repo):
    git(repo, "branch", "x", "HEAD~1")
    git(repo, "tag", "x", "HEAD")
    with pytest.raises(RevisionError, match="'x' is ambiguous: a branch and a tag share the name"):
        resolve(repo, "x")
    assert resolve(repo, "refs/heads/x").commit != resolve(repo, "refs/tags/x").commit


def test_an_environment_kept_in_the_tree_is_installed_packages_not_the_revisions_code(repo, monkeypatch):
    """The README's own `.venv` inside the repository: its site-packages is on sys.path and inside the tree, and
    linked into REV's tree as data; its packages (torch among them) are neither REV's project modules nor files a
    side loaded from its tree."""
    from bench_core.workflows.side_by_side.importer import in_environment
    from bench_core.workflows.side_server import loaded_files

    site = repo / ".venv" / "lib" / "python3.11" / "site-packages"
    write(repo, {".venv/pyvenv.cfg": "home = /usr/bin\n", ".venv/lib/python3.11/site-packages/somelib/__init__.py":
                 "X = 1\n"})
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "somelib", raising=False)
    import somelib

    assert in_environment(Path(somelib.__file__).resolve(), repo.resolve())
    assert not in_environment((repo / "mypkg" / "core.py").resolve(), repo.resolve())
    loaded = LoadedRevision(repo, "HEAD~1")
    try:
        assert (loaded.root / ".venv" / "pyvenv.cfg").exists()      # shared as data, as before
        assert {"mypkg", "models"} <= loaded.importer.local and "somelib" not in loaded.importer.local
        assert not [r for r in loaded.importer.search_roots if "site-packages" in str(r)]
        files = loaded_files([str(repo), str(loaded.root)])
        assert not [f for f in files if "site-packages" in f]
    finally:
        loaded.close()
        del sys.modules["somelib"]
