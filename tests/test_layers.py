"""The product's layers (docs/architecture.md): no module imports one of a higher layer."""

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
