"""Bad arguments are refused before any forward pass: ablation positions outside the run,
malformed heads, heads the model lacks in an evaluation, an empty prompt list."""

import pytest
import torch
from oracles import Counter

import lensprobe as lp
from lensprobe.core.errors import LensprobeError
from lensprobe.evals.problems.load import Problem
from lensprobe.studies.heads import ablation_effect


@pytest.fixture
def forwards(tiny):
    counter = Counter()
    tiny.add_hook("hook_embed", counter)
    yield counter
    tiny.reset_hooks(including_permanent=True)


def test_forward_and_ablation_effect_refuse_positions_outside_the_prompt(tiny, forwards):
    p = lp.build_prompt(tiny, "What is 2+3?")
    n = len(p)
    with pytest.raises(LensprobeError, match=rf"ablation positions 5000 lie outside the prompt \({n} tokens"):
        ablation_effect(tiny, p, lp.ablate_heads("L0H1", positions=[5000]))
    with pytest.raises(LensprobeError, match=rf"positions {n}-{n + 1} lie outside the prompt"):
        lp.forward(tiny, p, lp.ablate_heads("L0H1", positions=[1, n, n + 1]))
    with pytest.raises(LensprobeError, match=rf"positions from {n} on lie outside the prompt"):
        lp.forward(tiny, p, lp.ablate_heads("L0H1", positions=slice(n, None)))
    with pytest.raises(LensprobeError, match="lie outside the prompt"):
        lp.ablation_sweep(tiny, [p], heads=[(0, 1)], positions=[n], progress=False)
    assert forwards.calls == 0
    # the last prompt position is inside, and ablating it changes the logits there only
    clean = lp.forward(tiny, p)
    ablated = lp.forward(tiny, p, lp.ablate_heads("L0H1", positions=[n - 1]))
    assert torch.equal(ablated[0, :-1], clean[0, :-1]) and not torch.equal(ablated[0, -1], clean[0, -1])


def test_generation_refuses_positions_beyond_prompt_plus_new_tokens(tiny, forwards):
    p = lp.build_prompt(tiny, "What is 2+3?")
    n = len(p)
    with pytest.raises(LensprobeError, match=rf"outside the prompt \+ max_new_tokens \({n + 3} tokens"):
        lp.generate(tiny, p, max_new_tokens=3, interventions=[lp.ablate_heads("L0H1", positions=[n + 3])])
    assert forwards.calls == 0
    out = lp.generate(tiny, p, max_new_tokens=3, stop_at_eos=False,
                      interventions=[lp.ablate_heads("L0H1", positions=[n + 2])])  # the last generated one
    assert len(out.generated_ids[0]) == 3


def test_malformed_heads_and_empty_prompt_lists_say_what_is_wrong(tiny, forwards):
    with pytest.raises(LensprobeError, match=r"\(0, 'x'\) is not a \(layer, head\) pair: the head must be an int"):
        lp.ablate_heads((0, "x"))
    with pytest.raises(LensprobeError, match=r"\(0, 1.5\) is not a \(layer, head\) pair: .* got float"):
        lp.ablate_heads((0, 1.5))
    with pytest.raises(LensprobeError, match="no prompt given"):
        lp.generate(tiny, [], max_new_tokens=2)
    assert forwards.calls == 0


def test_evaluation_refuses_a_missing_head_before_the_first_batch(tiny, forwards):
    probs = [Problem(id=f"q{i}", problem=f"What is {i}+1?", answer=str(i + 1)) for i in range(3)]
    conds = [lp.Condition("w/o"), lp.Condition("ablated", interventions=(lp.ablate_heads("L0H99"),))]
    with pytest.raises(LensprobeError, match=r"condition 'ablated': .*99"):
        lp.evaluate(tiny, probs, conds, max_new_tokens=2, batch_size=1, progress=False)
    far = lp.Condition("far", interventions=(lp.ablate_heads("L0H1", positions=[4000]),))
    with pytest.raises(LensprobeError, match=r"condition 'far': ablation positions 4000 lie outside the prompt"):
        lp.evaluate(tiny, probs, [lp.Condition("w/o"), far], max_new_tokens=2, batch_size=1, progress=False)
    assert forwards.calls == 0
