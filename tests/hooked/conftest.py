"""Fixtures of the HookedTransformer tests: the tiny model as a TransformerLens 3.x ``HookedTransformer``,
and its oracle, the plain ``LlamaForCausalLM`` with the same weights (``tiny_hf_model`` of the same seed),
built separately: no TransformerLens and no lensprobe code runs in its forward."""

import pytest

import lensprobe as lp


@pytest.fixture(scope="session")
def hooked():
    from lensprobe.core.models.testing import tiny_hooked_model

    return tiny_hooked_model(seed=0)


@pytest.fixture(scope="session")
def hooked_hf():
    from lensprobe.core.models.testing import tiny_hf_model

    return tiny_hf_model(seed=0)[0]


@pytest.fixture(scope="session")
def hooked_prompts(hooked):
    """Two prompts of different lengths (so a batch of both is left-padded), one with a filler."""
    a = lp.build_prompt(hooked, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT)
    b = lp.build_prompt(hooked, "the cat sat on the mat", system="You answer.")
    f = lp.build_prompt(hooked, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT, filler=lp.Filler.meaningless(count=6))
    assert len(a) != len(b)
    return a, b, f
