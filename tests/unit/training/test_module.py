"""GPTLightningModule's optimizer: parameter groups and the AdamW kernel it picks per device."""

from functools import partial

import torch

from gptmini.model import GPTConfig
from gptmini.training.module import GPTLightningModule, optimizer_kernel_kwargs


def test_kernel_choice_per_device_and_config_wins():
    adamw = partial(torch.optim.AdamW, lr=1e-3)
    assert optimizer_kernel_kwargs(adamw, "cpu") == {"foreach": True}
    assert optimizer_kernel_kwargs(adamw, "cuda") == {"fused": True}
    # a kernel chosen in the config (optimizer.fused=true / optimizer.foreach=false) is never overridden
    assert optimizer_kernel_kwargs(partial(torch.optim.AdamW, fused=True), "cpu") == {}
    assert optimizer_kernel_kwargs(partial(torch.optim.AdamW, foreach=False), "cuda") == {}
    # an optimizer without these options gets none
    assert optimizer_kernel_kwargs(partial(torch.optim.SGD, lr=0.1), "cpu") == {"foreach": True}
    assert optimizer_kernel_kwargs(partial(torch.optim.LBFGS, lr=0.1), "cpu") == {}


def test_configure_optimizers_decays_matrices_only_with_the_cpu_kernel():
    module = GPTLightningModule(
        model_config=GPTConfig.from_preset("tiny", vocab_size=256).to_dict(),
        optimizer=partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.1),
    )
    opt = module.configure_optimizers()
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.defaults["foreach"] is True
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    # every trainable parameter is in exactly one group (the tied embedding/LM head once)
    ids = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(module.model.parameters()))


def test_progress_bar_names_step_based_runs_without_a_negative_epoch_count():
    import lightning as L

    from gptmini.training.callbacks import ProgressBar

    def description(max_epochs: int) -> str:
        bar = ProgressBar()
        trainer = L.Trainer(max_epochs=max_epochs, max_steps=5, logger=False, enable_checkpointing=False)
        bar.setup(trainer, None, stage="fit")
        return bar._get_train_description(0).strip()

    assert description(-1) == "Training"  # Lightning's own would read "Epoch 0/-2"
    assert description(3) == "Epoch 0/2"


def test_flops_per_batch_follows_the_batch_shape():
    import warnings

    module = GPTLightningModule(model_config=GPTConfig.from_preset("tiny", vocab_size=256).to_dict())
    for b, t in ((2, 32), (3, 16), (2, 32)):
        x = torch.randint(0, 256, (b, t))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # self.log outside a Trainer
            module.training_step((x, x), 0)
        assert module.flops_per_batch == int(module.model.flops_per_token(t) * b * t)
