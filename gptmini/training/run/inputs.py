"""The files a run reads (the corpus, ``model.init_from``), checked before anything else runs."""

from __future__ import annotations

import glob
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gptmini.data.corpora import EMBEDDED_SOURCES, is_url, path_problem
from gptmini.training.errors import RunError
from gptmini.training.run.resume import resolve_init_from


def check_input_files(cfg: DictConfig) -> None:
    """The files a run reads, checked before anything else runs (the command line calls this before
    ``plan_run``; kept apart so that configs can be checked without the files existing)."""
    # "???" values are reported by plan_run.
    init_from = None if OmegaConf.is_missing(cfg.model, "init_from") else cfg.model.get("init_from")
    if init_from is not None:
        kind, path = resolve_init_from(init_from, cfg.paths.output_root)
        if kind == "checkpoint":
            from gptmini.checkpoint import load_checkpoint

            load_checkpoint(path, mmap=True)  # a gptmini checkpoint (trained or imported): refused if not one
        else:
            from gptmini.hf.formats import hf_model_type

            # a folder of a format gptmini cannot read (its model_type) is refused before the data is prepared
            hf_model_type(path)
    _check_data_files(cfg)


def _check_data_files(cfg: DictConfig) -> None:
    if "source" in cfg.data and not OmegaConf.is_missing(cfg.data, "source"):
        _check_data_source(cfg.data)


def _check_data_source(data: DictConfig) -> None:
    """A local corpus path that does not exist fails here, before Lightning is even imported."""
    source = data.get("source")
    if not isinstance(source, str) or not source:
        raise RunError(
            f"data.source={source!r} is invalid: expected 'shakespeare', a file, a folder, a glob or a URL"
        )
    if source in EMBEDDED_SOURCES or is_url(source):
        return
    if glob.has_magic(source):
        if not any(Path(p).is_file() for p in glob.iglob(source, recursive=True)):
            raise RunError(
                f"data.source={source!r} matches no files: check the pattern (quote it in the shell)"
            )
        return
    path = Path(source)
    problem = path_problem(path)
    if problem is not None:
        raise RunError(f"data.source={source} {problem}")
    if not path.exists():
        raise RunError(
            f"data.source={source} does not exist: expected 'shakespeare' (embedded), an existing text file, a "
            "folder or glob of text/JSONL/Parquet/Arrow files like 'texts/**/*.txt', or an http(s) URL"
        )
    if path.is_file() and path.stat().st_size == 0:
        raise RunError(f"data.source={source} is an empty file: point it at a UTF-8 text corpus")
