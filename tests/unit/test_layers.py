"""Imports point one way: a part of gptmini imports only parts of its own layer or below (lazy imports inside
functions included), so the model never depends on training, nor the data on the model."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "gptmini"

# lowest first; a module may import from its own layer or any lower one
LAYERS = [
    (
        "gptmini.fileio",
        "gptmini.conf_dir",
        "gptmini.options",
        "gptmini.attention",
        "gptmini.lm_loss",
        "gptmini.liger",
    ),
    ("gptmini.model", "gptmini.feed_forward", "gptmini.generation", "gptmini.ingredients", "gptmini.limits"),
    ("gptmini.data",),
    ("gptmini.runs", "gptmini.hf", "gptmini.viz", "gptmini.insight"),
    ("gptmini.inference",),
    ("gptmini.training.hardware", "gptmini.training.errors", "gptmini.training.lightning_compat"),
    ("gptmini.training.loop",),
    ("gptmini.training.callbacks", "gptmini.board"),
    ("gptmini.training.run", "gptmini.training"),
    ("gptmini.cli",),
]


def _layer(module: str) -> int:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS in {__file__}")


def _modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _imports(module: str) -> set[str]:
    path = PACKAGE.parent / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from package import submodule` imports the submodule (and runs the package's __init__, which
            # only holds a docstring); any other name comes from the module itself
            submodules = {
                f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")
            }
            found |= submodules
            if len(submodules) < len(node.names):
                found.add(node.module)
    return found


def _is_module(name: str) -> bool:
    path = PACKAGE.parent / Path(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


@pytest.mark.parametrize("module", [m for m in _modules() if m != "gptmini"])
def test_imports_point_down(module):
    ours = {m for m in _imports(module) if m.startswith("gptmini.")}
    upward = sorted(m for m in ours if _layer(m) > _layer(module))
    assert not upward, f"{module} (layer {_layer(module)}) imports higher layers: {upward}"


def test_the_package_never_imports_the_benchmarks_or_tests():
    for module in _modules():
        if module == "gptmini":
            continue
        assert not {m for m in _imports(module) if m.split(".")[0] in ("benchmarks", "tests")}, module


def test_a_higher_layer_import_is_caught():
    assert _layer("gptmini.training.run.app") > _layer("gptmini.model") > _layer("gptmini.attention.sdpa")


def test_the_architecture_page_lists_the_layers_as_the_code_does():
    """docs/architecture.md's layer table is LAYERS: same layers, in order, each with the same modules."""
    import re

    page = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", page, re.M)
    assert [int(n) for n, _ in rows] == list(range(len(LAYERS)))
    for (_, modules), layer in zip(rows, LAYERS, strict=True):
        assert re.findall(r"`([\w.]+)`", modules) == list(layer)


def test_the_run_s_schema_is_handed_values_and_never_walks_the_config():
    """The config's path goes one way: the plan walks the composed config and hands each node's values to the
    schema, which neither takes a config (no DictConfig anywhere in it) nor imports the plan."""
    assert "gptmini.training.run.plan" not in _imports("gptmini.training.run.schema")
    tree = ast.parse((PACKAGE / "training" / "run" / "schema.py").read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert "DictConfig" not in names
