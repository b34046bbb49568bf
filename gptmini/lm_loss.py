"""Next-token cross entropy straight from the last hidden states, without the (tokens, vocabulary) logits.

With the GPT-2 vocabulary the output layer is most of a small model's step: its logits for a batch of 1,024
tokens are 50,304 × 1,024 floats (206 MB), written by the matmul, read and written again by log-softmax, and
twice more by their gradients. Here rows go through in chunks: each chunk's logits give its loss and, at once,
their gradient (softmax minus the one-hot target), which is multiplied into the gradients of the hidden states
and the weight before the next chunk reuses the memory. The backward only scales what the forward computed.
This is the chunked linear cross-entropy that Liger-Kernel and others fuse on GPUs, written with plain PyTorch
operations. ``model.loss`` chooses the model's loss path once, when it is built (``choose_loss``): this one,
liger-kernel's fused kernel (``gptmini.liger``), or the plain logits then ``F.cross_entropy``."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

# logits per chunk (512 rows of the GPT-2 vocabulary, 103 MB in float32): each chunk adds its (V, C) product into
# the weight's gradient, which larger chunks do fewer times, while a chunk still holds a fraction of a large batch's
# logits. Measured on the default model's step, float32 and bf16 autocast, against chunks of 64 to 1,024 rows.
CHUNK_ELEMENTS = 512 * 50304
# below this vocabulary the logits are small and one fused cross entropy is as fast or faster (the crossover
# measured on the quick-start model's step; `make bench`'s lm_loss table, docs/benchmarks.md)
MIN_VOCAB = 2048


# model.loss's values: auto picks chunked or plain (``resolve_loss``); liger is liger-kernel's fused Triton kernel
LOSSES = ("auto", "plain", "chunked", "liger")
# a loss path: hidden states (N, C), the output weight's real rows (V, C), targets (N,; -1 ignored) -> the mean loss
LossFn = Callable[[Tensor, Tensor, Tensor], Tensor]


def resolve_loss(loss: str, vocab_size: int, softcap: float | None) -> str:
    """The path ``loss`` names, ``auto`` made concrete: chunked on a machine without a CUDA GPU for a vocabulary of
    ``MIN_VOCAB`` or more (the chunks compute plain logits, so not with a soft cap), else plain. The GPU's default
    stays plain, which ``torch.compile`` fuses, until the GPU round measures chunked and liger against it."""
    if loss != "auto":
        return loss
    large = vocab_size >= MIN_VOCAB and softcap is None
    return "chunked" if large and not torch.cuda.is_available() else "plain"


def choose_loss(loss: str, vocab_size: int, softcap: float | None) -> LossFn | None:
    """A model's loss path, once, when it is built; None: the plain path (the logits, then ``F.cross_entropy``),
    which the model computes itself."""
    path = resolve_loss(loss, vocab_size, softcap)
    if path == "chunked":
        return linear_cross_entropy
    if path == "liger":
        from gptmini import liger

        return partial(liger.linear_cross_entropy, softcap=softcap)
    return None


def chunk_rows(vocab: int) -> int:
    """Rows per chunk for a vocabulary of ``vocab``: ``CHUNK_ELEMENTS`` logits, at least one row."""
    return max(1, CHUNK_ELEMENTS // vocab)


def _check_shapes(h: Tensor, targets: Tensor) -> None:
    if h.dim() != 2 or targets.shape != h.shape[:1]:
        raise ValueError(
            f"expected h (N, C) and targets (N,), got {tuple(h.shape)} and {tuple(targets.shape)}"
        )


def _chunked(
    h: Tensor, weight: Tensor, targets: Tensor, ignore_index: int, chunk: int, grad_h: bool, grad_w: bool
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """Each row's loss (N,), 0 where ignored; whether it is scored (N,); and (when asked) the gradients of the
    summed loss."""
    N = h.shape[0]
    scored = targets != ignore_index  # (N,)
    # ignored rows point at class 0; their loss and gradient are masked
    safe = targets.masked_fill(~scored, 0)
    losses = torch.empty(N, dtype=torch.float32, device=h.device)
    dh = torch.empty(h.shape, dtype=torch.float32, device=h.device) if grad_h else None
    dw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if grad_w else None
    # the matmuls' dtype: autocast's (bf16-mixed precision) where it is on, as for any linear layer, else the
    # weight's; softmax and the accumulated gradients stay in float32 either way
    device = h.device.type
    mm_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
    w_mm, h_mm = weight.to(mm_dtype), h.to(mm_dtype)  # cast once, not per chunk
    for start in range(0, N, chunk):
        rows = slice(start, start + chunk)
        hc, tc, keep = h_mm[rows], safe[rows], scored[rows]
        logits = (hc @ w_mm.t()).float()  # (n, V)
        picked = logits.gather(1, tc[:, None]).squeeze(1)  # (n,)
        # log-sum-exp with one pass of exp, in place: the exponentials are the softmax's numerators below
        top = logits.amax(dim=-1, keepdim=True)  # (n, 1)
        exps = logits.sub_(top).exp_()  # (n, V)
        sums = exps.sum(dim=-1, keepdim=True)  # (n, 1)
        lse = (top + sums.log()).squeeze(1)  # (n,)
        losses[rows] = (lse - picked) * keep
        if not (grad_h or grad_w):
            continue
        # d(lse - picked)/dlogits = softmax - onehot, in place; zero for ignored rows
        row_scale = keep[:, None].to(exps.dtype)  # (n, 1): 1 for scored rows, 0 for ignored ones
        probs = exps.mul_(row_scale / sums)
        probs.scatter_add_(1, tc[:, None], -row_scale)
        if mm_dtype != torch.float32:
            probs = probs.to(mm_dtype)
        if dh is not None:
            dh[rows] = probs @ w_mm  # (n, C)
        if dw is not None:
            if mm_dtype == torch.float32:
                dw.addmm_(probs.t(), hc)  # (V, C), accumulated in place
            else:
                dw += probs.t() @ hc  # a lower-precision product, accumulated in float32
    return losses, scored, dh, dw


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, targets: Tensor, ignore_index: int, chunk: int) -> Tensor:  # type: ignore[override]
        losses, scored, dh, dw = _chunked(
            h, weight, targets, ignore_index, chunk, ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        )
        count = scored.sum()
        ctx.save_for_backward(dh, dw, count)
        ctx.dtypes = (h.dtype, weight.dtype)
        return losses.sum() / count

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None, None, None]:  # type: ignore[override]
        dh, dw, count = ctx.saved_tensors
        scale = grad / count  # the mean's 1 / count, times what flows in
        h_dtype, w_dtype = ctx.dtypes
        return (
            None if dh is None else (dh * scale).to(h_dtype),
            None if dw is None else (dw * scale).to(w_dtype),
            None,
            None,
            None,
        )


def linear_cross_entropy(
    h: Tensor, weight: Tensor, targets: Tensor, ignore_index: int = -1, chunk: int | None = None
) -> Tensor:
    """Mean cross entropy of ``F.linear(h, weight)`` against ``targets``, as ``F.cross_entropy`` computes it
    (rows whose target is ``ignore_index`` are left out of the mean), for h (N, C), weight (V, C), targets (N,)."""
    _check_shapes(h, targets)
    chunk = chunk or chunk_rows(weight.shape[0])
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(h, weight, targets, ignore_index, chunk)
    losses, scored, _, _ = _chunked(h, weight, targets, ignore_index, chunk, False, False)
    return losses.sum() / scored.sum()


@torch.no_grad()
def token_losses(h: Tensor, weight: Tensor, targets: Tensor, chunk: int | None = None) -> Tensor:
    """Each row's cross entropy (N,) of ``F.linear(h, weight)`` against ``targets``, as
    ``F.cross_entropy(..., reduction="none")``, without gradients and without the (N, V) logits."""
    _check_shapes(h, targets)
    return _chunked(h, weight, targets, -1, chunk or chunk_rows(weight.shape[0]), False, False)[0]
