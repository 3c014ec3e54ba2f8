"""Does each side run its own code? Checked before a side-by-side comparison in one process is trusted.

In one process the revision's test function is called with the current session's fixture values, and its
imports are redirected into the revision's tree. Two things can then make both sides run the same code
silently: a fixture whose code (or the project code it uses) differs between the trees, and a module of the
project that the revision's side imported from the current tree. Both are found by following what the code
refers to (module globals, the modules of functions and classes) through the project's files, and comparing
each such file with its counterpart in the revision's tree.
"""
from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable

import bench_core
from bench_core.workflows.side_by_side.importer import in_environment
from bench_core.workflows.side_by_side.revisions import file_sha256, resolved

# the engine is shared by both sides on purpose (the revision importer never aliases it): not the code compared
ENGINE = Path(bench_core.__file__).resolve().parent


def _file_of(obj: Any) -> Path | None:
    if isinstance(obj, ModuleType):
        f = getattr(obj, "__file__", None)
    else:
        mod = sys.modules.get(getattr(obj, "__module__", None) or "")
        f = getattr(mod, "__file__", None)
    return resolved(str(f)) if f else None


def _imported(f: Path, mod: ModuleType | None) -> set[str]:
    """The module names the source file `f` imports (relative imports resolved against its package), and for
    `from X import y` also `X.y`, which may be a submodule."""
    try:
        tree = ast.parse(f.read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return set()
    package = (getattr(mod, "__package__", None) or "").split(".") if mod is not None else []
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                head = package[:len(package) - node.level + 1] if node.level <= len(package) else []
                base = ".".join([*head, base] if base else head)
            names.add(base)
            names.update(f"{base}.{a.name}" if base else a.name for a in node.names)
    return names


def project_files(start: Iterable[Any], inside: Iterable[Path], by_source: bool = True) -> set[Path]:
    """The project files (under any of `inside`) that the objects `start` come from, and every project file
    their code refers to (module globals, the modules of functions and classes) or, `by_source`, imports by
    name, transitively: what their code may run. (The revision's modules import through an alias, so their
    names say nothing; what they bound does.)"""
    roots = [Path(p).resolve() for p in inside]
    modules = {name: m for name, m in list(sys.modules.items()) if isinstance(m, ModuleType)}
    by_file = {}
    for m in modules.values():
        f = _file_of(m)
        if f is not None:
            by_file.setdefault(f, m)
    seen: set[Path] = set()
    todo = [f for f in map(_file_of, start) if f is not None]
    while todo:
        f = todo.pop()
        if f in seen or not any(f.is_relative_to(r) and not in_environment(f, r) for r in roots) or \
                f.is_relative_to(ENGINE):
            continue
        seen.add(f)
        mod = by_file.get(f)
        refs = [v for v in (vars(mod).values() if mod is not None else ())
                if isinstance(v, ModuleType) or inspect.isfunction(v) or inspect.isclass(v)]
        if by_source:
            refs += [modules[n] for n in _imported(f, mod) if n in modules]
        todo += [g for g in map(_file_of, refs) if g is not None and g not in seen]
    return seen


def differing(files: Iterable[Path], current_root: Path, rev_root: Path) -> list[str]:
    """Of `files` (in the current tree), those whose counterpart in the revision's tree is missing or other."""
    out = []
    for f in sorted(files):
        rel = f.relative_to(current_root.resolve())
        theirs = rev_root / rel
        if not theirs.exists():
            out.append(f"{rel} (not in the revision)")
        elif file_sha256(theirs) != file_sha256(f):
            out.append(str(rel))
    return out


def fixture_problems(fixtures: dict[str, Callable], current_root: Path, rev_root: Path) -> list[str]:
    """Fixtures (name -> function) whose value the revision's side would take from the current tree's code
    although that code differs in the revision: each named with the files that differ."""
    out = []
    for name, func in sorted(fixtures.items()):
        files = project_files([func], [current_root])
        diff = differing(files, current_root, rev_root)
        if diff:
            where = _defined_in(func, current_root)
            through = [f for f in diff if f != where]
            said = (f"{where}, through {', '.join(through)}" if where and through else
                    where if where else ", ".join(diff))
            out.append(f"the fixture {name!r} ({said})")
    return out


def _defined_in(func: Callable, root: Path) -> str | None:
    """The file a fixture is written in, relative to the tree (None where it is not the tree's)."""
    try:
        path = Path(inspect.getsourcefile(inspect.unwrap(func)) or "").resolve()
    except (TypeError, OSError):
        return None
    root = Path(root).resolve()
    return str(path.relative_to(root)) if path.is_relative_to(root) else None


def borrowed(module: ModuleType, current_root: Path, rev_root: Path) -> list[str]:
    """Project files of the current tree that the revision's module uses although they differ in the
    revision (an import that found the current tree's copy)."""
    used = project_files([module], [current_root, rev_root], by_source=False)
    root = current_root.resolve()
    return differing({f for f in used if f.is_relative_to(root)}, current_root, rev_root)


def crossed(files: dict[str, str | None], own: Path, other: Path) -> list[str]:
    """Of the files a side's process loaded (path -> sha256), those inside the other side's tree whose content
    differs from the same file in its own tree: code it borrowed and should not have."""
    out = []
    for path, sha in files.items():
        p = Path(path)
        if p.is_relative_to(ENGINE):
            continue
        if p.is_relative_to(Path(other).resolve()) and not p.is_relative_to(Path(own).resolve()):
            mine = Path(own).resolve() / p.relative_to(Path(other).resolve())
            if not mine.exists() or file_sha256(mine) != sha:
                out.append(str(p.relative_to(Path(other).resolve())))
    return sorted(out)


def holds_torch_state(value: Any, depth: int = 2) -> bool:
    """Whether `value` is, or holds within `depth` levels (items of a container, attributes of an object, the cells of
    a closure), a tensor, a module or an optimizer: memory that was allocated when it was built."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    if isinstance(value, (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)):
        return True
    if depth <= 0 or isinstance(value, (str, bytes, int, float, bool, type(None), ModuleType, type)):
        return False
    if isinstance(value, dict):
        inner = list(value.values())
    elif isinstance(value, (list, tuple, set, frozenset)):
        inner = list(value)
    elif getattr(value, "__closure__", None):
        inner = []
        for cell in value.__closure__:
            try:
                inner.append(cell.cell_contents)
            except ValueError:   # a cell not filled yet
                pass
    else:
        inner = list(getattr(value, "__dict__", {}).values())
    return any(holds_torch_state(v, depth - 1) for v in inner[:1000])


def kept_note(kept: dict[str, list[str]]) -> str | None:
    """The comparison's note where a side's process kept fixtures of a wider scope than the test holding torch state
    (`kept`: per side, "name (scope)"): built once in that process, so every round reused them."""
    names = sorted({k for side in kept.values() for k in side})
    if not names:
        return None
    return (f"fixture(s) {', '.join(names)} hold torch state built once in each side's process and reused by every "
            f"round: the bias of that allocation (several percent on memory-bound work, docs/side-by-side.md) is in "
            f"the ratio, not in its interval; a function-scoped fixture is rebuilt every round")
