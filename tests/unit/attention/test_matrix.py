"""Every registered causal attention against every check of the matrix (``attention_matrix.CHECKS``)."""

import pytest
from attention_matrix import CHECKS

from gptmini.attention import available_attention


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
@pytest.mark.parametrize("name", available_attention())
def test_matrix(name, check):
    check(name)
