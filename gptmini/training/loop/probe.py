"""One attention pass per validation, shared by every logger that reads the model's attention (``ProbeReader``).

Each of those callbacks asks the :class:`ValidationProbe` for what it needs in ``on_validation_epoch_end`` and
reads it in ``on_validation_end``; Lightning runs every callback's ``on_validation_epoch_end`` before any
callback's ``on_validation_end``, so by the first read every request of the validation is in, and one batched
pass through the model's explicit attention path (``GPT.attention_maps``) answers them all, whatever the order of
the callbacks in the config.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch

from gptmini.insight.probes import Probes
from gptmini.insight.scores import score_patterns


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``model`` in eval mode (no dropout) for the block, then back in the mode it was in, whatever happens."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


class ValidationProbe:
    """The probe sequences of one validation and their attention, computed once.

    The first read of a step runs every sequence asked for at that step as one batch: each sequence is padded on
    the right to the longest, which leaves its own attention as it is (the model is causal: no query sees a later
    key), and cut back to its length. A request for another step starts afresh.

    ``forward_context``: what the pass runs under (the run's precision, as the validation steps); default none."""

    def __init__(
        self, forward_context: Callable[[], contextlib.AbstractContextManager] | None = None
    ) -> None:
        self.forward_context = forward_context or contextlib.nullcontext
        self.passes = 0  # batched passes run so far
        self._step: int | None = None
        self._texts: dict[tuple[int, ...], torch.Tensor | None] = {}  # ids -> (n_layer, n_head, T, T), CPU
        self._probes: Probes | None = None
        self._scores: dict[str, torch.Tensor] | None = None  # name -> (n_layer, n_head) on the CPU

    # --- requests ---

    def text(self, step: int, ids: Sequence[int]) -> None:
        """Asks for the attention of ``ids`` (a probe text) at ``step``."""
        self._at(step)
        self._texts.setdefault(tuple(int(i) for i in ids), None)

    def scores(self, step: int, probes: Probes) -> None:
        """Asks for every head's scores on ``probes`` at ``step``."""
        self._at(step)
        if self._probes is not probes:
            self._probes, self._scores = probes, None

    def _at(self, step: int) -> None:
        if step != self._step:
            self._step, self._texts, self._probes, self._scores = step, {}, None, None

    # --- reads ---

    def text_maps(self, model: torch.nn.Module, step: int, ids: Sequence[int]) -> torch.Tensor:
        """The attention of ``model`` on ``ids`` at ``step``: (n_layer, n_head, T, T), float32 on the CPU."""
        self.text(step, ids)
        self._run(model)
        maps = self._texts[tuple(int(i) for i in ids)]
        assert maps is not None  # _run answered every request
        return maps

    def head_scores(self, model: torch.nn.Module, step: int) -> dict[str, torch.Tensor] | None:
        """The head scores asked for at ``step`` (name -> (n_layer, n_head), on the CPU), or None when no one
        asked for them (no head insight in this run)."""
        if step != self._step or self._probes is None:
            return None
        self._run(model)
        return self._scores

    # --- the pass ---

    def _run(self, model: torch.nn.Module) -> None:
        texts = [ids for ids, maps in self._texts.items() if maps is None]
        probes = self._probes if self._scores is None else None
        rows = [torch.tensor(ids, dtype=torch.long) for ids in texts]
        if probes is not None:
            rows += [*probes.text.cpu(), *probes.repeated.cpu()]  # (2P,) each
        if not rows:
            return
        device = next(model.parameters()).device
        length = max(r.numel() for r in rows)
        batch = torch.zeros(len(rows), length, dtype=torch.long)  # (B, T): padded on the right
        for i, r in enumerate(rows):
            batch[i, : r.numel()] = r
        with eval_mode(model), torch.no_grad(), self.forward_context():
            maps = model.attention_maps(batch.to(device))  # (n_layer, B, n_head, T, T)
        self.passes += 1
        for i, ids in enumerate(texts):
            t = len(ids)
            self._texts[ids] = maps[:, i, :, :t, :t].float().cpu()  # (n_layer, n_head, t, t)
        if probes is not None:
            first, b_text = len(texts), probes.text.size(0)
            t, r = probes.text.size(1), probes.repeated.size(1)
            text = maps[:, first : first + b_text, :, :t, :t]  # (n_layer, B_text, n_head, T_text, T_text)
            repeated = maps[:, first + b_text :, :, :r, :r]  # (n_layer, B_rep, n_head, 2P, 2P)
            scores = score_patterns(text, repeated, probes.period)
            self._scores = {k: v.cpu() for k, v in scores.items()}
