"""The layer-0 mechanism: the affine fit of attention with vs without filler (exact where it must be,
checked against a plain transformers twin), and MLP activation statistics against a by-hand computation."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import lensprobe as lp
from lensprobe.core.models.testing import tiny_model
from lensprobe.studies.mechanism import (
    ActivationStats,
    activation_stats,
    affine_fit_summary,
    filler_affine_fit,
    fraction_beyond,
    mad_eps,
    mechanism_prompts,
    near_zero_fraction,
)

QUESTION = "What is 12+7?"


def prompts_of(model, count: int = 7):
    with_f = lp.build_prompt(model, QUESTION, system=lp.MATH_SYSTEM_PROMPT, filler=lp.Filler.meaningless(count=count))
    without = lp.build_prompt(model, QUESTION, system=lp.MATH_SYSTEM_PROMPT)
    return with_f, without


@pytest.fixture(scope="module")
def flat_scores():
    """The tiny model with layer 0's q_proj zeroed: every layer-0 score is 0, so attention is uniform
    over the keys a query sees, whatever their positions."""
    model = tiny_model(seed=0)
    with torch.no_grad():
        model.original_model.model.layers[0].self_attn.q_proj.weight.zero_()
    return model


def layer0_values_by_hand(hf, tokens):
    """``v_proj(input_layernorm(embed(tokens)))`` of layer 0 with plain torch: [pos, kv_head, d_head]."""
    layer = hf.model.layers[0]
    with torch.inference_mode():
        x = layer.input_layernorm(hf.model.embed_tokens(tokens[0]))
        v = layer.self_attn.v_proj(x)
    return v.view(v.shape[0], hf.config.num_key_value_heads, -1).double()


def test_the_affine_fit_is_exact_when_scores_do_not_depend_on_the_filler(flat_scores, twin_of):
    with_f, without = prompts_of(flat_scores)
    fit = filler_affine_fit(flat_scores, with_f, without, layer=0)
    n_heads, n_q = 4, len(with_f.positions("question"))
    assert len(fit) == n_heads * n_q and set(fit["head"]) == set(range(n_heads))
    assert fit["rel_error"].max() < 1e-5
    assert fit["rel_change"].min() > 1e-2  # the filler does change the output: the fit is not trivial
    # Uniform attention over keys 0..i: the inserted keys (filler + its newline) take n_inserted / (i + 1).
    inserted = [j for j in range(len(with_f)) if j not in set(with_f.positions_except("filler"))]
    assert inserted == list(range(*with_f.segments["filler"])) + list(range(*with_f.segments["filler_sep"]))
    v = layer0_values_by_hand(twin_of(flat_scores), with_f.tokens)
    for _, row in fit.iterrows():
        i = with_f.positions("question")[row["position"]]
        assert row["prompt_pos"] == i and row["token"] == with_f.str_tokens[i]
        assert row["filler_mass"] == pytest.approx(len(inserted) / (i + 1), abs=1e-6)
        assert row["lambda"] == pytest.approx(1 - len(inserted) / (i + 1), abs=1e-6)
        bias = v[inserted, row["head"] // 2].sum(0) / (i + 1)  # 4 query heads share 2 KV heads
        assert row["bias_norm"] == pytest.approx(float(bias.norm()), rel=1e-4)


def test_lambda_matches_the_plain_model_and_the_fit_is_approximate_with_rope(tiny, tiny_hf):
    with_f, without = prompts_of(tiny, count=9)
    fit = filler_affine_fit(tiny, with_f, without, layer=0, heads=[1, 3])
    assert set(fit["head"]) == {1, 3} and set(fit["head_label"]) == {"L0H1", "L0H3"}
    with torch.inference_mode():
        att = tiny_hf(with_f.tokens, output_attentions=True).attentions[0][0].double()  # [head, q, k]
    kept = set(with_f.positions_except("filler"))
    filler_keys = [j for j in range(len(with_f)) if j not in kept]
    q = with_f.positions("question")
    for h in (1, 3):
        got = fit[fit["head"] == h].sort_values("position")
        by_hand = 1 - att[h][q][:, filler_keys].sum(-1)
        np.testing.assert_allclose(got["lambda"].to_numpy(), by_hand.numpy(), atol=1e-6)
    # RoPE moves the question by the filler length: scores change, so the fit is close but not exact.
    assert (fit["rel_error"] > 1e-5).all()
    assert (fit["rel_error"] < fit["rel_change"]).all()
    summary = affine_fit_summary(fit)
    assert summary["head_label"].tolist() == ["L0H1", "L0H3"]
    first = fit[fit["head"] == 1]
    row = summary.iloc[0]
    assert row["mean_lambda"] == pytest.approx(first["lambda"].mean())
    assert row["max_rel_error"] == pytest.approx(first["rel_error"].max())
    assert row["n_positions"] == len(q)


@pytest.mark.unchecked
def test_the_fit_refuses_prompts_that_do_not_differ_by_the_filler(tiny):
    with_f, without = prompts_of(tiny)
    with pytest.raises(lp.LensprobeError, match="with_filler has no 'filler' segment"):
        filler_affine_fit(tiny, without, without)
    with pytest.raises(lp.LensprobeError, match="without has a 'filler' segment"):
        filler_affine_fit(tiny, with_f, with_f)
    other = lp.build_prompt(tiny, "What is 3*4?", system=lp.MATH_SYSTEM_PROMPT)
    with pytest.raises(lp.LensprobeError, match="the prompts differ outside the filler"):
        filler_affine_fit(tiny, with_f, other)
    with pytest.raises(lp.LensprobeError, match="layer 2 out of range"):
        filler_affine_fit(tiny, with_f, without, layer=2)
    with pytest.raises(lp.LensprobeError, match="must be a Prompt"):
        filler_affine_fit(tiny, with_f.tokens, without)
    with pytest.raises(lp.LensprobeError, match="not a filler_affine_fit table"):
        affine_fit_summary(with_f.tokens)


@pytest.mark.unchecked
def test_tensor_helpers_by_hand():
    a = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0, 0.05])
    mag = np.abs(a.numpy())
    lower_median = lambda x: np.sort(x)[(len(x) - 1) // 2]  # noqa: E731 (torch.median's lower middle)
    mad = lower_median(np.abs(mag - lower_median(mag)))
    assert mad_eps(a, c=0.5) == pytest.approx(1.4826 * mad * 0.5, rel=1e-6)
    assert near_zero_fraction(a, 0.06) == pytest.approx(2 / 6)
    assert near_zero_fraction(a, 0.0) == 0.0
    assert fraction_beyond(a, 1.0) == pytest.approx(2 / 6)
    with pytest.raises(lp.LensprobeError, match="must be a floating-point tensor"):
        mad_eps(torch.tensor([1, 2]), c=0.1)
    with pytest.raises(lp.LensprobeError, match="c must be a non-negative finite number"):
        mad_eps(a, c=-1)
    with pytest.raises(lp.LensprobeError, match="is empty"):
        near_zero_fraction(torch.tensor([]), 0.1)


def gate_and_up_by_hand(hf, prompt):
    """Layer 0's gate_proj and up_proj outputs, captured with plain torch forward hooks: [pos, d_mlp]."""
    mlp, seen = hf.model.layers[0].mlp, {}
    handles = [mlp.gate_proj.register_forward_hook(lambda m, i, o: seen.__setitem__("gate", o.detach().clone())),
               mlp.up_proj.register_forward_hook(lambda m, i, o: seen.__setitem__("up", o.detach().clone()))]
    try:
        with torch.inference_mode():
            hf(prompt.tokens)
    finally:
        for h in handles:
            h.remove()
    return seen["gate"][0], seen["up"][0]


def test_activation_stats_equal_a_by_hand_computation(tiny, tiny_hf):
    ps = mechanism_prompts(tiny, QUESTION, count=11)
    arm = lp.ARM(c=0.1, percentile=95, seed=0)
    stats = activation_stats(tiny, {"w/o": ps["w/o"], "w/ Mless": ps["w/ Mless"], "w/o + ARM": ps["w/o"]},
                             interventions={"w/o + ARM": [arm]}, c=0.2, bins=25, magnitudes=(0.05, 0.2))
    assert isinstance(stats, ActivationStats) and stats.conditions == ["w/o", "w/ Mless", "w/o + ARM"]
    by_hand = {}
    for name in ("w/o", "w/ Mless"):
        gate, _ = gate_and_up_by_hand(tiny_hf, ps[name])
        by_hand[name] = F.silu(gate)[ps[name].positions("question")].reshape(-1).double().numpy()
    gate, _ = gate_and_up_by_hand(tiny_hf, ps["w/o"])
    edited = lp.interventions.arm_redistribute(F.silu(gate)[None], c=0.1, percentile=95, generator=torch.Generator().manual_seed(0))
    by_hand["w/o + ARM"] = edited[0][ps["w/o"].positions("question")].reshape(-1).double().numpy()
    assert not np.allclose(by_hand["w/o + ARM"], by_hand["w/o"])  # ARM moved some question entries
    mag = np.abs(by_hand["w/o"]).astype(np.float32)
    med = np.sort(mag)[(len(mag) - 1) // 2]
    dev = np.abs(mag - med)
    eps = 1.4826 * np.sort(dev)[(len(dev) - 1) // 2] * 0.2
    assert stats.eps == pytest.approx(eps, rel=1e-5) and stats.reference == "w/o"
    lo = min(a.min() for a in by_hand.values())
    hi = max(a.max() for a in by_hand.values())
    edges = np.linspace(lo, hi, 26)
    for name, a in by_hand.items():
        row = stats.summary.set_index("condition").loc[name]
        assert row["n"] == a.size
        assert row["near_zero"] == pytest.approx(np.mean(np.abs(a) < eps), abs=1e-9)
        assert row["mean_abs"] == pytest.approx(np.abs(a).mean(), rel=1e-5)
        assert row["beyond_0.05"] == pytest.approx(np.mean(np.abs(a) > 0.05))
        assert row["beyond_0.2"] == pytest.approx(np.mean(np.abs(a) > 0.2))
        assert row["negative"] == pytest.approx(np.mean(a < 0))
        hist = stats.histogram[stats.histogram["condition"] == name]
        np.testing.assert_allclose(hist["left"].to_numpy(), edges[:-1], rtol=1e-5, atol=1e-6)
        counts, _ = np.histogram(a, bins=edges)
        np.testing.assert_array_equal(hist["count"].to_numpy(), counts)
        np.testing.assert_allclose(hist["fraction"].to_numpy(), counts / a.size)


def test_hook_post_and_given_eps(tiny, tiny_hf):
    ps = mechanism_prompts(tiny, QUESTION, count=5)
    stats = activation_stats(tiny, {"w/ Mless": ps["w/ Mless"]}, where="hook_post", eps=0.01, bins=[-1.0, 0.0, 1.0])
    gate, up = gate_and_up_by_hand(tiny_hf, ps["w/ Mless"])
    a = (F.silu(gate) * up)[ps["w/ Mless"].positions("question")].reshape(-1).double().numpy()
    row = stats.summary.iloc[0]
    assert stats.reference is None and row["eps"] == 0.01 and row["where"] == "hook_post"
    assert row["near_zero"] == pytest.approx(np.mean(np.abs(a) < 0.01))
    np.testing.assert_array_equal(stats.histogram["count"].to_numpy(), np.histogram(a, bins=[-1.0, 0.0, 1.0])[0])


@pytest.mark.unchecked
def test_activation_stats_errors(tiny):
    ps = mechanism_prompts(tiny, QUESTION, count=5)
    other = lp.build_prompt(tiny, "What is 3*4?", system=lp.MATH_SYSTEM_PROMPT)
    with pytest.raises(lp.LensprobeError, match="non-empty dict"):
        activation_stats(tiny, {})
    with pytest.raises(lp.LensprobeError, match=r"interventions for unknown conditions \['arm'\]"):
        activation_stats(tiny, ps, interventions={"arm": [lp.ARM(c=0.1, percentile=95)]})
    with pytest.raises(lp.LensprobeError, match="where must be one of"):
        activation_stats(tiny, ps, where="gate")
    with pytest.raises(lp.LensprobeError, match="other 'question' tokens"):
        activation_stats(tiny, {"a": ps["w/o"], "b": other})
    with pytest.raises(lp.LensprobeError, match="reference 'x' is not one of the conditions"):
        activation_stats(tiny, ps, reference="x")
    with pytest.raises(lp.LensprobeError, match="bin edges must be at least two increasing numbers"):
        activation_stats(tiny, ps, bins=[1.0, 0.0])
    with pytest.raises(lp.LensprobeError, match="unknown segment 'answer'"):
        activation_stats(tiny, ps, segment="answer")
