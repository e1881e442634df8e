"""Non-finite values stay NaN: metrics, measures, generation and evaluation rows.

Expected values are computed by hand with Python floats over exactly the entries each
metric reads, so a NaN or infinity makes the expected value NaN only where it is read.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lensprobe as lp
from lensprobe.core.errors import LensprobeError
from lensprobe.core.measures.measure import AnswerLogProb, CallableMeasure, NextTokenEntropy
from lensprobe.core.measures.metrics import nonfinite_rows
from lensprobe.evals.problems.load import Problem

SPECIAL = [math.nan, math.inf, -math.inf]


@st.composite
def with_specials(draw, shape: tuple[int, ...], low: float = -5.0, high: float = 5.0):
    """A float64 tensor of ``shape`` with NaN/inf written at a few random positions."""
    n = math.prod(shape)
    values = draw(st.lists(st.floats(low, high), min_size=n, max_size=n))
    spots = draw(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(SPECIAL)), max_size=4))
    for index, value in spots:
        values[index] = value
    return torch.tensor(values, dtype=torch.float64).reshape(shape)


def entropy_by_hand(row: list[float]) -> float:
    if any(math.isnan(x) or x == math.inf for x in row) or all(x == -math.inf for x in row):
        return math.nan
    top = max(row)
    weights = [math.exp(x - top) for x in row]  # exp(-inf) = 0: a token of probability 0
    total = sum(weights)
    return -sum(w / total * math.log(w / total) for w in weights if w > 0)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.data())
def test_entropy_is_nan_exactly_on_broken_rows(rows, vocab, data):
    logits = data.draw(with_specials((rows, vocab)))
    expected = torch.tensor([entropy_by_hand(r) for r in logits.tolist()], dtype=torch.float64)
    got = lp.metrics.entropy(logits)
    torch.testing.assert_close(got, expected, equal_nan=True)
    assert torch.equal(nonfinite_rows(logits), expected.isnan())


def test_entropy_of_a_nan_row_and_an_all_minus_inf_row_is_nan_not_zero():
    logits = torch.tensor([[float("nan"), 1.0, 2.0], [-math.inf] * 3, [0.0, -math.inf, 0.0]])
    got = lp.metrics.entropy(logits)
    assert got[0].isnan() and got[1].isnan()
    assert got[2].item() == pytest.approx(math.log(2))


@pytest.mark.unchecked
def test_entropy_converts_a_list_and_refuses_what_has_no_vocabulary():
    assert lp.metrics.entropy([0.0, 0.0, 0.0, 0.0]).item() == pytest.approx(math.log(4))
    with pytest.raises(LensprobeError, match="0-d tensor"):
        lp.metrics.entropy(torch.tensor(1.0))
    with pytest.raises(LensprobeError, match="vocabulary axis .last. is empty"):
        lp.metrics.entropy(torch.zeros(2, 0))
    with pytest.raises(LensprobeError, match="entropy needs logits as a tensor"):
        lp.metrics.entropy(["a", "b"])
    with pytest.raises(LensprobeError, match="real-valued logits"):
        lp.metrics.entropy(torch.tensor([True, False]))


@pytest.mark.unchecked
def test_attention_metrics_refuse_what_is_not_a_pattern():
    with pytest.raises(LensprobeError, match="pattern must be a tensor .*got list"):
        lp.metrics.average_attention_received([[1.0]])
    with pytest.raises(LensprobeError, match="floating-point attention weights"):
        lp.metrics.attention_proportion(torch.ones(2, 2, dtype=torch.long), [0])


def _mean_or_nan(values: list[float]) -> float:
    if any(not math.isfinite(v) for v in values):
        return math.nan
    return sum(values) / len(values) if values else math.nan


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 2), st.integers(2, 6), st.data())
def test_average_attention_received_reads_only_below_the_diagonal(heads, n, data):
    pattern = data.draw(with_specials((heads, n, n), 0.0, 1.0))
    expected = torch.tensor([[_mean_or_nan([pattern[h, i, j].item() for i in range(j + 1, n)]) for j in range(n)]
                             for h in range(heads)], dtype=torch.float64)
    torch.testing.assert_close(lp.metrics.average_attention_received(pattern), expected, equal_nan=True)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 2), st.integers(2, 6), st.data())
def test_attention_proportion_reads_only_its_queries_and_keys(heads, n, data):
    pattern = data.draw(with_specials((heads, n, n), 0.0, 1.0))
    keys = sorted(set(data.draw(st.lists(st.integers(0, n - 2), min_size=1, max_size=n))))
    queries = range(max(keys) + 1, n)
    expected = []
    for h in range(heads):
        sums = [[pattern[h, i, j].item() for j in keys] for i in queries]
        bad = any(not math.isfinite(v) for row in sums for v in row)
        expected.append(math.nan if bad else sum(sum(r) for r in sums) / len(sums))
    got = lp.metrics.attention_proportion(pattern, keys)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), equal_nan=True)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 2), st.integers(1, 5), st.data())
def test_attention_by_token_class_reads_only_each_class_keys(heads, n, data):
    pattern = data.draw(with_specials((heads, n, n), 0.0, 1.0))
    tokens = data.draw(st.lists(st.sampled_from(["#", "*", " ", "a"]), min_size=n, max_size=n))
    rules = {"#": "#", "*": "*", " ": " "}
    expected = []
    for cls in rules:
        keys = [j for j, t in enumerate(tokens) if t == cls]
        per = [sum(pattern[h, i, j].item() for j in keys) for h in range(heads) for i in range(n)]
        bad = any(not math.isfinite(pattern[h, i, j].item()) for h in range(heads) for i in range(n) for j in keys)
        expected.append(math.nan if bad else sum(per) / len(per))
    got = lp.metrics.attention_by_token_class(pattern, tokens, {c: (lambda t, c=c: t == c) for c in rules})
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), equal_nan=True)


def test_measures_are_nan_where_they_read_non_finite_logits():
    logits = torch.zeros(3, 4, 5)  # [batch, pos, vocab]
    logits[0, 0, 1] = math.nan     # read by the callable only (any position)
    logits[1, -1, 2] = math.inf    # read by the entropy measure (last position)
    logits[2, 1, 0] = math.nan     # read by the answer log-prob (predicts the answer's 1st token)
    got = NextTokenEntropy().compute(logits, torch.zeros(3, 4, dtype=torch.long), None, [])  # tokens: unread
    assert got.isnan().tolist() == [False, True, False]
    assert got[0].item() == pytest.approx(math.log(5))
    tokens = torch.tensor([[0, 0, 3, 4]])  # a 2-token prompt and a 2-token answer: reads positions 1, 2
    logp = AnswerLogProb("x").compute(logits, tokens, tokens[:, :2], [])
    assert logp.isnan().tolist() == [False, False, True]
    assert logp[:2].tolist() == pytest.approx([2 * -math.log(5)] * 2)
    custom = CallableMeasure(lambda lg, p: torch.zeros(lg.shape[0])).compute(logits, tokens, None, [])
    assert custom.isnan().tolist() == [True, True, True]
    clean = CallableMeasure(lambda lg, p: torch.ones(lg.shape[0])).compute(torch.zeros(2, 3, 5), tokens, None, [])
    assert clean.tolist() == [1.0, 1.0]


# ----- generation with a NaN injected mid-run ---------------------------------------------

def _nan_at(step: int, row: int):
    """A hook writing NaN into one row's residual stream at one generation step."""
    def hook(x, hook):
        info = hook.step
        if info is not None and info.step == step:
            x = x.clone()
            x[row] = math.nan
            return x
        return None
    return hook


def _noop(x, hook):
    return None


def test_generation_stops_a_row_with_non_finite_logits_and_warns(tiny):
    prompts = [lp.build_prompt(tiny, "What is 2+3?"), lp.build_prompt(tiny, "Name a color.")]
    clean = lp.trace_generation(tiny, prompts, max_new_tokens=6, stop_at_eos=False,
                                interventions=[("blocks.0.hook_resid_post", _noop)])
    with pytest.warns(RuntimeWarning, match=r"non-finite logits .* at step 2 in row 1: it stops"):
        broken = lp.trace_generation(tiny, prompts, max_new_tokens=6, stop_at_eos=False,
                                     interventions=[("blocks.0.hook_resid_post", _nan_at(2, 1))])
    assert clean.finish_reasons == ["length", "length"]
    assert broken.finish_reasons == ["length", "nonfinite"]
    # row 0 never saw a NaN: the same tokens, entropies and attention as the clean run
    assert torch.equal(broken.token_ids_rows[0], clean.token_ids_rows[0])
    torch.testing.assert_close(broken.entropy_rows[0], clean.entropy_rows[0])
    torch.testing.assert_close(broken.attention_rows["prompt"][0], clean.attention_rows["prompt"][0])
    # row 1: the clean run's first two steps, then nothing, and NaN entropy from step 2 on
    assert torch.equal(broken.token_ids_rows[1, :2], clean.token_ids_rows[1, :2])
    assert (broken.token_ids_rows[1, 2:] == -1).all()
    torch.testing.assert_close(broken.entropy_rows[1, :2], clean.entropy_rows[1, :2])
    assert broken.entropy_rows[1, 2:].isnan().all()
    assert broken.generated_ids[1] == clean.generated_ids[1][:2]


def test_sampling_goes_on_after_a_row_turned_nan(tiny):
    p = lp.build_prompt(tiny, "What is 2+3?")
    kwargs = dict(max_new_tokens=4, do_sample=True, seed=0, n_samples=3, stop_at_eos=False)
    clean = lp.generate(tiny, p, interventions=[("blocks.0.hook_resid_post", _noop)], **kwargs)
    with pytest.warns(RuntimeWarning, match=r"at step 1 in rows 0, 2: they stop"):
        out = lp.generate(tiny, p, interventions=[("blocks.0.hook_resid_post", _nan_at(1, [0, 2]))], **kwargs)
    assert out.finish_reasons == ["nonfinite", "length", "nonfinite"]
    assert out.generated_ids[1] == clean.generated_ids[1]  # the same draws: seeded per sample
    assert out.generated_ids[0] == clean.generated_ids[0][:1] and out.generated_ids[2] == clean.generated_ids[2][:1]


def test_evaluation_records_broken_generations_as_errors(tiny):
    probs = [Problem(id="a", problem="What is 2+3?", answer="5"), Problem(id="b", problem="What is 1+1?", answer="2")]
    cond = lp.Condition("nan", interventions=(("blocks.0.hook_resid_post", _nan_at(1, 0)),))
    with pytest.warns(RuntimeWarning, match="at step 1 in row 0"):
        rows = lp.evaluate(tiny, probs, [cond, lp.Condition("w/o")], max_new_tokens=3, batch_size=2, progress=False)
    assert rows["finish"].tolist()[:2] == ["nonfinite", "length"]
    broken = rows.iloc[0]
    assert broken["prediction"] is None
    assert all(broken[g] is None for g in (*lp.evals.GRADERS, "paper-exact"))
    assert all(rows.iloc[r]["math-verify"] in (True, False) for r in (1, 2, 3))
    acc = lp.evals.accuracy(rows, "condition")
    assert acc["n"].tolist() == [1, 2]  # the broken row is no trial
    assert lp.evals.compare(rows, "nan", "w/o").n == 1  # nor half of a pair
    with pytest.raises(LensprobeError, match=r"1 row\(s\) have no 'math-verify' verdict \(finish 'nonfinite'"):
        lp.evals.pass_at_k_table(rows, 1)
