"""Window datasets (random and strided) and the samplers that split one sample stream across ranks."""

import pickle

import numpy as np
import pytest
import torch

from gptmini.data.errors import DataError
from gptmini.data.windows import RandomWindowDataset, ShardSampler, StreamSampler, StridedWindowDataset


def test_split_too_short_for_block_size():
    tokens = np.arange(10, dtype=np.uint16)
    with pytest.raises(
        DataError, match=r"split 'val' has 10 tokens but block_size=10 needs at least 11.*val_fraction"
    ):
        StridedWindowDataset(tokens, 10, name="val")
    with pytest.raises(DataError, match="split 'train' has 10 tokens"):
        RandomWindowDataset(tokens, 64, num_samples=4, seed=0)


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "tokens.bin"
    np.arange(10_000, dtype=np.uint16).tofile(path)
    return np.memmap(path, dtype=np.uint16, mode="r")


def test_random_windows_line_up_and_are_deterministic(token_file):
    ds = RandomWindowDataset(token_file, block_size=16, num_samples=10_000, seed=7)
    for i in (0, 1, 4095, 4096, 9999, 123_456):  # indices past len are valid (later epochs)
        x, y = ds[i]
        s = ds.start(i)
        assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (16,)
        assert torch.equal(x[1:], y[:-1])
        assert (
            x.tolist() == token_file[s : s + 16].tolist()
            and y.tolist() == token_file[s + 1 : s + 17].tolist()
        )
    other = RandomWindowDataset(token_file, block_size=16, num_samples=10_000, seed=7)
    order = [9999, 3, 5000, 3]
    assert [other.start(i) for i in order] == [ds.start(i) for i in order]  # any order, any instance
    starts = [ds.start(i) for i in range(5000)]
    assert min(starts) >= 0 and max(starts) <= 10_000 - 17 and len(set(starts)) > 3000
    reseeded = RandomWindowDataset(token_file, block_size=16, num_samples=10_000, seed=8)
    assert [reseeded.start(i) for i in range(50)] != starts[:50]
    clone = pickle.loads(pickle.dumps(ds))
    assert isinstance(clone.tokens, np.memmap) and torch.equal(clone[42][0], ds[42][0])


def test_strided_windows_cover_the_split(token_file):
    tokens = token_file[:1000]
    for block, stride in ((16, None), (16, 5), (33, 33), (999, None)):
        ds = StridedWindowDataset(tokens, block, stride)
        targets = set()
        for i in range(len(ds)):
            x, y = ds[i]
            assert torch.equal(x[1:], y[:-1])
            targets.update(y.tolist())
        assert targets == set(range(1, 1000))
        assert [int(s) for s in StridedWindowDataset(tokens, block, stride).starts] == [
            int(s) for s in ds.starts
        ]
    assert StridedWindowDataset(tokens, 100).starts.tolist() == [*range(0, 900, 100), 899]


def test_stream_sampler():
    sampler = StreamSampler(10)
    assert list(sampler) == list(range(10)) and len(sampler) == 10
    sampler.set_epoch(2)
    assert list(sampler) == list(range(20, 30))
    assert list(StreamSampler(4, start=lambda: 13)) == [13, 14, 15, 16]
    assert list(StreamSampler(4, start=lambda: None)) == [0, 1, 2, 3]


def test_stream_and_shard_samplers_split_one_stream_across_ranks():
    single = list(StreamSampler(12, start=lambda: 24))
    ranks = [list(StreamSampler(12, start=lambda: 24, rank=r, world_size=2)) for r in range(2)]
    assert single == list(range(24, 36))
    assert sorted(ranks[0] + ranks[1]) == single and ranks[0][:2] == [24, 26]
    assert len(StreamSampler(13, rank=1, world_size=2)) == 6
    shards = [list(ShardSampler(7, r, 3)) for r in range(3)]
    assert sorted(sum(shards, [])) == list(range(7))  # every validation window exactly once, no padding
