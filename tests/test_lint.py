"""The code passes the project's ruff configuration (pyproject.toml) and the
floors; no file of the repository points outside it; the README is at most
200 lines. (What is large in shardsink/ is a report, ``scripts/sizes``, not
a test: a module is split when it holds two concepts, not at a count.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = "from importlinter.cli import lint_imports_command; lint_imports_command()"


@pytest.mark.parametrize(
    "args", [["check", "shardsink", "tests"], ["format", "--check", "shardsink", "tests"]]
)
def test_ruff(args: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_floors() -> None:
    """Every import runs down the floors (pyproject's import-linter contract)."""
    result = subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "floors KEPT" in result.stdout


# --- the house: nothing points outside, nothing too long --------------------------------------

#: What a file of the repository must not mention: the design document and
#: the shared directory that lived beside the repository, not in it (spelt
#: in pieces, so that this file does not mention them either).
_SHARED, _DESIGN = r"\.\./" + "shared", "DESIGN"
OUTSIDE = re.compile(rf"{_SHARED}|{_DESIGN}\.md|{_DESIGN} section")
README_MAX_LINES = 200


def _tracked_files() -> list[Path]:
    """Every file git tracks (the working tree's copy; one deleted but not yet
    committed is skipped)."""
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    ).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def _text(path: Path) -> str | None:
    """The file's text, ``None`` for a binary file (a NUL byte or not UTF-8)."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def test_no_file_points_outside_the_repository() -> None:
    """No tracked file mentions the shared directory beside the repository or
    the design document in it: the facts are in docs/ (or stated where they
    are used)."""
    offenders = []
    for path in _tracked_files():
        if not path.is_file():
            continue
        text = _text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "files point outside the repository:\n" + "\n".join(offenders)


def test_readme_at_most_200_lines() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, more than {README_MAX_LINES}"


def test_the_architectures_floors_are_the_contracts() -> None:
    """docs/architecture.md draws the floors as pyproject's ``floors``
    layers contract has them, top first."""
    import re
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (floors,) = [c for c in contracts["contracts"] if c["name"] == "floors"]
    layers = [layer.replace("shardsink.", "") for layer in floors["layers"]]
    doc = (ROOT / "docs" / "architecture.md").read_text()
    drawn = re.findall(r"^floor (\d+) +(\S+(?: \| \S+)*)", doc, flags=re.M)
    assert [name for _, name in drawn] == layers
    assert [int(n) for n, _ in drawn] == list(range(len(layers) - 1, -1, -1))
