"""Another git revision of the project, loaded into this process beside the current code.

`snapshot` extracts REV's tracked files (`git archive`) into a temporary folder: the user's working tree,
index and worktree list are never touched. `importer.RevisionImporter` then loads REV's project modules under an
alias package (`_bench_rev_<sha>.models`, ...), and gives each of them its own `__import__`, through
which an absolute import of a project module (`import models`, `from mypkg.sub import f`, also inside a
function body, run later) resolves to REV's copy, while everything else (torch, numpy, the measuring
engine `bench_core` itself) is shared. Relative imports resolve inside the alias by themselves.

What cannot share a process, and is refused with a message that says so: compiled extensions of the
project, and code that registers global names twice (a `torch.library` operator defined on both
sides fails when REV's module runs). `importlib.import_module("models")` called by REV's code is not
redirected (it bypasses `__import__`); such code sees the current tree's module.
"""
from __future__ import annotations

import ast
import hashlib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable

from bench_core.core.errors import RevisionError
from bench_core.files import git
from bench_core.workflows.side_by_side.importer import RevisionImporter, search_roots

def _git(root: Path, *args: str, binary: bool = False, env=None):
    try:
        return git.run(root, *args, binary=binary, env=env)
    except git.GitUnavailable as exc:
        raise RevisionError(str(exc)) from None


@dataclass(frozen=True)
class Revision:
    """Which code a side ran: the commit, and for the working tree whether (and how) it was dirty."""

    label: str                 # what the user asked for: "REV" or "working tree"
    commit: str | None
    dirty: bool = False
    diff_sha256: str | None = None   # hash of `git diff HEAD` when dirty: which uncommitted changes ran

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    def describe(self) -> str:
        """Which code ran, in words: the commit, and whether the tree was dirty (and with which diff)."""
        commit = self.commit[:12] if self.commit else "no commit"
        return f"working tree at {commit}" + (f", dirty (diff sha256 {self.diff_sha256[:12]})" if self.dirty
                                              else ", clean")


def working_tree(root: Path, data: Iterable[Path] = ()) -> Revision:
    """The current tree: its commit, and whether it differs from it (changed files, and new files git does not
    ignore: an untracked benchmark file is part of what runs), with a hash of those differences. bench_core's own
    results (`.bench`) and the folders of `data` (its stored baselines and references) are not code that runs."""
    head = _git(root, "rev-parse", "--verify", "HEAD")
    commit = head.stdout.strip() if head.returncode == 0 else None
    resolved = Path(root).resolve()
    ours = [":(exclude).bench"] + [f":(exclude){Path(d).resolve().relative_to(resolved)}" for d in data
                                   if Path(d).resolve().is_relative_to(resolved) and Path(d).resolve() != resolved]
    status = _git(root, "status", "--porcelain", "--", ".", *ours)
    dirty = status.returncode == 0 and bool(status.stdout.strip())
    digest = None
    if dirty:
        diff = _git(root, "diff", "HEAD", "--", ".", *ours, binary=True)
        new = _git(root, "ls-files", "-z", "--others", "--exclude-standard", "--", ".", *ours)
        h = hashlib.sha256(diff.stdout)
        for rel in sorted(p for p in new.stdout.split("\0") if p):
            try:
                content = (Path(root) / rel).read_bytes()
            except OSError:   # gone since it was listed, or not a file to read: its name is what is known
                content = b""
            h.update(rel.encode() + b"\0" + content)
        digest = h.hexdigest() if diff.returncode == 0 else None
    return Revision("working tree", commit, dirty, digest)


def resolve(root: Path, rev: str) -> Revision:
    """The commit REV names, or a RevisionError saying what to do (unknown name, shallow clone)."""
    if not rev or rev.startswith("-"):
        raise RevisionError(f"--bench-against needs a git revision (a branch, tag or SHA), got {rev!r}")
    inside = _git(root, "rev-parse", "--is-inside-work-tree")
    if inside.returncode != 0:
        raise RevisionError(f"{root} is not inside a git repository, so there is no revision {rev!r} to compare with")
    both = [ref for ref in (f"refs/heads/{rev}", f"refs/tags/{rev}")
            if _git(root, "rev-parse", "--verify", "--quiet", ref).returncode == 0]
    if len(both) == 2:   # git would take the tag without a word
        raise RevisionError(f"revision {rev!r} is ambiguous: a branch and a tag share the name; say which "
                            f"(--bench-against refs/heads/{rev} or refs/tags/{rev})")
    out = _git(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if out.returncode != 0:
        shallow = _git(root, "rev-parse", "--is-shallow-repository").stdout.strip() == "true"
        hint = ("this is a shallow clone, so older commits are missing: fetch them first "
                "(`git fetch --unshallow`, or `fetch-depth: 0` in actions/checkout)") if shallow else (
            "check the name; a remote branch needs `git fetch` first")
        raise RevisionError(f"revision {rev!r} is unknown here: {hint}")
    return Revision(rev, out.stdout.strip())


def snapshot(root: Path, rev: Revision, into: Path) -> Path:
    """REV's tree under `into` (a fresh folder) as it really is at REV, not as an archive of it: every tracked
    file (`export-ignore` is for archives, not for code that runs) and every submodule at the commit REV records
    for it; then the files git does not track here (data, weights, local settings), linked where REV has none
    (`link_untracked`). Returns the folder of the repository root."""
    _checkout(Path(root), rev.commit, Path(into), rev.label)
    link_untracked(Path(root), Path(into))
    return into


def working_copy(root: Path, into: Path) -> Path:
    """This tree as it is now, under `into`: every file git tracks (each submodule's too) as it is here, edits
    included, and the new files git does not ignore, copied; what git does not track is then linked as `snapshot`
    links it (data shared, code and builds each side's own). For a side that runs this tree's code in another
    interpreter, whose compiled modules are built in that copy."""
    tracked = _git(root, "ls-files", "-z", "--cached", "--recurse-submodules")
    new = _git(root, "ls-files", "-z", "--others", "--exclude-standard")
    for out in (tracked, new):
        if out.returncode != 0:
            raise RevisionError(f"copying this tree ({root}) failed at git ls-files: {out.stderr.strip()}")
    for rel in sorted({p for out in (tracked, new) for p in out.stdout.split("\0") if p}):
        source, target = Path(root) / rel, Path(into) / rel
        if source.is_symlink() or source.is_file():   # a file deleted here is not in the copy either
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    link_untracked(Path(root), Path(into))
    return into


def _checkout(repo: Path, commit: str, into: Path, label: str) -> None:
    with tempfile.TemporaryDirectory(prefix="bench_core-index-") as tmp:
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}   # a private index: the user's stays untouched
        for args in (("read-tree", commit), ("checkout-index", "--all", "--force", f"--prefix={into}/")):
            out = _git(repo, *args, env=index)
            if out.returncode != 0:
                raise RevisionError(f"extracting {label} ({commit[:12]}) failed at git {args[0]}: {out.stderr.strip()}")
    for path, at in submodules_at(repo, commit):
        _checkout_submodule(repo, path, at, into, label)


def submodules_at(repo: Path, commit: str) -> list[tuple[str, str]]:
    """(path, commit) of every submodule `commit` of `repo` records."""
    listing = _git(repo, "ls-tree", "-r", "-z", commit)
    return [(path, meta.split()[2]) for meta, _, path in (e.partition("\t") for e in listing.stdout.split("\0"))
            if meta.startswith("160000 commit ")]


def _checkout_submodule(repo: Path, path: str, commit: str, into: Path, label: str) -> None:
    sub = repo / path
    if not (sub / ".git").exists():
        raise RevisionError(f"{label} has the submodule {path}, which is not checked out here: run "
                            f"`git submodule update --init` first, so its code at {label}'s commit can be compared")
    if _git(sub, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        raise RevisionError(f"{label} records the submodule {path} at {commit[:12]}, a commit this clone of it does "
                            f"not have: fetch it (`git -C {path} fetch`, or `submodules: recursive` with full depth)")
    _checkout(sub, commit, into / path, f"{label}'s {path}")


LEFT_OUT = {".git", "__pycache__", ".bench", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


CODE = {".py", ".pyx", ".pxd", ".so", ".pyd", ".o", ".obj"}
BUILD_OUTPUT = {"build", "dist", ".eggs"}   # a build's own folders: a revision's build writes its own, never this tree's
OPERATOR_MARKERS = ("torch.library", "custom_op", "TORCH_LIBRARY", "cpp_extension")


def link_untracked(current_root: Path, tree: Path) -> list[str]:
    """The one policy for what git does not track: data is shared, code is each side's own. Every untracked
    or ignored file or folder of the current tree (data, weights, a virtual environment, local settings) is
    visible to REV's side too, linked at the same path wherever REV's tree has nothing there; code that git
    does not track (a Python file or extension, a folder with Python files in it) is not, since REV never had
    it, and caches and a build's own folders (`build/`, `dist/`) are left out. Returns the paths linked."""
    out = _git(current_root, "ls-files", "-z", "--others", "--directory", "--no-empty-directory")
    linked = []
    for rel in (p.rstrip("/") for p in out.stdout.split("\0") if p):
        parts, source = Path(rel).parts, current_root / rel
        if any(part in LEFT_OUT or part.endswith(".egg-info") for part in parts) or parts[0] in BUILD_OUTPUT or \
                source.suffix in CODE or (
                source.is_dir() and any(p.suffix in CODE for p in source.iterdir())):
            continue
        target = tree / rel
        if target.exists() or target.is_symlink() or any((tree / Path(*parts[:i])).is_symlink()
                                                         for i in range(1, len(parts))):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(current_root / rel, target_is_directory=(current_root / rel).is_dir())
        linked.append(rel)
    return linked


def repo_root(path: Path) -> Path:
    out = _git(path, "rev-parse", "--show-toplevel")
    if out.returncode != 0:
        raise RevisionError(f"{path} is not inside a git repository: --bench-against compares git revisions")
    return Path(out.stdout.strip()).resolve()


def scenario_index(tree: Path) -> dict[str, list[tuple[Path, str]]]:
    """Scenario name -> the (test file, test function) pairs of `tree` that declare it with a literal name."""
    found: dict[str, list[tuple[Path, str]]] = {}
    files = []
    for folder, dirs, names in os.walk(tree):   # links (shared data, a virtual environment) are not followed
        dirs[:] = sorted(d for d in dirs if d not in LEFT_OUT and not d.startswith("."))
        files += [Path(folder) / n for n in sorted(names) if n.endswith(".py") and (
            n.startswith("test_") or n.endswith("_test.py")) and not (Path(folder) / n).is_symlink()]
    for path in files:
        module = _parsed(path)
        if module is None:
            continue
        for fn in (n for n in module.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")):
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
                callee = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
                first = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "name"), None)
                if callee == "Scenario" and isinstance(first, ast.Constant) and isinstance(first.value, str):
                    found.setdefault(first.value, []).append((path, fn.name))
    return found


def test_functions(path: Path, measuring_only: bool = False) -> list[str]:
    """The test functions a test file defines, module-level and in its test classes, named as pytest shows them
    (`Class::method` in a class). `measuring_only`: those that take the `bench` or `benchmark` fixture. A file that
    does not parse defines none."""
    module = _parsed(path)
    if module is None:
        return []
    found = [(prefix + fn.name, fn) for prefix, body in [("", module.body)] + [
        (f"{c.name}::", c.body) for c in module.body if isinstance(c, ast.ClassDef) and c.name.startswith("Test")]
        for fn in body if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name.startswith("test")]
    return [name for name, fn in found if not measuring_only or {"bench", "benchmark"} & {a.arg for a in fn.args.args}]


def defines(path: Path, function: str, cls: str | None = None) -> bool:
    """Whether the file at `path` defines `function` at module level (or, with `cls`, in that class), whatever
    pytest's naming rules; a file that does not parse is given the benefit of the doubt (loading it will tell)."""
    module = _parsed(path)
    if module is None:
        return True
    body = module.body if cls is None else next(
        (c.body for c in module.body if isinstance(c, ast.ClassDef) and c.name == cls), [])
    return any(isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == function for f in body)


def _parsed(path: Path) -> ast.Module | None:
    """A test file's syntax tree; None where it cannot be read or does not parse (it declares nothing then)."""
    try:
        return ast.parse(Path(path).read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None


_RESOLVED: dict[str, Path] = {}


def resolved(file: str) -> Path:
    """`Path(file).resolve()`, remembered for an absolute name: a loaded module's file stays where it is, and the
    fidelity checks and each side's server ask about every module torch loaded, scenario after scenario (resolving
    them all at every item weighs on a server's first run of a small step: docs/side-by-side.md). A relative name
    is resolved each time, from the working directory of the moment."""
    if file in _RESOLVED:
        return _RESOLVED[file]
    path = Path(file).resolve()
    if os.path.isabs(file):
        _RESOLVED[file] = path
    return path


def file_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


class LoadedRevision:
    """A revision extracted into a temporary folder and importable beside the current code."""

    def __init__(self, current_root: Path, rev: str | None, sys_path: Iterable[str] | None = None,
                 data: Iterable[Path] = ()):
        self.current_root = repo_root(Path(current_root))
        self.current = working_tree(self.current_root, data)
        self._declared: dict[str, list[tuple[Path, str]]] | None = None
        self._operator_code: list[str] | None = None
        self._sys_path = sys_path
        self.compiled = None   # compiled.Prepared: how REV's side got its compiled code, where the project has any
        self.borrowed: set[Path] = set()   # test files git does not track here, copied into REV's tree to measure it
        if rev is None:   # this tree itself, to be run in another interpreter: nothing to extract or load here
            self.revision, self.root, self._tmp, self.importer = self.current, self.current_root, None, None
            self._operator_code = []
            return
        self.revision = resolve(self.current_root, rev)
        self._tmp = tempfile.TemporaryDirectory(prefix="bench_core-rev-")
        self.root = snapshot(self.current_root, self.revision, Path(self._tmp.name))
        self.importer = RevisionImporter(self.root, search_roots(self.current_root, self.root, sys_path),
                                         self.revision.commit[:12]).install()

    def use_copy(self) -> None:
        """This tree compared with itself in another interpreter gets a copy of its own for that side (its
        compiled modules built there); `self.revision` stays this tree."""
        self._tmp = tempfile.TemporaryDirectory(prefix="bench_core-copy-")
        self.root = working_copy(self.current_root, Path(self._tmp.name))

    def counterpart(self, current_file: Path) -> Path:
        """The file of REV at the place `current_file` has in the current tree."""
        rel = Path(current_file).resolve().relative_to(self.current_root)
        return self.root / rel

    def borrow_test(self, current_file: Path) -> Path | None:
        """A test file git does not track here (a benchmark written since, never committed), copied into REV's
        tree with an untracked conftest.py beside it, so that it measures REV's code as well; None where the file
        is tracked, or REV has a file there."""
        current_file = Path(current_file).resolve()
        target = self.counterpart(current_file)
        rel = str(current_file.relative_to(self.current_root))
        if target.exists() or _git(self.current_root, "ls-files", "--error-unmatch", rel).returncode == 0:
            return None
        for source in (current_file, current_file.parent / "conftest.py"):
            there = self.counterpart(source)
            if source.is_file() and not there.exists():
                there.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, there)
        self.borrowed.add(target)
        return target

    def module_for(self, current_file: Path) -> ModuleType:
        """REV's version of a current module file (a test file); RevisionError when REV lacks it."""
        path = self.counterpart(current_file)
        if not path.exists():
            raise RevisionError(f"{path.relative_to(self.root)} does not exist in {self.revision.label} "
                                f"({self.revision.commit[:12]})")
        return self.module_at(path)

    def module_at(self, path: Path) -> ModuleType:
        """The revision's module at `path`, a file of its tree."""
        self.importer.refresh(search_roots(self.current_root, self.root, self._sys_path))
        return self.importer.load(path)

    def ran_from_revision(self, fn: Any) -> bool:
        """True when `fn`'s code is REV's: its file lies inside the extracted revision."""
        code = getattr(getattr(fn, "__func__", fn), "__code__", None)
        if code is None and callable(fn):
            code = getattr(getattr(type(fn), "__call__", None), "__code__", None)
        return code is not None and Path(code.co_filename).resolve().is_relative_to(self.root.resolve())

    def operator_code(self) -> list[str]:
        """Python files that differ between the revision and the current tree and register torch operators
        (`torch.library`, `custom_op`, a C++ extension) in either version. Such code cannot be loaded twice into
        one process faithfully: a second registration of an operator name may silently replace the first, and
        both sides would run one kernel."""
        if self._operator_code is None:
            out = _git(self.current_root, "diff", "--name-only", "-z", self.revision.commit, "--", "*.py")
            self._operator_code = [rel for rel in out.stdout.split("\0") if rel and any(
                marker in text for path in (self.root / rel, self.current_root / rel) if path.is_file()
                for text in [path.read_text(errors="replace")] for marker in OPERATOR_MARKERS)]
        return self._operator_code

    def not_here(self, current_files: Iterable[Path], ran: set[str]) -> list[str]:
        """REV's benchmark tests (tests that take `bench` or `benchmark`) in the counterparts of `current_files`
        that this tree's files no longer define (renamed or removed since), less those found again by a scenario
        name they declare that ran now: each as `file::test`."""
        declared = {(path, fn): name for name, places in self._index().items() for path, fn in places}
        out = []
        for mine in sorted({Path(f).resolve() for f in current_files}):
            theirs = self.counterpart(mine) if mine.is_relative_to(self.current_root) else None
            if theirs is None or not theirs.exists() or theirs in self.borrowed:
                continue
            here = set(test_functions(mine))
            # (a scenario name is declared by a module-level function: a method's `Class::name` is never one)
            out += [f"{mine.relative_to(self.current_root)}::{name}" for name in test_functions(theirs, True)
                    if name not in here and declared.get((theirs, name)) not in ran]
        return out

    def _index(self) -> dict[str, list[tuple[Path, str]]]:
        if self._declared is None:
            self._declared = scenario_index(self.root)
        return self._declared

    def declaring(self, scenario: str) -> list[tuple[Path, str]]:
        """The revision's test functions that declare scenario `scenario` by name (`Scenario("NAME", ...)`, a
        literal name): how a test that was renamed or moved is found again. (file, function) pairs."""
        return self._index().get(scenario, [])

    def proof(self, current_file: Path, current_fn: Any, their_fn: Any) -> dict:
        """Which code each side ran: the test files with their sha256, the functions, and for the revision
        every project module it loaded and whether its function's code lies inside the extracted revision."""
        code = getattr(their_fn, "__code__", None)
        theirs = Path(code.co_filename) if code is not None else self.counterpart(current_file)
        return {"current": {"test_file": str(current_file), "test_file_sha256": file_sha256(current_file),
                            "function": current_fn.__qualname__},
                "baseline": {"test_file": str(theirs), "test_file_sha256": file_sha256(theirs),
                             "function": their_fn.__qualname__, "module": their_fn.__module__,
                             "code_from_revision": self.ran_from_revision(their_fn),
                             "project_modules": self.loaded_modules()}}

    def loaded_modules(self) -> dict[str, str | None]:
        """REV's project modules loaded so far: name -> sha256 of the file they ran from."""
        prefix = self.importer.alias + "."
        return {n[len(prefix):]: file_sha256(m.__file__) for n, m in sorted(sys.modules.items())
                if n.startswith(prefix) and getattr(m, "__file__", None)}

    def close(self) -> None:
        if self.importer is not None:
            self.importer.uninstall()
        if self._tmp is not None:
            self._tmp.cleanup()
