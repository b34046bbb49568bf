"""Every registered causal attention, plain and with each option it declares, against every check of the
matrix (``attention_matrix.CHECKS``)."""

import pytest
from attention_matrix import CHECKS, configurations

from gptmini.attention import available_attention

CASES = [(name, options) for name in available_attention() for options in configurations(name)]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
@pytest.mark.parametrize(
    "name, options", CASES, ids=[n + "".join(f"-{k}={v}" for k, v in o.items()) for n, o in CASES]
)
def test_matrix(name, options, check):
    check(name, options)
