"""Ablation sweeps: every cell equals a single ablation run; metrics checked by hand on a separately
built plain transformers model."""

import math

import pandas as pd
import pytest
import torch

import lensprobe as lp
from lensprobe.core.errors import LensprobeError
from lensprobe.core.measures.measure import AnswerLogProb, measure_once, resolve_measure
from lensprobe.experiments.sweep import ablation_sweep
from lensprobe.interventions.ablation import ablate_heads


@pytest.fixture(scope="module")
def prompts(tiny):
    a = lp.build_prompt(tiny, "What is 12+7?", system="Please reason step by step.",
                        filler=lp.Filler.meaningless(count=5))
    b = lp.build_prompt(tiny, "What is 3*4?", system="Please reason step by step.",
                        filler=lp.Filler.meaningful(count=3))
    return [a, b]


def single(model, prompt, metric, heads, answer=None, **kw):
    """The measure with ``heads`` ablated alone; no heads: the clean run (no intervention)."""
    measure = resolve_measure(metric, answer=answer)
    ablation = (ablate_heads(heads, prompt=prompt, **kw),) if heads else ()
    return float(measure_once(model, measure, prompt, *ablation)[0])


def test_every_sweep_cell_equals_a_single_ablation(tiny, prompts):
    # batch_size 3: the 8 heads + the clean row span three forwards
    res = ablation_sweep(tiny, prompts, "logprob", answers=["19", "12"], batch_size=3, progress=False)
    assert res.table.shape == (tiny.cfg.n_layers, tiny.cfg.n_heads)
    for p_idx, (prompt, answer) in enumerate(zip(prompts, ["19", "12"], strict=True)):
        base = single(tiny, prompt, "logprob", [], answer=answer)
        assert res.baseline[p_idx].item() == pytest.approx(base, abs=1e-5)
        for i, (layer, head) in enumerate(res.heads):
            want = single(tiny, prompt, "logprob", [(layer, head)], answer=answer)
            assert res.ablated[p_idx, i].item() == pytest.approx(want, abs=1e-5)
    changes = res.changes.abs()
    assert changes.max() > 1e-3  # ablations matter on this model
    # the table is the mean change over prompts
    assert res.table.loc[1, 2] == pytest.approx(res.changes[:, res.heads.index((1, 2))].mean().item(), abs=1e-6)


def test_answer_logprob_by_hand(tiny, tiny_hf, prompts):
    p = prompts[0]
    answer = " 19, the sum"
    ids = tiny.tokenizer.encode(answer, add_special_tokens=False)
    assert len(ids) > 1  # several answer tokens: the sum is exercised
    tokens = torch.cat([p.tokens, torch.tensor([ids])], dim=1)
    with torch.inference_mode():
        logits = tiny_hf(tokens).logits[0]
    n = len(p)
    want = sum(torch.log_softmax(logits[n - 1 + i], -1)[t].item() for i, t in enumerate(ids))
    got = measure_once(tiny, AnswerLogProb(answer), p)[0].item()
    assert got == pytest.approx(want, abs=1e-5)


def test_mean_sweep_cells(tiny, prompts):
    ref = [prompts[1]]
    res = ablation_sweep(tiny, prompts[0], "entropy", heads=["L0H1", "L1H3"], method="mean", reference=ref,
                         batch_size=2, progress=False)
    for i, pair in enumerate(res.heads):
        want = single(tiny, prompts[0], "entropy", [pair], method="mean", reference=ref)
        assert res.ablated[0, i].item() == pytest.approx(want, abs=1e-6)
    assert res.changes.abs().min() > 5e-6  # each mean ablation moved the entropy
    grid = res.grid()
    assert math.isnan(grid[0, 0]) and not math.isnan(grid[0, 1])  # unswept heads are NaN


def test_attention_metric_sweep_by_hand(tiny, tiny_hf, prompts):
    """attention:filler = mean over layers, heads and the queries after the filler of the attention
    summed over the filler's keys; L0H2 ablated = its slice of layer 0's o_proj input zeroed."""
    p = prompts[0]
    res = ablation_sweep(tiny, p, "attention:filler", heads="L0H2", progress=False)
    keys = p.positions("filler")
    d = tiny.cfg.d_head

    def zero_l0h2(mod, args):
        x = args[0].clone()
        x[..., 2 * d:3 * d] = 0
        return (x,)

    def measure(ablate: bool) -> float:
        handle = tiny_hf.model.layers[0].self_attn.o_proj.register_forward_pre_hook(zero_l0h2) if ablate else None
        try:
            with torch.inference_mode():
                attentions = tiny_hf(p.tokens, output_attentions=True).attentions
        finally:
            if handle is not None:
                handle.remove()
        values = [float(a[0, h, q, keys].sum()) for a in attentions for h in range(a.shape[1])
                  for q in range(max(keys) + 1, len(p))]
        return sum(values) / len(values)

    want, clean = measure(True), measure(False)
    assert res.baseline[0].item() == pytest.approx(clean, abs=1e-6)
    assert res.ablated[0, 0].item() == pytest.approx(want, abs=1e-6)
    assert abs(want - clean) > 1e-5  # ablating a layer-0 head changes attention in layer 1


def test_positions_restrict_the_sweep(tiny, prompts):
    p = prompts[0]
    res = ablation_sweep(tiny, p, "entropy", heads="H0", positions="question", progress=False)
    everywhere = ablation_sweep(tiny, p, "entropy", heads="H0", progress=False)
    for i, pair in enumerate(res.heads):
        assert res.ablated[0, i].item() == pytest.approx(
            single(tiny, p, "entropy", [pair], positions="question"), abs=1e-6)
        if pair[0] == 0:  # a layer-0 head over the question reaches the last position through layer 1 ...
            assert abs(res.changes[0, i].item()) > 2e-6
        else:  # ... a last-layer head over the question cannot, while ablating it everywhere does
            assert res.changes[0, i].item() == 0.0
        assert abs(res.ablated[0, i].item() - everywhere.ablated[0, i].item()) > 2e-6


def test_callable_metric_and_outputs(tiny, prompts, tmp_path):
    def top_logit(logits, prompt):
        return logits[:, -1].max(-1).values

    res = ablation_sweep(tiny, prompts, top_logit, heads="L1H0,L1H1", progress=False)
    assert res.metric == "top_logit"
    path = res.to_csv(tmp_path / "sweep.csv")
    table = pd.read_csv(path, index_col="layer")
    assert table.shape == (2, 4) and table.loc[1, "0"] == pytest.approx(res.table.loc[1, 0])
    long = pd.read_csv(tmp_path / "sweep_long.csv")
    assert len(long) == 2 * 2 and set(long["label"]) == {"L1H0", "L1H1"}
    assert list(res.top(1)["label"]) == [long.groupby("label")["change"].mean().abs().idxmax()]

    from lensprobe.viz import sweep_heatmap

    fig = sweep_heatmap(res)
    z = fig.data[0].z
    assert z[1][0] == pytest.approx(res.table.loc[1, 0])
    assert z[0][0] is None or math.isnan(z[0][0])  # layer 0 was not swept


def test_sweep_bad_input(tiny, prompts):
    with pytest.raises(LensprobeError, match="one value per batch row"):
        ablation_sweep(tiny, prompts[0], lambda logits, p: logits[:, -1], heads="L0H0", progress=False)
    with pytest.raises(LensprobeError, match="unknown metric"):
        ablation_sweep(tiny, prompts[0], "perplexity", progress=False)
    with pytest.raises(LensprobeError, match="answer"):
        ablation_sweep(tiny, prompts[0], "logprob", progress=False)
    with pytest.raises(LensprobeError, match="2 answers for 1 prompts"):
        ablation_sweep(tiny, prompts[0], "logprob", answers=["1", "2"], progress=False)
    with pytest.raises(LensprobeError, match="mean.*reference"):
        ablation_sweep(tiny, prompts[0], method="mean", progress=False)
    with pytest.raises(LensprobeError, match="0-3"):
        ablation_sweep(tiny, prompts[0], heads="L0H7", progress=False)


def test_sweep_cells_on_smollm2(smol):
    """On the real GQA model, batched rows give the same numbers as single runs."""
    p = lp.build_prompt(smol, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT)
    heads = ["L0H0", "L0H4", "L7H8", "L29H3"]
    res = ablation_sweep(smol, p, "entropy", heads=heads, batch_size=5, progress=False)
    for i, pair in enumerate(res.heads):
        assert res.ablated[0, i].item() == pytest.approx(single(smol, p, "entropy", [pair]), abs=1e-4)
    assert res.changes.abs().max() > 1e-3


@pytest.mark.parametrize("metric", ["attention:filler", "entropy"])
def test_shared_prefix_gives_the_same_numbers(tiny, prompts, metric):
    """Rows of a batch whose heads all sit in layer 1 share layer 0 (run once, at batch size 1)."""
    p = prompts[0]
    shared = ablation_sweep(tiny, p, metric, heads="L1H0,L1H1,L1H3", batch_size=2, progress=False)
    plain = ablation_sweep(tiny, p, metric, heads="L1H0,L1H1,L1H3", batch_size=2, progress=False,
                           share_prefix=False)
    assert torch.allclose(shared.ablated, plain.ablated, atol=1e-6)
    for i, pair in enumerate(shared.heads):
        assert shared.ablated[0, i].item() == pytest.approx(single(tiny, p, metric, [pair]), abs=1e-6)
    if metric == "entropy":
        assert shared.changes.abs().min() > 5e-6  # each ablation moved the entropy
    else:  # last-layer heads cannot change any attention pattern
        assert shared.changes.abs().max() == 0.0


@pytest.mark.parametrize("share_prefix", [True, False])
def test_a_sweep_under_arm_equals_single_runs_with_arm(tiny, prompts, share_prefix):
    arm = lp.ARM(layer=0, c=0.5, percentile=95, seed=2, per_row=True)
    p = prompts[0]
    heads = [(0, 1), (1, 0), (1, 3)]
    res = ablation_sweep(tiny, p, "entropy", heads=heads, batch_size=2, progress=False, interventions=[arm],
                         share_prefix=share_prefix)
    measure = resolve_measure("entropy")
    assert torch.allclose(res.baseline, measure_once(tiny, measure, p, arm), atol=1e-6)
    assert not torch.allclose(res.baseline, measure_once(tiny, measure, p), atol=1e-6)  # ARM acted
    for k, head in enumerate(heads):
        alone = measure_once(tiny, measure, p, ablate_heads(head), arm)
        assert torch.allclose(res.ablated[0, k], alone[0], atol=1e-6), head


def test_a_sweep_refuses_arm_over_the_whole_batch(tiny, prompts):
    with pytest.raises(LensprobeError, match=r"ARM computes over the whole batch .* per_row=True, the default"):
        ablation_sweep(tiny, prompts[0], heads=[(0, 1)], progress=False,
                       interventions=[lp.ARM(c=0.5, percentile=95, per_row=False)])


def test_a_head_whose_ablation_makes_the_metric_nan_is_told_from_a_head_not_swept():
    from lensprobe.experiments.sweep import SweepResult
    from lensprobe.viz import sweep_heatmap

    result = SweepResult([(0, 0), (0, 1)], torch.tensor([1.0]), torch.tensor([[float("nan"), 3.0]]), "m", "zero", 2, 2)
    grid = result.grid()
    assert grid[0, 1] == 2.0 and grid[0, 0] != grid[0, 0] and grid[1, 1] != grid[1, 1]  # NaN in both ...
    assert result.measured().tolist() == [[True, True], [False, False]]  # ... only one of them swept
    text = sweep_heatmap(result).data[0].text
    assert text[0][0] == "L0H0 (NaN)" and text[0][1] == "L0H1" and text[1][1] == "L1H1 (not swept)"
