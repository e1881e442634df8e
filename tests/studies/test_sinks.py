"""Attention sinks and massive activations: every number against plain ``transformers`` on the same weights
(``output_attentions=True`` for the sink masses, ``output_hidden_states=True`` and a decoder layer's own
output for the residual stream), worked out by hand here, over the prompt and at a generation step
(position ``prompt length - 1 + step`` of the final sequence), on both engines."""

import pytest
import torch

import lensprobe as lp
from lensprobe.studies.filler import FillerSetup
from lensprobe.studies.sink_hooks import FIRST, MassiveEntries
from lensprobe.studies.sinks import SinkConfig, attention_sinks

QUESTION = "What is 12+7?"
SMALL = FillerSetup(count=5)


def hf_run(hf, ids: list[int]):
    """Attentions ``[layer][head, q, k]`` and residual streams ``[layer][pos, d_model]`` after each decoder
    layer: ``hidden_states[l + 1]`` (the last entry has the final norm applied, so the last layer's output
    is taken from the layer itself)."""
    outs = []
    handle = hf.model.layers[-1].register_forward_hook(
        lambda _m, _a, out: outs.append((out[0] if isinstance(out, tuple) else out)[0].detach().clone()))
    try:
        with torch.no_grad():
            out = hf(torch.tensor([ids]), output_attentions=True, output_hidden_states=True)
    finally:
        handle.remove()
    resid = [h[0] for h in out.hidden_states[1:-1]] + outs
    return [a[0].double() for a in out.attentions], [r.double() for r in resid]


def sel(df, **eq):
    mask = True
    for col, value in eq.items():
        mask = mask & (df[col] == value)
    return df[mask]


def by_hand_top(x: torch.Tensor, k: int) -> list[tuple[float, int]]:
    """The ``k`` largest ``|entries|`` of ``x`` (flat index), sorted by hand, and the lower median."""
    flat = x.reshape(-1).tolist()
    order = sorted(range(len(flat)), key=lambda i: -abs(flat[i]))[:k]
    return [(abs(flat[i]), i) for i in order]


def lower_median(x: torch.Tensor) -> float:
    mags = sorted(abs(v) for v in x.reshape(-1).tolist())
    return mags[(len(mags) - 1) // 2]


@pytest.fixture(scope="module")
def sinks(tiny):
    return attention_sinks(tiny, QUESTION, conditions=["w/o", "w/ Mless"], setup=SMALL, segments=("filler", "question"),
                           max_new_tokens=4, entries=3, stop_at_eos=False)


def test_prompt_sink_mass_equals_the_plain_models_attention(tiny, tiny_hf, sinks):
    for cond in ("w/o", "w/ Mless"):
        p = sinks.prompts[cond]
        att, _ = hf_run(tiny_hf, p.tokens[0].tolist())
        n = len(p)
        spans = {FIRST: (0, 1), "question": p.segments["question"]}
        if cond == "w/ Mless":
            spans["filler"] = p.segments["filler"]
        assert set(sel(sinks.prompt, condition=cond)["target"]) == set(spans)
        for layer in (0, 1):
            for head in range(tiny.cfg.n_heads):
                for target, (a, b) in spans.items():
                    want = [float(att[layer][head, q, a:b].sum()) for q in range(b, n)]
                    row = sel(sinks.prompt, condition=cond, layer=layer, head=head, target=target)
                    assert len(row) == 1 and int(row["queries"].iloc[0]) == n - b
                    assert float(row["mass"].iloc[0]) == pytest.approx(sum(want) / len(want), abs=1e-6)
                    per_q = sel(sinks.queries, condition=cond, layer=layer, head=head, target=target)
                    assert per_q["query"].tolist() == list(range(b, n))
                    assert per_q["mass"].tolist() == pytest.approx(want, abs=1e-6)


def test_a_condition_without_the_segment_has_no_rows_for_it(sinks):
    assert "filler" not in set(sel(sinks.prompt, condition="w/o")["target"])
    assert "filler" not in set(sel(sinks.steps, condition="w/o")["target"])
    assert "filler" in set(sel(sinks.steps, condition="w/ Mless")["target"])
    assert sinks.targets == (FIRST, "question", "filler") and sinks.conditions == ("w/o", "w/ Mless")


@pytest.mark.parametrize("engine", ["bridge", "hf"])
def test_step_sink_mass_equals_the_plain_model_on_the_final_sequence(tiny, tiny_hf, engine):
    res = attention_sinks(tiny, QUESTION, conditions=["w/ Mless"], setup=SMALL, layers=[1], max_new_tokens=4,
                          stop_at_eos=False, engine=engine)
    trace = res.traces["w/ Mless"]
    assert trace.meta["engine"] == engine
    p = res.prompts["w/ Mless"]
    ids = p.tokens[0].tolist() + trace.generated_ids[0]
    att, _ = hf_run(tiny_hf, ids)
    a, b = p.segments["filler"]
    steps = sel(res.steps, layer=1)
    assert sorted(set(steps["step"])) == [0, 1, 2, 3]
    for step in range(4):
        pos = len(p) - 1 + step
        rows = sel(steps, step=step)
        assert set(rows["position"]) == {pos}
        for head in range(tiny.cfg.n_heads):
            first = float(sel(rows, head=head, target=FIRST)["mass"].iloc[0])
            filler = float(sel(rows, head=head, target="filler")["mass"].iloc[0])
            assert first == pytest.approx(float(att[1][head, pos, 0]), abs=1e-5)
            assert filler == pytest.approx(float(att[1][head, pos, a:b].sum()), abs=1e-5)
            if step < 3:  # the step alignment: the next position's row is another number
                assert first != pytest.approx(float(att[1][head, pos + 1, 0]), abs=1e-5)
    tokens = sel(steps, head=0, target=FIRST).sort_values("step")["token"].tolist()
    assert tokens == [p.str_tokens[-1], *trace.str_tokens_rows[0][:3]]


def test_prompt_massive_activations_equal_the_hidden_states_by_hand(tiny, tiny_hf, sinks):
    for cond in ("w/o", "w/ Mless"):
        p = sinks.prompts[cond]
        _, resid = hf_run(tiny_hf, p.tokens[0].tolist())
        for layer in (0, 1):
            rows = sel(sinks.massive, condition=cond, phase="prompt", layer=layer).sort_values("rank")
            want = by_hand_top(resid[layer], 3)
            med = lower_median(resid[layer])
            d = tiny.cfg.d_model
            assert rows["magnitude"].tolist() == pytest.approx([m for m, _ in want], abs=1e-5)
            assert rows["position"].tolist() == [i // d for _, i in want]
            assert rows["dim"].tolist() == [i % d for _, i in want]
            assert rows["token"].tolist() == [p.str_tokens[i // d] for _, i in want]
            assert rows["median"].tolist() == pytest.approx([med] * 3, abs=1e-6)
            assert rows["ratio"].tolist() == pytest.approx([m / med for m, _ in want], rel=1e-4)
            flat = resid[layer].reshape(-1)
            assert rows["value"].tolist() == pytest.approx([float(flat[i]) for _, i in want], abs=1e-5)


def test_step_massive_activations_equal_the_hidden_states_by_hand(tiny, tiny_hf, sinks):
    trace = sinks.traces["w/ Mless"]
    p = sinks.prompts["w/ Mless"]
    _, resid = hf_run(tiny_hf, p.tokens[0].tolist() + trace.generated_ids[0])
    for layer in (0, 1):
        for step in range(4):
            pos = len(p) - 1 + step
            rows = sel(sinks.massive, condition="w/ Mless", phase="step", layer=layer, step=step).sort_values("rank")
            x = resid[layer][pos]
            want = by_hand_top(x, 3)
            assert set(rows["position"]) == {pos}
            assert rows["dim"].tolist() == [i for _, i in want]
            assert rows["magnitude"].tolist() == pytest.approx([m for m, _ in want], abs=1e-5)
            assert rows["median"].tolist() == pytest.approx([lower_median(x)] * 3, abs=1e-6)
            assert rows["value"].tolist() == pytest.approx([float(x[i]) for _, i in want], abs=1e-5)
    largest = sinks.largest("step")
    assert (largest["rank"] == 0).all() and len(largest) == 2 * 2 * 4  # conditions x layers x steps


def test_a_conditions_ablation_reaches_the_prompt_pass_and_every_step(tiny, tiny_hf):
    """A Condition that zero-ablates L0H1: the masses of layer 1 equal the plain model's with that head's slice
    of layer 0's o_proj input zeroed by hand."""
    ablated = lp.Condition("w/o, L0H1 ablated", interventions=(lp.ablate_heads("L0H1"),))
    res = attention_sinks(tiny, QUESTION, conditions=[ablated], setup=SMALL, layers=[1], max_new_tokens=3,
                          stop_at_eos=False)
    p, trace = res.prompts[ablated.name], res.traces[ablated.name]
    d_head = tiny.cfg.d_head

    def zero_head(_m, args):
        x = args[0].clone()
        x[..., d_head:2 * d_head] = 0
        return (x,)

    handle = tiny_hf.model.layers[0].self_attn.o_proj.register_forward_pre_hook(zero_head)
    try:
        att, resid = hf_run(tiny_hf, p.tokens[0].tolist() + trace.generated_ids[0])
    finally:
        handle.remove()
    clean, _ = hf_run(tiny_hf, p.tokens[0].tolist() + trace.generated_ids[0])
    n = len(p)
    for head in range(tiny.cfg.n_heads):
        got = float(sel(res.prompt, layer=1, head=head, target=FIRST)["mass"].iloc[0])
        assert got == pytest.approx(float(att[1][head, 1:n, 0].mean()), abs=1e-6)
        assert got != pytest.approx(float(clean[1][head, 1:n, 0].mean()), abs=1e-6)  # the ablation mattered
        for step in range(3):
            row = sel(res.steps, layer=1, head=head, target=FIRST, step=step)
            assert float(row["mass"].iloc[0]) == pytest.approx(float(att[1][head, n - 1 + step, 0]), abs=1e-5)
    top = sel(res.massive, phase="prompt", layer=1, rank=0)
    assert float(top["magnitude"].iloc[0]) == pytest.approx(by_hand_top(resid[1][:n], 1)[0][0], abs=1e-5)


def test_a_condition_with_generation_settings_of_its_own_is_refused(tiny):
    odd = lp.Condition("sampled", generate_kwargs={"do_sample": True})
    with pytest.raises(lp.LensprobeError, match="has generate_kwargs"):
        attention_sinks(tiny, QUESTION, conditions=[odd], max_new_tokens=1)


def test_the_reducer_keeps_only_k_entries_and_the_median():
    x = torch.tensor([[1.0, -5.0, 2.0, 0.5], [0.0, 0.0, 3.0, -1.0]])
    got = MassiveEntries(2)(x)
    assert got.shape == (2, 7)
    assert got[0].tolist() == [5.0, 2.0, 1.0, 2.0, -5.0, 2.0, 1.0]
    assert got[1].tolist() == [3.0, 1.0, 2.0, 3.0, 3.0, -1.0, 0.0]


def test_means_over_heads_are_the_tables_means(sinks):
    means = sinks.head_means()
    rows = sel(sinks.prompt, condition="w/ Mless", layer=1, target="filler")
    got = sel(means, condition="w/ Mless", layer=1, target="filler")
    assert float(got["mass"].iloc[0]) == pytest.approx(rows["mass"].mean())
    steps = sinks.step_means()
    rows = sel(sinks.steps, condition="w/o", layer=0, step=2, target=FIRST)
    assert float(sel(steps, condition="w/o", layer=0, step=2, target=FIRST)["mass"].iloc[0]) == \
        pytest.approx(rows["mass"].mean())


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"segments": ("nothing",)}, "no condition's prompt has a segment 'nothing'"),
    ({"segments": ("filler", "filler")}, "given twice"),
    ({"segments": (FIRST,)}, "always measured"),
    ({"entries": 0}, "entries"),
    ({"entries": 10_000}, "entries"),
    ({"max_new_tokens": 10**6}, "max_new_tokens"),
    ({"n_samples": 2, "do_sample": True}, "one sample"),
    ({"layers": [7]}, "layer"),
    pytest.param({"engine": "fast"}, "engine", marks=pytest.mark.unchecked),  # what a caller without checks sees
    ({"setup": FillerSetup(system=None)}, "setup.system"),
    ({"conditions": ["w/o", "nonsense"]}, "unknown condition"),
])
def test_bad_settings_are_refused_before_any_forward(tiny, monkeypatch, kwargs, message):
    import lensprobe.studies.sinks as mod

    def no_forward(*a, **k):
        raise AssertionError("a forward ran")

    monkeypatch.setattr(mod, "forward", no_forward)
    monkeypatch.setattr(mod, "trace_generation", no_forward)
    with pytest.raises(lp.LensprobeError, match=message):
        attention_sinks(tiny, QUESTION, **{"setup": SMALL, **kwargs})


def test_a_setup_agreeing_with_the_arguments_is_taken(tiny):
    res = attention_sinks(tiny, QUESTION, system=None, conditions=["w/o"], setup=FillerSetup(system=None, count=3),
                          layers=[0], max_new_tokens=1)
    assert res.setup.system is None and res.setup.count == 3 and "system" not in res.prompts["w/o"].segments


def test_the_command_config_parses_and_checks_its_settings():
    assert SinkConfig().segment_names() == ("filler",) and SinkConfig().layers == "all"
    assert SinkConfig(segments="none").segment_names() == ()
    assert SinkConfig(segments="filler, question").segment_names() == ("filler", "question")
    for bad, match in (({"segments": "filler,,x"}, "segment names"), ({"entries": 0}, "entries"),
                       ({"layers": "x"}, "layers")):
        with pytest.raises(lp.LensprobeError, match=match):
            SinkConfig(**bad)


def test_embedded_model_sinks_equal_the_plain_model(smol, smol_hf):
    res = attention_sinks(smol, QUESTION, conditions=["w/o", "w/ Mless"], layers=[0, 3, 29], max_new_tokens=3,
                          stop_at_eos=False, entries=2)
    for cond in ("w/o", "w/ Mless"):
        p, trace = res.prompts[cond], res.traces[cond]
        att, resid = hf_run(smol_hf, p.tokens[0].tolist() + trace.generated_ids[0])
        n = len(p)
        for layer in (0, 3, 29):
            for head in (0, 4, 8):
                got = float(sel(res.prompt, condition=cond, layer=layer, head=head, target=FIRST)["mass"].iloc[0])
                assert got == pytest.approx(float(att[layer][head, 1:n, 0].mean()), abs=1e-4)
                step = sel(res.steps, condition=cond, layer=layer, head=head, target=FIRST, step=2)
                assert float(step["mass"].iloc[0]) == pytest.approx(float(att[layer][head, n + 1, 0]), abs=1e-4)
            prompt_rows = sel(res.massive, condition=cond, phase="prompt", layer=layer).sort_values("rank")
            want = by_hand_top(resid[layer][:n], 2)
            assert prompt_rows["magnitude"].tolist() == pytest.approx([m for m, _ in want], rel=1e-4)
            assert prompt_rows["dim"].tolist() == [i % smol.cfg.d_model for _, i in want]
            assert float(prompt_rows["median"].iloc[0]) == pytest.approx(lower_median(resid[layer][:n]), rel=1e-3)
