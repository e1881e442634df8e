"""Head ablation at hook_z: oracles against a separately built plain transformers model, positions under
the KV cache, bad input."""

import pytest
import torch

import lensprobe as lp
from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.heads import kv_group_heads, parse_heads, resolve_heads
from lensprobe.interventions.ablation import ablate_heads, ablate_kv_group
from lensprobe.interventions.replacement import head_means


@pytest.fixture(scope="module")
def prompts(tiny):
    with_filler = lp.build_prompt(tiny, "What is 12+7?", system="Please reason step by step.",
                                  filler=lp.Filler.meaningless(count=6))
    without = lp.build_prompt(tiny, "What is 3*4?", system="Please reason step by step.")
    return with_filler, without


def hf_logits(hf, tokens, edits):
    """Plain transformers forward with ``o_proj`` inputs edited: edits = {layer: fn(x) -> x}.

    ``x`` is the input of ``self_attn.o_proj``: [batch, pos, n_heads * d_head], heads in order.
    """
    handles = []
    for layer, fn in edits.items():
        def pre(mod, args, fn=fn):
            return (fn(args[0].clone()),)

        handles.append(hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(pre))
    try:
        with torch.inference_mode():
            return hf(tokens).logits
    finally:
        for h in handles:
            h.remove()


def hf_o_proj_inputs(hf, tokens, layer):
    """[batch, pos, n_heads, d_head] input of ``o_proj`` in plain transformers."""
    got = {}

    def pre(mod, args):
        got["x"] = args[0].detach().clone()

    h = hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(pre)
    try:
        with torch.inference_mode():
            hf(tokens)
    finally:
        h.remove()
    x = got["x"]
    cfg = hf.config
    return x.view(*x.shape[:2], cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads)


def zero_slice(heads, d_head, positions=None):
    def fn(x):
        for h in heads:
            if positions is None:
                x[..., h * d_head:(h + 1) * d_head] = 0
            else:
                x[:, positions, h * d_head:(h + 1) * d_head] = 0
        return x

    return fn


def bridge_logits(model, tokens, *interventions):
    return lp.forward(model, tokens, *interventions)


# ------------------------------------------------------------------ head specs


def test_parse_heads_forms():
    assert parse_heads("L0H13") == ((0, 13),)
    assert parse_heads("l2h1, L*H4") == ((2, 1), (None, 4))
    assert parse_heads(["H3", (1, 2), "L0H0"]) == ((None, 3), (1, 2), (0, 0))
    assert parse_heads((1, 2)) == ((1, 2),)
    assert parse_heads("all") == ((None, None),)


def test_resolve_heads_expands_every_layer(tiny):
    assert resolve_heads(tiny, "H2") == [(0, 2), (1, 2)]
    assert resolve_heads(tiny, (None, 1)) == [(0, 1), (1, 1)]
    assert len(resolve_heads(tiny, "all")) == tiny.cfg.n_layers * tiny.cfg.n_heads
    assert kv_group_heads(tiny, 1, 1) == [(1, 2), (1, 3)]  # 4 query heads over 2 KV heads


# ------------------------------------------------------------------ oracles


def test_zero_ablation_equals_zeroing_o_proj_input(tiny, tiny_hf, prompts):
    tokens = prompts[0].tokens
    d = tiny.cfg.d_head
    got = bridge_logits(tiny, tokens, ablate_heads(["L1H2", (0, 1), "L0H3"]))
    want = hf_logits(tiny_hf, tokens, {1: zero_slice([2], d), 0: zero_slice([1, 3], d)})
    clean = bridge_logits(tiny, tokens)
    assert (got - want).abs().max() <= 1e-5
    assert (got - clean).abs().max() > 1e-3  # the ablation did something


def test_zero_ablation_oracle_on_smollm2(smol, smol_hf):
    p = lp.build_prompt(smol, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT)
    d = smol.cfg.d_head
    got = bridge_logits(smol, p.tokens, ablate_heads("L0H4,L3H8"))
    want = hf_logits(smol_hf, p.tokens, {0: zero_slice([4], d), 3: zero_slice([8], d)})
    assert (got - want).abs().max() <= 1e-5
    assert (got - hf_logits(smol_hf, p.tokens, {})).abs().max() > 1e-3


def test_ablating_every_head_equals_zeroing_every_o_proj_input_and_leaves_no_hook(tiny, tiny_hf, prompts):
    tokens = prompts[0].tokens
    clean = hf_logits(tiny_hf, tokens, {})  # the plain model, built apart from the bridge
    # every head, every position: the attention blocks add nothing (plain model with all o_proj inputs zeroed)
    everything = bridge_logits(tiny, tokens, ablate_heads("all"))
    want = hf_logits(tiny_hf, tokens, {layer: lambda x: x.zero_() for layer in range(tiny.cfg.n_layers)})
    assert (everything - want).abs().max() <= 1e-5 and (everything - clean).abs().max() > 1e-2
    # positions past the prompt would select nothing in a forward over the prompt: refused
    with pytest.raises(LensprobeError, match=rf"positions {tokens.shape[1] + 5} lie outside the prompt"):
        bridge_logits(tiny, tokens, ablate_heads("all", positions=[tokens.shape[1] + 5]))
    # and nothing is left attached afterwards: the bridge gives the plain model's logits again
    assert (bridge_logits(tiny, tokens) - clean).abs().max() <= 1e-5


@pytest.mark.parametrize("build,empty", [(ablate_heads, []), (ablate_heads, ()), (ablate_heads, ""), (ablate_heads, " , "),
                                         (ablate_kv_group, []), (ablate_kv_group, "")])
def test_an_empty_head_list_is_refused_with_the_fix(build, empty):
    """An empty selection used to ablate nothing silently; now it names the fix."""
    with pytest.raises(LensprobeError, match=r"pass at least one (head, e\.g\. 'L0H1'|KV group, e\.g\. 'L0KV1'); to run "
                       r"without ablation pass no intervention"):
        build(empty)


def test_mean_ablation_by_hand(tiny, tiny_hf, prompts):
    ref = [prompts[0], prompts[1]]
    target = prompts[1].tokens
    layer, head, d = 1, 3, tiny.cfg.d_head
    z = [hf_o_proj_inputs(tiny_hf, p.tokens, layer)[0, :, head] for p in ref]  # [pos, d_head] each
    mean = torch.cat(z).mean(0)

    def fill(x):
        x[..., head * d:(head + 1) * d] = mean
        return x

    want = hf_logits(tiny_hf, target, {layer: fill})
    got = bridge_logits(tiny, target, ablate_heads([(layer, head)], method="mean", reference=ref))
    assert (got - want).abs().max() <= 1e-5
    assert (got - hf_logits(tiny_hf, target, {})).abs().max() > 1e-3
    means = head_means(tiny, ref, layers=[layer])
    assert torch.allclose(means.values[layer][head], mean, atol=1e-6)


def test_mean_ablation_per_position_by_hand(tiny, tiny_hf, prompts):
    ref = [prompts[0], prompts[1]]  # different lengths
    target = prompts[1].tokens
    layer, head, d = 0, 2, tiny.cfg.d_head
    z = [hf_o_proj_inputs(tiny_hf, p.tokens, layer)[0, :, head] for p in ref]
    n = target.shape[1]
    per_pos = torch.stack([torch.stack([zz[i] for zz in z if i < zz.shape[0]]).mean(0) for i in range(n)])

    def fill(x):
        x[0, :, head * d:(head + 1) * d] = per_pos
        return x

    want = hf_logits(tiny_hf, target, {layer: fill})
    abl = ablate_heads([(layer, head)], method="mean", reference=ref, per_position=True)
    got = bridge_logits(tiny, target, abl)
    assert (got - want).abs().max() <= 1e-5
    overall = torch.cat(z).mean(0)  # per position is not the overall mean

    def fill_overall(x):
        x[..., head * d:(head + 1) * d] = overall
        return x

    assert (got - hf_logits(tiny_hf, target, {layer: fill_overall})).abs().max() > 1e-3


def test_resample_ablation_by_hand(tiny, tiny_hf, prompts):
    source, target = prompts[0].tokens, prompts[1].tokens  # source is longer
    layer, head, d = 1, 0, tiny.cfg.d_head
    src_z = hf_o_proj_inputs(tiny_hf, source, layer)[0, : target.shape[1], head]

    def fill(x):
        x[0, :, head * d:(head + 1) * d] = src_z
        return x

    want = hf_logits(tiny_hf, target, {layer: fill})
    got = bridge_logits(tiny, target, ablate_heads("L1H0", method="resample", reference=prompts[0]))
    assert (got - want).abs().max() <= 1e-5
    assert (got - hf_logits(tiny_hf, target, {})).abs().max() > 1e-3
    with pytest.raises(LensprobeError, match="only .* positions"):
        bridge_logits(tiny, source, ablate_heads("L1H0", method="resample", reference=prompts[1]))


def test_positions_segment_matches_hand_zeroing(tiny, tiny_hf, prompts):
    p = prompts[0]
    d = tiny.cfg.d_head
    q = p.positions("question")
    got = bridge_logits(tiny, p.tokens, ablate_heads("H1", positions="question", prompt=p))
    want = hf_logits(tiny_hf, p.tokens, {0: zero_slice([1], d, q), 1: zero_slice([1], d, q)})
    assert (got - want).abs().max() <= 1e-5
    everywhere = hf_logits(tiny_hf, p.tokens, {0: zero_slice([1], d), 1: zero_slice([1], d)})
    assert (got - everywhere).abs().max() > 1e-3  # only the question's positions were zeroed
    # bind() resolves the name later, e.g. per prompt in an evaluation
    late = ablate_heads("H1", positions="question").bind(p)
    assert torch.equal(bridge_logits(tiny, p.tokens, late), got)


def test_kv_group_equals_zeroing_that_kv_heads_values(tiny, tiny_hf, prompts):
    tokens = prompts[0].tokens
    hf = tiny_hf
    d = tiny.cfg.d_head
    group = 1

    def zero_v(mod, args, out):
        out = out.clone()
        out[..., group * d:(group + 1) * d] = 0
        return out

    h = hf.model.layers[0].self_attn.v_proj.register_forward_hook(zero_v)
    try:
        with torch.inference_mode():
            want = hf(tokens).logits
    finally:
        h.remove()
    got = bridge_logits(tiny, tokens, ablate_kv_group("L0KV1"))
    assert (got - want).abs().max() <= 1e-5
    assert (got - hf_logits(tiny_hf, tokens, {})).abs().max() > 1e-3
    # GQA: ablating one query head of the group is not the same as ablating the group
    one = bridge_logits(tiny, tokens, ablate_heads("L0H2"))
    assert (one - got).abs().max() > 1e-4


def test_batch_rows_are_ablated_alike(tiny, prompts):
    a = prompts[1].tokens
    batch = torch.cat([a, a.flip(-1)])
    abl = ablate_heads("L0H0,L1H3")
    got = bridge_logits(tiny, batch, abl)
    assert torch.allclose(got[0], bridge_logits(tiny, a, abl)[0], atol=1e-5)
    assert torch.allclose(got[1], bridge_logits(tiny, a.flip(-1), abl)[0], atol=1e-5)


# ------------------------------------------------------------------ positions under the KV cache


def cached_step_logits(model, prompt_tokens, new_tokens, *interventions):
    """Last-position logits of the prompt, then of each new token fed one at a time (KV cache)."""
    out = []
    with torch.inference_mode(), lp.intervene(model, *interventions):
        logits, pkv = model(prompt_tokens, return_type="logits_and_cache")
        out.append(logits[0, -1])
        for t in new_tokens:
            logits, pkv = model(torch.tensor([[t]]), past_key_values=pkv, return_type="logits_and_cache")
            out.append(logits[0, -1])
    return torch.stack(out)


@pytest.mark.parametrize("positions", [None, "question", "generated", [2, 5]])
def test_cached_generation_equals_full_forward(tiny, tiny_hf, prompts, positions):
    """The hook sees only the newest position in a cached step; prompt positions are ablated
    once (their keys/values stay cached ablated), generated ones when they come. Reference: one
    uncached forward of the plain model with those positions' head outputs zeroed."""
    p = prompts[0]
    new = [11, 42, 7, 99]
    n = len(p)
    zeroed = {None: None, "question": p.positions("question"), "generated": list(range(n, n + len(new)))}
    if positions == [2, 5]:
        positions = [2, 5, n + 1]  # two prompt positions ... and one generated position
        zeroed[tuple(positions)] = positions
    where = zeroed[tuple(positions) if isinstance(positions, list) else positions]
    abl = ablate_heads("L0H1,L1H2", positions=positions, prompt=p)
    stepped = cached_step_logits(tiny, p.tokens, new, abl)
    tokens = torch.cat([p.tokens, torch.tensor([new])], dim=1)
    d = tiny.cfg.d_head
    full = hf_logits(tiny_hf, tokens, {0: zero_slice([1], d, where), 1: zero_slice([2], d, where)})[0, n - 1:]
    assert (stepped - full).abs().max() <= 1e-5
    clean = hf_logits(tiny_hf, tokens, {})[0, n - 1:]
    if positions == "generated":  # the prompt's own prediction is untouched, later ones change
        assert torch.allclose(stepped[0], clean[0], atol=1e-5)
    assert (stepped[1:] - clean[1:]).abs().max() > 1e-3


def test_generated_positions_by_hand(tiny, tiny_hf, prompts):
    p = prompts[1]
    d = tiny.cfg.d_head
    new = [5, 6, 7]
    n = len(p)
    tokens = torch.cat([p.tokens, torch.tensor([new])], dim=1)
    want = hf_logits(tiny_hf, tokens, {1: zero_slice([3], d, list(range(n, n + 3)))})
    got = cached_step_logits(tiny, p.tokens, new, ablate_heads("L1H3", positions="generated", prompt=p))
    assert (got - want[0, n - 1:]).abs().max() <= 1e-5
    assert (got - hf_logits(tiny_hf, tokens, {})[0, n - 1:]).abs().max() > 1e-3


# ------------------------------------------------------------------ bad input


def test_head_out_of_range_names_range_and_paper_counting(tiny):
    with pytest.raises(LensprobeError, match="head 4 out of range") as err:
        resolve_heads(tiny, "L0H4")
    msg = str(err.value)
    assert "0-3" in msg and "papers count from 1" in msg
    with pytest.raises(LensprobeError, match=r"layer 2 out of range: model has 2 layers \(0-1\)"):
        resolve_heads(tiny, [(2, 0)])


def test_out_of_range_is_caught_before_any_forward(tiny, prompts):
    with pytest.raises(LensprobeError, match="0-3"):
        with lp.intervene(tiny, ablate_heads("L0H4")):
            raise AssertionError("must not get here")


@pytest.mark.parametrize("heads", [["L0H1", "L0H1"], ["H1", "L1H1"], [(0, 2), "L0H2"]])
def test_duplicate_heads(tiny, heads):
    with pytest.raises(LensprobeError, match="twice"):
        resolve_heads(tiny, heads)


@pytest.mark.parametrize("bad", ["L0X3", "L0H", "13", "head 3", "L-1H2", ""])
def test_malformed_labels(bad):
    with pytest.raises(LensprobeError, match="L\\{layer\\}H\\{head\\}|head"):
        ablate_heads(bad)


def test_malformed_label_message_names_the_label():
    with pytest.raises(LensprobeError, match="'L0X3' is not a head label.*L0H13"):
        ablate_heads("L0X3")


@pytest.mark.unchecked
def test_method_errors():
    with pytest.raises(LensprobeError, match="mean.*reference"):
        ablate_heads("L0H1", method="mean")
    with pytest.raises(LensprobeError, match="resample.*reference"):
        ablate_heads("L0H1", method="resample")
    with pytest.raises(LensprobeError, match="unknown ablation method"):
        ablate_heads("L0H1", method="median")
    with pytest.raises(LensprobeError, match="no reference"):
        ablate_heads("L0H1", reference=[[1, 2]])


def test_position_errors(tiny, prompts):
    with pytest.raises(LensprobeError, match=">= 0"):
        ablate_heads("L0H1", positions=[-1])
    with pytest.raises(LensprobeError, match="segment.*prompt"):
        with lp.intervene(tiny, ablate_heads("L0H1", positions="question")):
            pass
    with pytest.raises(LensprobeError, match="unknown segment"):
        ablate_heads("L0H1", positions="nope", prompt=prompts[0])


def test_kv_group_errors(tiny):
    with pytest.raises(LensprobeError, match="KV group 2 out of range.*0-1"):
        with lp.intervene(tiny, ablate_kv_group([(0, 2)])):
            pass
    with pytest.raises(LensprobeError, match="not a KV group label"):
        ablate_kv_group("L0H1")
    with pytest.raises(LensprobeError, match="twice"):
        ablate_kv_group("L0KV1,L0KV1")


def test_repr_describes_the_ablation_stably(prompts):
    """Evaluations hash the repr into their configuration: it names everything that matters."""
    a, b = prompts
    r1 = repr(ablate_heads("L0H1,H2", method="mean", reference=[a, b], positions=["question", 1], prompt=a))
    r2 = repr(ablate_heads("L0H1,H2", method="mean", reference=[a, b], positions=["question", 1], prompt=a))
    r3 = repr(ablate_heads("L0H1,H2", method="mean", reference=[b, a], positions=["question", 1], prompt=a))
    assert r1 == r2 and r1 != r3
    q = a.positions("question")
    assert f"{q[0]}-{q[-1]}" in r1 and "'mean'" in r1 and "L*H2" in r1 and "0x" not in r1
