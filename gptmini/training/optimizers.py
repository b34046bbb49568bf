"""Muon for the hidden matrices, AdamW for the rest: two PyTorch optimizers behind one ``Optimizer``.

Lightning (automatic optimization, gradient accumulation, clipping, checkpoints), the learning-rate schedulers
and ``LearningRateMonitor`` see a single optimizer whose ``param_groups`` are the two inner optimizers' own
group dicts (a scheduler that sets a group's ``lr`` sets it in the optimizer that uses it) and whose state dict
holds both inner state dicts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

# the parameter roles of GPT.parameter_roles; "hidden" goes to Muon, the others to AdamW, each its own group
ROLES = ("hidden", "embedding", "head", "matrix", "vector")
ADAMW_ROLES = ROLES[1:]


class MuonAdamW(torch.optim.Optimizer):
    """``torch.optim.Muon`` (Jordan et al.) on the ``hidden`` matrices and ``torch.optim.AdamW`` on the
    embeddings, the LM head, other matrices and vectors, each role one named parameter group with its own
    ``lr`` and ``weight_decay`` (``hidden``: Muon's settings; ``adamw``: AdamW's betas and eps, shared by its
    groups). ``fused``/``foreach`` choose AdamW's kernel, as for plain AdamW.

    ``stacked``: hidden matrices that stack several projections by rows (a fused [W_q; W_k; W_v]), with each
    one's row count. Muon orthogonalises each projection's rows on its own: measured against orthogonalising the
    fused matrix whole, it reached a lower loss in the same steps (docs/benchmarks.md, "Training recipe"). It
    steps one parameter per projection that shares the fused weight's memory (``torch.optim.Muon`` orthogonalises
    whole parameters); everything outside the step (clipping, ``zero_grad``, the schedulers) sees the fused
    weight."""

    # built from GPT.parameter_roles(), not from a flat parameter list (GPTLightningModule reads this)
    takes_parameter_roles = True

    def __init__(
        self,
        roles: dict[str, list[nn.Parameter]],
        hidden: dict[str, Any],
        adamw: dict[str, Any],
        embedding: dict[str, Any],
        head: dict[str, Any],
        matrix: dict[str, Any],
        vector: dict[str, Any],
        fused: bool | None = None,
        foreach: bool | None = None,
        stacked: dict[nn.Parameter, tuple[int, ...]] | None = None,
    ) -> None:
        unknown = sorted(set(roles) - set(ROLES))
        if unknown:
            raise ValueError(f"unknown parameter role(s) {unknown}: expected {', '.join(ROLES)}")
        not_2d = [tuple(p.shape) for p in roles.get("hidden", []) if p.dim() != 2]
        if not_2d:
            raise ValueError(f"Muon takes 2-D matrices only; hidden parameters of shapes {not_2d} are not")
        settings = {"embedding": embedding, "head": head, "matrix": matrix, "vector": vector}
        adam_groups = [
            {"params": roles[r], "name": r, **dict(settings[r])} for r in ADAMW_ROLES if roles.get(r)
        ]
        kernel = {k: v for k, v in (("fused", fused), ("foreach", foreach)) if v is not None}
        adam_defaults = dict(adamw)
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        # per stacked hidden matrix: its projections as parameters viewing its rows (what Muon steps)
        self._projections: list[tuple[nn.Parameter, list[nn.Parameter]]] = []
        for p in roles.get("hidden", []):
            rows = (stacked or {}).get(p)
            if rows is None:
                continue
            if sum(rows) != p.shape[0]:
                raise ValueError(
                    f"stacked projections of {sum(rows)} rows do not fill a matrix of shape {tuple(p.shape)}"
                )
            views = [nn.Parameter(v) for v in p.detach().split(list(rows))]  # the same memory, not a copy
            self._projections.append((p, views))
        if roles.get("hidden"):
            muon_settings = dict(hidden)
            if "ns_coefficients" in muon_settings:
                muon_settings["ns_coefficients"] = tuple(muon_settings["ns_coefficients"])
            self.optimizers["muon"] = torch.optim.Muon(
                [{"params": roles["hidden"], "name": "hidden"}], **muon_settings
            )
        if adam_groups:
            if "betas" in adam_defaults:
                adam_defaults["betas"] = tuple(adam_defaults["betas"])
            self.optimizers["adamw"] = torch.optim.AdamW(adam_groups, **adam_defaults, **kernel)
        if not self.optimizers:
            raise ValueError("MuonAdamW got no trainable parameters")
        # The base class is given every parameter once (it checks them); its groups are then replaced by the
        # inner optimizers' own dicts.
        params = [p for opt in self.optimizers.values() for g in opt.param_groups for p in g["params"]]
        super().__init__(params, {})
        self.param_groups = [g for opt in self.optimizers.values() for g in opt.param_groups]

    # the fused AdamW inside does not unscale float16 gradients itself: GradScaler unscales them first
    _step_supports_amp_scaling = False

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
            grads = (None,) * len(parts) if p.grad is None else p.grad.split([v.shape[0] for v in parts])
            for v, g in zip(parts, grads, strict=True):
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
            for opt in self.optimizers.values():
                opt.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)

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
