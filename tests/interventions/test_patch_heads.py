"""Per-head patching across prompts of different lengths: each value equals plain transformers with that
head's o_proj input replaced at the paired positions by the other prompt's, by hand."""

import pytest
import torch

import lensprobe as lp
from lensprobe.experiments.headpatch import aligned_positions


@pytest.fixture(scope="module")
def prompts(tiny):
    system = "Please reason step by step."
    with_filler = lp.build_prompt(tiny, "What is 12+7?", system=system, filler=lp.Filler.meaningless(count=6))
    without = lp.build_prompt(tiny, "What is 12+7?", system=system)
    return with_filler, without


def entropy(logits: torch.Tensor) -> float:
    logp = logits[0, -1].double().log_softmax(-1)
    return float(-(logp.exp() * logp).sum())


def o_proj_inputs(hf, tokens) -> dict[int, torch.Tensor]:
    seen = {}
    handles = [layer.self_attn.o_proj.register_forward_pre_hook(
        lambda mod, args, i=i: seen.__setitem__(i, args[0].detach().clone())) for i, layer in enumerate(hf.model.layers)]
    try:
        with torch.no_grad():
            hf(tokens)
    finally:
        for h in handles:
            h.remove()
    return seen


def test_each_head_patched_equals_plain_transformers_by_hand(tiny, twin_of, prompts):
    clean, corrupted = prompts
    hf = twin_of(tiny)
    res = lp.patch_heads(tiny, clean, corrupted, "entropy", batch_size=3)
    clean_pos, corrupted_pos, unmatched = aligned_positions(clean, corrupted)
    assert unmatched == [("filler", "only the clean prompt"), ("filler_sep", "only the clean prompt")]
    assert len(clean_pos) == len(corrupted) == len(clean) - 7  # 6 filler tokens and their separator
    assert bool((clean.tokens[0, clean_pos] == corrupted.tokens[0, corrupted_pos]).all())
    source = o_proj_inputs(hf, corrupted.tokens)
    d_head = int(tiny.cfg.d_head)
    with torch.no_grad():
        base = entropy(hf(clean.tokens).logits)
    assert float(res.baseline[0]) == pytest.approx(base, abs=1e-5)
    for i, (layer, head) in enumerate(res.heads):
        cols = slice(head * d_head, (head + 1) * d_head)

        def swap(mod, args, layer=layer, cols=cols):
            x = args[0].clone()
            x[0, clean_pos, cols] = source[layer][0, corrupted_pos, cols]
            return (x,)

        handle = hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(swap)
        try:
            with torch.no_grad():
                want = entropy(hf(clean.tokens).logits)
        finally:
            handle.remove()
        assert float(res.changes[0, i]) == pytest.approx(want - base, abs=2e-5), (layer, head)
    assert "filler (only the clean prompt) has no counterpart and is not patched" in res.summary()


def test_named_segments_and_refusals(tiny, prompts):
    clean, corrupted = prompts
    only_q = lp.patch_heads(tiny, clean, corrupted, "entropy", heads=["L0H1", "L1H2"], segments="question")
    assert list(only_q.clean_positions) == clean.positions("question")
    assert ("system", "not asked for") in only_q.unmatched
    other = lp.build_prompt(tiny, "What is 3 times 4 plus 1?", system="Please reason step by step.")
    with pytest.raises(lp.LensprobeError, match="segment 'question' has .* tokens in the source but"):
        lp.patch_heads(tiny, clean, other, "entropy", heads=["L0H1"])
    with pytest.raises(lp.LensprobeError, match="token ids without named segments"):
        lp.patch_heads(tiny, clean.tokens, corrupted, "entropy")


def test_the_heatmap_says_heads_were_patched(tiny, prompts):
    res = lp.patch_heads(tiny, *prompts, "entropy", heads=["L0H1", "L1H2"])
    fig = lp.viz.sweep_heatmap(res)
    title = " ".join(fig.layout.title.text.replace("<br>", " ").split())  # the note wraps to the figure's width
    assert "patched from the other prompt" in title and "head 14; patched - clean" in title
    assert fig.data[0].z[0][1] == pytest.approx(float(res.changes[0, 0]))


def test_the_filler_heads_recipe_is_one_call(tiny, tmp_path):
    import pandas as pd

    res = lp.reproduce("arm-fig-filler-heads-patched", tiny, out=tmp_path / "r", quick=True)
    assert res.table is None and (tmp_path / "r" / "report" / "index.html").is_file()
    (csv,) = (tmp_path / "r" / "report").rglob("patched-heads.csv")
    got = pd.read_csv(csv)
    from lensprobe.app.sections.filler import demo_question

    question, _ = demo_question(True)
    with_filler = lp.build_prompt(tiny, question, system=lp.MATH_SYSTEM_PROMPT, filler=lp.Filler.meaningless())
    without = lp.build_prompt(tiny, question, system=lp.MATH_SYSTEM_PROMPT)
    want = lp.patch_heads(tiny, with_filler, without, "entropy")
    torch.testing.assert_close(torch.tensor(got["change"].values, dtype=torch.float32), want.changes[0],
                               rtol=1e-5, atol=1e-6)
    assert "filler's own positions have no counterpart" in (tmp_path / "r" / "report" / "index.html").read_text()


def test_attribution_and_find_heads_resample_by_segment(tiny, twin_of, prompts):
    """AtP with align=True: dz is the other prompt's head output at the paired positions minus the clean one,
    dotted with the gradient there (by hand on plain transformers); find_heads' exact values are patch_heads'."""
    from oracles import hf_head_gradients

    clean, corrupted = prompts
    att = lp.attribute_heads(tiny, [clean], "entropy", ablation=[corrupted], align=True)
    hf = twin_of(tiny)
    zs, grads, ref = hf_head_gradients(hf, clean.tokens, entropy_of, reference=corrupted.tokens)
    clean_pos, corrupted_pos, _ = aligned_positions(clean, corrupted)
    d = int(tiny.cfg.d_head)
    for i, (layer, heads) in enumerate(att.units):
        cols = slice(heads[0] * d, (heads[0] + 1) * d)
        dz = ref[layer][0][corrupted_pos][:, cols] - zs[layer][0][clean_pos][:, cols]
        want = float((dz.double() * grads[layer][0][clean_pos][:, cols].double()).sum())
        assert float(att.estimates[0, i]) == pytest.approx(want, rel=1e-3, abs=1e-6), (layer, heads)
    found = lp.find_heads(tiny, [clean], "entropy", ablation=[corrupted], align=True, flag=0.0, top=3)
    patched = lp.patch_heads(tiny, clean, corrupted, "entropy")
    labels = [f"L{layer}H{head}" for layer, head in patched.heads]
    for row in found.table.itertuples():
        assert row.exact == pytest.approx(float(patched.changes[0, labels.index(row.head_label)]), abs=1e-5)
    with pytest.raises(lp.LensprobeError, match="align= pairs positions by segment"):
        lp.attribute_heads(tiny, [clean], "entropy", ablation="zero", align=True)


def entropy_of(logits: torch.Tensor) -> torch.Tensor:
    logp = logits[-1].double().log_softmax(-1)
    return -(logp.exp() * logp).sum()
