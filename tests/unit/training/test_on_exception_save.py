"""A run that fails after its first step saves on_exception.ckpt with the whole state, saying nothing of
Lightning's ``weights_only`` default (it is passed explicitly)."""

from __future__ import annotations

import logging

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gptmini.training.callbacks.guards import SafeOnExceptionCheckpoint


class FailsAtStep3(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        if self.global_step == 2:
            raise RuntimeError("boom")
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_the_exception_checkpoint_holds_the_whole_state_and_logs_no_weights_only_default(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    trainer = L.Trainer(
        max_steps=5,
        callbacks=[SafeOnExceptionCheckpoint(tmp_path / "checkpoints")],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    data = DataLoader(TensorDataset(torch.randn(16, 2)), batch_size=2)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(FailsAtStep3(), data)
    ckpt = torch.load(tmp_path / "checkpoints" / "on_exception.ckpt", weights_only=True)
    assert ckpt["global_step"] == 2 and ckpt["optimizer_states"]  # resumable: the optimizer's state is there
    assert "weights_only" not in caplog.text
