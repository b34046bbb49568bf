"""The wheel a user gets from ``pip install .``: it carries the Hydra configs (conf/ -> gptmini/conf/), every
package and the console scripts, and nothing of the repository besides (tests, benchmarks, scripts).

The fast tests build the wheel and read its file list. The slow one installs it into a fresh virtual
environment and, in an empty folder outside the repository where only the installed package can be found, runs
``gptmini train debug=smoke`` and samples from the run by name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "gptmini", "conf")  # what the build reads


SCRIPTS = (
    "gptmini",
    "gptmini-train",
    "gptmini-sample",
    "gptmini-eval",
    "gptmini-attention",
    "gptmini-prepare",
    "gptmini-analyze",
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, str]:
    """The wheel, built the way ``pip install .`` builds it, and pip's output. Built from a copy of the
    sources: an in-tree build would leave build/ and *.egg-info in the shared working tree."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    for name in SOURCES:
        path = REPO_ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", root / "dist", src],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (whl,) = (root / "dist").glob("gptmini-*.whl")
    return whl, proc.stdout + proc.stderr


def test_wheel_ships_configs_every_package_and_nothing_else(wheel):
    whl, build_log = wheel
    # setuptools warns (and may one day drop the files) when a config folder is not a listed package
    assert "is absent from the `packages` configuration" not in build_log, build_log
    names = set(zipfile.ZipFile(whl).namelist())

    conf_root = REPO_ROOT / "conf"
    conf = {
        f"gptmini/conf/{p.relative_to(conf_root).as_posix()}" for p in conf_root.rglob("*") if p.is_file()
    }
    assert conf and conf <= names, sorted(conf - names)
    for group in ("model", "experiment", "trainer", "debug"):  # subfolders, not just the top level
        assert any(n.startswith(f"gptmini/conf/{group}/") for n in names), group
    code = {
        p.relative_to(REPO_ROOT).as_posix()
        for p in (REPO_ROOT / "gptmini").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert code <= names, sorted(code - names)  # a package missing from pyproject's list would be absent
    # the options' settings composing reads instead of importing their classes
    assert "gptmini/training/run/settings_specs.json" in names

    tops = {n.split("/")[0] for n in names}
    assert tops == {"gptmini", f"{whl.name.split('-')[0]}-{whl.name.split('-')[1]}.dist-info"}, tops
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "scripts/")) or "/tests/" in n]


def _entry_points(text: str, group: str) -> dict[str, str]:
    """name -> target of one [group] of an entry_points.txt."""
    lines = text.splitlines()
    section = lines[lines.index(f"[{group}]") + 1 :]
    section = section[: next((i for i, line in enumerate(section) if line.startswith("[")), len(section))]
    return dict(line.split(" = ") for line in section if " = " in line)


def test_wheel_declares_the_console_scripts_and_their_targets_exist(wheel):
    whl, _ = wheel
    zf = zipfile.ZipFile(whl)
    (entry_points,) = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
    scripts = _entry_points(zf.read(entry_points).decode(), "console_scripts")
    assert set(scripts) == set(SCRIPTS), scripts
    names = set(zf.namelist())
    for name, target in scripts.items():
        module, func = target.split(":")
        path = f"{module.replace('.', '/')}.py"
        assert path in names, (name, target)
        assert f"\ndef {func}(" in zf.read(path).decode(), (name, target)  # the function the script calls


def test_wheel_ships_the_attention_tab_and_registers_it_with_tensorboard(wheel):
    whl, _ = wheel
    zf = zipfile.ZipFile(whl)
    names = set(zf.namelist())
    static = {
        p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "gptmini" / "board" / "static").iterdir()
    }
    assert static and static <= names, sorted(static - names)  # the tab's ES module, served from package data
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    plugins = _entry_points(zf.read(entry_points).decode(), "tensorboard_plugins")
    assert plugins == {"gptmini_attention": "gptmini.board.plugin:AttentionLoader"}, plugins
    assert "\nclass AttentionLoader(" in zf.read("gptmini/board/plugin.py").decode()


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed: its ``bin/`` folder. Only gptmini comes from the
    wheel; its dependencies (torch, Lightning, ...) are this interpreter's, seen through a .pth file appended
    after the new environment's own site-packages, so nothing is downloaded. The folders a .pth file lists are
    added to sys.path as they are (the .pth files inside them are not run), so this interpreter's editable
    gptmini cannot be imported there."""
    whl, _ = wheel
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--clear", "--without-pip", venv], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dev = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}  # pip is found there too
    Path(purelib, "_gptmini_test_deps.pth").write_text("\n".join(sorted(dev)) + "\n")
    # --ignore-installed: this interpreter's own (editable) gptmini is visible to pip and must be neither reused
    # nor uninstalled.
    install = subprocess.run(
        [python, "-m", "pip", "install", "--no-deps", "--ignore-installed", "--no-index", whl],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    return venv / "bin"


@pytest.mark.slow
def test_gptmini_train_debug_smoke_works_from_the_wheel_in_an_empty_folder(installed, tmp_path):
    # not the repository, and nothing in it: only the installed package can be found
    work = tmp_path / "empty"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "HYDRA_FULL_ERROR")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONSAFEPATH="1")

    def run(*argv: str | Path, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(a) for a in argv], cwd=work, env=env, capture_output=True, text=True, timeout=timeout
        )

    # which folders on the new interpreter's sys.path hold a gptmini package: the first one wins
    where = run(
        installed / "python",
        "-c",
        "import json, os, sys, gptmini, gptmini.conf_dir as c; print(json.dumps([gptmini.__file__, str(c.conf_dir()), "
        "[p for p in sys.path if os.path.isdir(os.path.join(p or os.getcwd(), 'gptmini'))]]))",
    )
    assert where.returncode == 0, where.stderr[-3000:]
    module_file, conf, holders = json.loads(where.stdout)
    venv = installed.parent
    assert Path(module_file).is_relative_to(venv), where.stdout  # the wheel's copy, not the repository's
    assert Path(conf) == Path(module_file).parent / "conf", where.stdout  # the configs shipped inside it
    assert holders and Path(holders[0]).is_relative_to(venv), holders
    assert str(REPO_ROOT) not in holders and not work.is_relative_to(REPO_ROOT), holders

    version = run(installed / "gptmini", "--version")
    assert version.returncode == 0 and version.stdout.strip().startswith("gptmini "), version.stderr
    listing = run(installed / "gptmini", "--help")
    for command in (
        "train",
        "data",
        "sample",
        "eval",
        "attention",
        "analyze",
        "export",
        "import",
        "bench",
        "board",
    ):
        assert f"\n  {command} " in listing.stdout, (command, listing.stdout)

    train = run(installed / "gptmini", "train", "debug=smoke")
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    # everything it wrote is in the folder it ran in: the prepared corpus and the run
    assert sorted(p.name for p in work.iterdir()) == ["data", "outputs"], sorted(work.iterdir())
    (run_dir,) = (work / "outputs" / "smoke").iterdir()
    assert "run finished: 6 steps" in (run_dir / "train.log").read_text()
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()

    for command in ("sample", "eval", "attention", "data", "analyze"):
        help_ = run(installed / "gptmini", command, "--help")
        assert help_.returncode == 0 and "usage: gptmini" in help_.stdout, (command, help_.stderr[-2000:])
    # the run is found by name under outputs/, as a user in this folder would name it
    sample = run(
        installed / "gptmini", "sample", "--ckpt", "smoke", "--prompt", "ROMEO:", "--max-new-tokens", "4"
    )
    assert sample.returncode == 0 and "ROMEO:" in sample.stdout, sample.stderr[-3000:]
    # the previous release's spelling still works, and says the new one
    old = run(installed / "gptmini-sample", "--prompt", "ROMEO:", "--max-new-tokens", "2")
    assert old.returncode == 0 and "ROMEO:" in old.stdout and "gptmini sample" in old.stderr, old.stderr[
        -3000:
    ]
