"""docs/development.md's layout table names every module of the package: each folder of ``gptmini/`` has a row
that names each of its modules, and each top-level module is named as ``gptmini/NAME.py``."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "gptmini"


def _rows() -> dict[str, str]:
    """The layout table's rows: first cell -> the whole row."""
    text = (REPO / "docs" / "development.md").read_text()
    table = text.split("### Layout", 1)[1].split("\n\n")[2]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = line.strip("|").split("|")
        rows[cells[0].strip()] = line
    return rows


def _names(row: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", row))


def test_every_folder_of_the_package_has_a_row_naming_each_of_its_modules() -> None:
    rows = _rows()
    for folder in sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()):
        key = f"`gptmini/{folder.name}/`"
        assert key in rows, f"docs/development.md's layout table has no row for gptmini/{folder.name}/"
        modules = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("__")}
        missing = sorted(modules - _names(rows[key]))
        assert not missing, f"the row of gptmini/{folder.name}/ does not name {missing}"


def test_every_top_level_module_is_named_and_every_named_path_exists() -> None:
    rows = _rows()
    named = set().union(*(_names(cell) for cell in rows))
    modules = {f"gptmini/{p.name}" for p in PACKAGE.glob("*.py") if not p.stem.startswith("__")}
    assert not sorted(modules - named), f"not in the layout table: {sorted(modules - named)}"
    stale = sorted(n for n in named if n.startswith("gptmini/") and not (REPO / n).exists())
    assert not stale, f"the layout table names paths that do not exist: {stale}"
