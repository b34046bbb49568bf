"""Where the Hydra configs live: ``gptmini/conf`` inside an installed wheel (shipped as package data), else the
repository's top-level ``conf/`` (a source checkout or an editable install)."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def conf_dir() -> Path:
    for candidate in (_PACKAGE / "conf", _PACKAGE.parent / "conf"):
        if (candidate / "train.yaml").is_file():
            return candidate
    raise FileNotFoundError(
        f"gptmini's configs (train.yaml) are neither in {_PACKAGE / 'conf'} (installed wheel) nor in "
        f"{_PACKAGE.parent / 'conf'} (source checkout): reinstall gptmini with `pip install .`"
    )
