"""Packages with compiled code, side by side: what the two trees hold (extension modules built in the work tree,
the C/C++/CUDA/Cython sources and the build inputs they come from), and how the revision's side gets binaries of
its own: the work tree's reused where every compiled input is identical, built by the project's declared command
where they differ (once per revision tree, interpreter, torch and compiler: cached), and refused where they differ
and nothing declares how to build them. Just-in-time extensions (`torch.utils.cpp_extension.load`) are compiled
by each side's own process, each in a build folder of its own.

One process cannot hold two builds of one extension module (the second import returns the first), so a project
with compiled code is compared with each side in a process of its own, always.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

from bench_core.core.errors import BenchError
from bench_core.files import children, git
from bench_core.files.atomic import atomic_write, dump_json
from bench_core.files.storage import read_json
from bench_core.workflows.side_by_side.importer import in_environment

EXTENSION_SUFFIXES = tuple(sorted(set(importlib.machinery.EXTENSION_SUFFIXES) | {".so", ".pyd"}, key=len,
                                  reverse=True))
SOURCE_SUFFIXES = frozenset({".c", ".cc", ".cpp", ".cxx", ".c++", ".cu", ".cuh", ".h", ".hh", ".hpp", ".hxx",
                             ".inl", ".pyx", ".pxd", ".pxi"})
BUILD_FILES = frozenset({"setup.py", "setup.cfg", "CMakeLists.txt", "meson.build"})
# the tables of pyproject.toml that say how to build (the rest, [tool.pytest] or [tool.bench_core], do not)
PYPROJECT_BUILD = (("build-system",), ("tool", "setuptools"), ("tool", "scikit-build"), ("tool", "meson-python"),
                   ("tool", "cython"))
# folders that are not the project's own importable code: build trees, environments, caches
NOT_THE_PROJECT = frozenset({".git", "__pycache__", ".bench", ".pytest_cache", "build", "dist", ".venv", "venv",
                             ".tox", ".nox", "site-packages", "node_modules", ".eggs", ".pixi", ".conda",
                             "conda-meta", "lib-dynload"})
BUILD_LIMIT_S = 3600.0
CACHE_ENV = "BENCH_CORE_BUILD_CACHE"   # where builds are cached, for the processes bisect starts in its worktrees


class CompiledError(BenchError):
    """The revision's side cannot get binaries of its own: the message says which files and what to do."""


# what an interpreter says of itself, for a build: an extension module is built against one Python and one torch
_FACTS = """import importlib.metadata, importlib.util, os, sys
try:
    torch = importlib.metadata.version("torch")
except importlib.metadata.PackageNotFoundError:
    torch = None
spec = importlib.util.find_spec("torch")
at = os.path.realpath(spec.origin) if spec is not None and spec.origin else None
facts = [sys.executable, os.path.realpath(sys.prefix), sys.version, torch, at]
"""


@dataclass(frozen=True)
class Interpreter:
    """The interpreter a side imports its extension modules in, as far as a build depends on it: its environment
    (prefix), Python's version and build, and the torch it imports (version and files: an extension compiled
    against one torch's headers and libraries may fail to load, or misbehave, in another)."""

    executable: str
    prefix: str
    python: str
    torch: str | None
    torch_at: str | None

    @classmethod
    def this(cls) -> "Interpreter":
        found: dict = {}
        exec(_FACTS, found)   # noqa: S102 - our own constant, the same text another interpreter runs
        return cls(*found["facts"])

    @classmethod
    def of(cls, python: str) -> "Interpreter":
        """What `python` says of itself; CompiledError where it does not run."""
        try:
            out = subprocess.run([python, "-c", _FACTS + "print(__import__('json').dumps(facts))"],
                                 capture_output=True, text=True, timeout=120)
            return cls(*json.loads(out.stdout.strip().splitlines()[-1]))
        except (OSError, subprocess.SubprocessError, ValueError, IndexError, TypeError):
            raise CompiledError(f"the interpreter {python} could not say which Python and torch it runs (is it a "
                                f"Python executable?), so no build can be made for it") from None

    def runs_builds_of(self, other: "Interpreter") -> bool:
        """Whether a module built for `other` is one built for this interpreter too: the same environment, Python
        and torch."""
        return (self.prefix, self.python, self.torch, self.torch_at) == (other.prefix, other.python, other.torch,
                                                                          other.torch_at)

    def said(self) -> str:
        return f"{self.executable} (Python {self.python.split()[0]}, torch {self.torch or 'not installed'})"


def is_extension(rel: str) -> bool:
    return Path(rel).name.endswith(EXTENSION_SUFFIXES)


def _project_file(rel: str) -> bool:
    parts = Path(rel).parts
    return not any(p in NOT_THE_PROJECT or p.endswith(".egg-info") for p in parts[:-1])


def _source(rel: str) -> bool:
    return Path(rel).suffix in SOURCE_SUFFIXES and _project_file(rel)


def _build_input(rel: str) -> bool:
    return Path(rel).name in BUILD_FILES | {"pyproject.toml"} and _project_file(rel)


def _digest(path: Path) -> str | None:
    """A compiled input's content, hashed; pyproject.toml by its build tables only. None: the tree lacks it."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if path.name == "pyproject.toml":
        try:
            doc = tomllib.loads(data.decode("utf-8", errors="replace"))
        except tomllib.TOMLDecodeError:
            return hashlib.sha256(data).hexdigest()
        tables = {}
        for keys in PYPROJECT_BUILD:
            node = doc
            for k in keys:
                node = node.get(k) if isinstance(node, dict) else None
            tables[".".join(keys)] = node
        if not any(tables.values()):   # no build tables: as good as no pyproject.toml, for a build
            return None
        data = json.dumps(tables, sort_keys=True, default=str).encode()
    return hashlib.sha256(data).hexdigest()


def _listing(root: Path, *args: str) -> list[str]:
    out = git.run(root, *args)
    return [p for p in out.stdout.split("\0") if p] if out.returncode == 0 else []


def built_in(root: Path) -> list[str]:
    """Extension modules in the work tree that git does not track (built there: `pip install -e .`,
    `setup.py build_ext --inplace`), outside build folders and environments."""
    return sorted(rel for rel in _listing(root, "ls-files", "-z", "--others")
                  if is_extension(rel) and _project_file(rel) and (root / rel).is_file()
                  and not in_environment(root / rel, root))


@dataclass(frozen=True)
class CompiledCode:
    """What the two trees hold of compiled code: the work tree's built extension modules, the compiled sources
    and build inputs of either tree, and which of those differ between the trees."""

    built: tuple[str, ...]
    sources: tuple[str, ...]
    differ: tuple[str, ...]
    digests: tuple[str, str] = ("", "")   # of each tree's compiled sources (current, revision), as listed
    here: tuple[tuple[str, str | None], ...] = ()   # each compiled source of the work tree and its digest, as read

    @property
    def present(self) -> bool:
        return bool(self.built or self.sources)


def survey(current_root: Path, rev_root: Path, commit: str) -> CompiledCode:
    """The compiled code of the work tree at `current_root` and of the revision `commit` extracted at `rev_root`.
    Build inputs (setup.py, pyproject.toml's build tables) count only where there is compiled code at all."""
    here = set(_listing(current_root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"))
    there = set(_listing(current_root, "ls-tree", "-r", "-z", "--name-only", commit))
    built = built_in(current_root)
    sources = sorted(rel for rel in here | there if _source(rel))
    if not built and not sources:
        return CompiledCode((), (), ())
    inputs = sources + sorted(rel for rel in here | there if _build_input(rel))
    digests = {rel: (_digest(current_root / rel), _digest(rev_root / rel)) for rel in inputs}   # each file read once
    differ = [rel for rel in inputs if digests[rel][0] != digests[rel][1]]
    of_sources = tuple(hashlib.sha256(json.dumps([(rel, digests[rel][side]) for rel in sources]).encode())
                       .hexdigest()[:16] for side in (0, 1))
    return CompiledCode(tuple(built), tuple(sources), tuple(differ + _submodules_moved(current_root, commit)),
                        of_sources, tuple((rel, digests[rel][0]) for rel in sources))


def survey_tree(root: Path) -> CompiledCode:
    """The compiled code of the work tree at `root` alone: its side in another interpreter runs the same sources."""
    here = _listing(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    sources = sorted(rel for rel in here if _source(rel))
    each = [(rel, _digest(root / rel)) for rel in sources]
    digest = hashlib.sha256(json.dumps(each).encode()).hexdigest()[:16]
    return CompiledCode(tuple(built_in(root)), tuple(sources), (), (digest, digest), tuple(each))


def _submodules_moved(root: Path, commit: str) -> list[str]:
    """Submodules whose checkout here is not the commit the revision records (or has changes of its own): their
    compiled sources are not listed above, and may be what a build is made of."""
    from bench_core.workflows.side_by_side.revisions import submodules_at

    moved = []
    for path, at in submodules_at(root, commit):
        here = git.output(root / path, "rev-parse", "HEAD")
        if here != at or git.output(root / path, "status", "--porcelain"):
            moved.append(f"{path} (submodule)")
    return moved


@dataclass(frozen=True)
class Prepared:
    """How the revision's side got its compiled code: `how` is "reused" (the work tree's binaries, copied: every
    compiled input identical), "built" (by the declared command, `build_s` seconds, outside every timed window),
    "cached" (built by an earlier run), or "own" (nothing built ahead of time: each side compiles its own)."""

    how: str
    files: tuple[str, ...]
    said: str
    build_s: float | None = None
    log: str | None = None
    why: str = ""                       # why each side runs in a process of its own
    sources: tuple[str, str] = ("", "")   # a digest of each side's compiled sources (current, revision)
    cache: str = ""

    def to_dict(self) -> dict:
        return {"how": self.how, "files": list(self.files), "said": self.said, "build_s": self.build_s,
                "log": self.log}

    def extensions_folder(self, side: str) -> Path:
        """The build folder of one side's just-in-time extensions (TORCH_EXTENSIONS_DIR): one per side and content
        of its compiled sources, so two sides never share or overwrite a build, and a second run finds its own."""
        digest = self.sources[0 if side == "candidate" else 1]
        return Path(self.cache) / "torch_extensions" / f"{side}-{digest}"


def _shown(files: Iterable[str], n: int = 4) -> str:
    files = list(files)
    return ", ".join(files[:n]) + (f" and {len(files) - n} more" if len(files) > n else "")


def prepare(code: CompiledCode, current_root: Path, rev_root: Path, label: str, commit: str, build: str | None,
            cache: Path, where: str = ".", python: Interpreter | None = None, tree: str | None = None) -> Prepared:
    """Give the revision's tree at `rev_root` the compiled code its side runs, or raise CompiledError. `where`: the
    project's folder inside the repository (pytest's rootdir, whose pyproject.toml declares the build), where the
    revision's build runs. `python`: the interpreter the revision's side runs in, where it is not this one (its
    build made by it); `tree`: what the revision's tree is, for the cache (default: `commit`'s git tree)."""
    other = python is not None and not python.runs_builds_of(Interpreter.this())
    digests = code.digests
    if other:   # its just-in-time builds in a folder of that interpreter's own
        digests = (digests[0], hashlib.sha256(json.dumps([digests[1], python.prefix, python.python, python.torch,
                                                          python.torch_at]).encode()).hexdigest()[:16])
    return replace(_prepared(code, current_root, rev_root, label, commit, build, cache, where,
                             python if other else None, tree),
                   why=f"the project has compiled code ({_shown(code.built or code.sources, 2)}), and one process "
                       f"cannot hold two builds of one extension module",
                   sources=digests,
                   cache=str(cache))


FRESH = "fresh-sources.json"   # in the build cache: the work tree's built modules and its sources' contents as last
                               # seen with every source older than the newest module


def _stale(code: CompiledCode, root: Path, cache: Path | None = None) -> list[str]:
    """This tree's compiled sources changed after its newest built module: the current side would run a build of
    other sources than its own. A source dated after the build but holding what it held when this run's modules
    were last seen fresh (a `git checkout` of another branch and back rewrites a file with its old content) is not
    stale: `cache` keeps that record (the survey's digests, `code.here`), written whenever every source is older
    than the modules."""
    try:   # the newest: a build skips extensions whose sources did not change, keeping their older files
        stamps = [(rel, (root / rel).stat()) for rel in code.built]
    except OSError:
        return []
    if not stamps:
        return []
    built = max(st.st_mtime for _, st in stamps)
    newer = [rel for rel in code.sources if (root / rel).is_file() and (root / rel).stat().st_mtime > built]
    if cache is None:
        return newer
    record = cache / FRESH
    modules = [[rel, st.st_size, st.st_mtime_ns] for rel, st in stamps]   # a rebuild changes these: a new record
    if not newer:
        cache.mkdir(parents=True, exist_ok=True)
        atomic_write(record, dump_json({"tree": str(root.resolve()), "modules": modules, "sources": dict(code.here)}),
                     overwrite=True)
        return []
    try:
        doc = read_json(record)
    except (OSError, ValueError, BenchError):   # none yet, or unreadable: the dates decide
        return newer
    if doc.get("tree") != str(root.resolve()) or doc.get("modules") != modules:
        return newer
    seen, now = doc.get("sources") or {}, dict(code.here)
    return [rel for rel in newer if rel not in seen or now.get(rel) != seen[rel]]


def _prepared(code: CompiledCode, current_root: Path, rev_root: Path, label: str, commit: str, build: str | None,
              cache: Path, where: str = ".", python: Interpreter | None = None, tree: str | None = None) -> Prepared:
    stale = _stale(code, current_root, cache)
    if stale:
        raise CompiledError(f"this tree's built {_shown(code.built)} is older than its source {_shown(stale)}, "
                            f"changed since the last build (edited, or checked out by git): the current side would run "
                            f"a build of other sources than its own. Build this tree first "
                            f"({build or 'python setup.py build_ext --inplace'})")
    if not code.built and build:
        raise CompiledError(f"this tree has compiled sources ({_shown(code.sources)}) but no extension module built "
                            f"from them, and the project declares an ahead-of-time build: build this tree first "
                            f"({build}); a project whose extensions are compiled just in time declares no build")
    if not code.built:
        why = ("compiled sources differ" if code.differ else "compiled sources identical") + \
              ", nothing built ahead of time in this tree"
        return Prepared("own", (), f"compiled code: {why}: each side's process compiles its own (just-in-time "
                                   f"extensions in a build folder of each side's own)")
    if python is not None:   # built here for this interpreter: the other needs a build of its own, sources alike
        if not build:
            raise CompiledError(
                f"{label}'s side runs in {python.said()}, and this tree runs extension modules built for this "
                f"interpreter ({_shown(code.built)}): that side needs a build of its own, made by its interpreter, "
                f"and a binary built against another Python or torch may fail to load or misbehave. Declare how the "
                f"project builds in place, in pyproject.toml: [tool.bench_core] build = \"python setup.py build_ext "
                f"--inplace\" (or --bench-build CMD); docs/compiled.md")
        why = (f"compiled code differs in {label} ({_shown(code.differ)}) and it runs in another interpreter"
               if code.differ else f"compiled code is built per interpreter, and {label}'s side runs in "
                                   f"{python.said()}")
        return _built(rev_root, label, commit, build, cache, current_root, why, where, python, tree)
    if not code.differ:
        for rel in code.built:
            _copy(current_root / rel, rev_root / rel)
        return Prepared("reused", code.built, f"compiled code: every compiled source and build input is identical in "
                                              f"{label}: its side runs copies of this tree's built "
                                              f"{_shown(code.built)}")
    if not build:
        raise CompiledError(
            f"compiled code differs between {label} and this tree ({_shown(code.differ)}), and this tree runs "
            f"extension modules built from it ({_shown(code.built)}): {label}'s side needs a build of its own, and "
            f"measuring it with this tree's binary would compare one build with itself. Declare how the project "
            f"builds in place, in pyproject.toml: [tool.bench_core] build = \"python setup.py build_ext --inplace\" "
            f"(or --bench-build CMD); docs/compiled.md")
    return _built(rev_root, label, commit, build, cache, current_root,
                  f"compiled code differs in {label} ({_shown(code.differ)})", where)


# what else a build's output depends on, as the build tools read it from the environment (setuptools and
# torch.utils.cpp_extension): the compilers, their flags, the CUDA toolkit and the GPU architectures built for
BUILD_ENV = ("CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "LDSHARED", "ARCHFLAGS", "CUDA_HOME",
             "CUDA_PATH", "NVCC_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", "TORCH_CUDA_ARCH_LIST",
             "TORCH_EXTENSIONS_DIR")


def build_key(root: Path, commit: str, build: str, python: Interpreter | None = None, tree: str | None = None) -> str:
    """A build's cache key: the revision's tree (`tree`, else `commit`'s git tree), the interpreter that builds it
    (`python`, else this one: its environment, Python and torch), the compiler, the command, and the build
    environment (`BUILD_ENV`) as set: a cached binary is never one built with other flags or for another torch."""
    tree = tree or git.output(root, "rev-parse", f"{commit}^{{tree}}") or commit
    py = python or Interpreter.this()
    env = {name: os.environ[name] for name in BUILD_ENV if name in os.environ}
    parts = [tree, py.executable, py.prefix, py.python, py.torch, py.torch_at, compiler(), build, env]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]


def compiler() -> str | None:
    """The C++ compiler a build would use ($CXX, else c++), by its own first line of --version; None: not found."""
    cxx = os.environ.get("CXX") or "c++"
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{cxx}: {(out.stdout.strip().splitlines() or [''])[0]}"


def cache_folder(project_cache: Path) -> Path:
    """Where builds are cached: the project's (`.bench/builds`), or the one a parent process named."""
    return Path(os.environ.get(CACHE_ENV) or project_cache)


@dataclass(frozen=True)
class Built:
    """A tree given its build: the extension modules the build made in it, whether they came from the cache,
    how long the build took (None: cached), its log, and its cache entry."""

    files: tuple[str, ...]
    cached: bool
    seconds: float | None
    log: str
    entry: Path


def ensure_built(git_root: Path, tree: Path, commit: str, label: str, build: str, cache: Path,
                 where: str = ".", python: Interpreter | None = None, tree_id: str | None = None) -> Built:
    """`tree` (commit `commit` of the repository at `git_root`, extracted; or a copy of the work tree, `tree_id`
    saying what it holds) given the extension modules `build` makes in place: copied from the cache where this
    tree, interpreter, torch and compiler built them before, else built now (in `tree`'s folder `where`, the
    project's, by `python` or this interpreter: first on PATH, and $PYTHON) and cached. CompiledError on failure."""
    key = build_key(git_root, commit, build if where in ("", ".") else f"cd {where} && {build}", python, tree_id)
    entry, log = cache / key, cache / "logs" / f"{key}.log"
    manifest = entry / "manifest.json"
    if manifest.is_file():
        doc = read_json(manifest)
        for rel in doc["files"]:
            _copy(entry / "files" / rel, tree / rel)
        return Built(tuple(doc["files"]), True, None, doc.get("log", str(log)), entry)
    before = _extensions(tree)   # what the tree held before its build (tracked binaries): not what it built
    log.parent.mkdir(parents=True, exist_ok=True)
    executable = python.executable if python is not None else sys.executable
    env = {**os.environ, "PYTHON": executable,
           "PATH": os.pathsep.join([str(Path(executable).parent), os.environ.get("PATH", "")])}
    env.pop(CACHE_ENV, None)
    started = time.monotonic()
    cwd = tree / where
    if not cwd.is_dir():
        raise CompiledError(f"building {label} ({commit[:12]}): the project's folder {where} is not in its tree, so "
                            f"its build ({build!r}) has nowhere to run")
    ran = children.run_logged(["/bin/sh", "-c", build], log, BUILD_LIMIT_S, tail_lines=3, cwd=str(cwd), env=env,
                              start_new_session=True, ending=children.end_group)   # its compilers end with it
    seconds = time.monotonic() - started
    if ran.code != 0:
        what = f"ran past {BUILD_LIMIT_S:g} s and was ended" if ran.code is None else f"failed (exit {ran.code})"
        raise CompiledError(f"building {label} ({commit[:12]}) with {build!r} {what}; its log is {log}: {ran.tail}")
    files = sorted(rel for rel, stamp in _extensions(tree).items() if before.get(rel) != stamp)
    if not files:
        raise CompiledError(f"building {label} ({commit[:12]}) with {build!r} built no extension module inside its "
                            f"tree (log: {log}): the build command must build in place (python setup.py build_ext "
                            f"--inplace), never install into the environment")
    for rel in files:
        _copy(tree / rel, entry / "files" / rel)
    atomic_write(manifest, dump_json({"files": files, "commit": commit, "command": build,
                                      "build_s": round(seconds, 3), "log": str(log)}), overwrite=True)
    return Built(tuple(files), False, seconds, str(log), entry)


def _built(rev_root: Path, label: str, commit: str, build: str, cache: Path, current_root: Path, why: str,
           where: str = ".", python: Interpreter | None = None, tree: str | None = None) -> Prepared:
    b = ensure_built(current_root, rev_root, commit, label, build, cache, where, python, tree)
    if b.cached:
        return Prepared("cached", b.files, f"{why}: its side runs its own build, made by an earlier run ({build!r}, "
                                           f"cached in {b.entry}); nothing built", log=b.log)
    return Prepared("built", b.files, f"{why}: its side runs its own build ({build!r}: {_shown(b.files)}), built in "
                                      f"{b.seconds:.1f} s outside every timed window; cached for the next run in "
                                      f"{b.entry}", build_s=b.seconds, log=b.log)


def _extensions(tree: Path) -> dict[str, tuple[int, int]]:
    """The extension modules in `tree`, each with its size and modification time."""
    out = {}
    for rel in _walk(tree):
        if is_extension(rel):
            st = (tree / rel).stat()
            out[rel] = (st.st_size, st.st_mtime_ns)
    return out


def _walk(root: Path) -> Iterable[str]:
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in NOT_THE_PROJECT and not d.endswith(".egg-info")
                   and not os.path.islink(os.path.join(folder, d))]
        for f in files:
            yield os.path.relpath(os.path.join(folder, f), root)


def _copy(source: Path, target: Path) -> None:
    """A built file copied (never linked: each side's tree holds its own bytes), over a link a tree may hold; dated
    now, as a build would leave it (a copy dated as its source would read as older than the tree's sources)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink():
        target.unlink()
    shutil.copyfile(source, target)
    shutil.copymode(source, target)

