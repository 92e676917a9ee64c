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


#: Floors whose door is no re-export: ``bench``'s is empty so that each
#: ``shardsink bench`` command imports its own module only; ``testing``'s is
#: the public API, loaded on first use.
OPEN_FLOORS = {"bench", "testing"}


def test_other_floors_go_through_a_floors_door() -> None:
    """An import from another floor names the floor's package (its door,
    its ``__init__``), not a module inside it: ``from ..persist import
    Shard``, never ``from ..persist.shard import Shard``."""
    package = Path(__file__).parents[1] / "shardsink"
    past = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).parts
        floor = parts[0] if len(parts) > 1 else None
        where = ["shardsink", *parts[:-1]]
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level and node.module):
                continue
            module = where[: len(where) - node.level + 1] + node.module.split(".")
            into = module[1] if len(module) > 1 else None
            inside = len(module) > 2 and (package / into).is_dir()
            if inside and into != floor and into not in OPEN_FLOORS:
                past.append(f"{path.relative_to(package.parent)}:{node.lineno} {node.module}")
    assert past == []


#: Doors that bind a function over their module's name, older than this
#: test: ``from shardsink.shm import sweep`` is the function, not the module.
SHADOWING = {"shm": {"sweep"}, "netns": {"sweep"}, "chaos": {"schedule"}}


def test_no_door_hides_a_module_of_its_floor() -> None:
    """A door that re-exports a name its floor has a module of makes
    ``from ..persist import digest`` the function, and the module out of
    reach through the door (``persist.digest`` once did)."""
    package = Path(__file__).parents[1] / "shardsink"
    hidden = {}
    for door in sorted(package.glob("*/__init__.py")):
        floor = door.parent
        modules = {p.stem for p in floor.glob("*.py")}
        modules |= {p.name for p in floor.iterdir() if p.is_dir()}
        bound = set()
        for node in ast.parse(door.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                bound |= {a.asname or a.name for a in node.names}
        shadowed = bound & modules - SHADOWING.get(floor.name, set())
        if shadowed:
            hidden[floor.name] = sorted(shadowed)
    assert hidden == {}
