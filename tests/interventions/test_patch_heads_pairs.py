"""patch_heads over many pairs: each pair's clean, corrupted and patched metrics equal plain transformers with that
head's o_proj input replaced by hand; the mean equals the mean of single-pair calls; shares divide by the total
effect or are NaN and flagged; problems and a filler condition build the pairs; the figures draw the result."""

import math

import pytest
import torch

import lensprobe as lp
from lensprobe.experiments import headpatch
from lensprobe.experiments.headpatch import aligned_positions

SYSTEM = "Please reason step by step."
QUESTIONS = ("What is 12+7?", "What is 3 times 4?")
ANSWERS = ["19", "12"]
"""Log-prob of an answer: the tiny random model's next-token entropy is near uniform (its filler effect ~1e-6
nats, which leaves the share undefined), the answer's log-prob moves by ~0.02 nats."""


@pytest.fixture(scope="module")
def pairs(tiny):
    clean = [lp.build_prompt(tiny, q, system=SYSTEM, filler=lp.Filler.meaningless(count=6)) for q in QUESTIONS]
    corrupted = [lp.build_prompt(tiny, q, system=SYSTEM) for q in QUESTIONS]
    return clean, corrupted


@pytest.fixture(scope="module")
def many(tiny, pairs):
    return lp.patch_heads(tiny, *pairs, "logprob", answers=ANSWERS, batch_size=3)


def answer_ids(tiny, answer: str) -> torch.Tensor:
    return torch.tensor([tiny.tokenizer.encode(answer, add_special_tokens=False)])


def logprob(hf, tokens: torch.Tensor, answer: torch.Tensor) -> float:
    """Summed log-probability of ``answer`` fed after ``tokens`` (teacher forcing) on plain transformers."""
    with torch.no_grad():
        logp = hf(torch.cat([tokens, answer], 1)).logits[0].double().log_softmax(-1)
    n = tokens.shape[1]
    return sum(float(logp[n - 1 + j, int(t)]) for j, t in enumerate(answer[0]))


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


def hand_patched(hf, clean, corrupted, answer, layer: int, head: int, d_head: int) -> float:
    """The answer's log-prob after ``clean`` with head ``(layer, head)``'s o_proj input taken from ``corrupted`` at the paired
    positions, by a hook on plain transformers."""
    clean_pos, corrupted_pos, _ = aligned_positions(clean, corrupted)
    source = o_proj_inputs(hf, corrupted.tokens)[layer]
    cols = slice(head * d_head, (head + 1) * d_head)

    def swap(mod, args):
        x = args[0].clone()
        x[0, clean_pos, cols] = source[0, corrupted_pos, cols]
        return (x,)

    handle = hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(swap)
    try:
        return logprob(hf, clean.tokens, answer)
    finally:
        handle.remove()


def test_each_pair_equals_plain_transformers_patched_by_hand(tiny, twin_of, pairs, many):
    hf = twin_of(tiny)
    d_head = int(tiny.cfg.d_head)
    assert many.n_pairs == 2 and many.changes.shape == (2, len(many.heads))
    assert not many.share_undefined.any() and not many.mean_share_undefined
    for p, (clean, corrupted) in enumerate(zip(*pairs, strict=True)):
        answer = answer_ids(tiny, ANSWERS[p])
        base, other = logprob(hf, clean.tokens, answer), logprob(hf, corrupted.tokens, answer)
        assert float(many.clean[p]) == pytest.approx(base, abs=1e-5)
        assert float(many.corrupted[p]) == pytest.approx(other, abs=1e-5)
        assert float(many.gap[p]) == pytest.approx(other - base, abs=2e-5)
        for i, (layer, head) in enumerate(many.heads):
            want = hand_patched(hf, clean, corrupted, answer, layer, head, d_head)
            assert float(many.patched[p, i]) == pytest.approx(want, abs=2e-5), (p, layer, head)
            assert float(many.changes[p, i]) == pytest.approx(want - base, abs=2e-5)
            assert float(many.shares[p, i]) == pytest.approx((want - base) / (other - base), rel=1e-3, abs=1e-4)


def test_the_mean_is_the_mean_of_single_pair_calls(tiny, pairs, many):
    singles = [lp.patch_heads(tiny, c, k, "logprob", answers=a) for c, k, a in zip(*pairs, ANSWERS, strict=True)]
    want = torch.stack([s.changes[0] for s in singles]).mean(0)
    torch.testing.assert_close(many.mean_changes, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(many.grid(), torch.stack([s.grid() for s in singles]).mean(0), rtol=0, atol=1e-6,
                               equal_nan=True)
    gap = sum(float(s.corrupted[0] - s.clean[0]) for s in singles) / 2
    torch.testing.assert_close(many.mean_shares, want / gap, rtol=1e-4, atol=1e-6)
    for p, single in enumerate(singles):
        part = many.prompt(p)
        torch.testing.assert_close(part.changes, single.changes, rtol=0, atol=1e-6)
        assert part.clean_positions == single.clean_positions and part.unmatched == single.unmatched
    top = many.top(len(many.heads))
    label = top["label"][0]
    i = [f"L{a}H{b}" for a, b in many.heads].index(label)
    assert top["change"][0] == pytest.approx(float(want[i]), abs=1e-6)
    assert top["share"][0] == pytest.approx(float(want[i]) / gap, rel=1e-4)
    with pytest.raises(lp.LensprobeError, match=r"this result has 2 pairs: read .pair_positions\[i\]"):
        _ = many.clean_positions
    long = many.to_dataframe()
    assert len(long) == 2 * len(many.heads) and set(long["prompt"]) == {0, 1}
    assert long["corrupted"].tolist()[:: len(many.heads)] == pytest.approx(many.corrupted.tolist())
    assert list(many.pairs_table()["clean"]) == pytest.approx(many.clean.tolist())


def test_a_total_effect_of_about_zero_leaves_the_share_nan_and_flagged(tiny, pairs):
    clean, _ = pairs
    same = lp.patch_heads(tiny, [clean[0], clean[1]], [clean[0], clean[1]], "entropy", heads=["L0H1", "L1H2"])
    assert same.share_undefined.tolist() == [True, True] and same.mean_share_undefined
    assert all(math.isnan(v) for v in same.shares.reshape(-1).tolist())
    assert all(math.isnan(v) for v in same.mean_shares.tolist())
    assert not any(math.isinf(v) for v in same.to_dataframe()["share"])
    assert "share not defined: the total effect is about 0" in same.summary()
    assert math.isnan(same.grid("share")[0, 1])
    mixed = lp.patch_heads(tiny, [clean[0], clean[1]], [clean[0], pairs[1][1]], "logprob", answers=ANSWERS,
                           heads=["L0H1"])
    assert mixed.share_undefined.tolist() == [True, False]
    assert math.isnan(float(mixed.shares[0, 0])) and math.isfinite(float(mixed.shares[1, 0]))
    assert "share not defined on pair(s) 0" in mixed.summary()


def test_problems_and_a_filler_condition_build_the_pairs_in_one_call(tiny, twin_of):
    problems = [lp.evals.Problem(id=f"p{i}", problem=q, answer=a)
                for i, (q, a) in enumerate(zip(QUESTIONS, ANSWERS, strict=True))]
    got = lp.patch_heads(tiny, problems, filler="w/ Mless", metric="logprob", heads=["L0H1", "L1H0"])
    cond = lp.evals.builtin_condition("w/ Mless")
    clean = [cond.prompt_builder(tiny)(q) for q in QUESTIONS]
    corrupted = [lp.evals.builtin_condition("w/o").prompt_builder(tiny)(q) for q in QUESTIONS]
    assert [p.text for p in clean] != [p.text for p in corrupted] and "filler" in clean[0].segments
    want = lp.patch_heads(tiny, clean, corrupted, "logprob", answers=ANSWERS, heads=["L0H1", "L1H0"])
    torch.testing.assert_close(got.patched, want.patched, rtol=0, atol=1e-6)
    torch.testing.assert_close(got.corrupted, want.corrupted, rtol=0, atol=1e-6)
    hf = twin_of(tiny)
    for p, answer in enumerate(ANSWERS):  # the corrupted metric is the answer's log-prob without the filler
        ids = lp.build_prompt(tiny, QUESTIONS[p], system=lp.MATH_SYSTEM_PROMPT).tokens
        assert torch.equal(ids, corrupted[p].tokens)
        assert float(got.corrupted[p]) == pytest.approx(logprob(hf, ids, answer_ids(tiny, answer)), abs=1e-4)
    entropy = lp.patch_heads(tiny, problems, filler="w/ Mless", heads=["L0H1"])  # entropy reads no answer
    assert entropy.metric != got.metric and entropy.n_pairs == 2


def test_bad_pairs_are_refused_before_any_forward(tiny, pairs, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a forward ran")

    monkeypatch.setattr(headpatch, "record_z", refuse)
    monkeypatch.setattr(headpatch, "sweep_prompt", refuse)
    monkeypatch.setattr(headpatch, "measure_once", refuse)
    clean, corrupted = pairs
    cases = [
        ((clean, corrupted[:1]), {}, "2 clean prompts but 1 corrupted ones"),
        ((clean,), {}, "needs the corrupted prompts"),
        ((QUESTIONS, corrupted), {"filler": "w/ Mless"}, "pass corrupted prompts or filler=, not both"),
        ((QUESTIONS,), {"filler": "w/o"}, "has no filler: nothing differs"),
        ((QUESTIONS,), {"filler": "w/o, w/ Mless"}, "names one condition"),
        (([1, 2],), {"filler": "w/ Mless"}, "a question string or a problem"),
        ((QUESTIONS,), {"filler": "w/ Mless", "metric": "logprob"}, "answer"),
        (([clean[0], clean[1]], [corrupted[1], corrupted[0]]), {}, "segment 'question' has"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(lp.LensprobeError, match=message):
            lp.patch_heads(tiny, *args, **kwargs)


def test_the_figures_draw_the_result_its_table_and_its_grid(many):
    fig = lp.viz.sweep_heatmap(many)
    title = " ".join(fig.layout.title.text.replace("<br>", " ").split())
    assert "patched - clean, mean over 2 pairs" in title and "ablated - baseline" not in title
    grid = many.grid()
    for drawn in (lp.viz.sweep_heatmap(grid), lp.viz.sweep_heatmap(grid.numpy()), lp.viz.sweep_heatmap(many.table)):
        z = torch.tensor(drawn.data[0].z, dtype=torch.float32)
        torch.testing.assert_close(z, grid, equal_nan=True)
        text = " ".join(drawn.layout.title.text.replace("<br>", " ").split())
        assert "ablated - baseline" not in text
    assert "patched - clean, mean over 2 pairs" in lp.viz.sweep_heatmap(many.table).layout.title.text.replace("<br>", " ")
    share = lp.viz.sweep_heatmap(many.grid("share"), title="Share of the filler's effect")
    torch.testing.assert_close(torch.tensor(share.data[0].z, dtype=torch.float32), many.grid("share"), equal_nan=True)
    assert "patched - clean" in fig.to_html(include_plotlyjs=False)
    with pytest.raises(lp.LensprobeError, match="value must be 'change' or 'share'"):
        many.grid("kl")
    with pytest.raises(lp.LensprobeError, match=r"two dimensions, got shape \(3,\)"):
        lp.viz.sweep_heatmap(torch.zeros(3))
