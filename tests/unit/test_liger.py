"""liger-kernel's options (``model.loss=liger``, ``model.fused_ops=liger``): their kernels against PyTorch's path on a
CUDA GPU with liger-kernel installed (skipped elsewhere); everywhere, the same parameters and checkpoints as
PyTorch's modules, the CPU hand-off, and the refusal of a run that cannot use them."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch.testing import assert_close

from gptmini import liger
from gptmini.model import GPT, GPTConfig

LIGER = torch.cuda.is_available() and importlib.util.find_spec("liger_kernel") is not None
needs_liger = pytest.mark.skipif(not LIGER, reason="liger-kernel's kernels need a CUDA GPU and gptmini[gpu]")

# every block variant whose kernels fused_ops=liger changes (norms with and without a bias, and the activations);
# gelu keeps PyTorch's GELU, its norms are liger's
BLOCKS = [
    {"norm": "layernorm", "mlp": "gelu"},
    {"norm": "layernorm", "mlp": "gelu", "bias": False},
    {"norm": "rmsnorm", "mlp": "swiglu"},
    {"norm": "layernorm", "mlp": "relu2"},
]


def _model(device: str, vocab: int = 300, **settings: object) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=vocab, block_size=16, n_layer=2, n_head=2, n_embd=32, **settings)
    return GPT(config).to(device)


def _batch(device: str, vocab: int = 300) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, vocab, (4, 16), generator=gen)
    y = torch.randint(0, vocab, (4, 16), generator=gen)
    y[0, :5] = -1  # ignored targets
    return x.to(device), y.to(device)


def _loss_and_grads(
    model: GPT, x: torch.Tensor, y: torch.Tensor, bf16: bool = False
) -> tuple[torch.Tensor, dict]:
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        _, loss = model(x, y, return_logits=False)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def _assert_same(
    got: tuple[torch.Tensor, dict], want: tuple[torch.Tensor, dict], bf16: bool = False, **tol: float
) -> None:
    """The same loss and gradients; ``bf16``: to bf16's precision, each gradient to 3 % of its largest entry (a
    fixed tolerance would pass a norm's small gradients if they were zero)."""
    assert_close(got[0], want[0], **({"atol": 2e-2, "rtol": 1e-2} if bf16 else tol))
    assert got[1].keys() == want[1].keys()
    for name, grad in want[1].items():
        scaled = {"atol": 0.03 * grad.abs().max().item(), "rtol": 0.0}
        assert_close(got[1][name], grad, msg=name, **(scaled if bf16 else tol))


@pytest.mark.parametrize("block", BLOCKS)
def test_fused_ops_liger_keeps_the_modules_parameters_and_runs_pytorchs_ops_on_a_cpu(block: dict) -> None:
    # a GPU-trained checkpoint opens and evaluates anywhere: the same state dict, PyTorch's operations on the CPU
    plain, fused = _model("cpu", **block), _model("cpu", fused_ops="liger", **block)
    assert isinstance(fused.blocks[0].ln_1, liger.LayerNorm | liger.RMSNorm)
    assert {k: v.shape for k, v in fused.state_dict().items()} == {
        k: v.shape for k, v in plain.state_dict().items()
    }
    fused.load_state_dict(plain.state_dict())
    x, y = _batch("cpu")
    _assert_same(_loss_and_grads(fused, x, y), _loss_and_grads(plain, x, y), atol=0.0, rtol=0.0)


def test_unavailable_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert liger.unavailable() == "liger-kernel is not installed (pip install 'gptmini[gpu]')"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "triton" else object())
    assert liger.unavailable().startswith("triton is not installed")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert liger.unavailable() == "it runs on CUDA GPUs and this machine has none"


@pytest.mark.parametrize(
    ("setting", "fix"),
    [
        ("model.loss=liger", "or use model.loss=auto (chunked on a CPU)"),
        ("model.fused_ops=liger", "or use model.fused_ops=none"),
    ],
)
def test_a_liger_option_on_the_cpu_is_refused_in_one_line_before_any_work(
    tmp_path, gptmini_train, setting: str, fix: str
) -> None:
    proc = gptmini_train(
        ["debug=smoke", "trainer.accelerator=cpu", setting, f"paths.output_root={tmp_path}/out"]
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-3000:]
    (line,) = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert (
        f"({setting}) cannot run: this run is on the CPU; pip install 'gptmini[gpu]'" in line and fix in line
    )
    assert "Traceback" not in text
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]  # no run folder's files


# --- on a CUDA GPU with liger-kernel ---------------------------------------------------------------------------


@needs_liger
@pytest.mark.parametrize("model", [{}, {"logit_softcap": 15.0}])
def test_the_liger_loss_matches_plain_on_a_gpu(model: dict) -> None:
    x, y = _batch("cuda", vocab=3000)
    want = _loss_and_grads(_model("cuda", 3000, loss="plain", **model), x, y)
    _assert_same(
        _loss_and_grads(_model("cuda", 3000, loss="liger", **model), x, y), want, atol=1e-5, rtol=1e-4
    )


@needs_liger
def test_the_liger_loss_under_bf16_autocast_matches_plain_to_bf16s_precision() -> None:
    x, y = _batch("cuda", vocab=3000)
    want = _loss_and_grads(_model("cuda", 3000, loss="plain"), x, y, bf16=True)
    got = _loss_and_grads(_model("cuda", 3000, loss="liger"), x, y, bf16=True)
    _assert_same(got, want, bf16=True)


@needs_liger
@pytest.mark.parametrize("block", BLOCKS)
def test_fused_ops_liger_matches_pytorchs_ops_on_a_gpu(block: dict) -> None:
    x, y = _batch("cuda")
    want = _loss_and_grads(_model("cuda", **block), x, y)
    _assert_same(
        _loss_and_grads(_model("cuda", fused_ops="liger", **block), x, y), want, atol=1e-5, rtol=1e-4
    )
