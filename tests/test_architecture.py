"""The package's layers (ARCHITECTURE.md): imports flow one way, from higher layers to lower ones.

core -> model -> dynamics -> simulate -> {identify, estimate, control} -> cli. A module may import from
its own layer and any lower one, never from a higher one; identify, estimate and control never import
each other.
Every import is checked, also those inside functions (deferred imports), by reading the source.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "jaxarm"
LAYERS = {"core": 0, "model": 1, "dynamics": 2, "simulate": 3, "identify": 4, "estimate": 4, "control": 4, "cli": 5}


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] in LAYERS)


def _imported_packages(path: pathlib.Path):
    """(line, top-level jaxarm sub-package) for every import of jaxarm code in ``path``."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    package = parts[:-1] if path.name != "__init__.py" else parts[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                target = list(base) + (node.module.split(".") if node.module else [])
                if not target:  # "from .. import x" at the top: x names the sub-package
                    for alias in node.names:
                        yield node.lineno, alias.name
                    continue
                yield node.lineno, target[0]
            elif node.module and node.module.split(".")[0] == "jaxarm":
                mod = node.module.split(".")
                yield node.lineno, mod[1] if len(mod) > 1 else None
        elif isinstance(node, ast.Import):
            for alias in node.names:
                mod = alias.name.split(".")
                if mod[0] == "jaxarm":
                    yield node.lineno, mod[1] if len(mod) > 1 else None


def test_every_module_sits_in_a_layer():
    stray = [p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert not stray, f"modules outside the layers (put each in a sub-package): {stray}"
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(LAYERS)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    own = path.relative_to(PACKAGE).parts[0]
    bad = []
    for line, target in _imported_packages(path):
        if target is None or target == "__version__":
            if own != "cli":
                bad.append(f"line {line}: imports the jaxarm package itself")
            continue
        if target not in LAYERS:
            bad.append(f"line {line}: imports {target!r}, which is in no layer")
        elif target != own and LAYERS[target] >= LAYERS[own]:
            bad.append(f"line {line}: {own} (layer {LAYERS[own]}) imports {target} (layer {LAYERS[target]})")
    assert not bad, f"{path.relative_to(PACKAGE)}: " + "; ".join(bad)


def test_the_check_can_fail(monkeypatch):
    """The checker sees an upward import (so the test above is not vacuous)."""
    fake = PACKAGE / "dynamics" / "kinematics.py"
    src = "from ..simulate import rollouts\n\ndef f():\n    from ..cli import main\n"
    monkeypatch.setattr(pathlib.Path, "read_text", lambda self, *a, **k: src)
    assert sorted(t for _, t in _imported_packages(fake)) == ["cli", "simulate"]
    with pytest.raises(AssertionError, match="dynamics .layer 2. imports cli"):
        test_imports_point_down(fake)
