"""The functional core stands without Lightning: no module under ``functional/`` imports
Lightning, torchmetrics or the package's Lightning-bound parts (callbacks, probing)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import lightning_triage.functional as functional

CORE = Path(functional.__file__).parent
FORBIDDEN = ("lightning", "pytorch_lightning", "torchmetrics", "lightning_triage.callbacks",
             "lightning_triage.probing")


def imported_modules(source: str, path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` for every import statement of ``source``, the text of the core module
    at ``path`` (relative imports resolved from it)."""
    tree = ast.parse(source, filename=str(path))
    package = ".".join(("lightning_triage", *path.relative_to(CORE.parent).parent.parts))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.append((node.lineno, base))
    return found


def forbidden(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in FORBIDDEN)


@pytest.mark.parametrize("path", sorted(CORE.rglob("*.py")), ids=lambda p: str(p.relative_to(CORE)))
def test_core_module_imports_no_lightning(path: Path) -> None:
    bad = [(line, module) for line, module in imported_modules(path.read_text(), path) if forbidden(module)]
    assert bad == [], f"{path.relative_to(CORE.parent)} imports {bad}"


def test_the_scan_sees_a_lightning_import() -> None:
    source = "import torch\nfrom lightning.pytorch import Trainer\nfrom ...callbacks import base\n"
    modules = [m for _, m in imported_modules(source, CORE / "data" / "example.py")]
    assert [m for m in modules if forbidden(m)] == ["lightning.pytorch", "lightning_triage.callbacks"]


PROBING = CORE.parent / "probing"


@pytest.mark.parametrize("path", sorted(PROBING.rglob("*.py")), ids=lambda p: p.name)
def test_probing_imports_no_callbacks(path: Path) -> None:
    """``probing/`` sits below ``callbacks/``: it may use ``_compat`` but never the callbacks."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    bad = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
           and (node.module or "").startswith("lightning_triage.callbacks")]
    assert bad == [], f"probing/{path.name} imports lightning_triage.callbacks at lines {bad}"
