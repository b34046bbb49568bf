"""Muon for the hidden matrices, AdamW for the rest: two PyTorch optimizers behind one ``Optimizer``.

Lightning (automatic optimization, gradient accumulation, clipping, checkpoints), the learning-rate schedulers
and ``LearningRateMonitor`` see a single optimizer whose ``param_groups`` are the two inner optimizers' own
group dicts (a scheduler that sets a group's ``lr`` sets it in the optimizer that uses it) and whose state dict
holds both inner state dicts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

# the parameter roles of GPT.parameter_roles; "hidden" goes to Muon, the others to AdamW, each its own group
ROLES = ("hidden", "embedding", "head", "matrix", "vector")
ADAMW_ROLES = ROLES[1:]


def newton_schulz(
    updates: Tensor, coefficients: tuple[float, float, float], steps: int, eps: float
) -> Tensor:
    """Muon's orthogonalisation (``torch.optim.Muon``'s quintic Newton-Schulz iteration, in bf16) of a stack of
    same-shaped matrices at once: ``(N, rows, cols) -> (N, rows, cols)``."""
    a, b, c = coefficients
    x = updates.bfloat16()
    tall = updates.size(-2) > updates.size(-1)
    if tall:
        x = x.mT  # iterate on the wide orientation: the Gram matrix is the smaller one
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)  # each spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.mT  # (N, r, r), r = min(rows, cols)
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.baddbmm(x, poly, x, beta=a)
    return x.mT if tall else x


def muon_lr_scale(shape: torch.Size, adjust_lr_fn: str | None) -> float:
    """The factor ``torch.optim.Muon`` scales a matrix's learning rate by (its ``adjust_lr_fn``)."""
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1.0, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return 1.0


def check_muon_options(settings: Mapping[str, Any], prefix: str = "optimizer.hidden") -> None:
    """Raises ValueError naming the first invalid setting of Muon's in ``settings``: the ones
    ``torch.optim.Muon`` leaves unchecked (its momentum below 1, at least one Newton-Schulz step) and
    ``BatchedMuon``'s own options. The config's plan runs this by building the optimizer on a stand-in."""
    lr = settings.get("lr", 1.0)
    if isinstance(lr, (int, float)) and not lr > 0:  # a zero learning rate trains nothing, without a word
        raise ValueError(
            f"{prefix}.lr={lr:g} is invalid: the learning rate must be > 0 (e.g. {prefix}.lr=0.02)"
        )
    momentum = settings.get("momentum", 0.0)
    if isinstance(momentum, (int, float)) and not isinstance(momentum, bool) and not momentum < 1.0:
        # a momentum of 1 or more never forgets a gradient (the buffer grows without bound)
        raise ValueError(f"{prefix}.momentum={momentum!r} is invalid: it must be in [0, 1) (0.95 is usual)")
    steps = settings.get("ns_steps", 1)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(
            f"{prefix}.ns_steps={steps!r} is invalid: Newton-Schulz iterations, an integer >= 1 (5 is usual)"
        )
    for key in ("beta2", "momentum_warmup_start"):
        value = settings.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            raise ValueError(
                f"{prefix}.{key}={value!r} is invalid: it must be in [0, 1) (0.95 / 0.85 are usual)"
            )
    steps = settings.get("momentum_warmup_steps", 0)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(
            f"{prefix}.momentum_warmup_steps={steps!r} is invalid: a number of optimizer steps >= 0 (0: no warmup)"
        )


def warmup_momentum(step: int, group: Mapping[str, Any]) -> float:
    """Muon's momentum at optimizer ``step`` (0-based): with ``momentum_warmup_steps`` N > 0 it ramps linearly from
    ``momentum_warmup_start`` to the group's ``momentum`` over the first N steps (modded-nanogpt), flat after."""
    n = group["momentum_warmup_steps"]
    if n <= 0:
        return group["momentum"]
    frac = min(step / n, 1.0)
    return (1 - frac) * group["momentum_warmup_start"] + frac * group["momentum"]


def normuon_scale(ortho: Tensor, second_moment: Tensor, beta2: float) -> Tensor:
    """NorMuon's variance normalisation (Li et al.; modded-nanogpt, nanochat) of a stack of orthogonalised updates
    ``(N, rows, cols)``: each neuron's mean square (per row of a tall or square matrix, per column of a wide one) is
    averaged over steps into ``second_moment`` (``(N, rows, 1)`` or ``(N, 1, cols)``, updated in place, decay
    ``beta2``), the update is divided by its root, then rescaled so that each matrix keeps its Frobenius norm: the
    neurons' step sizes are evened out, the update's size stays Muon's. Returns float32."""
    o = ortho.float()
    dim = -1 if o.size(-2) >= o.size(-1) else -2
    second_moment.lerp_(o.square().mean(dim=dim, keepdim=True), 1 - beta2)
    scaled = o * second_moment.clamp_min(1e-10).rsqrt()
    keep = o.norm(dim=(-2, -1), keepdim=True) / scaled.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-10)
    return scaled * keep


class BatchedMuon(torch.optim.Muon):
    """``torch.optim.Muon`` whose Newton-Schulz iterations run once per shape: the momentum updates of a group's
    same-shaped matrices are stacked and orthogonalised by batched products. The update and the state (one
    ``momentum_buffer`` per parameter) are Muon's own; only the number of kernel launches changes, from a dozen or
    so per matrix to as many per shape. That is what keeps a GPU busy when the hidden matrices are small (a few
    hundred wide), where ``torch.optim.Muon``'s loop over matrices is bound by launches.

    Options beyond Muon's (its keyword-only parameters, all off by default; each one's help is
    beside it), from the GPT-2 speedrun (modded-nanogpt) and nanochat: each a group setting saved with the group,
    their state in the per-parameter state (``second_momentum_buffer`` for ``normuon``; ``step`` for the momentum
    warmup, so a resumed run continues the ramp where it was). Cautious weight decay: Chen et al."""

    def __init__(
        self,
        params: Any,
        *,
        # NorMuon (modded-nanogpt, nanochat): each neuron's share of the orthogonalised update evened out by a
        # running second moment (decay beta2), the update's norm kept
        normuon: bool = False,
        # the decay of NorMuon's running second moment (normuon=true)
        beta2: float = 0.95,
        # decay only the weights the update already moves towards zero (update and weight of the same sign); an
        # AdamW role takes it too (optimizer.matrix.cautious_weight_decay=true)
        cautious_weight_decay: bool = False,
        # the momentum ramps from momentum_warmup_start to momentum over the first momentum_warmup_steps steps
        # (0: none)
        momentum_warmup_steps: int = 0,
        # the momentum the warmup starts from (momentum_warmup_steps > 0)
        momentum_warmup_start: float = 0.85,
        **muon: Any,
    ) -> None:
        # **muon: torch.optim.Muon's own settings (the config's schema reads them from its signature)
        options = {
            "normuon": normuon,
            "beta2": beta2,
            "cautious_weight_decay": cautious_weight_decay,
            "momentum_warmup_steps": momentum_warmup_steps,
            "momentum_warmup_start": momentum_warmup_start,
        }
        check_muon_options({**muon, **options})
        super().__init__(params, **muon)
        self.defaults.update(options)
        for group in self.param_groups:
            for k, v in options.items():
                group.setdefault(k, v)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._step_group(group)
        return loss

    def _momentum_updates(self, params: list[nn.Parameter], group: dict[str, Any]) -> list[Tensor]:
        """Each parameter's momentum buffer moved towards its gradient, and its update (Nesterov: the gradient
        moved towards the buffer; else the buffer): one multi-tensor kernel per momentum value instead of one or
        two per matrix (the parameters of a group share their step count, hence their momentum, unless resumed
        from mixed states)."""
        by_momentum: dict[float, list[nn.Parameter]] = {}
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
            by_momentum.setdefault(warmup_momentum(state.get("step", 0), group), []).append(p)
            state["step"] = state.get("step", 0) + 1
        updates: dict[nn.Parameter, Tensor] = {}
        for momentum, same in by_momentum.items():
            grads = [p.grad for p in same]
            bufs = [self.state[p]["momentum_buffer"] for p in same]
            torch._foreach_lerp_(bufs, grads, 1 - momentum)
            moved = torch._foreach_lerp(grads, bufs, momentum) if group["nesterov"] else bufs
            updates.update(zip(same, moved, strict=True))
        return [updates[p] for p in params]

    def _second_moments(self, params: list[nn.Parameter]) -> Tensor:
        # each matrix's NorMuon buffer, stacked: (N, rows, 1) for tall or square matrices, (N, 1, cols) for wide
        rows, cols = params[0].shape
        shape = (rows, 1) if rows >= cols else (1, cols)
        for p in params:
            if "second_momentum_buffer" not in self.state[p]:
                self.state[p]["second_momentum_buffer"] = p.new_zeros(shape, dtype=torch.float32)
        return torch.stack([self.state[p]["second_momentum_buffer"] for p in params])

    def _step_group(self, group: dict[str, Any]) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        by_shape: dict[tuple[Any, ...], list[tuple[nn.Parameter, Tensor]]] = {}
        for p, update in zip(params, self._momentum_updates(params, group), strict=True):
            by_shape.setdefault((tuple(p.shape), p.device, p.dtype), []).append((p, update))
        lr = float(group["lr"])
        decay = lr * group["weight_decay"]
        for (shape, _, _), items in by_shape.items():
            params = [p for p, _ in items]
            stacked = torch.stack([u for _, u in items])  # (N, rows, cols)
            ortho = newton_schulz(stacked, group["ns_coefficients"], group["ns_steps"], group["eps"])
            if group["normuon"]:
                second = self._second_moments(params)  # (N, rows, 1) or (N, 1, cols)
                ortho = normuon_scale(ortho, second, group["beta2"])
                for p, s in zip(params, second.unbind(0), strict=True):
                    self.state[p]["second_momentum_buffer"].copy_(s)
            step = lr * muon_lr_scale(torch.Size(shape), group["adjust_lr_fn"])
            updates = list(ortho.unbind(0))
            if group["cautious_weight_decay"]:
                # decay only the coordinates the step moves towards zero: update (-o) and weight of opposite
                # signs, o * p >= 0
                for p, o in zip(params, updates, strict=True):
                    p.sub_(p * (o * p >= 0), alpha=decay)
            else:
                torch._foreach_mul_(params, 1 - decay)
            # one multi-tensor kernel for the shape's matrices, as the decay above
            torch._foreach_add_(params, updates, alpha=-step)


@dataclass
class AdamWRole:
    """The settings of one AdamW parameter group of ``MuonAdamW`` (``optimizer.embedding|head|matrix|vector``);
    null takes the value of ``optimizer.adamw``, else AdamW's default."""

    # this role's learning rate; null: AdamW's default
    lr: float | None = None
    # this role's decoupled weight decay; null: AdamW's default
    weight_decay: float | None = None
    # decay only where the Adam step moves the weight towards zero (cautious_adamw_step)
    cautious_weight_decay: bool = False

    def group(self, role: str) -> dict[str, Any]:
        """The parameter group's settings, with the key of each bad one named."""
        if self.lr is not None and not self.lr > 0:  # a zero learning rate trains nothing, without a word
            raise ValueError(f"optimizer.{role}.lr={self.lr:g} is invalid: the learning rate must be > 0")
        if self.weight_decay is not None and not self.weight_decay >= 0:
            raise ValueError(
                f"optimizer.{role}.weight_decay={self.weight_decay:g} is invalid: it must be >= 0"
            )
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def cautious_adamw_step(adamw: torch.optim.Optimizer) -> None:
    """``adamw.step()``, with cautious weight decay in the groups that set ``cautious_weight_decay``: the decoupled
    decay (``lr * weight_decay`` of the weight before the step) only where the Adam step moves the weight towards
    zero. The step runs without decay in those groups; the direction it took (before minus after) gives the mask."""
    cautious = [g for g in adamw.param_groups if g.get("cautious_weight_decay") and g["weight_decay"] > 0]
    saved = []
    for g in cautious:
        params = [p for p in g["params"] if p.grad is not None]
        saved.append((g, g["weight_decay"], params, [p.detach().clone() for p in params]))
        g["weight_decay"] = 0.0
    try:
        adamw.step()
    finally:
        for g, decay, _, _ in saved:
            g["weight_decay"] = decay
    with torch.no_grad():
        for g, decay, params, before in saved:
            for p, b in zip(params, before, strict=True):
                p.sub_(b * ((b - p) * b > 0), alpha=g["lr"] * decay)


def keep_own_settings(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    """A ``load_state_dict`` pre-hook (``Optimizer.register_load_state_dict_pre_hook``): the saved state's buffers
    (momentum, Adam's moments, step counts) under this optimizer's own group settings (lr, weight decay, momentum,
    betas, eps, ...), so that a run resumed with other settings trains under them from its first step. Each saved
    group keeps its parameter ids, which map its buffers to the parameters."""
    saved = state_dict["param_groups"]
    if len(saved) != len(optimizer.param_groups):
        return state_dict  # torch refuses the mismatch itself
    groups = [
        {**was, **{k: v for k, v in own.items() if k != "params"}, "params": was["params"]}
        for was, own in zip(saved, optimizer.param_groups, strict=True)
    ]
    return {**state_dict, "param_groups": groups}


class HookHandles:
    """The handles of one hook registered on several optimizers, removed together (``RemovableHandle``'s use)."""

    def __init__(self, handles: list[RemovableHandle]) -> None:
        self.handles = handles

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


class MuonAdamW(torch.optim.Optimizer):
    """Muon (Jordan et al.; ``BatchedMuon``: ``torch.optim.Muon`` batched by shape) on the ``hidden`` matrices and
    ``torch.optim.AdamW`` on the embeddings, the LM head, other matrices and vectors, each role one named parameter
    group with its own ``lr`` and ``weight_decay`` (``hidden``: Muon's settings; ``adamw``: AdamW's betas and
    eps, shared by its groups).

    ``stacked``: hidden matrices that stack several projections by rows (a fused [W_q; W_k; W_v]), with each
    one's row count. Muon orthogonalises each projection's rows on its own: measured against orthogonalising the
    fused matrix whole, it reached a lower loss in the same steps (docs/benchmarks.md, "Training recipe"). It
    steps one parameter per projection that shares the fused weight's memory (``torch.optim.Muon`` orthogonalises
    whole parameters); everything outside the step (clipping, ``zero_grad``, the schedulers) sees the fused
    weight."""

    # built from GPT.parameter_roles(), not from a flat parameter list (GPTLightningModule reads this)
    takes_parameter_roles = True
    # Muon orthogonalises each whole matrix, which FSDP shards across devices (the plan refuses the pair)
    runs_under_fsdp = False
    # the constructor each settings node is passed to, less what MuonAdamW passes itself: the config's schema of
    # the node is that constructor's signature (gptmini.training.run.schema.signature_spec)
    settings_of: ClassVar[dict[str, tuple[Any, tuple[str, ...]]]] = {
        "hidden": (BatchedMuon, ("params",)),
        "adamw": (torch.optim.AdamW, ("params", "lr", "weight_decay", "fused", "foreach")),
        **{role: (AdamWRole, ()) for role in ADAMW_ROLES},
    }

    def __init__(
        self,
        roles: dict[str, list[nn.Parameter]],
        hidden: Mapping[str, Any],
        adamw: Mapping[str, Any],
        embedding: Mapping[str, Any],
        head: Mapping[str, Any],
        matrix: Mapping[str, Any],
        vector: Mapping[str, Any],
        # AdamW's fused kernel (as torch.optim.AdamW's fused); null: PyTorch's choice
        fused: bool | None = None,
        # AdamW's foreach kernel (as torch.optim.AdamW's foreach); null: PyTorch's choice
        foreach: bool | None = None,
        stacked: dict[nn.Parameter, tuple[int, ...]] | None = None,
    ) -> None:
        nodes = (embedding, head, matrix, vector)
        settings = {
            role: AdamWRole(**node).group(role) for role, node in zip(ADAMW_ROLES, nodes, strict=True)
        }
        unknown = sorted(set(roles) - set(ROLES))
        if unknown:
            raise ValueError(f"unknown parameter role(s) {unknown}: expected {', '.join(ROLES)}")
        adam_groups = [{"params": roles[r], "name": r, **settings[r]} for r in ADAMW_ROLES if roles.get(r)]
        kernel = {k: v for k, v in (("fused", fused), ("foreach", foreach)) if v is not None}
        adam_defaults = dict(adamw)
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        # per stacked hidden matrix: its projections as parameters viewing its rows (what Muon steps)
        self._projections: list[tuple[nn.Parameter, list[nn.Parameter]]] = []
        for p in roles.get("hidden", []):
            rows = (stacked or {}).get(p)
            if rows is None:
                continue
            views = [nn.Parameter(v) for v in p.detach().split(list(rows))]  # the same memory, not a copy
            self._projections.append((p, views))
        muon_settings = dict(hidden)
        check_muon_options(muon_settings)  # also without hidden matrices: a bad setting is bad either way
        if roles.get("hidden"):
            if "ns_coefficients" in muon_settings:
                muon_settings["ns_coefficients"] = tuple(muon_settings["ns_coefficients"])
            self.optimizers["muon"] = BatchedMuon(
                [{"params": roles["hidden"], "name": "hidden"}], **muon_settings
            )
        if adam_groups:
            if "betas" in adam_defaults:
                adam_defaults["betas"] = tuple(adam_defaults["betas"])
            self.optimizers["adamw"] = torch.optim.AdamW(adam_groups, **adam_defaults, **kernel)
        # The base class is given every parameter once (it checks them, and refuses none); its groups are then replaced by the
        # inner optimizers' own dicts.
        params = [p for opt in self.optimizers.values() for g in opt.param_groups for p in g["params"]]
        super().__init__(params, {})
        self.param_groups = [g for opt in self.optimizers.values() for g in opt.param_groups]

    @contextlib.contextmanager
    def _muon_steps_projections(self) -> Iterator[None]:
        """Within: Muon's group holds each stacked matrix's projections in its place (with the matching rows of its
        gradient), so that Muon steps, saves and loads them; outside, the stacked matrices themselves."""
        muon = self.optimizers.get("muon")
        if muon is None or not self._projections:
            yield
            return
        owners = muon.param_groups[0]["params"]
        views = {id(p): parts for p, parts in self._projections}
        for p, parts in self._projections:
            rows = [v.shape[0] for v in parts]
            grads = (None,) * len(parts) if p.grad is None else p.grad.split(rows)
            for v, w, g in zip(parts, p.detach().split(rows), grads, strict=True):
                # the rows of the weight as it is now: moving the module (Lightning moves it to the CPU after
                # fit, before the final checkpoint) gives its parameters new storage, which older views miss
                v.data = w
                v.grad = g
        muon.param_groups[0]["params"] = [v for p in owners for v in views.get(id(p), [p])]
        try:
            yield
        finally:
            # (on the group dict Muon holds now: load_state_dict replaces it)
            muon.param_groups[0]["params"] = owners
            for _, parts in self._projections:
                for v in parts:
                    v.grad = None

    @property  # type: ignore[override]
    def state(self) -> dict[torch.Tensor, Any]:
        """Each parameter's state, from the inner optimizer that holds it (the per-parameter dicts themselves,
        so that moving them in place, as Lightning does on resume, moves the inner optimizers' state)."""
        return {p: s for opt in self.optimizers.values() for p, s in opt.state.items()}

    @state.setter
    def state(self, value: Any) -> None:
        # The base class's constructor sets an empty state of its own; the inner optimizers hold the real one.
        if value:
            raise AttributeError(
                "MuonAdamW's state lives in its inner optimizers: load it with load_state_dict"
            )

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with self._muon_steps_projections():
            if "muon" in self.optimizers:
                self.optimizers["muon"].step()
        if "adamw" in self.optimizers:
            cautious_adamw_step(self.optimizers["adamw"])
        return loss

    def state_dict(self) -> dict[str, Any]:
        with self._muon_steps_projections():
            return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if set(state_dict) != set(self.optimizers):
            raise ValueError(
                f"optimizer state holds {sorted(state_dict)} but this optimizer is {sorted(self.optimizers)}: "
                "resume with the optimizer the checkpoint was trained with"
            )
        with self._muon_steps_projections():
            for name, opt in self.optimizers.items():
                opt.load_state_dict(state_dict[name])
        # loading replaced each inner optimizer's group dicts: expose the new ones
        self.param_groups = [g for opt in self.optimizers.values() for g in opt.param_groups]

    def register_load_state_dict_pre_hook(
        self, hook: Callable[..., Any], prepend: bool = False
    ) -> HookHandles:  # type: ignore[override]
        """The hook runs where the loading is done, in each inner optimizer (``load_state_dict``), with that
        optimizer and its own part of the state."""
        return HookHandles(
            [opt.register_load_state_dict_pre_hook(hook, prepend=prepend) for opt in self.optimizers.values()]
        )
