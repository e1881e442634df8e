"""ARM: the redistribution rule on hand-made tensors (counts and indices worked out by hand, a
numpy re-implementation as oracle), the hook-built intervention against a plain-torch MLP on
the twin model's weights, generation under a seed, per-row statistics, presets, bad input."""

import types

import numpy as np
import pytest
import torch

import lensprobe as lp
from lensprobe.core.errors import LensprobeError
from lensprobe.interventions import ARM, arm_redistribute
from lensprobe.interventions.arm import BatchDependenceWarning, activation_function

# |a| sorted: 0.0004 (i=6), 0.001 (i=1), 0.002 (i=3), 0.3, 0.5, 1.0, 1.2, 2.0.
# median(|a|) (lower middle of 8) = 0.3; deviations |.|-0.3 sorted: 0, 0.2, 0.298, 0.299,
# 0.2996, 0.7, 0.9, 1.7 -> MAD = 0.299, so eps = 1.4826 * 0.299 * c.
HAND = torch.tensor([[-0.3, 0.001, 2.0, -0.002, 0.5, 1.2, 0.0004, -1.0]])


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def moved(out: torch.Tensor, a: torch.Tensor) -> set[int]:
    return set(torch.nonzero((out != a).reshape(-1)).reshape(-1).tolist())


def numpy_arm(a: np.ndarray, u: np.ndarray, *, c, percentile, p_min=0.02, p_max=0.25, k=1.0):
    """The default rule written again in numpy (float64), given the uniform draws ``u``."""
    flat = a.reshape(-1).astype(np.float64)
    mag = np.abs(flat)
    srt = np.sort(mag)
    med = srt[(len(srt) - 1) // 2]  # torch.median: the lower middle value
    dev = np.sort(np.abs(mag - med))
    mad = max(dev[(len(dev) - 1) // 2], 1e-12)
    eps = 1.4826 * mad * c
    fraction = min(max(k * np.mean(mag < eps), p_min), p_max)
    n = max(1, int(round(fraction * flat.size)))
    idx = np.argsort(mag, kind="stable")[:n]
    pos_target = np.percentile(flat, percentile)
    neg_target = abs(flat[flat < 0].min())
    sign = np.where(flat[idx] < 0, -1.0, 1.0)
    out = flat.copy()
    out[idx] = sign * u[:n] * np.where(sign > 0, pos_target, neg_target)
    return out.reshape(a.shape), idx


# --------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(("c", "p_max", "expected"), [
    (0.1, 0.25, {6, 1}),        # eps 0.0443: 3 of 8 near zero -> 0.375 -> clamped 0.25 -> n = 2
    (0.1, 0.5, {6, 1, 3}),      # same, not clamped: n = round(3.0) = 3
    (0.001, 0.25, {6}),         # eps 0.00044: 1 of 8 -> 0.125 -> n = 1
])
def test_moves_exactly_the_hand_computed_entries(c, p_max, expected):
    out = arm_redistribute(HAND, c=c, percentile=95, p_max=p_max, generator=gen(0))
    assert moved(out, HAND) == expected
    keep = torch.ones(HAND.numel(), dtype=torch.bool)
    keep[list(expected)] = False
    assert torch.equal(out.reshape(-1)[keep], HAND.reshape(-1)[keep])  # bit-identical


def test_matches_a_numpy_reimplementation():
    a = torch.randn(3, 5, 40, generator=gen(1)) * torch.rand(3, 5, 40, generator=gen(2))
    out = arm_redistribute(a, c=0.3, percentile=99.5, generator=gen(7))
    n = len(moved(out, a))
    u = torch.rand(n, generator=gen(7)).double().numpy()
    expected, idx = numpy_arm(a.numpy(), u, c=0.3, percentile=99.5)
    assert moved(out, a) == set(idx.tolist())
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_moved_values_stay_within_their_bounds_and_the_near_zero_share_falls():
    a = torch.randn(4, 300, generator=gen(3))
    out = arm_redistribute(a, c=0.5, percentile=90, generator=gen(4))
    idx = sorted(moved(out, a))
    assert len(idx) > 10
    flat_a, flat_out = a.reshape(-1), out.reshape(-1)
    target = float(np.percentile(a.numpy(), 90))
    neg_bound = float(a.min().abs())
    for i in idx:
        if flat_a[i] >= 0:
            assert 0 <= flat_out[i] <= target + 1e-6
        else:
            assert -neg_bound - 1e-6 <= flat_out[i] <= 0
    mag = a.abs()
    med = mag.median()
    eps = 1.4826 * (mag - med).abs().median() * 0.5
    assert (out.abs() < eps).float().mean() < (mag < eps).float().mean()


def test_zero_bounds_still_move_exactly_the_smallest_entry():
    a = torch.randn(2, 50, generator=gen(5))
    out = arm_redistribute(a, c=0.2, percentile=95, p_min=0.0, p_max=0.0, generator=gen(0))
    assert moved(out, a) == {int(a.abs().reshape(-1).argmin())}


def test_generator_makes_it_reproducible():
    a = torch.randn(3, 64, generator=gen(6))
    first = arm_redistribute(a, c=0.2, percentile=95, generator=gen(11))
    again = arm_redistribute(a, c=0.2, percentile=95, generator=gen(11))
    other = arm_redistribute(a, c=0.2, percentile=95, generator=gen(12))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    assert moved(first, a) == moved(other, a)  # same entries, other draws


def test_add_mode_adds_the_shift_and_the_input_is_untouched():
    a = torch.randn(2, 80, generator=gen(8))
    before = a.clone()
    replaced = arm_redistribute(a, c=0.2, percentile=95, generator=gen(9))
    added = arm_redistribute(a, c=0.2, percentile=95, mode="add", generator=gen(9))
    assert torch.equal(a, before)
    idx = sorted(moved(replaced, a))
    keep = torch.ones(a.numel(), dtype=torch.bool)
    keep[idx] = False
    torch.testing.assert_close(added.reshape(-1)[idx], a.reshape(-1)[idx] + replaced.reshape(-1)[idx])
    assert torch.equal(added.reshape(-1)[keep], a.reshape(-1)[keep])


def test_low_precision_input_keeps_its_dtype_and_unmoved_bits():
    a = torch.randn(2, 3, 32, generator=gen(10)).to(torch.bfloat16)
    out = arm_redistribute(a, c=0.2, percentile=95, generator=gen(0))
    assert out.dtype == torch.bfloat16 and out.shape == a.shape
    changed = out != a
    assert 0 < int(changed.sum()) <= round(0.25 * a.numel())
    assert torch.equal(out[~changed], a[~changed])


def test_gemma_variant_moves_the_quantile_share_and_reads_percent_or_fraction():
    a = torch.randn(100, generator=gen(0))
    out = arm_redistribute(a, c=0.1, percentile=0.85, variant="gemma", generator=gen(1))
    mag = a.abs()
    tau = torch.quantile(mag, 0.1)
    assert moved(out, a) == set(torch.nonzero(mag <= tau).reshape(-1).tolist())
    assert len(moved(out, a)) == 10  # quantile position 0.1 * 99 = 9.9: the 10 smallest
    same = arm_redistribute(a, c=0.1, percentile=85, variant="gemma", generator=gen(1))
    assert torch.equal(out, same)
    target = float(torch.quantile(mag, 0.85))
    idx = sorted(moved(out, a))
    assert all(0 <= out[i] <= target + 1e-6 for i in idx if a[i] >= 0)
    assert all(-float(a.min().abs()) - 1e-6 <= out[i] <= 0 for i in idx if a[i] < 0)


# --------------------------------------------------------------------------- the intervention


def capture(model, tokens, *interventions):
    store = {}

    def rec(name):
        def fn(x, hook):
            store[name] = x.detach().clone()
        return fn

    names = ["blocks.0.mlp.hook_in", "blocks.0.mlp.hook_out"]
    with lp.intervene(model, *interventions, *[(n, rec(n)) for n in names]):
        model(tokens)
    return store["blocks.0.mlp.hook_in"], store["blocks.0.mlp.hook_out"]


@pytest.mark.parametrize("which", ["tiny", pytest.param("smol", marks=pytest.mark.slow)])
def test_hook_built_arm_equals_a_plain_torch_mlp_on_the_twin_weights(request, which):
    model = request.getfixturevalue(which)
    twin = request.getfixturevalue(f"{which}_hf")
    tokens = model.to_tokens("What is 12+7? The answer is 19.")
    rule = dict(c=0.2, percentile=95) if which == "tiny" else dict(c=0.1, percentile=95)  # the latter: a preset
    x, out = capture(model, tokens, ARM(layer=0, seed=3, **rule))
    _, plain_out = capture(model, tokens)
    mlp = twin.model.layers[0].mlp
    with torch.no_grad():
        gate = x @ mlp.gate_proj.weight.T
        up = x @ mlp.up_proj.weight.T
        act = arm_redistribute(mlp.act_fn(gate), generator=gen(3), **rule)
        expected = (act * up) @ mlp.down_proj.weight.T
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
    assert (out - plain_out).abs().max() > 1e-3  # the intervention did something


def test_generation_under_a_seed_is_deterministic(tiny):
    ids = tiny.tokenizer.encode("What is 3*4? It is")
    arm = ARM(c=0.2, percentile=95, seed=0)
    first = lp.generate(tiny, ids, max_new_tokens=4, interventions=[arm])
    again = lp.generate(tiny, ids, max_new_tokens=4, interventions=[arm])
    other = lp.generate(tiny, ids, max_new_tokens=4, interventions=[ARM(c=0.2, percentile=95, seed=1)])
    assert torch.equal(first.token_ids_rows, again.token_ids_rows)
    assert torch.equal(first.entropy_rows, again.entropy_rows)
    assert not torch.equal(first.entropy_rows, other.entropy_rows)


def test_per_row_statistics_do_not_depend_on_the_batch(tiny):
    rows = [tiny.tokenizer.encode("What is 12+7?"), tiny.tokenizer.encode("The cat sat on")]
    width = min(len(r) for r in rows)
    batch = torch.tensor([r[:width] for r in rows])
    assert not torch.equal(batch[0], batch[1])
    _, together = capture(tiny, batch, ARM(c=0.2, percentile=95, seed=0, per_row=True))
    for b in range(2):
        _, alone = capture(tiny, batch[b:b + 1], ARM(c=0.2, percentile=95, seed=0, per_row=True))
        torch.testing.assert_close(together[b:b + 1], alone, rtol=0, atol=1e-5)
    # Over the whole tensor (the authors' rule) a row's result depends on its batch.
    with pytest.warns(BatchDependenceWarning, match="over a forward of 2 rows"):
        _, pooled = capture(tiny, batch, ARM(c=0.2, percentile=95, seed=0, per_row=False))
    _, alone = capture(tiny, batch[:1], ARM(c=0.2, percentile=95, seed=0, per_row=False))
    assert (pooled[:1] - alone).abs().max() > 1e-4


# --------------------------------------------------------------------------- presets


def test_presets_follow_the_authors_table():
    qwen = ARM.preset("Qwen/Qwen2.5-Math-7B")
    assert (qwen.c, qwen.percentile, qwen.variant) == (0.1, 95, "default")
    assert (ARM.preset("qwen2.5-math-7b", "AIME2024").c, ARM.preset("Qwen2.5-Math-7B", "aime2024").percentile) == (0.05, 90)
    assert ARM.preset("Qwen/Qwen2.5-Math-1.5B").c == 0.13
    llama = ARM.preset("meta-llama/Llama-3.1-8B-Instruct")
    assert (llama.c, llama.percentile, llama.p_min) == (0.32, 90, 0.2)
    gemma = ARM.preset("google/gemma-3-27b-it", benchmark="aime2024")
    assert (gemma.c, gemma.percentile, gemma.variant) == (0.25, 0.965, "gemma")
    assert ARM.preset("google/GEMMA-3-27B-IT").percentile == 0.85
    assert ARM.preset("Qwen/Qwen2.5-32B-Instruct", "aime2024").percentile == 99.5
    assert ARM.preset("Qwen/Qwen2.5-Math-7B", seed=4, layer=1).seed == 4
    with pytest.raises(LensprobeError, match=r"authors report no ARM gain for qwen2.5-32b-instruct on math500.*lp\.ARM\(c=\.\.\., percentile=\.\.\.\)"):
        ARM.preset("Qwen/Qwen2.5-32B-Instruct")
    with pytest.raises(LensprobeError, match=r"no ARM preset for 'lensprobe-tiny-llama'.*c=\.\.\., percentile="):
        ARM.preset("lensprobe-tiny-llama")
    with pytest.raises(LensprobeError, match=r"unknown benchmark 'gsm8k'"):
        ARM.preset("Qwen/Qwen2.5-Math-7B", "gsm8k")
    with pytest.raises(LensprobeError, match=r"unknown ARM field\(s\) \['sed'\]"):
        ARM.preset("Qwen/Qwen2.5-Math-7B", sed=1)


# --------------------------------------------------------------------------- bad input


@pytest.mark.unchecked
@pytest.mark.parametrize(("kwargs", "match"), [
    ({}, r"ARM needs c and percentile: pass lp\.ARM\(c=\.\.\., percentile=\.\.\.\)"),
    ({"c": 0.1}, r"ARM needs percentile"),
    ({"c": -0.1, "percentile": 95}, r"c must be a non-negative number, got -0\.1"),
    ({"c": 0.1, "percentile": 150}, r"percentile must be in \[0, 100\].*got 150"),
    ({"c": 0.1, "percentile": 95, "p_min": 0.3, "p_max": 0.2}, r"p_min \(0\.3\) must not exceed p_max \(0\.2\)"),
    ({"c": 0.1, "percentile": 95, "p_max": 1.5}, r"p_max must be a fraction in \[0, 1\], got 1\.5"),
    ({"c": 0.1, "percentile": 95, "k": -1}, r"k must be a non-negative number, got -1"),
    ({"c": 0.1, "percentile": 95, "mode": "scale"}, r"mode: expected one of replace, add, got 'scale'"),
    ({"c": 0.1, "percentile": 95, "variant": "qwen"}, r"variant: expected one of default, gemma, got 'qwen'"),
    ({"c": 1.5, "percentile": 0.85, "variant": "gemma"}, r"variant='gemma', c is the fraction.*got 1\.5"),
    ({"c": 0.1, "percentile": 95, "layer": -1}, r"layer must be a non-negative int \(0-based\), got -1"),
    ({"c": 0.1, "percentile": 95, "seed": 1.5}, r"seed: expected a whole number or None, got 1\.5"),
    ({"c": 0.1, "percentile": 95, "per_row": "yes"}, r"per_row: expected true or false \(a bool\), got 'yes'"),
    ({"c": True, "percentile": 95}, r"c: expected a finite number or None, got True"),
])
def test_bad_settings_are_refused_up_front(kwargs, match):
    with pytest.raises(LensprobeError, match=match):
        ARM(**kwargs)


@pytest.mark.unchecked
def test_bad_tensors_and_models_are_refused(tiny):
    with pytest.raises(LensprobeError, match=r"activations must be a floating-point tensor, got Tensor of dtype torch\.int64"):
        arm_redistribute(torch.arange(4), c=0.1, percentile=95)
    with pytest.raises(LensprobeError, match=r"activations is empty"):
        arm_redistribute(torch.zeros(0), c=0.1, percentile=95)
    with pytest.raises(LensprobeError, match=r"layer 5 out of range: model has 2 layers \(0-1\)"):
        ARM(layer=5, c=0.1, percentile=95).hooks(tiny)
    not_gated = types.SimpleNamespace(cfg=types.SimpleNamespace(n_layers=2, gated_mlp=False), hook_dict={})
    with pytest.raises(LensprobeError, match=r"ARM needs a gated MLP .*this model has no gated MLP"):
        ARM(c=0.1, percentile=95).hooks(not_gated)
    no_hooks = types.SimpleNamespace(cfg=types.SimpleNamespace(n_layers=2, gated_mlp=True),
                                     hook_dict={"blocks.0.mlp.hook_post": None})
    with pytest.raises(LensprobeError, match=r"lacks \['blocks\.0\.mlp\.hook_pre', 'blocks\.0\.mlp\.hook_pre_linear'\]"):
        ARM(c=0.1, percentile=95).hooks(no_hooks)
    post = ARM(c=0.1, percentile=95).hooks(tiny)[-1][1]
    with pytest.raises(LensprobeError, match=r"gate and up projections were not recorded"):
        post(torch.zeros(1, 2, 128), None)


def test_activation_function_falls_back_to_the_config_name():
    silu = activation_function(types.SimpleNamespace(cfg=types.SimpleNamespace(act_fn="silu")), 0)
    x = torch.linspace(-3, 3, 7)
    torch.testing.assert_close(silu(x), torch.nn.functional.silu(x))
    with pytest.raises(LensprobeError, match=r"cannot find the activation function of layer 0's MLP.*'swoosh'"):
        activation_function(types.SimpleNamespace(cfg=types.SimpleNamespace(act_fn="swoosh")), 0)


@pytest.mark.parametrize("mode", ["replace", "add"])
def test_rows_at_once_equal_one_call_per_row_bit_for_bit(mode):
    """arm_redistribute_rows (every row's statistics at once, what per-row ARM runs at each decode
    step) gives each row exactly what arm_redistribute gives it alone: values and draws."""
    from lensprobe.interventions.arm_rule import arm_redistribute_rows

    g = torch.Generator().manual_seed(11)
    rows = torch.randn(6, 97, generator=g)
    rows[1, :40] = 0.0  # ties at zero
    rows[2] = rows[2].abs()  # no negative entry
    rows[3, ::3] = rows[3, 1]  # repeated values
    rows[4] *= 1e-3
    for c, pct, p_min, p_max, k in [(0.1, 95, 0.02, 0.25, 1), (0.5, 99.5, 0.0, 1.0, 2), (0.0, 0, 0.0, 0.0, 1)]:
        rule = dict(c=c, percentile=pct, p_min=p_min, p_max=p_max, k=k, mode=mode)
        together = arm_redistribute_rows(rows, [torch.Generator().manual_seed(b) for b in range(6)], **rule)
        for b in range(6):
            alone = arm_redistribute(rows[b], generator=torch.Generator().manual_seed(b), **rule)
            assert torch.equal(together[b], alone), (rule, b)
    with pytest.raises(LensprobeError, match="one generator per row"):
        arm_redistribute_rows(rows, [None], c=0.1, percentile=95)
