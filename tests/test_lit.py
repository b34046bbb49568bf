"""GPTLightningModule's optimizer: parameter groups and the AdamW kernel it picks per device."""

from functools import partial

import torch

from gptmini.lit import GPTLightningModule, optimizer_kernel_kwargs
from gptmini.model import PRESETS


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
        model_config=PRESETS["tiny"].to_dict(),
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
