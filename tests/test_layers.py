"""The product's layers (docs/architecture.md): no module imports one of a higher layer, and no
modules import each other round a circle, within a layer or across."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOT_MODULES = ("signing", "models", "delivery", "app", "wsgi", "gunicorn.conf")

# Low to high. A module belongs to the first layer naming it or a package above it.
LAYERS = (
    ("signing", "partner.timestamps", "partner.errors", "partner.safe_text", "partner.sealing", "partner.private_files",
     "partner.envelopes"),
    ("partner.telemetry", "partner.outbound", "partner.config", "partner.validation", "partner.bounded_schemas"),
    ("partner.store", "models", "partner.queue"),
    ("partner.keys", "partner.publishers", "partner.event_types", "partner.idempotency", "partner.publishing",
     "partner.subscriptions", "partner.events", "partner.outbox", "partner.outcomes", "partner.claims", "partner.concurrency",
     "partner.retry", "partner.retention", "partner.resealing", "partner.history", "partner.dead_letters", "partner.organizations"),
    ("delivery", "partner.jobs", "partner.courier", "partner.edge", "partner.startup"),
    ("partner.operator", "app", "wsgi", "gunicorn.conf"),
)


def layer_of(module: str) -> int | None:
    for number, names in enumerate(LAYERS):
        if any(module == name or module.startswith(name + ".") for name in names):
            return number
    return None


def product_modules() -> dict[str, Path]:
    modules = {name: ROOT / f"{name}.py" for name in ROOT_MODULES}
    for path in (ROOT / "partner").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of its code (a deferred import counts too). The
    product imports absolutely only."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: a relative import"
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


MODULES = product_modules()


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module and the modules among `modules` it imports (for type hints and deferred too)."""
    return {module: {name for name in imports_of(path) if name in modules and name != module}
            for module, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each circle of imports once, as a path from its first module (by name) round to it again: a
    shortest one through that module, for each set of modules that all reach one another."""
    reachable = {module: _reached(graph, module) for module in graph}
    groups = {min(other for other in reachable[module] if module in reachable[other])
              for module in graph if module in reachable[module]}
    return [_shortest_round(graph, first) for first in sorted(groups)]


def _reached(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, stack = set(), [start]
    while stack:
        for name in graph[stack.pop()] - seen:
            seen.add(name)
            stack.append(name)
    return seen


def _shortest_round(graph: dict[str, set[str]], first: str) -> list[str]:
    paths, seen = [[first]], set()
    while True:  # breadth first: `first` is on a circle, so the search ends
        path = paths.pop(0)
        for name in sorted(graph[path[-1]]):
            if name == first:
                return [*path, first]
            if name not in seen:
                seen.add(name)
                paths.append([*path, name])


def test_every_product_module_has_a_layer():
    assert [name for name in MODULES if layer_of(name) is None and name != "partner"] == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_runs_upward(module):
    own = layer_of(module)
    if own is None:
        return
    upward = sorted(name for name in imports_of(MODULES[module])
                    if (layer := layer_of(name)) is not None and layer > own)
    assert upward == [], f"{module} (layer {own}) imports from a higher layer"


def test_a_module_that_imports_upward_is_found(tmp_path):
    """The check itself: a store module importing the domain is caught."""
    path = tmp_path / "bad.py"
    path.write_text("from partner.subscriptions import find_subscription\n")
    assert "partner.subscriptions" in imports_of(path)
    assert layer_of("partner.subscriptions") > layer_of("partner.store.bad")


def test_no_modules_import_each_other_round_a_circle():
    found = [" -> ".join(circle) for circle in circles(import_graph(MODULES))]
    assert found == [], f"modules import each other round a circle: {'; '.join(found)}"


def test_a_circle_of_imports_is_found(tmp_path):
    """The check itself: a circle of three, one module outside it importing into it, and an import
    for type hints only (under TYPE_CHECKING) counting as much as any other."""
    sources = {"a": "import b\n", "b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from c import C\n",
               "c": "def later():\n    import a\n", "d": "import a\n"}
    for name, source in sources.items():
        (tmp_path / f"{name}.py").write_text(source)
    graph = import_graph({name: tmp_path / f"{name}.py" for name in sources})
    assert circles(graph) == [["a", "b", "c", "a"]]
