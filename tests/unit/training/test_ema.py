"""callbacks.ema: the average follows the EMA recurrence written out by hand, validation and checkpoints see the
average, the trained weights travel beside it, and a run resumed from a checkpoint ends exactly as one never
interrupted; bad settings are refused by the constructor."""

from __future__ import annotations

import re
from functools import partial

import lightning as L
import pytest
import torch

from benchmarks.common import preset_config
from gptmini.training.loop.ema import EMAWeightAveraging
from gptmini.training.loop.module import GPTLightningModule

pytestmark = pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated")


def _module() -> GPTLightningModule:
    torch.manual_seed(0)
    return GPTLightningModule(
        model_config=preset_config("tiny", vocab_size=64).to_dict(),
        optimizer=partial(torch.optim.AdamW, lr=1e-2),
    )


def _loader() -> torch.utils.data.DataLoader:
    # every batch the same: a resumed run sees the same batches whatever its position in the epoch
    x = torch.randint(0, 64, (1, 17), generator=torch.Generator().manual_seed(0)).repeat(16, 1)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:, :-1], x[:, 1:]), batch_size=2)


class Recorder(L.Callback):
    """The trained weights after each optimizer step, and the weights each validation runs on."""

    def __init__(self) -> None:
        self.trained: list[torch.Tensor] = []
        self.validated: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self.trained.append(pl_module.model.wte.weight.detach().clone())

    def on_validation_batch_start(self, trainer, pl_module, *args) -> None:
        if not trainer.sanity_checking:
            self.validated.append(pl_module.model.wte.weight.detach().clone())


def _trainer(tmp_path, callbacks, **kw) -> L.Trainer:
    args = dict(
        accelerator="cpu",
        max_steps=4,
        logger=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
        num_sanity_val_steps=0,
    )
    return L.Trainer(callbacks=callbacks, **{**args, **kw})


def _ema(weights: list[torch.Tensor], decay: float, start: int) -> list[torch.Tensor]:
    # the recurrence by hand: the first update copies the weights, then avg = decay * avg + (1 - decay) * w
    out, avg = [], None
    for step, w in enumerate(weights):
        if step >= start:
            avg = w.clone() if avg is None else decay * avg + (1 - decay) * w
        out.append(avg)
    return out


@pytest.mark.parametrize("start_step", [0, 1])
def test_ema_follows_the_recurrence_and_validation_and_the_end_use_it(tmp_path, start_step):
    module, recorder = _module(), Recorder()
    ema = EMAWeightAveraging(decay=0.6, start_step=start_step)
    trainer = _trainer(
        tmp_path, [recorder, ema], enable_checkpointing=False, val_check_interval=2, limit_val_batches=1
    )
    trainer.fit(module, train_dataloaders=_loader(), val_dataloaders=_loader())
    expected = _ema(recorder.trained, 0.6, start_step)
    assert len(recorder.trained) == 4 and len(recorder.validated) == 2
    assert not torch.equal(expected[3], recorder.trained[3])  # the average is not the weights
    for seen, want in zip(recorder.validated, (expected[1], expected[3]), strict=True):
        torch.testing.assert_close(seen, want)
    # training ends with the average in the model (what the final checkpoint and any evaluation use)
    torch.testing.assert_close(module.model.wte.weight.detach(), expected[3])


def test_checkpoints_hold_the_average_and_a_resumed_run_ends_exactly_as_an_uninterrupted_one(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    def run(folder, ckpt_path=None):
        module, recorder = _module(), Recorder()
        saver = ModelCheckpoint(dirpath=folder, every_n_train_steps=2, save_top_k=-1, filename="{step}")
        trainer = _trainer(folder, [recorder, EMAWeightAveraging(decay=0.7), saver], limit_val_batches=0)
        trainer.fit(module, train_dataloaders=_loader(), ckpt_path=ckpt_path)
        return module, recorder

    whole, recorder = run(tmp_path / "whole")
    ckpt = torch.load(tmp_path / "whole" / "step=2.ckpt", weights_only=True)
    expected = _ema(recorder.trained, 0.7, 0)
    torch.testing.assert_close(ckpt["state_dict"]["model.wte.weight"], expected[1])
    torch.testing.assert_close(ckpt["current_model_state"]["model.wte.weight"], recorder.trained[1])
    resumed, _ = run(tmp_path / "resumed", ckpt_path=tmp_path / "whole" / "step=2.ckpt")
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


class StartWeights(L.Callback):
    """The weights a (resumed) run starts training from."""

    def on_train_start(self, trainer, pl_module) -> None:
        self.weights = pl_module.model.wte.weight.detach().clone()


def test_the_final_checkpoint_keeps_the_trained_weights_beside_the_average(tmp_path):
    """Training ends with the average in the model; the checkpoint saved after it (the run's final last.ckpt)
    still holds the trained weights as current_model_state, not a second copy of the average."""
    module, recorder = _module(), Recorder()
    trainer = _trainer(tmp_path, [recorder, EMAWeightAveraging(decay=0.7)], limit_val_batches=0)
    trainer.fit(module, train_dataloaders=_loader())
    trainer.save_checkpoint(tmp_path / "last.ckpt")  # as training.app.fit writes the final last.ckpt
    ckpt = torch.load(tmp_path / "last.ckpt", weights_only=True)
    expected = _ema(recorder.trained, 0.7, 0)
    torch.testing.assert_close(ckpt["state_dict"]["model.wte.weight"], expected[3])
    torch.testing.assert_close(ckpt["current_model_state"]["model.wte.weight"], recorder.trained[3])
    assert not torch.equal(expected[3], recorder.trained[3])


@pytest.mark.parametrize("ema_now", [True, False], ids=["with_ema", "without_ema"])
def test_a_resume_continues_from_the_trained_weights_with_or_without_ema(tmp_path, ema_now):
    """A 4-step EMA run's checkpoint, resumed for 2 more steps with callbacks.ema on or off: training starts from
    the trained weights (the optimizer's state is theirs), never from the average; with EMA on, the average
    continues from the checkpoint's; the weights end as those of a 6-step run never interrupted."""
    first_recorder = Recorder()
    first = _trainer(tmp_path / "a", [first_recorder, EMAWeightAveraging(decay=0.7)], limit_val_batches=0)
    first.fit(_module(), train_dataloaders=_loader())
    first.save_checkpoint(tmp_path / "a.ckpt")
    ckpt = torch.load(tmp_path / "a.ckpt", weights_only=True)
    trained = ckpt["current_model_state"]["model.wte.weight"]
    average = ckpt["state_dict"]["model.wte.weight"]

    start, recorder = StartWeights(), Recorder()
    ema = EMAWeightAveraging(decay=0.7)
    callbacks = [start, recorder, ema] if ema_now else [start, recorder]
    resumed = _module()
    _trainer(tmp_path / "b", callbacks, max_steps=6, limit_val_batches=0).fit(
        resumed, train_dataloaders=_loader(), ckpt_path=tmp_path / "a.ckpt"
    )
    torch.testing.assert_close(start.weights, trained, rtol=0, atol=0)
    assert not torch.equal(start.weights, average)
    # the oracle: the same 6 steps uninterrupted (the average does not change what is trained)
    whole_recorder = Recorder()
    _trainer(tmp_path / "c", [whole_recorder], max_steps=6, limit_val_batches=0).fit(
        _module(), train_dataloaders=_loader()
    )
    torch.testing.assert_close(recorder.trained, whole_recorder.trained[4:], rtol=0, atol=0)
    if ema_now:
        # the average went on from the checkpoint's: two more EMA updates of the resumed steps' weights
        want = average
        for w in recorder.trained:
            want = 0.7 * want + 0.3 * w
        torch.testing.assert_close(resumed.model.wte.weight.detach(), want)
    else:
        torch.testing.assert_close(resumed.model.wte.weight.detach(), recorder.trained[-1], rtol=0, atol=0)


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "decay:1.5",
            r"callbacks\.ema\.decay=1\.5 is invalid: the average's decay per optimizer step, in \(0, 1\)",
        ),
        ("start_step:-1", r"callbacks\.ema\.start_step=-1 is invalid"),
    ],
)
def test_bad_ema_settings_are_refused_when_the_trainer_is_built(compose_cfg, override, message):
    """A callback's settings are typed by its constructor's signature at planning; the values it refuses are the
    constructor's to check, one line naming the setting, when the trainer's callbacks are built (training builds
    them before it prepares any data)."""
    from hydra.errors import InstantiationException

    from gptmini.training.run.app import build_trainer
    from gptmini.training.run.plan import plan_run

    cfg = compose_cfg(
        ["debug=smoke", f"callbacks.ema={{_target_:gptmini.training.loop.ema.EMAWeightAveraging,{override}}}"]
    )
    plan = plan_run(cfg)  # the plan types the callbacks' settings; their ranges are their constructors'
    with pytest.raises(InstantiationException) as caught:
        build_trainer(plan)
    assert isinstance(caught.value.__cause__, ValueError)
    assert re.fullmatch(message + ".*", str(caught.value.__cause__))
    assert "\n" not in str(caught.value.__cause__)


def test_a_good_ema_setting_composes_and_builds(compose_cfg):
    from hydra.utils import instantiate

    from gptmini.training.run.plan import plan_run

    cfg = compose_cfg(
        ["debug=smoke", "callbacks.ema={_target_:gptmini.training.loop.ema.EMAWeightAveraging,decay:0.9}"]
    )
    plan_run(cfg)
    callback = instantiate(cfg.callbacks.ema)
    assert isinstance(callback, EMAWeightAveraging) and callback.decay == 0.9
