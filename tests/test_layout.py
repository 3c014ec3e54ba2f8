"""The package's shape, checked: layers import only downwards, the core and the deciding layer need no torch, no
private names across modules, no import cycles, no names taken from a package's front door, a true module map."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "bench_core"

# What each layer may import from bench_core, deferred imports included. A layer always may import itself.
ALLOWED = {
    "core": set(),
    "timing": {"core"},
    "deciding": {"core"},
    "files": {"core"},
    "output": {"core", "deciding", "timing", "files"},
    "workflows": {"core", "timing", "deciding", "files", "output"},
    "session": {"core", "timing", "deciding", "files", "output", "workflows"},
    "shells": {"core", "timing", "deciding", "files", "output", "workflows", "session"},
}


def _name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _modules() -> dict[str, ast.Module]:
    return {_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(PKG.rglob("*.py"))}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _imports(tree: ast.Module, top_level_only: bool):
    """(imported bench_core module, names taken from it) for every import of bench_core in the module."""
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    mods = _modules.cache
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"relative import at line {node.lineno}: bench_core imports absolutely")
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "bench_core":
            for a in node.names:   # `from bench_core.files import storage` takes a module
                sub = f"{node.module}.{a.name}"
                yield (sub, []) if sub in mods else (node.module, [a.name])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "bench_core":
                    yield a.name, []


_modules.cache = _modules()
MODULES = _modules.cache


def _torch_imports(tree: ast.Module) -> list[int]:
    out = []
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        out += [node.lineno for n in names if n.split(".")[0] == "torch"]
    return out


def test_each_layer_imports_only_the_layers_below_it():
    offenders = []
    for mod, tree in MODULES.items():
        layer = _layer(mod)
        if layer in (None, "__main__"):   # the front door and `python -m bench_core`
            continue
        assert layer in ALLOWED, f"{mod}: a layer the layout does not know ({layer}); add it to ALLOWED and the map"
        for src, _ in _imports(tree, top_level_only=False):
            theirs = _layer(src)
            if theirs is not None and theirs != layer and theirs not in ALLOWED[layer]:
                offenders.append(f"{mod} ({layer}) imports {src} ({theirs})")
    assert not offenders, offenders


def test_the_core_and_the_deciding_layer_never_import_torch():
    offenders = [f"{mod}: line {line}" for mod, tree in MODULES.items() if _layer(mod) in ("core", "deciding")
                 for line in _torch_imports(tree)]
    assert not offenders, offenders


def test_nothing_takes_a_name_from_a_package_front_door():
    """A module that imports a name from `bench_core` (or a subpackage's `__init__`) runs that `__init__`
    midway through its own import: the road to a cycle. Subpackage front doors hold no code at all."""
    packages = {m for m in MODULES if (PKG.parent / m.replace(".", "/") / "__init__.py").exists()}
    offenders = [f"{mod} takes {names} from {src}" for mod, tree in MODULES.items()
                 for src, names in _imports(tree, top_level_only=False) if src in packages and names]
    assert not offenders, offenders
    busy = [m for m in packages if m != "bench_core" and any(
        not isinstance(n, ast.Expr) for n in MODULES[m].body)]
    assert not busy, f"subpackage __init__ files hold only a docstring: {busy}"


def test_no_module_imports_a_private_name_from_another():
    offenders = [f"{mod} imports {name} from {src}"
                 for mod, tree in MODULES.items()
                 for src, names in _imports(tree, top_level_only=False)
                 for name in names if name.startswith("_") and not name.startswith("__")]
    assert not offenders, offenders


@pytest.mark.parametrize("top_level_only", [True, False], ids=["module-level", "including-deferred"])
def test_import_graph_has_no_cycles(top_level_only):
    graph = {m: {src for src, _ in _imports(t, top_level_only) if src in MODULES and src != m}
             for m, t in MODULES.items()}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(m, path):
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycle.extend(path[path.index(n):] + [n] if n in path else [m, n])
                return True
            if state.get(n) is None and visit(n, path + [n]):
                return True
        state[m] = 2
        return False

    for m in sorted(graph):
        if state.get(m) is None and visit(m, [m]):
            break
    assert not cycle, " -> ".join(cycle)


NO_TORCH = """
import importlib, sys
if sys.argv[1] == "blocked":
    sys.modules["torch"] = None          # any `import torch` now raises ImportError
else:                                    # as if torch were not installed at all
    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "torch":
                raise ModuleNotFoundError(f"No module named {{name!r}}")
    sys.meta_path.insert(0, NoTorch())
import bench_core
for name in sys.argv[2:]:
    importlib.import_module(name)
if sys.argv[1] == "missing":
    from bench_core.shells.cli import main
    sys.exit(main(["compare", "{base}", "{new}", "--min-runs", "1"]))
"""


@pytest.mark.parametrize("how", ["blocked", "missing"])
def test_the_pure_layers_and_the_file_gate_work_without_torch(tmp_path, how):
    """Blocked (`sys.modules["torch"] = None`): every pure module imports. Missing (not installed): the JSON-only
    `bench-core compare` also decides; scipy, which the statistics call, looks at a blocked torch and fails."""
    from helpers import meas
    from bench_core.files import storage

    for run in range(5):   # a baseline of five runs, 1% apart; the new session is twice as slow
        storage.save_baseline(tmp_path, "main", [meas([2.0 + 0.02 * run, 2.1, 2.05] * 4, name="s")], {"device": "cpu"},
                              append=run > 0)
    base = tmp_path / "main.json"
    new = storage.write_session(tmp_path / "n", [meas([4.0, 4.2, 4.1] * 4, name="s")], {"device": "cpu"})
    pure = sorted(m for m in MODULES if _layer(m) in ("core", "deciding") or m in (
        "bench_core.files.storage", "bench_core.files.atomic", "bench_core.output.tables", "bench_core.output.fitting",
        "bench_core.output.comparison_tables", "bench_core.shells.cli"))
    res = subprocess.run([sys.executable, "-c", NO_TORCH.format(base=base, new=new), how, *pure],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "Error" not in res.stderr, res.stderr
    if how == "blocked":
        assert res.returncode == 0
    else:
        assert res.returncode == 1 and "slower" in res.stdout, (res.stdout, res.stderr)   # a 2x regression, said


def test_the_module_map_matches_the_tree():
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([\w/]+\.py)` \|", section, re.MULTILINE))
    on_disk = {str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if p.name != "__init__.py" or p.parent == PKG}
    assert listed == on_disk, f"missing from the map: {on_disk - listed}; no such module: {listed - on_disk}"


def test_every_class_fits_250_lines_every_function_80_and_the_pytest_shell_350():
    """Sizes a reader can hold in one sitting (decorators and docstrings count)."""
    too_long = []
    for mod, tree in MODULES.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                limit = 250 if isinstance(node, ast.ClassDef) else 80
                if node.end_lineno - node.lineno + 1 > limit:
                    too_long.append(f"{mod}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not too_long, too_long
    assert len((PKG / "shells" / "plugin.py").read_text().splitlines()) <= 350


def test_every_name_on_the_front_door_resolves():
    import bench_core

    missing = [name for name in bench_core.__all__ if getattr(bench_core, name, None) is None]
    assert not missing, missing


def test_the_readme_is_a_newcomers_page_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 250
    for section in ("## Install and run", "## Writing a scenario", "### Gate regressions in CI",
                    "### Validate an optimization"):
        assert f"\n{section}\n" in text, section
    links = re.findall(r"\]\(((?:docs/|CHANGELOG)[^)#]*)", text)
    assert links and all((ROOT / link).exists() for link in links), [x for x in links if not (ROOT / x).exists()]
    docs = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert docs <= {Path(link).name for link in links}, f"docs the README does not lead to: {docs - set(map(str, links))}"


def test_only_the_session_records_an_outcome_and_writes_its_ledger():
    """A workflow returns what a scenario came to as its `Outcome`; the session records it whole
    (`Ledger.record`), and no module outside session.py touches the ledger's lists or records for it."""
    lists = {"_results", "_errors", "_comparisons", "_decisions", "_profiles", "_replicas", "_not_counted",
             "_side_by_side", "_one_side", "_new", "_unmeasured", "_leaks"}

    def session_like(node) -> bool:
        return (isinstance(node, ast.Name) and node.id in ("session", "s")) or (
            isinstance(node, ast.Attribute) and node.attr in ("session", "_session"))
    offenders = []
    for mod, tree in MODULES.items():
        if mod == "bench_core.session":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in lists and session_like(node.value):
                offenders.append(f"{mod}:{node.lineno}: {node.attr}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr == "record" and session_like(node.func.value):
                offenders.append(f"{mod}:{node.lineno}: records an outcome")
    assert not offenders, offenders
    from bench_core.session import Ledger

    # one writer for what an outcome holds; errors and profiler passes are the session's notes beside them
    assert sorted(n for n in vars(Ledger) if n.startswith("record")) == ["record", "record_error", "record_profile"]
