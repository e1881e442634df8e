"""The suite runs with lensprobe's annotations checked at call time (jaxtyping shapes and dtypes, the
other annotations by beartype: ``--jaxtyping-packages`` in pyproject.toml's addopts), so a tensor of
the wrong shape fails a test; a test marked ``unchecked`` runs without them (tests/conftest.py)."""

import jaxtyping
import pytest
import torch

import lensprobe as lp
from lensprobe.core.models.testing import tiny_model
from lensprobe.studies.mechanism import mad_eps


def test_a_tensor_of_the_wrong_rank_fails_the_shape_check():
    assert not jaxtyping.config.jaxtyping_disable
    # [query_pos, key_pos] needs two axes: a 1-D tensor is refused before the function runs
    with pytest.raises(jaxtyping.TypeCheckError, match="average_attention_received"):
        lp.metrics.average_attention_received(torch.ones(4))
    # logits need a vocabulary axis
    with pytest.raises(jaxtyping.TypeCheckError, match="entropy"):
        lp.metrics.entropy(torch.tensor(1.0))


def test_a_wrong_dtype_and_a_wrong_plain_type_fail_too():
    with pytest.raises(jaxtyping.TypeCheckError, match="mad_eps"):
        mad_eps(torch.tensor([1, 2]), c=0.1)  # Float[...]: an integer tensor is refused
    with pytest.raises(jaxtyping.TypeCheckError, match="'question'"):
        lp.build_prompt(tiny_model(seed=0), 123)


def test_shapes_shared_by_arguments_and_return_are_checked_together():
    pattern = torch.softmax(torch.randn(2, 5, 5), dim=-1).tril()
    assert lp.metrics.average_attention_received(pattern).shape == (2, 5)  # "... key_pos" from "... query_pos key_pos"
    assert lp.metrics.entropy(torch.zeros(3, 7)).shape == (3,)


@pytest.mark.unchecked
def test_unchecked_tests_see_lensprobes_own_messages():
    with pytest.raises(lp.LensprobeError):
        lp.metrics.average_attention_received(torch.ones(4))
    assert jaxtyping.config.jaxtyping_disable
