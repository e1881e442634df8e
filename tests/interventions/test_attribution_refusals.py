"""Attribution refuses what it cannot attribute, as the exact sweep does, and verification refuses an
attribution of another model, other prompts or another metric (compared by content)."""

import pytest

import lensprobe as lp
from lensprobe.core.models.testing import tiny_model
from lensprobe.experiments.attribution import attribute_heads
from lensprobe.experiments.verify import verify_attribution


@pytest.fixture(scope="module")
def prompts(tiny):
    system = "Please reason step by step."
    return [lp.build_prompt(tiny, "What is 3*4?", system=system), lp.build_prompt(tiny, "What is 12+7?", system=system)]


@pytest.mark.parametrize("positions, message", [
    ([10000], "ablation positions 10000 lie outside the prompt"),
    ([], r"no ablation positions given \(an empty list\)"),
    ("generated", "positions='generated' were resolved against a prompt of .* none generated"),
])
def test_positions_that_ablate_nothing_are_refused_like_the_sweep(tiny, prompts, positions, message):
    with pytest.raises(lp.LensprobeError, match=message):
        lp.ablation_sweep(tiny, prompts[0], "entropy", heads=["L0H0"], positions=positions, progress=False)
    with pytest.raises(lp.LensprobeError, match=message):
        attribute_heads(tiny, prompts[0], "entropy", positions=positions)


def test_generated_positions_of_a_continuation_are_attributed(tiny, prompts):
    att = attribute_heads(tiny, prompts[0], "logprob", answers="12", positions="generated")
    assert att.estimates.abs().sum() > 0  # the answer's positions are after the prompt: they are ablated


def test_a_metric_whose_gradient_is_cut_is_refused(tiny, prompts):
    def cut(logits, prompt):  # has a gradient, but it is zero: the value itself is detached
        return logits[:, -1].detach().float().log_softmax(-1)[:, 5] + 0 * logits[:, -1, 0]

    sweep = lp.ablation_sweep(tiny, prompts[0], cut, progress=False)
    assert sweep.changes.abs().max() > 0  # the exact effects are not zero
    with pytest.raises(lp.LensprobeError, match=r"zero gradient at the output of every attributed head.*\.detach\(\)"):
        attribute_heads(tiny, prompts[0], cut)


def test_verification_refuses_another_model_prompts_or_metric(tiny, prompts):
    att = attribute_heads(tiny, prompts, "entropy")
    verify_attribution(tiny, prompts, "entropy", att, top=2)  # the same run verifies
    other = tiny_model(seed=1)  # the same shape and names, other weights
    with pytest.raises(lp.LensprobeError, match=r"the model given here differs from the attribution's \(compared by content\)"):
        verify_attribution(other, prompts, "entropy", att, top=2)
    swapped = [prompts[1], prompts[0]]  # the same count, other prompts in each place
    with pytest.raises(lp.LensprobeError, match="the prompts given here differ from the attribution's"):
        verify_attribution(tiny, swapped, "entropy", att, top=2)
    with pytest.raises(lp.LensprobeError, match="the metric given here differs from the attribution's"):
        verify_attribution(tiny, prompts, lambda logits, prompt: logits[:, -1, 0], att, top=2)
