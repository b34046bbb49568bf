"""The PROJECTOR's queries and keys: each head's placed in one space as AttentionViz does (checked against NumPy),
the token labels showing spaces and bytes, and the all-heads overview beside the per-head embeddings."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gptmini.training.callbacks.summary_logging import projector_label, shared_space, write_projector


def test_queries_and_keys_share_one_space_and_keep_their_centred_products() -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(10, 8, generator=g) * 5 + 3  # far from the keys, and larger
    k = torch.randn(10, 8, generator=g) * 0.5 - 1
    got_q, got_k = shared_space(q, k)
    qn, kn = q.double().numpy(), k.double().numpy()
    qc, kc = qn - qn.mean(0), kn - kn.mean(0)
    c = np.sqrt(np.linalg.norm(kc, axis=1).mean() / np.linalg.norm(qc, axis=1).mean())
    torch.testing.assert_close(got_q.double(), torch.from_numpy(qc * c), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_k.double(), torch.from_numpy(kc / c), atol=1e-5, rtol=1e-5)
    # zero means, equal mean norms, the centred dot products (the scores up to a per-query shift) unchanged
    assert got_q.mean(0).abs().max() < 1e-5 and got_k.mean(0).abs().max() < 1e-5
    assert got_q.norm(dim=1).mean().item() == pytest.approx(got_k.norm(dim=1).mean().item(), rel=1e-5)
    torch.testing.assert_close((got_q @ got_k.T).double(), torch.from_numpy(qc @ kc.T), atol=1e-4, rtol=1e-5)
    assert q.norm(dim=1).mean() > 5 * k.norm(dim=1).mean()  # before: apart in size


@pytest.mark.parametrize(
    ("token", "label"),
    [(" soft", "␣soft"), ("\\xc3", "⟨C3⟩"), (" caf\\xc3", "␣caf⟨C3⟩"), ("a\nb\tc\r", "a↵b⇥c␍"), ("", "∅")],
)
def test_labels_show_spaces_bytes_and_line_breaks(token: str, label: str) -> None:
    assert projector_label(token) == label


def test_every_head_and_one_all_heads_overview(tmp_path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    from gptmini.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=2, n_head=2, n_embd=8)).eval()
    ids = torch.tensor([[1, 2, 3, 1, 2]])
    inspection = model.inspect(ids)
    tokens = [" a", "b", "\\xc3", " a", "b"]
    writer = SummaryWriter(str(tmp_path))
    assert write_projector(writer, inspection, tokens, 7) == 4
    writer.close()
    config = (tmp_path / "projector_config.pbtxt").read_text()
    for tag in ("qk/layer0_head0", "qk/layer1_head1", "qk/all_heads"):
        assert f'tensor_name: "{tag}:00007"' in config
    overview = tmp_path / "00007" / "qk%2fall_heads"
    rows = (overview / "metadata.tsv").read_text().splitlines()
    assert rows[0] == "token\tposition\tkind\tlayer\thead" and len(rows) == 1 + 4 * 2 * 5
    assert rows[1] == "␣a\t0\tq\t0\t0" and rows[3] == "⟨C3⟩\t2\tq\t0\t0" and rows[-1] == "b\t4\tk\t1\t1"
    vectors = np.loadtxt(overview / "tensors.tsv")
    v = inspection.vectors[1]
    q, k = shared_space(v.q[0, 1], v.k[0, 1])
    np.testing.assert_allclose(vectors[-10:], torch.cat((q, k)).numpy(), rtol=1e-4, atol=1e-5)
    one = np.loadtxt(tmp_path / "00007" / "qk%2flayer1_head1" / "tensors.tsv")
    np.testing.assert_allclose(one, vectors[-10:], rtol=1e-6, atol=1e-7)
