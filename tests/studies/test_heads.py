"""Head studies: attention on one head over prompt + generated tokens, its figure, and the effect of an
ablation on the next token, against a separately built plain transformers model. The ``ablate`` and
``sweep`` commands are tested in ``tests/app/test_cli.py``, the report sections in ``tests/app/test_demo.py``."""

import pytest
import torch

import lensprobe as lp
from lensprobe.studies import heads as head_study
from lensprobe.studies.filler import FillerSetup, aligned_positions, condition_prompts


def hf_pattern(hf, tokens, layer):
    """[batch, head, q, k] attention weights of a separately built plain transformers model."""
    with torch.inference_mode():
        return hf(tokens, output_attentions=True).attentions[layer]


def received_by_hand(att):
    """[q, k] -> per key j the mean of att[i, j] over the queries i > j (NaN for the last key)."""
    n = att.shape[0]
    return [att[j + 1:, j].mean().item() if j < n - 1 else float("nan") for j in range(n)]


def same(got, want, tol=1e-5):
    return all((abs(a - b) <= tol) or (a != a and b != b) for a, b in zip(got, want, strict=True))


def test_head_attention_over_generation_by_hand(tiny, tiny_hf):
    setup = FillerSetup(system="Please reason step by step.", count=5)
    generated = {"w/o": [40, 41, 42], "w/ Mless": [50, 51]}
    table = head_study.head_attention_over_generation(
        tiny, "What is 12+7?", "L1H3", conditions=("w/o", "w/ Mless"), setup=setup, generated=generated)
    prompts = condition_prompts(tiny, "What is 12+7?",
                                FillerSetup(conditions=("w/o", "w/ Mless"), system=setup.system, count=5))
    for cond, p in prompts.items():
        new = generated[cond]
        tokens = torch.cat([p.tokens, torch.tensor([new])], dim=1)
        want = received_by_hand(hf_pattern(tiny_hf, tokens, layer=1)[0, 3])
        rows = table[table["condition"] == cond].sort_values("position")
        got = rows["attention"].tolist()
        assert len(got) == tokens.shape[1] and same(got, want)
        kept = aligned_positions(p)
        gen_rows = rows[rows["segment"] == "generated"]
        assert gen_rows["aligned_pos"].tolist() == list(range(len(kept), len(kept) + len(new)))
        assert rows["aligned_pos"].isna().sum() == len(p) - len(kept)  # the filler span is not aligned


def test_head_attention_over_generation_generates(tiny, tiny_hf):
    """Without given tokens each condition's prompt is continued greedily: the generated rows hold the
    plain model's greedy tokens, and every position's value is the head's average attention received."""
    table = head_study.head_attention_over_generation(tiny, "What is 12+7?", (0, 1), max_new_tokens=3)
    conditions = tuple(dict.fromkeys(table["condition"]))
    prompts = condition_prompts(tiny, "What is 12+7?", FillerSetup(conditions=conditions))
    assert len(prompts) == 2
    eos = tiny.tokenizer.eos_token_id
    for cond, p in prompts.items():
        with torch.inference_mode():
            out = tiny_hf.generate(p.tokens, attention_mask=torch.ones_like(p.tokens), max_new_tokens=3,
                                   do_sample=False, pad_token_id=tiny.tokenizer.pad_token_id)
        new = out[0, p.tokens.shape[1]:].tolist()
        new = new[: new.index(eos) + 1] if eos in new else new
        rows = table[table["condition"] == cond].sort_values("position")
        gen = rows[rows["segment"] == "generated"]
        assert gen["token"].tolist() == [tiny.tokenizer.decode([t]) for t in new]
        tokens = torch.cat([p.tokens, torch.tensor([new])], dim=1)
        assert same(rows["attention"].tolist(), received_by_hand(hf_pattern(tiny_hf, tokens, layer=0)[0, 1]))


def test_figures_draw_the_table(tiny):
    res = lp.studies.attention_received_by_condition(tiny, "What is 12+7?", layers=[0], heads=[2],
                                setup=FillerSetup(conditions=("w/o", "w/ Mless", "w/ Mful"), count=4))
    fig = lp_viz().head_attention_figure(res, 0, 2)
    assert [t.name for t in fig.data] == ["w/o filler", "Mless", "Mful"]
    aligned = res.aligned()
    mless = aligned[aligned["condition"] == "w/ Mless"].sort_values("aligned_pos")
    assert list(fig.data[1].y) == pytest.approx(mless["attention"].tolist(), nan_ok=True)
    assert "L0H2" in fig.layout.title.text and "layer 1" in fig.layout.title.text


def lp_viz():
    import lensprobe.viz as viz

    return viz


def test_ablation_effect_and_next_token_figure(tiny, tiny_hf):
    p = lp.build_prompt(tiny, "What is 12+7?")
    eff = head_study.ablation_effect(tiny, p, lp.ablate_heads("L1H1"), top_k=5)
    d = tiny.cfg.d_head

    def zero_l1h1(mod, args):
        x = args[0].clone()
        x[..., d:2 * d] = 0
        return (x,)

    with torch.inference_mode():
        clean = tiny_hf(p.tokens).logits[0, -1]
        handle = tiny_hf.model.layers[1].self_attn.o_proj.register_forward_pre_hook(zero_l1h1)
        try:
            after = tiny_hf(p.tokens).logits[0, -1]
        finally:
            handle.remove()

    def entropy_by_hand(logits):
        q = torch.softmax(logits.double(), -1)
        return float(-(q * q.log()).sum())

    assert eff.summary["entropy_clean"] == pytest.approx(entropy_by_hand(clean), abs=2e-6)
    assert eff.summary["entropy_ablated"] == pytest.approx(entropy_by_hand(after), abs=2e-6)
    assert eff.summary["max_abs_logit_change"] == pytest.approx((after - clean).abs().max().item(), abs=1e-6)
    assert eff.summary["max_abs_logit_change"] > 1e-3
    assert set(clean.topk(5).indices.tolist()) <= set(eff.tokens["token_id"])
    fig = lp_viz().next_token_figure(eff)
    assert list(fig.data[0].y) == pytest.approx(eff.tokens["p_clean"].tolist())
