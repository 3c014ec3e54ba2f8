"""The package's shape, checked: no private names across modules, no import cycles, a true module map."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "bench_core"


def _modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(), str(p)) for p in sorted(PKG.glob("*.py"))}


def _imports(tree: ast.Module, top_level_only: bool):
    """(imported bench_core module, names taken from it) for every import in the module."""
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                yield node.module.split(".")[0], [a.name for a in node.names]
            elif node.level == 1:  # from . import storage
                for a in node.names:
                    yield a.name, []
            elif node.module and node.module.startswith("bench_core."):
                yield node.module.split(".")[1], [a.name for a in node.names]
            elif node.module == "bench_core":
                for a in node.names:
                    if (PKG / f"{a.name}.py").exists():
                        yield a.name, []


def test_no_module_imports_a_private_name_from_another():
    offenders = [f"{mod} imports {name} from {src}"
                 for mod, tree in _modules().items()
                 for src, names in _imports(tree, top_level_only=False)
                 for name in names if name.startswith("_") and not name.startswith("__")]
    assert not offenders, offenders


@pytest.mark.parametrize("top_level_only", [True, False], ids=["module-level", "including-deferred"])
def test_import_graph_has_no_cycles(top_level_only):
    mods = _modules()
    graph = {m: {src for src, _ in _imports(t, top_level_only) if src in mods and src != m}
             for m, t in mods.items()}
    graph["__init__"] = set()  # the package's front door imports everything; nothing real goes through it
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


def test_readme_module_map_matches_the_tree():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(\w+)\.py` \|", section, re.MULTILINE))
    on_disk = {p.stem for p in PKG.glob("*.py")}
    assert listed == on_disk, f"missing from the map: {on_disk - listed}; no such module: {listed - on_disk}"
