"""What a default ``gptmini train`` process has imported when its first training step starts: none of the heavy
packages only other commands use (the Hugging Face and evaluation stacks, the Arrow and pandas readers). A real
process: only a fresh interpreter shows what the command itself imports."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning as L
import pytest

# imported by `gptmini eval --tasks`, the Parquet/Arrow corpus readers and the Hugging Face export: never by training
NOT_IN_A_TRAINING_RUN = ("lm_eval", "pyarrow", "pandas", "datasets", "accelerate", "safetensors", "sklearn")


class FirstStepModules(L.Callback):
    """Writes the top-level names in ``sys.modules`` to ``path`` when the first training batch starts."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ):
        if not self.path.exists():
            self.path.write_text(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))


@pytest.mark.slow
def test_a_default_training_run_imports_none_of_the_heavy_packages_it_does_not_use(run_cli, tmp_path):
    seen = tmp_path / "modules.json"
    proc = run_cli.train(
        [
            "debug=smoke",
            "trainer.max_steps=1",
            f"paths.output_root={tmp_path / 'runs'}",
            f"+callbacks.first_step_modules={{_target_:test_startup_imports.FirstStepModules,path:'{seen}'}}",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    modules = set(json.loads(seen.read_text()))
    assert {"torch", "lightning", "gptmini"} <= modules  # the oracle sees the run's own imports
    assert modules.isdisjoint(NOT_IN_A_TRAINING_RUN), sorted(modules & set(NOT_IN_A_TRAINING_RUN))
