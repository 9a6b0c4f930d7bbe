"""The package's layering, checked statically: imports only go down the layers, no import
cycle, and no private name is used outside the module that defines it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "augmentedgp"
PACKAGE = "augmentedgp"

# bottom to top: a module may import from its own layer (no cycle) or from layers below
LAYERS = [
    ("core",),
    ("kernels",),
    ("augmentation",),
    ("likelihoods",),
    ("variational",),
    ("models",),
    ("inference",),
    ("training",),
    ("contrib",),
    ("datasets", "persistence"),
    ("sklearn", "plotting"),
    ("cli", "launcher"),
    ("testing",),
    ("__init__",),
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _layer(module: str) -> int:
    parts = module.split(".")
    return RANK["__init__"] if len(parts) == 1 else RANK[parts[1]]


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    is_pkg = MODULES[module].name == "__init__.py"
    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str):
    """(imported module, imported names or None, line) for every import in the module,
    function-level ones included."""
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == PACKAGE:
                    yield a.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            if target.split(".")[0] != PACKAGE:
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                if sub in MODULES:  # ``from package import module``
                    yield sub, None, node.lineno
                else:
                    yield target, a.name, node.lineno


def _edges():
    return {m: sorted({t for t, _, _ in _imports(m) if t in MODULES and t != m}) for m in MODULES}


def test_every_module_has_a_layer():
    for m in MODULES:
        _layer(m)  # KeyError names a module outside the layer table


def test_imports_only_go_down():
    upward = [f"{m} -> {t}" for m, targets in _edges().items() for t in targets
              if _layer(t) > _layer(m)]
    assert upward == []


def test_no_import_cycle():
    edges, state, cycles = _edges(), {}, []

    def visit(m, stack):
        state[m] = "open"
        for t in edges[m]:
            if state.get(t) == "open":
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t, stack + [t])
        state[m] = "done"

    for m in MODULES:
        if m not in state:
            visit(m, [m])
    assert cycles == []


def _private_uses(module: str):
    tree = ast.parse(MODULES[module].read_text())
    aliases = {}  # local name -> module of this package or a name imported from one
    found = []
    for target, name, line in _imports(module):
        if name is not None and name.startswith("_") and not name.startswith("__"):
            found.append(f"{module}:{line} imports {target}.{name}")
        elif name is None and target.rsplit(".", 1)[-1].startswith("_"):
            found.append(f"{module}:{line} imports the private module {target}")
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = True
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            found.append(f"{module}:{node.lineno} uses {node.value.id}.{node.attr}")
    return found


def test_no_private_name_crosses_a_module():
    found = [u for m in MODULES for u in _private_uses(m)]
    assert found == []


@pytest.mark.parametrize("bad", ["core", "kernels"])
def test_the_checks_fail_on_a_violation(bad, monkeypatch):
    """The graph walk sees an upward edge and a private import when one is planted."""
    src = f"from augmentedgp.training.fit import _objective\nfrom augmentedgp import {bad}\n"
    probe = "augmentedgp.core.probe"
    monkeypatch.setitem(MODULES, probe, SRC / "core" / "probe.py")
    monkeypatch.setattr(Path, "read_text", lambda self: src if self.name == "probe.py"
                        else Path.read_bytes(self).decode())
    assert any(t == "augmentedgp.training.fit" and n == "_objective"
               for t, n, _ in _imports(probe))
    assert "augmentedgp.training.fit" in _edges()[probe]
    assert _layer("augmentedgp.training.fit") > _layer(probe)
    assert _private_uses(probe)
