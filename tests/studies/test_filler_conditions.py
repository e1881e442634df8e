"""The filler and head studies speak the one condition vocabulary: canonical names in every table,
older spellings accepted, user-defined conditions (with interventions) run like the built-in ones."""

import pytest
import torch

import lensprobe as lp
from lensprobe.core.prompts.conditions import paper_conditions
from lensprobe.studies import filler as fs
from lensprobe.studies import heads as hs

QUESTION = "What is 12+7?"


def test_tables_use_canonical_names_and_accept_old_spellings(tiny):
    setup = fs.FillerSetup(conditions=("none", "meaningless", "Mful", "random"), count=5)
    assert setup.conditions == fs.CONDITIONS == ("w/o", "w/ Mless", "w/ Mful", "random sentence")
    res = fs.attention_received_by_condition(tiny, QUESTION, layers=[0], heads=[1], setup=setup)
    assert res.conditions == fs.CONDITIONS
    assert list(dict.fromkeys(res.table["condition"])) == list(fs.CONDITIONS)
    assert res.filler_span("meaningless") == res.filler_span("w/ Mless") == res.prompts["w/ Mless"].segments["filler"]
    assert res.filler_span("none") is None
    old = fs.heads_by_change(res, condition="meaningless", baseline="none")
    new = fs.heads_by_change(res, condition="w/ Mless", baseline="w/o")
    assert old.equals(new)
    assert set(fs.condition_changes(res)["condition"]) == {"w/ Mless", "w/ Mful", "random sentence"}
    with pytest.raises(lp.LensprobeError, match="was not run"):
        res.filler_span("loud")


def test_study_prompts_are_the_conditions_prompts(tiny):
    setup = fs.FillerSetup(count=6, seed=2, system="Be brief.")
    built = fs.condition_prompts(tiny, QUESTION, setup)
    conds = paper_conditions(count=6, seed=2, system="Be brief.")
    for name, cond in conds.items():
        want = cond.prompt_builder(tiny)(QUESTION)
        assert built[name].tokens.tolist() == want.tokens.tolist() and built[name].segments == want.segments
    assert setup.condition("meaningful") == conds["w/ Mful"]


def test_user_defined_condition_with_an_intervention(tiny, tiny_hf):
    abl = lp.ablate_heads("L0H2")
    mine = lp.Condition("L0H2 zeroed", system=lp.MATH_SYSTEM_PROMPT, interventions=(abl,))
    res = fs.attention_received_by_condition(tiny, QUESTION, layers=[1], setup=fs.FillerSetup(conditions=("w/o", mine)))
    assert res.conditions == ("w/o", "L0H2 zeroed")
    p = res.prompts["L0H2 zeroed"]
    # by hand: the plain model with L0H2's slice of layer 0's o_proj input zeroed, then per key j the
    # mean attention of head 3 in layer 1 over the queries after j
    d = tiny.cfg.d_head

    def zero_l0h2(mod, args):
        x = args[0].clone()
        x[..., 2 * d:3 * d] = 0
        return (x,)

    handle = tiny_hf.model.layers[0].self_attn.o_proj.register_forward_pre_hook(zero_l0h2)
    try:
        with torch.inference_mode():
            att = tiny_hf(p.tokens, output_attentions=True).attentions[1][0, 3]  # [q, k]
    finally:
        handle.remove()
    n = att.shape[0]
    want = torch.tensor([att[j + 1:, j].mean().item() if j < n - 1 else float("nan") for j in range(n)])
    rows = res.table[(res.table["condition"] == "L0H2 zeroed") & (res.table["head"] == 3)]
    got = torch.tensor(rows.sort_values("position")["attention"].to_numpy(dtype=float), dtype=torch.float32)
    torch.testing.assert_close(got, want, equal_nan=True, atol=1e-6, rtol=0)
    plain = res.table[(res.table["condition"] == "w/o") & (res.table["head"] == 3)]
    assert not torch.allclose(torch.tensor(plain.sort_values("position")["attention"].to_numpy(dtype=float),
                                           dtype=torch.float32), got, equal_nan=True)  # the ablation mattered
    with pytest.raises(lp.LensprobeError, match="unknown condition 'loud'"):
        fs.FillerSetup(conditions=("w/o", "loud"))
    with pytest.raises(lp.LensprobeError, match="unique"):
        fs.FillerSetup(conditions=("w/o", lp.Condition("w/o"))).resolve()


def test_filler_vs_random_and_generation_use_canonical_names(tiny):
    fr = lp.studies.filler_vs_random([tiny], QUESTION, layer=0, head=1, setup=fs.FillerSetup(count=4))
    assert set(fr.table["condition"]) == {"w/ Mless", "random sentence"}
    generated = {"none": [40, 41], "w/ Mless": [50]}  # keys in any spelling
    table = hs.head_attention_over_generation(tiny, QUESTION, "L0H1", conditions=("none", "meaningless"),
                                              setup=fs.FillerSetup(count=4), generated=generated)
    assert list(dict.fromkeys(table["condition"])) == ["w/o", "w/ Mless"]
    gen = table[table["segment"] == "generated"]
    assert gen.groupby("condition").size().to_dict() == {"w/o": 2, "w/ Mless": 1}
