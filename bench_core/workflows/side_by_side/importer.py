"""REV's project modules loaded into this process under an alias package, beside the current code
(`_bench_rev_<sha>.models`, ...): each gets an `__import__` of its own, through which an absolute import of a
project module resolves to REV's copy, while everything else (torch, numpy, the measuring engine) is shared."""
from __future__ import annotations

import builtins
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterable

from bench_core.core.errors import RevisionError

ENGINE = __name__.split(".")[0]   # the measuring engine is shared by both sides, never aliased


class RevisionImporter(importlib.abc.MetaPathFinder):
    """Loads REV's project modules under `alias`, each with an `__import__` that keeps REV's imports in REV.

    `search_roots`: folders of the snapshot that play the part of the current process's sys.path
    entries inside the repository (its root, `src/`, a `benchmarks/` that a conftest put on sys.path).
    A top-level name found in one of them is a project module; everything else is shared.
    """

    def __init__(self, snapshot_root: Path, search_roots: Iterable[Path], tag: str):
        self.root = Path(snapshot_root)
        self.search_roots = [Path(p) for p in dict.fromkeys(search_roots) if Path(p).is_dir()]
        self.alias = f"_bench_rev_{tag}"
        self.local = self._project_names()
        self._builtins = dict(vars(builtins))
        self._builtins["__import__"] = self._import
        self._installed = False

    def refresh(self, search_roots: Iterable[Path]) -> None:
        """More import roots, known later (pytest puts a test's folder on sys.path when it collects the test,
        after the revision was loaded): the revision's modules found there are its own too."""
        self.search_roots = [Path(p) for p in dict.fromkeys([*self.search_roots, *search_roots]) if Path(p).is_dir()]
        self.local |= self._project_names()

    def _project_names(self) -> set[str]:
        names = set()
        for root in self.search_roots:
            for p in root.iterdir():
                if p.suffix == ".py" and p.stem.isidentifier():
                    names.add(p.stem)
                elif p.is_dir() and p.name.isidentifier() and any(p.glob("*.py")):
                    names.add(p.name)
        names.discard(ENGINE)
        return names

    # -- the import hook -------------------------------------------------------------------------
    def install(self) -> "RevisionImporter":
        if not self._installed:
            pkg = ModuleType(self.alias)
            pkg.__path__ = []  # a package that holds only what this importer puts in it
            sys.modules[self.alias] = pkg
            sys.meta_path.insert(0, self)
            self._installed = True
        return self

    def uninstall(self) -> None:
        if self._installed:
            sys.meta_path.remove(self)
            for name in [n for n in sys.modules if n == self.alias or n.startswith(self.alias + ".")]:
                del sys.modules[name]
            self._installed = False

    def _import(self, name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name.partition(".")[0] in self.local:
            module = builtins.__import__(f"{self.alias}.{name}", globals, locals, fromlist, 0)
            if fromlist:
                return module
            return sys.modules[f"{self.alias}.{name.partition('.')[0]}"]  # `import a.b` binds `a`
        return builtins.__import__(name, globals, locals, fromlist, level)

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(self.alias + "."):
            return None
        parts = fullname[len(self.alias) + 1:].split(".")
        if parts[0] not in self.local:
            return None
        for root in self.search_roots:
            spec = self._spec_under(root, parts, fullname)
            if spec is not None:
                return spec
        return None

    def _spec_under(self, root: Path, parts: list[str], fullname: str):
        base = root.joinpath(*parts)
        if base.is_dir():
            init = base / "__init__.py"
            loader = _RevisionLoader(fullname, str(init), self._builtins) if init.exists() else _NamespaceLoader()
            spec = importlib.util.spec_from_file_location(fullname, str(init) if init.exists() else None,
                                                          loader=loader, submodule_search_locations=[str(base)])
            if not init.exists():
                spec = importlib.machinery.ModuleSpec(fullname, loader, is_package=True)
                spec.submodule_search_locations = [str(base)]
            return spec
        source = base.with_suffix(".py")
        if source.exists():
            return importlib.util.spec_from_file_location(
                fullname, str(source), loader=_RevisionLoader(fullname, str(source), self._builtins))
        compiled = [p for p in base.parent.glob(f"{base.name}.*") if p.suffix in (".so", ".pyd")]
        if compiled:
            raise RevisionError(f"{fullname.split('.', 1)[1]} is a compiled extension ({compiled[0].name}) in the "
                                f"revision: it cannot be loaded twice into one process")
        return None

    def load(self, path: Path) -> ModuleType:
        """REV's module at `path` (a file of the snapshot, e.g. a test file), loaded under the alias."""
        rel = Path(path).resolve().relative_to(self.root.resolve())
        name = f"{self.alias}._file_{'_'.join(rel.with_suffix('').parts)}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, str(path),
                                                      loader=_RevisionLoader(name, str(path), self._builtins))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module


class _RevisionLoader(importlib.machinery.SourceFileLoader):
    def __init__(self, fullname: str, path: str, builtins_: dict):
        super().__init__(fullname, path)
        self._builtins_ = builtins_

    def exec_module(self, module: ModuleType) -> None:
        # Every frame of this module's code looks names up in these builtins, so its `import`
        # statements, lazy ones in function bodies included, go through the revision's importer.
        module.__dict__["__builtins__"] = self._builtins_
        super().exec_module(module)


class _NamespaceLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module: ModuleType) -> None:
        return None


def search_roots(current_root: Path, snapshot_root: Path, sys_path: Iterable[str] | None = None) -> list[Path]:
    """REV's counterparts of the current process's import roots inside the repository; not those of an
    environment kept in the tree (its site-packages hold installed packages, torch among them, never REV's)."""
    current_root = Path(current_root).resolve()
    roots = [snapshot_root]
    for entry in sys.path if sys_path is None else sys_path:
        path = Path(entry or ".").resolve()
        if not path.is_relative_to(current_root) or in_environment(path, current_root):
            continue
        roots.append(Path(snapshot_root) / path.relative_to(current_root))
    if (Path(snapshot_root) / "src").is_dir():
        roots.append(Path(snapshot_root) / "src")
    return roots


def in_environment(path: Path, root: Path) -> bool:
    """Whether `path` lies in a Python environment kept inside the tree `root` (a virtual environment or a conda
    one, of any name: its pyvenv.cfg or conda-meta says so), where installed packages live, not the project's code.
    Both paths as the caller resolved them."""
    path, root = Path(path), Path(root)
    if not path.is_relative_to(root):
        return False
    return any(_is_environment(str(root / parent)) for parent in path.relative_to(root).parents
               if parent != Path("."))


@functools.lru_cache(maxsize=4096)
def _is_environment(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "pyvenv.cfg")) or os.path.isdir(os.path.join(folder, "conda-meta"))
