import pytest
import torch
from torch.testing import assert_close

from gptmini.attention import KVCache


def test_kv_cache_update_and_overflow():
    cache = KVCache(batch_size=2, n_head=3, max_len=5, head_size=4)
    k1, v1 = torch.randn(2, 3, 3, 4), torch.randn(2, 3, 3, 4)
    keys, values = cache.update(k1, v1)
    assert cache.pos == 3
    assert_close(keys, k1)
    k2, v2 = torch.randn(2, 3, 2, 4), torch.randn(2, 3, 2, 4)
    keys, values = cache.update(k2, v2)
    assert cache.pos == 5
    assert_close(keys, torch.cat([k1, k2], dim=2))
    assert_close(values, torch.cat([v1, v2], dim=2))
    with pytest.raises(ValueError, match=r"5 cached \+ 1 new positions exceed max_len=5"):
        cache.update(torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4))
    cache.reset()
    assert cache.pos == 0
    keys, _ = cache.update(k2, v2)
    assert_close(keys, k2)
