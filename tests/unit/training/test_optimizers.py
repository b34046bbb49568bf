"""optimizer=muon: every parameter has exactly one role, only 2-D hidden matrices reach Muon, for every attention
of the zoo, every attention variant and the Llama blocks; MuonAdamW steps exactly as the two PyTorch optimizers
built by hand; its state dict round-trips (resume), and the module and config wire it."""

from __future__ import annotations

import copy
import inspect
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from benchmarks.common import preset_config
from gptmini.attention import available_attention
from gptmini.conf_dir import conf_dir
from gptmini.model import GPT, GPTConfig
from gptmini.training.loop.optimizers import ROLES, BatchedMuon, MuonAdamW
from gptmini.training.run.schema import option_settings

VARIANTS = sorted(p.stem for p in (conf_dir() / "attention_variant").glob("*.yaml"))
# optimizer=muon as a run composes it: its file over its constructors' defaults
MUON = OmegaConf.to_container(
    OmegaConf.merge(
        option_settings(conf_dir())["optimizer", "muon"],
        OmegaConf.load(conf_dir() / "optimizer" / "muon.yaml"),
    )
)
SETTINGS = {k: v for k, v in MUON.items() if not k.startswith("_")}


def _tiny(**kw) -> GPT:
    base = {
        "vocab_size": 50,
        "block_size": 16,
        "n_layer": 2,
        "n_head": 4,
        "n_embd": 32,
        "pad_vocab_multiple": 1,
    }
    return GPT(GPTConfig(**{**base, **kw}))


def _models() -> dict[str, GPT]:
    models = {f"attention={n}": _tiny(attention=n) for n in available_attention()}
    for v in VARIANTS:
        models[f"variant={v}"] = _tiny(
            **OmegaConf.to_container(OmegaConf.load(conf_dir() / "attention_variant" / f"{v}.yaml"))
        )
    models["llama_tiny"] = GPT(preset_config("llama_tiny", vocab_size=50))
    models["relu2_untied"] = _tiny(mlp="relu2", tie_weights=False, position="rope", qk_norm=True)
    models["attention_only"] = _tiny(mlp="none")
    # the input ingredients' tables are embeddings, their gates AdamW matrices and vectors: none reaches Muon
    models["ingredients"] = _tiny(value_embeds=1, smear_gate=True, bigram_embed=True, n_kv_head=2)
    return models


@pytest.mark.parametrize("name, model", list(_models().items()), ids=list(_models()))
def test_every_parameter_has_one_role_and_only_hidden_2d_matrices_reach_muon(name, model):
    roles = model.parameter_roles()
    assert set(roles) == set(ROLES)
    ids = [id(p) for ps in roles.values() for p in ps]
    assert len(ids) == len(set(ids)), "a parameter in two roles"
    assert set(ids) == {id(p) for p in model.parameters()}, "a parameter in no role"
    assert all(p.dim() == 2 for p in roles["hidden"])
    # the hidden matrices are exactly the blocks' attention and MLP weights: no embedding, head, norm or bias
    hidden = {id(p) for p in roles["hidden"]}
    names = {n for n, p in model.named_parameters() if id(p) in hidden}
    assert names and all(n.startswith("blocks.") and n.endswith(("weight", "in_proj_weight")) for n in names)
    assert not any("norm" in n or "ln_" in n for n in names)
    assert {id(model.wte.weight)} <= {id(p) for p in roles["embedding"]}
    # every 2-D block weight of a projection is hidden (the head and embeddings never are)
    block_2d = {n for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2}
    # the exceptions: additive's per-head scoring vectors and einsum's per-head bias tables (not projections)
    assert {n.rsplit(".", 1)[-1] for n in block_2d - names} <= {"v", "b_q", "b_k", "b_v"}
    stacked = model.stacked_projections()
    assert all(id(p) in hidden and sum(rows) == p.shape[0] for p, rows in stacked.items())
    optimizer = MuonAdamW(roles, stacked=stacked, **copy.deepcopy(SETTINGS))
    muon_params = {id(p) for g in optimizer.optimizers["muon"].param_groups for p in g["params"]}
    assert muon_params == hidden


def test_untied_head_is_its_own_role_and_a_tied_one_is_the_embedding():
    untied, tied = _tiny(tie_weights=False).parameter_roles(), _tiny().parameter_roles()
    assert len(untied["head"]) == 1 and untied["head"][0].shape == (50, 32)
    assert tied["head"] == []


def _params_and_grads(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = _tiny(position="rope", qk_norm=True, tie_weights=False)
    x = torch.randint(0, 50, (3, 16))
    _, loss = model(x, x.roll(-1, 1))
    loss.backward()
    return model


def test_muon_adamw_steps_exactly_as_the_two_pytorch_optimizers_built_by_hand():
    """The oracle: torch.optim.Muon over separate q, k and v matrices (copies of the fused weight's rows, with
    their rows of its gradient) and the other hidden matrices, torch.optim.AdamW over the rest."""
    a, b = _params_and_grads(), _params_and_grads()
    opt = MuonAdamW(a.parameter_roles(), stacked=a.stacked_projections(), **copy.deepcopy(SETTINGS))
    rb, stacked = b.parameter_roles(), b.stacked_projections()
    assert len(stacked) == 2 and all(rows == (32, 32, 32) for rows in stacked.values())  # one qkv per block
    separate: dict[int, list[torch.nn.Parameter]] = {}
    for p, rows in stacked.items():
        parts = [torch.nn.Parameter(w.detach().clone()) for w in p.split(rows)]
        for part, g in zip(parts, p.grad.split(rows), strict=True):
            part.grad = g.clone()
        separate[id(p)] = parts
    s = SETTINGS
    # BatchedMuon's own options (its keyword-only parameters) are all off in conf/optimizer/muon.yaml: plain Muon,
    # which takes none of them
    params = inspect.signature(BatchedMuon).parameters.values()
    options = {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}
    assert all(s["hidden"][k] == v for k, v in options.items())
    plain = {k: v for k, v in s["hidden"].items() if k not in options}
    muon = torch.optim.Muon([q for p in rb["hidden"] for q in separate.get(id(p), [p])], **plain)
    adamw = torch.optim.AdamW(
        [{"params": rb[r], **s[r]} for r in ("embedding", "head", "matrix", "vector") if rb[r]],
        betas=tuple(s["adamw"]["betas"]),
        eps=s["adamw"]["eps"],
    )
    for _ in range(3):  # the same gradients each step: momentum and moments accumulate alike
        opt.step()
        muon.step()
        adamw.step()
    with torch.no_grad():
        for p, parts in ((p, separate[id(p)]) for p in stacked):
            p.copy_(torch.cat(parts))  # the separate projections, stacked back
    for (n, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0, msg=n)
    # and orthogonalising per projection is not the same as orthogonalising the stacked matrix whole
    c = _params_and_grads()
    MuonAdamW(c.parameter_roles(), **copy.deepcopy(SETTINGS)).step()
    d = _params_and_grads()
    MuonAdamW(d.parameter_roles(), stacked=d.stacked_projections(), **copy.deepcopy(SETTINGS)).step()
    assert not torch.equal(c.blocks[0].attn.qkv.weight, d.blocks[0].attn.qkv.weight)
    torch.testing.assert_close(c.blocks[0].mlp.c_fc.weight, d.blocks[0].mlp.c_fc.weight, rtol=0, atol=0)
    assert {g["name"] for g in opt.param_groups} == {"hidden", "embedding", "head", "vector"}


def test_state_dict_round_trips_and_the_scheduler_sets_each_inner_optimizers_lr(tmp_path: Path):
    from gptmini.training.loop.schedulers import WarmupStableDecayLR

    a = _params_and_grads()
    opt = MuonAdamW(a.parameter_roles(), stacked=a.stacked_projections(), **copy.deepcopy(SETTINGS))
    sched = WarmupStableDecayLR(opt, max_steps=4, decay_fraction=0.5)
    for _ in range(3):
        opt.step()
        sched.step()
    assert opt.optimizers["muon"].param_groups[0]["lr"] == pytest.approx(0.02 * 0.5)
    assert opt.optimizers["adamw"].param_groups[0]["lr"] == pytest.approx(3e-3 * 0.5)
    path = tmp_path / "opt.pt"
    torch.save(opt.state_dict(), path)
    state = torch.load(path, weights_only=True)  # plain data: checkpoints load with weights_only=True
    b = _params_and_grads()
    b.load_state_dict(a.state_dict())
    opt_b = MuonAdamW(b.parameter_roles(), stacked=b.stacked_projections(), **copy.deepcopy(SETTINGS))
    opt_b.load_state_dict(state)
    assert [g["lr"] for g in opt_b.param_groups] == [g["lr"] for g in opt.param_groups]
    # one state per parameter, the q, k and v of each fused projection apart
    assert (
        len(opt_b.state)
        == len(opt.state)
        == sum(1 for _ in a.parameters()) + 2 * len(a.stacked_projections())
    )
    opt.step()
    opt_b.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0)
    with pytest.raises(ValueError, match="resume with the optimizer the checkpoint was trained with"):
        opt_b.load_state_dict({"adamw": state["adamw"]})


def test_the_module_builds_muon_from_roles_with_the_fused_adamw_kernel():
    from hydra.utils import instantiate

    from gptmini.training.loop.module import GPTLightningModule

    cfg = _tiny().config.to_dict()
    module = GPTLightningModule(cfg, optimizer=instantiate(OmegaConf.create(MUON)))
    optimizer = module.configure_optimizers()
    assert isinstance(optimizer, MuonAdamW)
    assert optimizer.optimizers["adamw"].defaults["fused"] is True
    assert optimizer.optimizers["muon"].param_groups[0]["lr"] == 0.02
    assert len(optimizer._projections) == module.config.n_layer  # each block's fused q/k/v, per projection


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["experiment=shakespeare_char_cpu"],
            r"optimizer\.betas, optimizer\.lr are not settings of .*MuonAdamW: its settings are per parameter role",
        ),
        (["optimizer.hidden.lr=0"], r"optimizer\.hidden\.lr=0 is invalid"),
        (["optimizer.embedding.weight_decay=-1"], r"optimizer\.embedding\.weight_decay=-1 is invalid"),
        (["trainer=fsdp"], r"cannot run under FSDP .* Use trainer=ddp"),
        (
            ["scheduler=wsd", "scheduler.decay_shape=exp"],
            r"scheduler\.decay_shape='exp' is invalid: valid shapes are linear, cosine, 1-sqrt",
        ),
        (["scheduler=wsd", "scheduler.decay_fraction=1.5"], r"scheduler\.decay_fraction=1\.5 is invalid"),
        (
            ["target_val_loss=1.9", "callbacks=none"],
            r"target_val_loss=1\.9 needs the callback that stops there",
        ),
    ],
)
def test_bad_muon_and_wsd_settings_fail_at_config_time(compose_cfg, overrides, message):
    from gptmini.training.errors import RunError
    from gptmini.training.run.plan import plan_run

    cfg = compose_cfg(["debug=smoke", "optimizer=muon", *overrides])
    with pytest.raises(RunError, match=message):
        plan_run(cfg)


@pytest.mark.parametrize(
    "overrides, message",
    [
        # the speedrun sets Muon's learning rate; swapping its optimizer for AdamW left optimizer.hidden in the
        # AdamW partial, which failed inside configure_optimizers with a traceback
        (
            ["experiment=speedrun_char_cpu", "data.source=${paths.data_root}/input.txt"],
            r"optimizer\.hidden is not a setting of torch\.optim\.AdamW: it is a per-role setting of "
            r"optimizer=muon: use optimizer=muon, or drop it \(~optimizer\.hidden\)",
        ),
        (
            ["+optimizer.hidden.lr=0.02", "+optimizer.head.lr=1e-3"],
            r"optimizer\.head, optimizer\.hidden are not settings of torch\.optim\.AdamW: they are per-role "
            r"settings .* \(~optimizer\.head ~optimizer\.hidden\)",
        ),
        (
            ["+optimizer.momentum=0.9"],
            r"optimizer\.momentum is not a setting of torch\.optim\.AdamW: its settings are ",
        ),
    ],
)
def test_a_plain_optimizer_refuses_keys_its_constructor_does_not_take(compose_cfg, overrides, message):
    from gptmini.training.errors import RunError
    from gptmini.training.run.plan import plan_run

    cfg = compose_cfg(["debug=smoke", *overrides, "optimizer=adamw"])
    with pytest.raises(RunError, match=message):
        plan_run(cfg)


@pytest.mark.parametrize("scheduler", ["warmup_cosine", "wsd"])
def test_a_scheduler_refuses_keys_its_constructor_does_not_take(compose_cfg, scheduler):
    from gptmini.training.errors import RunError
    from gptmini.training.run.plan import plan_run

    # the speedrun's WSD settings (decay_fraction) under scheduler=warmup_cosine failed with a TypeError traceback
    if scheduler == "warmup_cosine":
        overrides, message = (
            ["experiment=speedrun_char_cpu", "data.source=x.txt", "scheduler=warmup_cosine"],
            r"scheduler\.decay_fraction is not a setting of gptmini\.training\.loop\.schedulers\.WarmupCosineLR: its "
            r"settings are min_lr_ratio, warmup_steps; drop it \(~scheduler\.decay_fraction\)",
        )
    else:
        overrides, message = (
            ["debug=smoke", "scheduler=wsd", "+scheduler.cycles=2"],
            r"scheduler\.cycles is not a setting of gptmini\.training\.loop\.schedulers\.WarmupStableDecayLR",
        )
    with pytest.raises(RunError, match=message):
        plan_run(compose_cfg(overrides))


def test_a_plain_optimizer_takes_its_constructor_keywords(compose_cfg):
    from gptmini.training.run.plan import plan_run

    plan_run(
        compose_cfg(["debug=smoke", "optimizer=adamw", "optimizer.amsgrad=true", "optimizer.fused=true"])
    )
    plan_run(
        compose_cfg(
            ["experiment=speedrun_char_cpu", "data.source=x.txt", "optimizer=adamw", "~optimizer.hidden"]
        )
    )


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("adjust_lr_fn", ["original", "match_rms_adamw"])
def test_batched_muon_steps_as_torch_muon(nesterov, adjust_lr_fn):
    """The oracle: torch.optim.Muon's loop over matrices. Same-shaped matrices (wide, tall, square) are
    orthogonalised in one batched product; the parameters and the state must come out the same."""
    from gptmini.training.loop.optimizers import BatchedMuon

    torch.manual_seed(0)
    shapes = [(8, 24), (24, 8), (8, 24), (16, 16), (24, 8), (16, 16), (16, 16)]
    a = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    settings = dict(lr=0.05, weight_decay=0.1, momentum=0.9, nesterov=nesterov, adjust_lr_fn=adjust_lr_fn)
    batched, oracle = BatchedMuon(a, **settings), torch.optim.Muon(b, **settings)
    for step in range(3):
        grads = [torch.randn(s) for s in shapes]
        if step == 1:
            grads[2] = None  # a matrix without a gradient this step is left alone, as Muon leaves it
        for pa, pb, g in zip(a, b, grads, strict=True):
            pa.grad = None if g is None else g.clone()
            pb.grad = None if g is None else g.clone()
        batched.step()
        oracle.step()
    for pa, pb in zip(a, b, strict=True):
        torch.testing.assert_close(pa, pb)
        torch.testing.assert_close(batched.state[pa]["momentum_buffer"], oracle.state[pb]["momentum_buffer"])
    # the same state format: torch.optim.Muon loads what BatchedMuon saves
    c = [torch.nn.Parameter(p.detach().clone()) for p in a]
    reloaded = torch.optim.Muon(c, **settings)
    reloaded.load_state_dict(batched.state_dict())
    torch.testing.assert_close(
        reloaded.state[c[0]]["momentum_buffer"], batched.state[a[0]]["momentum_buffer"]
    )


def test_newton_schulz_orthogonalises_each_matrix_of_the_stack():
    """Independent check: after Muon's five quintic steps every singular value of each matrix lies near 1
    (Keller Jordan's iteration lands them in roughly [0.7, 1.2]), whatever the scale of the input."""
    from gptmini.training.loop.optimizers import newton_schulz

    torch.manual_seed(0)
    g = torch.randn(3, 16, 48) * torch.tensor([1e-3, 1.0, 1e3]).view(3, 1, 1)
    out = newton_schulz(g, (3.4445, -4.7750, 2.0315), 5, 1e-7).float()
    assert out.shape == g.shape
    s = torch.linalg.svdvals(out)
    assert s.min() > 0.6 and s.max() < 1.3, s
    tall = newton_schulz(g.mT, (3.4445, -4.7750, 2.0315), 5, 1e-7).float()
    torch.testing.assert_close(tall, out.mT)


def test_muon_adamw_follows_a_model_moved_after_it_was_built():
    """Lightning moves the module to the CPU after fit and then saves the final checkpoint: the stacked
    projections Muon steps must be the moved weight's rows, not views of the storage it had before."""
    model = _params_and_grads()
    opt = MuonAdamW(model.parameter_roles(), stacked=model.stacked_projections(), **copy.deepcopy(SETTINGS))
    opt.step()
    model.to(torch.float64)  # new storage for every parameter, as a move to another device gives
    for state in opt.state.values():  # and the state follows, as Lightning moves it with the module
        for k, v in state.items():
            if torch.is_tensor(v) and v.is_floating_point():
                state[k] = v.to(torch.float64)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    state = opt.state_dict()  # failed: a float32 view given the moved float64 gradient
    assert state["muon"]["state"]
    qkv = model.blocks[0].attn.qkv.weight
    before = qkv.detach().clone()
    opt.step()
    assert not torch.equal(qkv, before)  # the step reached the moved weight itself


# --- the speedrun's Muon options: NorMuon, cautious weight decay, momentum warmup ---------------------------


def _reference_muon(params, grads_per_step, *, lr, wd, momentum, start, warmup, beta2, normuon, cautious):
    """Muon with the options, one matrix at a time in float64, written from the formulas (modded-nanogpt's
    NorMuon and cautious weight decay): the oracle for BatchedMuon's batched float32 version."""
    from gptmini.training.loop.optimizers import muon_lr_scale, newton_schulz

    ps = [p.detach().double().clone() for p in params]
    bufs = [torch.zeros_like(p) for p in ps]
    seconds = [None] * len(ps)
    for step, grads in enumerate(grads_per_step):
        m = momentum if warmup == 0 else start + min(step / warmup, 1.0) * (momentum - start)
        for i, (p, g) in enumerate(zip(ps, grads, strict=True)):
            g = g.double()
            bufs[i] = m * bufs[i] + (1 - m) * g
            u = (1 - m) * g + m * bufs[i]  # Nesterov
            o = newton_schulz(u[None].float(), (3.4445, -4.775, 2.0315), 5, 1e-7)[0].double()
            if normuon:
                rows, cols = o.shape
                per_neuron = (o**2).mean(dim=1 if rows >= cols else 0, keepdim=True)
                prev = torch.zeros_like(per_neuron) if seconds[i] is None else seconds[i]
                seconds[i] = beta2 * prev + (1 - beta2) * per_neuron
                scaled = o / seconds[i].sqrt()
                o = scaled * (o.norm() / scaled.norm())
            mask = (o * p >= 0).double() if cautious else torch.ones_like(p)
            ps[i] = p - lr * wd * p * mask - lr * muon_lr_scale(p.shape, "original") * o
    return ps, seconds


@pytest.mark.parametrize(
    "options",
    [
        {"normuon": True},
        {"cautious_weight_decay": True},
        {"momentum_warmup_steps": 2, "momentum_warmup_start": 0.5},
        {"normuon": True, "cautious_weight_decay": True, "momentum_warmup_steps": 3},
    ],
    ids=["normuon", "cautious", "momentum_warmup", "all"],
)
def test_batched_muon_options_step_as_the_formulas(options):
    from gptmini.training.loop.optimizers import BatchedMuon

    torch.manual_seed(0)
    shapes = [(8, 24), (24, 8), (8, 24), (16, 16)]  # wide (per-column statistics), tall (per-row), square
    params = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    start = [p.detach().clone() for p in params]
    grads = [[torch.randn(s) for s in shapes] for _ in range(4)]
    opt = BatchedMuon(params, lr=0.05, weight_decay=0.3, momentum=0.9, adjust_lr_fn="original", **options)
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        opt.step()
    expected, seconds = _reference_muon(
        start,
        grads,
        lr=0.05,
        wd=0.3,
        momentum=0.9,
        start=options.get("momentum_warmup_start", 0.85),
        warmup=options.get("momentum_warmup_steps", 0),
        beta2=0.95,
        normuon=options.get("normuon", False),
        cautious=options.get("cautious_weight_decay", False),
    )
    for p, e in zip(params, expected, strict=True):
        torch.testing.assert_close(p.double(), e, rtol=2e-4, atol=2e-5)
    if options.get("normuon"):
        for p, s in zip(params, seconds, strict=True):
            torch.testing.assert_close(
                opt.state[p]["second_momentum_buffer"].double(), s, rtol=1e-4, atol=1e-8
            )
    assert all(opt.state[p]["step"] == 4 for p in params)


def test_normuon_evens_out_the_neurons_and_keeps_the_update_norm():
    from gptmini.training.loop.optimizers import normuon_scale

    torch.manual_seed(0)
    o = torch.randn(3, 12, 5) * torch.linspace(0.1, 3.0, 12)[:, None]  # tall: rows of very different sizes
    second = torch.zeros(3, 12, 1)
    out = normuon_scale(o, second, beta2=0.0)  # beta2=0: this step's statistics alone
    torch.testing.assert_close(out.norm(dim=(-2, -1)), o.norm(dim=(-2, -1)))
    row_rms = out.square().mean(-1)
    torch.testing.assert_close(row_rms, row_rms[:, :1].expand_as(row_rms))  # every row the same size
    torch.testing.assert_close(second, o.square().mean(-1, keepdim=True))


def test_cautious_weight_decay_spares_the_weights_the_update_pushes_away_from_zero():
    from gptmini.training.loop.optimizers import BatchedMuon, newton_schulz

    torch.manual_seed(1)
    w = torch.randn(6, 6)
    g = torch.randn(6, 6)
    plain, cautious = torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.clone())
    no_decay = torch.nn.Parameter(w.clone())
    for p, kw in ((plain, {}), (cautious, {"cautious_weight_decay": True}), (no_decay, {})):
        p.grad = g.clone()
        decay = 0.0 if p is no_decay else 0.5
        BatchedMuon([p], lr=0.1, weight_decay=decay, momentum=0.0, nesterov=False, **kw).step()
    o = newton_schulz(g[None], (3.4445, -4.775, 2.0315), 5, 1e-7)[0]
    same_sign = o * w >= 0
    assert same_sign.any() and (~same_sign).any()
    # where the step moves the weight away from zero, no decay; elsewhere the plain decoupled decay
    torch.testing.assert_close(cautious[~same_sign], no_decay[~same_sign])
    torch.testing.assert_close(cautious[same_sign], plain[same_sign])


def test_momentum_warmup_ramps_linearly_then_holds():
    from gptmini.training.loop.optimizers import warmup_momentum

    group = {"momentum": 0.95, "momentum_warmup_start": 0.85, "momentum_warmup_steps": 4}
    got = [warmup_momentum(s, group) for s in range(7)]
    assert got == pytest.approx([0.85, 0.875, 0.9, 0.925, 0.95, 0.95, 0.95])
    assert warmup_momentum(0, {**group, "momentum_warmup_steps": 0}) == 0.95


def test_muon_options_resume_exactly_from_a_saved_state(tmp_path: Path):
    """Three steps, save, load into a fresh model and optimizer, three more: the same weights as six steps in one
    go (the NorMuon buffers and the momentum warmup's step count are in the state)."""
    options = {
        "normuon": True,
        "beta2": 0.9,
        "cautious_weight_decay": True,
        "momentum_warmup_steps": 5,
        "weight_decay": 0.1,
    }
    settings = copy.deepcopy(SETTINGS)
    settings["hidden"] |= options

    def run(model, opt, steps, seed):
        for s in range(steps):
            torch.manual_seed(seed + s)
            idx = torch.randint(0, 50, (2, 16))
            _, loss = model(idx, idx.roll(-1, 1))
            loss.backward()
            opt.step()
            opt.zero_grad()

    torch.manual_seed(0)
    whole = _tiny(position="rope", qk_norm=True)
    resumed = copy.deepcopy(whole)
    opt = MuonAdamW(whole.parameter_roles(), stacked=whole.stacked_projections(), **copy.deepcopy(settings))
    run(whole, opt, 6, 100)
    first = MuonAdamW(
        resumed.parameter_roles(), stacked=resumed.stacked_projections(), **copy.deepcopy(settings)
    )
    run(resumed, first, 3, 100)
    torch.save({"model": resumed.state_dict(), "opt": first.state_dict()}, tmp_path / "ckpt.pt")
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    again = _tiny(position="rope", qk_norm=True)
    again.load_state_dict(ckpt["model"])
    second = MuonAdamW(
        again.parameter_roles(), stacked=again.stacked_projections(), **copy.deepcopy(settings)
    )
    second.load_state_dict(ckpt["opt"])
    assert second.optimizers["muon"].param_groups[0]["normuon"] is True
    run(again, second, 3, 103)
    for pa, pb in zip(whole.parameters(), again.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0)


@pytest.mark.parametrize(
    "override, message",
    [
        ("optimizer.hidden.beta2=1.5", r"optimizer\.hidden\.beta2=1\.5 is invalid: it must be in \[0, 1\)"),
        ("optimizer.hidden.normuon=3", r"optimizer\.hidden\.normuon=3 is invalid: true or false"),
        (
            "optimizer.hidden.momentum_warmup_steps=-2",
            r"optimizer\.hidden\.momentum_warmup_steps=-2 is invalid: a number of optimizer steps >= 0",
        ),
        (
            "+optimizer.hidden.normuon_beta=0.9",
            r"optimizer\.hidden\.normuon_beta is not a setting of optimizer\.hidden: its settings are .*normuon",
        ),
    ],
)
def test_bad_muon_options_fail_at_config_time(compose_cfg, override, message):
    from gptmini.training.errors import RunError
    from gptmini.training.run.plan import plan_run

    with pytest.raises(RunError, match=message):
        plan_run(compose_cfg(["debug=smoke", "optimizer=muon", override]))


def test_cautious_weight_decay_of_an_adamw_role_steps_as_the_formula():
    """An AdamW role with cautious weight decay against Adam written out in float64: the decay (lr * wd * weight)
    only where the Adam step and the weight have the same sign; the other roles keep AdamW's plain decay."""
    torch.manual_seed(0)
    cautious_w, plain_w = torch.randn(6, 5), torch.randn(7)
    cautious, plain = torch.nn.Parameter(cautious_w.clone()), torch.nn.Parameter(plain_w.clone())
    settings = copy.deepcopy(SETTINGS)
    settings["matrix"] = {"lr": 0.05, "weight_decay": 0.5, "cautious_weight_decay": True}
    settings["vector"] = {"lr": 0.05, "weight_decay": 0.5}
    opt = MuonAdamW({"matrix": [cautious], "vector": [plain]}, **settings)
    grads = [(torch.randn(6, 5), torch.randn(7)) for _ in range(3)]
    for gc, gp in grads:
        cautious.grad, plain.grad = gc.clone(), gp.clone()
        opt.step()
    beta1, beta2 = settings["adamw"]["betas"]
    eps = settings["adamw"]["eps"]

    def adam(w, gs, is_cautious):
        p, m, v = (
            w.double().clone(),
            torch.zeros_like(w, dtype=torch.float64),
            torch.zeros_like(w, dtype=torch.float64),
        )
        for t, g in enumerate(gs, start=1):
            g = g.double()
            m = beta1 * m + (1 - beta1) * g
            v = beta2 * v + (1 - beta2) * g * g
            step = 0.05 * (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt() + eps)
            mask = (step * p > 0).double() if is_cautious else torch.ones_like(p)
            p = p - 0.05 * 0.5 * p * mask - step
        return p

    want_cautious = adam(cautious_w, [g for g, _ in grads], True)
    torch.testing.assert_close(cautious.double(), want_cautious, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        plain.double(), adam(plain_w, [g for _, g in grads], False), rtol=1e-5, atol=1e-6
    )
    assert not torch.allclose(want_cautious, adam(cautious_w, [g for g, _ in grads], False))
    # the setting is the group's own: saved with it, and the decay is back in place after the step
    group = opt.optimizers["adamw"].param_groups[0]
    assert group["cautious_weight_decay"] is True and group["weight_decay"] == 0.5


def test_a_bad_adamw_role_cautious_setting_fails_at_config_time(compose_cfg):
    from gptmini.training.errors import RunError
    from gptmini.training.run.plan import plan_run

    cfg = compose_cfg(["debug=smoke", "optimizer=muon", "optimizer.matrix.cautious_weight_decay=3"])
    with pytest.raises(
        RunError, match=r"optimizer\.matrix\.cautious_weight_decay=3 is invalid: true or false"
    ):
        plan_run(cfg)


def test_a_loaded_state_keeps_the_optimizer_s_own_settings_and_takes_the_saved_buffers():
    """keep_own_settings, as a resumed run registers it (GPTLightningModule.configure_optimizers): a plain AdamW
    loaded from a state saved under other settings trains under its own lr, weight decay, betas and eps, with the
    saved moments and step counts unchanged."""
    from gptmini.training.loop.optimizers import keep_own_settings

    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
    first = torch.optim.AdamW([{"params": weights[:1]}, {"params": weights[1:], "weight_decay": 0.0}], lr=0.1)
    for _ in range(2):
        first.zero_grad()
        sum((w**2).sum() for w in weights).backward()
        first.step()
    saved = copy.deepcopy(first.state_dict())
    own = {"lr": 0.01, "weight_decay": 0.5, "betas": (0.8, 0.9), "eps": 1e-6}
    resumed = torch.optim.AdamW(
        [{"params": weights[:1]}, {"params": weights[1:], "weight_decay": 0.0}], **own
    )
    resumed.register_load_state_dict_pre_hook(keep_own_settings)
    resumed.load_state_dict(saved)
    assert [{k: g[k] for k in own} for g in resumed.param_groups] == [own, {**own, "weight_decay": 0.0}]
    for index, weight in enumerate(weights):
        for name, want in saved["state"][index].items():
            torch.testing.assert_close(resumed.state[weight][name], want, rtol=0, atol=0)


def test_muon_adamw_runs_a_load_hook_in_each_inner_optimizer():
    """MuonAdamW loads through its inner optimizers: a load_state_dict pre-hook registered on it runs in each, with
    that optimizer and its part of the state, and its handle removes it from all."""
    opt = MuonAdamW(_tiny().parameter_roles(), **copy.deepcopy(SETTINGS))
    seen = []
    handle = opt.register_load_state_dict_pre_hook(lambda inner, state: seen.append((inner, set(state))))
    opt.load_state_dict(opt.state_dict())
    assert [inner for inner, _ in seen] == list(opt.optimizers.values())
    assert all(keys == {"state", "param_groups"} for _, keys in seen)
    handle.remove()
    opt.load_state_dict(opt.state_dict())
    assert len(seen) == 2
