"""``record=``: activations at every step of a generation, against plain ``transformers`` on the final
sequence (each decoder layer's input and output, taken with torch hooks on the twin, position
``prompt length - 1 + step``), on both engines, with left padding, continuous batching and refill,
samples, an ablation applied to the twin by hand, and the files."""

import pytest
import torch
from oracles import layer_io

import lensprobe as lp
from lensprobe.generation.traces.activations import Record

TOL = 1e-5


def assert_row_matches_twin(trace, r: int, twin, prompt_ids: list[int], names=("pre", "post")) -> None:
    """Row ``r``'s recorded values at every step it ran equal the twin's at ``prompt length - 1 + step``."""
    gen = trace.generated_ids[r]
    ins, outs = layer_io(twin, prompt_ids + gen)
    n = int(trace.recorded_rows[r].sum())
    assert n == len(gen) >= 2
    at = len(prompt_ids) - 1 + torch.arange(n)
    for layer in range(len(outs)):
        for kind, want in (("pre", ins[layer]), ("post", outs[layer])):
            name = f"blocks.{layer}.hook_resid_{kind}"
            if kind not in names or name not in trace.activations_rows:
                continue
            got = trace.activations_rows[name][r, :n]
            assert torch.allclose(got, want[at], atol=TOL), (r, layer, kind)
            # the step alignment: the position one later (the convention nnsight once shipped off by one) differs
            assert not torch.allclose(got[:-1], want[at[:-1] + 1], atol=1e-3), (r, layer, kind)
            assert torch.isnan(trace.activations_rows[name][r, n:]).all()


@pytest.mark.parametrize("engine", ["bridge", "hf"])
def test_every_layers_residual_stream_per_step_equals_the_plain_model(tiny, tiny_hf, engine):
    prompts = [[5, 17, 3, 99, 42, 7, 8], [11, 12, 13]]  # left padding in one static batch
    out = lp.generate(tiny, prompts, max_new_tokens=6, stop_at_eos=False, engine=engine,
                      record=["blocks.*.hook_resid_pre", "blocks.*.hook_resid_post"])
    assert out.meta["engine"] == engine
    assert sorted(out.activations_rows) == sorted(f"blocks.{i}.hook_resid_{k}" for i in range(2)
                                                   for k in ("pre", "post"))
    assert out.activations_rows["blocks.1.hook_resid_post"].shape == (2, 6, tiny.cfg.d_model)
    for r, ids in enumerate(prompts):
        assert_row_matches_twin(out, r, tiny_hf, ids)


def test_rows_stopped_early_are_marked_not_recorded(tiny, tiny_hf):
    prompts = [[5, 17, 3, 99], [11, 12, 13, 14, 15]]
    out = lp.generate(tiny, prompts, max_new_tokens=5, stop_at_eos=False, caps=[2, 5],
                      record="blocks.1.hook_resid_post")
    assert out.recorded_rows.tolist() == [[True, True, False, False, False], [True] * 5]
    values = out.activations_rows["blocks.1.hook_resid_post"]
    assert torch.isnan(values[0, 2:]).all() and torch.isfinite(values[0, :2]).all()
    assert_row_matches_twin(out, 0, tiny_hf, prompts[0], names=("post",))
    one = out.row(0)
    assert one.activations["blocks.1.hook_resid_post"].shape == (2, tiny.cfg.d_model)


@pytest.mark.parametrize("batch_size", [1, 2])
def test_refilled_and_sampled_rows_equal_each_row_alone(tiny, batch_size):
    prompts = [[5, 17, 3, 99, 42], [11, 12, 13], [7, 8, 9, 10, 11, 12, 13]]
    kw = dict(stop_at_eos=False, do_sample=True, seed=3, n_samples=2, record="blocks.*.hook_resid_post")
    out = lp.generate(tiny, prompts, max_new_tokens=5, batch_size=batch_size, caps=[3, 5, 4], **kw)
    assert out.meta["batching"] == "continuous batching"
    for r in range(out.n_rows):
        pi, j = out.prompt_index[r], out.sample_index[r]
        alone = lp.generate(tiny, [prompts[pi]], max_new_tokens=[3, 5, 4][pi], **kw)
        assert out.generated_ids[r] == alone.generated_ids[j]
        n = len(out.generated_ids[r])
        for name, v in out.activations_rows.items():
            assert torch.allclose(v[r, :n], alone.activations_rows[name][j, :n], atol=TOL), (r, name)
            assert torch.isnan(v[r, n:]).all()


def test_under_an_ablation_the_values_are_those_of_the_ablated_plain_model(tiny, twin_of):
    twin = twin_of(tiny)
    d_head = tiny.cfg.d_head
    head = 1

    def zero_head(_m, args):
        x = args[0].clone()
        x[..., head * d_head:(head + 1) * d_head] = 0
        return (x,)

    ids = [5, 17, 3, 99, 42]
    out = lp.generate(tiny, ids, max_new_tokens=5, stop_at_eos=False, interventions=[lp.ablate_heads(f"L0H{head}")],
                      record="blocks.*.hook_resid_post")
    handle = twin.model.layers[0].self_attn.o_proj.register_forward_pre_hook(zero_head)
    try:
        assert_row_matches_twin(out, 0, twin, ids, names=("post",))
    finally:
        handle.remove()
    plain = lp.generate(tiny, ids, max_new_tokens=5, stop_at_eos=False, record="blocks.0.hook_resid_post")
    assert not torch.allclose(plain.activations_rows["blocks.0.hook_resid_post"],
                              out.activations_rows["blocks.0.hook_resid_post"], atol=1e-4)


def test_reduce_runs_in_the_hook_and_prompt_positions_are_kept_once(tiny, tiny_hf):
    p = lp.build_prompt(tiny, "What is 12+7?", system="You answer.", filler=lp.Filler.meaningless(count=4))
    ids = p.tokens[0].tolist()
    norm = Record("blocks.*.hook_resid_post", reduce=lambda x: x.norm(dim=-1), prompt="filler")
    full = Record("blocks.0.hook_resid_pre", prompt="prompt")
    out = lp.generate(tiny, p, max_new_tokens=4, stop_at_eos=False, record=[norm, full])
    ins, outs = layer_io(tiny_hf, ids + out.generated_ids[0])
    at = len(ids) - 1 + torch.arange(4)
    for layer in range(2):
        got = out.activations[f"blocks.{layer}.hook_resid_post"]
        assert got.shape == (4,)
        assert torch.allclose(got, outs[layer][at].norm(dim=-1), atol=TOL)
        start, end = p.segments["filler"]
        assert out.prompt_positions[f"blocks.{layer}.hook_resid_post"] == [list(range(start, end))]
        kept = out.prompt_activations[f"blocks.{layer}.hook_resid_post"][0]
        assert torch.allclose(kept, outs[layer][start:end].norm(dim=-1), atol=TOL)
    kept = out.prompt_activations["blocks.0.hook_resid_pre"][0]
    assert kept.shape == (len(ids), tiny.cfg.d_model) and torch.allclose(kept, ins[0][: len(ids)], atol=TOL)


def test_prompt_positions_under_left_padding(tiny, tiny_hf):
    a = lp.build_prompt(tiny, "What is 12+7?", system="You answer.")
    b = lp.build_prompt(tiny, "Hi", system="Be brief, and answer the question you are asked.")
    out = lp.generate(tiny, [a, b], max_new_tokens=2, stop_at_eos=False,
                      record=Record("blocks.1.hook_resid_post", prompt="question"))
    for r, p in enumerate((a, b)):
        _, outs = layer_io(tiny_hf, p.tokens[0].tolist())
        start, end = p.segments["question"]
        assert torch.allclose(out.prompt_activations["blocks.1.hook_resid_post"][r], outs[1][start:end], atol=TOL)


def test_recorded_values_survive_the_files(tiny, tmp_path):
    out = lp.generate(tiny, [[5, 17, 3, 99], [11, 12, 13, 14, 15]], max_new_tokens=4, stop_at_eos=False, caps=[2, 4],
                      record=[Record("blocks.*.hook_resid_post", reduce=lambda x: x[:, :3], prompt="prompt")])
    for suffix in ("parquet", "json"):
        back = lp.generation.load_trace(out.save(tmp_path / f"t.{suffix}"))
        assert back.recorded_rows.tolist() == out.recorded_rows.tolist()
        for name, v in out.activations_rows.items():
            assert torch.equal(back.activations_rows[name].isnan(), v.isnan())
            assert torch.equal(back.activations_rows[name].nan_to_num(), v.nan_to_num())
            assert all(torch.equal(x, y) for x, y in zip(back.prompt_activations[name], out.prompt_activations[name],
                                                          strict=True))
        assert back.prompt_positions == out.prompt_positions


def test_a_trace_set_records_and_its_folder_is_identified_by_what_it_records(tiny, tmp_path):
    prompts = [[5, 17, 3, 99], [11, 12, 13]]
    kw = dict(max_new_tokens=3, stop_at_eos=False, out=tmp_path / "set")
    traces = lp.generation.trace_prompts(tiny, prompts, record="blocks.1.hook_resid_post", **kw)
    alone = lp.generate(tiny, prompts[1], max_new_tokens=3, stop_at_eos=False, record="blocks.1.hook_resid_post")
    assert torch.allclose(traces[1].activations["blocks.1.hook_resid_post"],
                          alone.activations["blocks.1.hook_resid_post"], atol=TOL)
    with pytest.raises(lp.LensprobeError, match="another 'trace set' run:\n  record"):
        lp.generation.trace_prompts(tiny, prompts, record="blocks.0.hook_resid_post", **kw)


@pytest.mark.unchecked  # values outside the annotations, as a user without a type checker passes them
def test_bad_records_are_refused_before_any_forward(tiny):
    calls = []
    spy = ("blocks.0.hook_resid_pre", lambda x, hook: calls.append(1))
    cases = {
        "no hook point of this model is named 'blocks.0.hook_resid_middle'": "blocks.0.hook_resid_middle",
        r"no hook point of this model is named 'blocks\.\*\.hook_nothing'": "blocks.*.hook_nothing",
        "asked for twice": ["blocks.0.hook_resid_post", "blocks.*.hook_resid_post"],
        "neither a hook name": [3],
        "must be a hook name or pattern": 3.5,
    }
    for message, record in cases.items():
        with pytest.raises(lp.LensprobeError, match=message):
            lp.generate(tiny, [1, 2, 3], max_new_tokens=2, record=record, interventions=[spy])
    with pytest.raises(lp.LensprobeError, match="has no segment 'filler'"):
        lp.generate(tiny, [1, 2, 3], max_new_tokens=2, record=Record("blocks.0.hook_resid_post", prompt="filler"),
                    interventions=[spy])
    with pytest.raises(lp.LensprobeError, match="names: expected hook names or patterns"):
        Record([])
    with pytest.raises(lp.LensprobeError, match="reduce: expected a function"):
        Record("blocks.0.hook_resid_post", reduce=3)
    assert calls == []
    with pytest.raises(lp.LensprobeError, match=r"must return a tensor of \[batch, \.\.\.\]"):
        lp.generate(tiny, [1, 2, 3], max_new_tokens=2, record=Record("blocks.0.hook_resid_post", reduce=lambda x: x.sum()))


def test_one_forward_recorders_refuse_a_generation(tiny):
    rec = lp.interventions.ActivationRecorder(["blocks.0.hook_resid_post"])
    with pytest.raises(lp.LensprobeError, match="keeps one forward.*record="):
        lp.generate(tiny, [1, 2, 3], max_new_tokens=3, interventions=[rec])
    with pytest.raises(lp.LensprobeError, match="keeps one forward.*record="):
        lp.trace_generation(tiny, [1, 2, 3], max_new_tokens=3, interventions=[lp.interventions.AttentionRecorder([0])])
    # a manual KV-cached loop: the second forward continues the cache and is refused
    with lp.intervene(tiny, rec), pytest.raises(lp.LensprobeError, match="continues a KV cache"):
        _, cache = tiny(torch.tensor([[1, 2, 3]]), use_cache=True, return_type="logits_and_cache")
        tiny(torch.tensor([[4]]), past_key_values=cache, return_type="logits_and_cache")


@pytest.mark.slow
def test_the_embedded_models_residual_stream_per_step(smol, smol_hf):
    p = lp.build_prompt(smol, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT)
    out = lp.generate(smol, p, max_new_tokens=6, stop_at_eos=False, record="blocks.*.hook_resid_post")
    assert out.meta["engine"] == "hf"
    assert out.activations["blocks.29.hook_resid_post"].shape == (6, 576)  # every step, not the last only
    ids = p.tokens[0].tolist()
    _, outs = layer_io(smol_hf, ids + out.generated_ids[0])
    at = len(ids) - 1 + torch.arange(6)
    for layer in (0, 14, 29):
        got = out.activations[f"blocks.{layer}.hook_resid_post"]
        assert torch.allclose(got, outs[layer][at], atol=1e-4, rtol=1e-4), layer


def test_a_heads_z_per_step_runs_on_the_bridge_and_equals_the_plain_model(tiny, tiny_hf):
    ids = [5, 17, 3, 99, 42]
    out = lp.generate(tiny, ids, max_new_tokens=4, stop_at_eos=False,
                      record=lp.Record("blocks.1.attn.hook_z", reduce=lambda z: z[:, [2]]))
    assert out.meta["engine"] == "bridge"  # the plain engine serves the residual stream only
    kept = {}
    handle = tiny_hf.model.layers[1].self_attn.o_proj.register_forward_pre_hook(
        lambda _m, args: kept.__setitem__("x", args[0].detach().clone()))
    try:
        with torch.no_grad():
            tiny_hf(torch.tensor([ids + out.generated_ids[0]]))
    finally:
        handle.remove()
    d_head = tiny.cfg.d_head
    z = kept["x"][0].view(-1, tiny.cfg.n_heads, d_head)  # [pos, head, d_head]: the heads o_proj sums
    at = len(ids) - 1 + torch.arange(4)
    assert out.activations["blocks.1.attn.hook_z"].shape == (4, 1, d_head)
    assert torch.allclose(out.activations["blocks.1.attn.hook_z"][:, 0], z[at, 2], atol=TOL)
