"""The public API is exactly what docs/api.md lists: each of its modules'
``__all__`` names those and no others, and every one of them resolves; no
other module of the package declares an ``__all__``."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

API = Path(__file__).parents[1] / "docs" / "api.md"


def _listed() -> dict[str, set[str]]:
    """The names of each module's tables in docs/api.md (its ``## `module```
    heading, then every backticked name in the tables' second column)."""
    out: dict[str, set[str]] = {}
    module = None
    for line in API.read_text().splitlines():
        heading = re.match(r"## `([\w.]+)`", line)
        if heading:
            module = heading.group(1)
            out[module] = set()
        elif module and line.startswith("| ") and not line.startswith(("| what", "|---")):
            out[module] |= set(re.findall(r"`(\w+)`", line.split("|")[2]))
    return out


def test_the_doc_lists_three_modules() -> None:
    assert set(_listed()) == {"shardsink", "shardsink.storage", "shardsink.testing"}


@pytest.mark.parametrize("module", ["shardsink", "shardsink.storage", "shardsink.testing"])
def test_each_modules_names_are_the_documented_ones(module: str) -> None:
    imported = importlib.import_module(module)
    assert set(imported.__all__) == _listed()[module]
    assert len(imported.__all__) == len(set(imported.__all__))
    for name in imported.__all__:
        assert getattr(imported, name) is not None, name


def test_no_other_module_declares_a_public_surface() -> None:
    package = Path(__file__).parents[1] / "shardsink"
    public = {package / "__init__.py", package / "storage" / "__init__.py"}
    public.add(package / "testing" / "__init__.py")
    declaring = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if any(getattr(t, "id", None) == "__all__" for t in targets) and path not in public:
                declaring.append(str(path.relative_to(package.parent)))
    assert declaring == []
