"""Activation patching aligned by segment name, checked against hand-written hooks on a separately
built plain transformers model (entropy and KL divergence written out here)."""

import pytest
import torch

import lensprobe as lp
from lensprobe.core.errors import LensprobeError
from lensprobe.experiments.patching import patch

SYSTEM = "Please reason step by step."


@pytest.fixture(scope="module")
def pair(tiny):
    with_filler = lp.build_prompt(tiny, "What is 12+7?", system=SYSTEM, filler=lp.Filler.meaningless(count=8))
    without = lp.build_prompt(tiny, "What is 12+7?", system=SYSTEM)
    return with_filler, without


@pytest.fixture(scope="module")
def same_length(tiny):
    """Two prompts with different questions and the same segment lengths."""
    a = lp.build_prompt(tiny, "What is 12+7?", system=SYSTEM)
    b = lp.build_prompt(tiny, "What is 3*4?", system=SYSTEM)
    assert a.segments == b.segments and a.tokens.tolist() != b.tokens.tolist()
    return a, b


def entropy_by_hand(logits: torch.Tensor) -> float:
    p = torch.softmax(logits.double(), -1)
    return float(-torch.where(p > 0, p * p.log(), 0.0).sum())


def kl_by_hand(clean_logits: torch.Tensor, patched_logits: torch.Tensor) -> float:
    """KL(clean || patched) = sum p_clean (ln p_clean - ln p_patched), nats."""
    lp_clean = torch.log_softmax(clean_logits.double(), -1)
    lp_patched = torch.log_softmax(patched_logits.double(), -1)
    return float((lp_clean.exp() * (lp_clean - lp_patched)).sum())


def module_of(hf, site: str):
    """The plain model's module whose output (``"layer"``, ``"mlp"``) or input (``"o_proj"``) a site reads."""
    layer, kind = site.split(".")
    block = hf.model.layers[int(layer)]
    return {"layer": block, "mlp": block.mlp, "o_proj": block.self_attn.o_proj}[kind]


def _first(x):
    return x[0] if isinstance(x, tuple) else x


def hf_run(hf, tokens, *, record=(), write=None, attentions=False):
    """One plain forward. ``record``: sites whose activation [pos, ...] to return; ``write``:
    {site: (positions, values)} written into the batch-0 activation before it is used."""
    got, handles = {}, []
    write = write or {}
    for site in set(record) | set(write):
        mod = module_of(hf, site)
        if site.endswith("o_proj"):
            def pre(m, args, site=site):
                x = args[0].clone()
                got[site] = x[0].detach().clone()
                if site in write:
                    pos, values = write[site]
                    x[0, pos] = values
                return (x,)

            handles.append(mod.register_forward_pre_hook(pre))
        else:
            def post(m, args, out, site=site):
                hidden = _first(out).clone()
                got[site] = hidden[0].detach().clone()
                if site in write:
                    pos, values = write[site]
                    hidden[0, pos] = values
                return (hidden, *out[1:]) if isinstance(out, tuple) else hidden

            handles.append(mod.register_forward_hook(post))
    try:
        with torch.inference_mode():
            out = hf(tokens, output_attentions=attentions)
    finally:
        for h in handles:
            h.remove()
    return out, got


def top_logit(logits, prompt):
    """A metric with a wide range on the near-uniform tiny model: the largest last-position logit."""
    return logits[:, -1].max(-1).values


def test_patch_question_across_lengths_matches_hand_patch(tiny, tiny_hf, pair):
    src, tgt = pair
    assert len(src) != len(tgt)
    res = patch(tiny, src, tgt, "blocks.0.hook_resid_post", segments=["question", "assistant_prefix"],
                metric=top_logit)
    df = res.to_dataframe()
    assert list(df["site"]) == ["blocks.0.hook_resid_post @ question",
                                "blocks.0.hook_resid_post @ assistant_prefix", "all sites"]
    src_out, got = hf_run(tiny_hf, src.tokens, record=["0.layer"])
    layer0 = got["0.layer"]
    clean_logits = hf_run(tiny_hf, tgt.tokens)[0].logits[0, -1]
    clean, src_value = float(clean_logits.max()), float(src_out.logits[0, -1].max())
    assert res.target_value == pytest.approx(clean, abs=1e-6)
    assert res.source_value == pytest.approx(src_value, abs=1e-6)
    segs = (["question"], ["assistant_prefix"], ["question", "assistant_prefix"])
    for row, names in zip(df.itertuples(), segs, strict=True):
        s = [i for n in names for i in src.positions(n)]
        t = [i for n in names for i in tgt.positions(n)]
        logits = hf_run(tiny_hf, tgt.tokens, write={"0.layer": (t, layer0[s])})[0].logits[0, -1]
        assert row.patched == pytest.approx(float(logits.max()), abs=1e-6), row.site
        assert abs(float(logits.max()) - clean) > 1e-4  # the hand-patched run differs from the clean one
        # the library sums the KL in float32: agreement to a few 1e-7
        assert row.kl == pytest.approx(kl_by_hand(clean_logits, logits), rel=1e-2, abs=5e-7), row.site
        assert row.n_positions == len(t)
        assert row.change == pytest.approx(row.patched - row.clean, abs=1e-7)
        assert row.share == pytest.approx(row.change / (res.source_value - res.target_value), rel=1e-5)
    # the default metric is the next-token entropy at the last prompt position
    default = patch(tiny, src, tgt, "blocks.0.hook_resid_post", segments="question")
    assert default.target_value == pytest.approx(entropy_by_hand(clean_logits), abs=2e-6)


def test_patching_another_prompt_at_every_position_matches_hand_patch(tiny, tiny_hf, same_length):
    """hook_z (the o_proj input) of layer 0 and the layer-1 MLP output, copied from a prompt with another
    question: each site alone and both at once, against the same copies made by hand."""
    src, tgt = same_length
    res = patch(tiny, src, tgt, ["blocks.0.attn.hook_z", "blocks.1.hook_mlp_out"], metric=top_logit)
    df = res.to_dataframe()
    assert list(df["site"]) == ["blocks.0.attn.hook_z @ all positions", "blocks.1.hook_mlp_out @ all positions",
                                "all sites"]
    _, source_acts = hf_run(tiny_hf, src.tokens, record=["0.o_proj", "1.mlp"])
    every = list(range(len(tgt)))
    clean_logits = hf_run(tiny_hf, tgt.tokens)[0].logits[0, -1]
    for row, sites in zip(df.itertuples(), (["0.o_proj"], ["1.mlp"], ["0.o_proj", "1.mlp"]), strict=True):
        write = {site: (every, source_acts[site]) for site in sites}
        logits = hf_run(tiny_hf, tgt.tokens, write=write)[0].logits[0, -1]
        assert row.clean == pytest.approx(float(clean_logits.max()), abs=1e-6)
        assert row.patched == pytest.approx(float(logits.max()), abs=1e-6), row.site
        assert abs(row.patched - row.clean) > 1e-4, row.site  # patching that site changes the prediction
        # the library sums the KL in float32: agreement to a few 1e-7
        assert row.kl == pytest.approx(kl_by_hand(clean_logits, logits), rel=1e-2, abs=5e-7), row.site


def attention_to_by_hand(attentions, keys: list[int]) -> float:
    """Mean over layers, heads and the queries after the last key of the attention summed over ``keys``."""
    total, count = 0.0, 0
    for a in attentions:  # [head, q, k]
        for h in range(a.shape[0]):
            for q in range(max(keys) + 1, a.shape[1]):
                total += float(a[h, q, keys].sum())
                count += 1
    return total / count


def test_patch_hook_z_changes_attention_in_later_layers(tiny, tiny_hf, pair):
    """Layer-0 head outputs over the question, copied from the prompt with filler: layer 0's own
    attention cannot change, layer 1's does; the attention measure equals the plain model's."""
    src, tgt = pair
    res = patch(tiny, src, tgt, "blocks.0.attn.hook_z", segments="question", metric="attention:question")
    row = res.to_dataframe().iloc[0]
    keys = tgt.positions("question")
    _, source_acts = hf_run(tiny_hf, src.tokens, record=["0.o_proj"])
    clean_out, _ = hf_run(tiny_hf, tgt.tokens, attentions=True)
    copied = source_acts["0.o_proj"][src.positions("question")]
    patched_out, _ = hf_run(tiny_hf, tgt.tokens, write={"0.o_proj": (keys, copied)}, attentions=True)
    clean = [a[0] for a in clean_out.attentions]
    patched = [a[0] for a in patched_out.attentions]
    assert row["clean"] == pytest.approx(attention_to_by_hand(clean, keys), abs=1e-6)
    assert row["patched"] == pytest.approx(attention_to_by_hand(patched, keys), abs=1e-6)
    assert torch.allclose(patched[0], clean[0], atol=1e-7)  # layer 0 reads its inputs before hook_z
    assert abs(row["patched"] - row["clean"]) > 1e-5  # layer 1 moved


def test_patch_bad_input(tiny, pair):
    src, tgt = pair
    with pytest.raises(LensprobeError, match="equal lengths.*segments"):
        patch(tiny, src, tgt, "blocks.0.hook_resid_post")
    with pytest.raises(LensprobeError, match="'filler' has 8 tokens in the source but|unknown segment 'filler'"):
        patch(tiny, src, tgt, "blocks.0.hook_resid_post", segments="filler")
    with pytest.raises(LensprobeError, match="does not exist"):
        patch(tiny, src, tgt, "blocks.0.hook_nope", segments="question")
    with pytest.raises(LensprobeError, match="two position axes"):
        patch(tiny, src, tgt, "blocks.0.attn.hook_pattern", segments="question")
    other = lp.build_prompt(tiny, "What is 12+7? Show the steps.", system=SYSTEM)
    with pytest.raises(LensprobeError, match="same length in both"):
        patch(tiny, src, other, "blocks.0.hook_resid_post", segments="question")
