"""Activation patching aligned by segment name, checked against hand-written transformers hooks."""

import pytest
import torch

import lensprobe as lp
from lensprobe.core.errors import LensprobeError
from lensprobe.core.metrics import entropy
from lensprobe.interventions.patching import patch


@pytest.fixture(scope="module")
def pair(tiny):
    system = "Please reason step by step."
    with_filler = lp.build_prompt(tiny, "What is 12+7?", system=system, filler=lp.Filler.meaningless(count=8))
    without = lp.build_prompt(tiny, "What is 12+7?", system=system)
    return with_filler, without


def hf_layer_outputs(model, tokens, layer):
    hf = model.original_model
    got = {}

    def keep(mod, args, out):
        got["h"] = (out[0] if isinstance(out, tuple) else out).detach().clone()

    h = hf.model.layers[layer].register_forward_hook(keep)
    try:
        with torch.inference_mode():
            hf(tokens)
    finally:
        h.remove()
    return got["h"]


def hf_patched_logits(model, tokens, layer, positions, values):
    hf = model.original_model

    def put(mod, args, out):
        hidden = (out[0] if isinstance(out, tuple) else out).clone()
        hidden[0, positions] = values
        return (hidden, *out[1:]) if isinstance(out, tuple) else hidden

    h = hf.model.layers[layer].register_forward_hook(put)
    try:
        with torch.inference_mode():
            return hf(tokens).logits
    finally:
        h.remove()


def test_patch_question_across_lengths_matches_hand_patch(tiny, pair):
    src, tgt = pair
    assert len(src) != len(tgt)
    res = patch(tiny, src, tgt, "blocks.0.hook_resid_post", segments=["question", "assistant_prefix"])
    df = res.to_dataframe()
    assert list(df["site"]) == ["blocks.0.hook_resid_post @ question",
                                "blocks.0.hook_resid_post @ assistant_prefix", "all sites"]
    layer0 = hf_layer_outputs(tiny, src.tokens, 0)[0]
    for seg, row in zip(["question", "assistant_prefix"], df.itertuples(), strict=False):
        s, t = src.positions(seg), tgt.positions(seg)
        logits = hf_patched_logits(tiny, tgt.tokens, 0, t, layer0[s])
        assert row.patched == pytest.approx(entropy(logits[0, -1]).item(), abs=1e-5)
        assert row.n_positions == len(t)
    clean = entropy(tiny.original_model(tgt.tokens).logits[0, -1].detach()).item()
    assert res.target_value == pytest.approx(clean, abs=1e-5)
    src_value = entropy(tiny.original_model(src.tokens).logits[0, -1].detach()).item()
    assert res.source_value == pytest.approx(src_value, abs=1e-5)
    both = src.positions("question") + src.positions("assistant_prefix")
    both_t = tgt.positions("question") + tgt.positions("assistant_prefix")
    logits = hf_patched_logits(tiny, tgt.tokens, 0, both_t, layer0[both])
    assert df.iloc[-1]["patched"] == pytest.approx(entropy(logits[0, -1]).item(), abs=1e-5)
    assert (df["change"] - (df["patched"] - df["clean"])).abs().max() < 1e-9
    for row in df.itertuples():  # share of the source-target difference, by hand
        assert row.share == pytest.approx((row.patched - clean) / (src_value - clean), rel=1e-4, abs=1e-4)
    assert df["kl"].min() >= 0 and df["kl"].max() > 0


def test_patching_a_prompt_into_itself_changes_nothing(tiny, pair):
    src, _ = pair
    res = patch(tiny, src, src, ["blocks.0.attn.hook_z", "blocks.1.hook_mlp_out"], metric="logprob", answer="19")
    df = res.to_dataframe()
    assert len(df) == 3
    assert df["change"].abs().max() < 1e-6 and df["kl"].abs().max() < 1e-6
    assert df["share"].isna().all()  # no source-target difference to carry over


def test_patch_hook_z_changes_only_through_that_head_layer(tiny, pair):
    src, tgt = pair
    res = patch(tiny, src, tgt, "blocks.1.attn.hook_z", segments="question", metric="attention:question")
    # layer 1 is the last layer: its z cannot change any attention pattern
    assert res.to_dataframe()["change"].abs().max() < 1e-7


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
    other = lp.build_prompt(tiny, "What is 12+7? Show the steps.", system="Please reason step by step.")
    with pytest.raises(LensprobeError, match="same length in both"):
        patch(tiny, src, other, "blocks.0.hook_resid_post", segments="question")
