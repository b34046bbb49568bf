"""GPTLightningModule (optimizer groups, the AdamW kernel per device, gradient norm, FLOPs per batch) and the
callbacks that report on training: throughput, progress bar, model summary."""

import csv
import logging
from functools import partial
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch

from benchmarks.common import preset_config
from gptmini.training.loop.module import GPTLightningModule, optimizer_kernel_kwargs, weight_decay_groups

pytestmark = [
    # the small fits below train without validation data on purpose
    pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`"),
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated"),
]


def test_kernel_choice_per_device_and_config_wins():
    adamw = partial(torch.optim.AdamW, lr=1e-3)
    assert optimizer_kernel_kwargs(adamw, "cpu") == {"fused": True}
    assert optimizer_kernel_kwargs(adamw, "cuda") == {"fused": True}
    assert optimizer_kernel_kwargs(adamw, "cuda", "16-mixed") == {"foreach": True}
    assert optimizer_kernel_kwargs(adamw, "mps") == {"foreach": True}
    # a kernel chosen in the config (optimizer.fused=true / optimizer.foreach=false) is never overridden
    assert optimizer_kernel_kwargs(partial(torch.optim.AdamW, fused=True), "cpu") == {}
    assert optimizer_kernel_kwargs(partial(torch.optim.AdamW, foreach=False), "cuda") == {}
    # the plan's node carries the signature's every setting: fused/foreach left at None are not a choice
    assert optimizer_kernel_kwargs(partial(torch.optim.AdamW, fused=None, foreach=None), "cpu") == {
        "fused": True
    }
    # an optimizer without these options gets none
    assert optimizer_kernel_kwargs(partial(torch.optim.SGD, lr=0.1), "cpu") == {"fused": True}
    assert optimizer_kernel_kwargs(partial(torch.optim.SGD, lr=0.1), "mps") == {"foreach": True}
    assert optimizer_kernel_kwargs(partial(torch.optim.LBFGS, lr=0.1), "cpu") == {}


def test_configure_optimizers_decays_matrices_only_with_the_fused_cpu_kernel():
    module = GPTLightningModule(
        model_config=preset_config("tiny", vocab_size=256).to_dict(),
        optimizer=partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.1),
    )
    opt = module.configure_optimizers()
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.defaults["fused"] is True
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    # every trainable parameter is in exactly one group (the tied embedding/LM head once)
    ids = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(module.model.parameters()))


def _tiny_module(**kwargs) -> GPTLightningModule:
    return GPTLightningModule(
        model_config=preset_config("tiny", vocab_size=256).to_dict(),
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
        **kwargs,
    )


def _loader(batches: int = 8, b: int = 2, t: int = 16) -> torch.utils.data.DataLoader:
    x = torch.randint(0, 256, (batches * b, t + 1), generator=torch.Generator().manual_seed(0))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:, :-1], x[:, 1:]), batch_size=b)


def _fit(
    module: L.LightningModule, callbacks: list, tmp_path, val_loader: Any = None, **trainer_kwargs
) -> L.Trainer:
    kwargs = dict(
        accelerator="cpu",
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
        limit_val_batches=0,
    )
    trainer = L.Trainer(callbacks=callbacks, **{**kwargs, **trainer_kwargs})
    trainer.fit(module, train_dataloaders=_loader(), val_dataloaders=val_loader)
    return trainer


def test_grad_norm_is_the_global_l2_norm_of_all_gradients():
    module = _tiny_module()
    x = torch.randint(0, 256, (2, 16))
    _, loss = module.model(x, x)
    loss.backward()
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    manual = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
    assert torch.nn.utils.get_total_norm(grads).item() == pytest.approx(manual.item(), rel=1e-5)

    logged = {}
    module.log = lambda name, value, **_: logged.__setitem__(
        name, value
    )  # what on_before_optimizer_step logs
    module._trainer = SimpleNamespace(global_step=0, log_every_n_steps=1)
    module.on_before_optimizer_step(None)
    assert logged["train/grad_norm"].item() == pytest.approx(manual.item(), rel=1e-5)


def _manual_steps(state: dict, clip: float, algorithm: str, steps: int = 2) -> list[torch.Tensor]:
    # the reference: forward under bf16 autocast, backward, clip, the fused AdamW step, by hand
    torch.manual_seed(0)
    module = _tiny_module()
    module.model.load_state_dict(state)
    opt = torch.optim.AdamW(weight_decay_groups(module.model), lr=1e-3, fused=True)
    for i, (x, y) in enumerate(_loader()):
        if i == steps:
            break
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = module.model(x, y, return_logits=False)
        loss.backward()
        if algorithm == "value":
            torch.nn.utils.clip_grad_value_(module.model.parameters(), clip)
        else:
            torch.nn.utils.clip_grad_norm_(module.model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in module.model.parameters()]


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_bf16_mixed_clips_with_the_fused_kernel_like_the_manual_loop(tmp_path, algorithm):
    """Lightning refuses gradient clipping with a fused optimizer under any mixed precision (a float16 GradScaler
    concern); under bf16-mixed, which has none, the module clips itself. The run equals the same steps by hand,
    and the clip really bites (an unclipped run ends elsewhere)."""
    torch.manual_seed(0)
    module = _tiny_module()
    initial = {k: v.clone() for k, v in module.model.state_dict().items()}
    clip = 1e-3 if algorithm == "value" else 0.05  # far below this tiny model's first gradients
    trainer = _fit(
        module,
        [],
        tmp_path,
        precision="bf16-mixed",
        gradient_clip_val=clip,
        gradient_clip_algorithm=algorithm,
    )
    assert trainer.global_step == 2
    assert trainer.optimizers[0].defaults["fused"] is True
    trained = [p.detach() for p in module.model.parameters()]
    for got, want in zip(trained, _manual_steps(initial, clip, algorithm), strict=True):
        torch.testing.assert_close(got, want)
    unclipped = _manual_steps(initial, 1e9, algorithm)
    assert any(not torch.allclose(got, far) for got, far in zip(trained, unclipped, strict=True))


@pytest.mark.parametrize(("max_epochs", "label"), [(-1, "Training"), (3, "Epoch 0/2")])
def test_progress_bar_names_step_based_runs_without_a_negative_epoch_count(
    tmp_path, monkeypatch, max_epochs, label
):
    import gptmini.training.callbacks.console as console
    from gptmini.training.callbacks.console import ProgressBar

    monkeypatch.setattr(console, "console_is_terminal", lambda: True)  # the bar is drawn on a terminal only
    seen = []

    class Probe(L.Callback):  # runs after the bar's own hooks (callbacks run in list order)
        def on_train_batch_end(self, trainer, *args) -> None:
            seen.append(bar.progress.tasks[bar.train_progress_bar_id].description.strip())

    bar = ProgressBar()
    _fit(_tiny_module(), [bar, Probe()], tmp_path, max_epochs=max_epochs, enable_progress_bar=True)
    assert seen and set(seen) == {label}  # Lightning's own would read "Epoch 0/-2" for max_epochs=-1


def test_throughput_logs_tokens_once_per_optimizer_step(tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    from gptmini.training.callbacks.loggers import TokenThroughputMonitor

    monitor = TokenThroughputMonitor(window_size=2)
    trainer = _fit(
        _tiny_module(),
        [monitor],
        tmp_path,
        max_steps=3,
        accumulate_grad_batches=2,
        log_every_n_steps=1,
        logger=CSVLogger(tmp_path),
    )
    assert trainer.global_step == 3
    assert monitor.global_batch_tokens == 2 * 16 * 2  # batch x length x accumulate_grad_batches
    rows = list(csv.DictReader((tmp_path / "lightning_logs" / "version_0" / "metrics.csv").open()))
    seen = [float(r["perf/tokens_seen"]) for r in rows if r.get("perf/tokens_seen")]
    assert seen == [64.0, 128.0, 192.0]  # one row per optimizer step, not per micro-batch
    # the window holds two micro-batches from the second one on; every rate is positive
    assert monitor.last["perf/tokens_per_sec"] > 0 and monitor.last["perf/samples_per_sec"] > 0
    assert monitor.last["perf/flops_per_sec"] > 0
    with pytest.raises(ValueError, match="window_size"):
        TokenThroughputMonitor(window_size=1)


def test_throughput_leaves_a_validation_and_what_follows_it_out_of_the_training_time(tmp_path):
    """The monitor's batch-start hook is called only on the batch after a validation (it is off at the others):
    the time from the validation's start to that batch is still left out of the rates."""
    import time

    from gptmini.training.callbacks.loggers import TokenThroughputMonitor

    pause = 0.5

    class Clock(L.Callback):  # after the monitor: a slow validation end, and each step's end and rates
        def __init__(self) -> None:
            self.ends: list[float] = []
            self.rates: list[float] = []

        def on_validation_end(self, trainer, pl_module) -> None:
            if not trainer.sanity_checking:
                time.sleep(pause)  # work a validation holds the training thread for

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.ends.append(time.perf_counter())
            self.rates.append(monitor.last.get("perf/tokens_per_sec", 0.0))

    monitor, clock = TokenThroughputMonitor(window_size=2), Clock()
    trainer = _fit(
        _tiny_module(),
        [monitor, clock],
        tmp_path,
        val_loader=_loader(1),
        max_steps=3,
        log_every_n_steps=1,
        val_check_interval=2,
        limit_val_batches=1,
        num_sanity_val_steps=0,
    )
    assert trainer.global_step == 3
    # step 3's rate is over its window (from step 2's end): 32 tokens in the time from step 2's end to step 3's,
    # the validation and its pause left out
    counted = 2 * 16 / clock.rates[2]
    assert counted < clock.ends[2] - clock.ends[1] - 0.8 * pause


def test_parameter_summary_logs_params_without_flops(tmp_path, caplog):
    from gptmini.training.callbacks.console import ParameterSummary

    with caplog.at_level(logging.INFO, logger="gptmini.training.callbacks.console"):
        _fit(_tiny_module(), [ParameterSummary()], tmp_path, max_steps=1)
    (text,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model summary")]
    assert "| GPT " in text and "trainable params" in text and "Mode" in text
    assert "flops" not in text.lower()


def test_flops_per_batch_follows_the_batch_shape():
    import warnings

    module = GPTLightningModule(model_config=preset_config("tiny", vocab_size=256).to_dict())
    for b, t in ((2, 32), (3, 16), (2, 32)):
        x = torch.randint(0, 256, (b, t))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # self.log outside a Trainer
            module.training_step((x, x), 0)
        assert module.flops_per_batch == int(module.model.flops_per_token(t) * b * t)
