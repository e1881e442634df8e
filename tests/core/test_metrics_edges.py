"""Metrics at their edges: long patterns (several row blocks), non-finite entries, position tensors of
other shapes and dtypes, broken logit rows, and the refusals' exact messages. Expected values are
counted a second way, with loops over Python floats or plain torch on hand-made tensors."""

import math

import pytest
import test_metrics
import torch

from lensprobe import LensprobeError
from lensprobe.core.measures.metrics import (
    attention_by_token_class,
    attention_proportion,
    average_attention_received,
    entropy,
    nonfinite_rows,
)

A4 = test_metrics.A4.double()  # the causal 4x4 pattern of test_metrics.py, in float64


def causal(seed: int, heads: int, pos: int) -> torch.Tensor:
    """A random causal softmax pattern [head, pos, pos] in float64."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(heads, pos, pos, generator=gen, dtype=torch.float64)
    return scores.masked_fill(torch.ones(pos, pos, dtype=torch.bool).triu(1), -math.inf).softmax(-1)


def received_by_hand(pattern: torch.Tensor) -> list[float]:
    """Average attention received by each key of a [pos, pos] pattern, over Python floats."""
    pos = pattern.shape[-1]
    out = []
    for j in range(pos):
        later = [pattern[i, j].item() for i in range(j + 1, pos)]
        bad = any(not math.isfinite(v) for v in later)
        out.append(math.nan if bad or not later else sum(later) / len(later))
    return out


# ---------------------------------------------------------------- refusals


@pytest.mark.unchecked
def test_a_pattern_that_is_not_a_tensor_or_not_floating_point_is_refused_by_name():
    """The messages name what was passed (its shape, its type, its dtype) and the fix."""
    fix = r"; pass an attention pattern such as lp\.attention_patterns\(model, prompt\)\[layer\]\.$"
    want = r"^pattern must be a tensor \[\.\.\., query_pos, key_pos\] \(e\.g\. \[head, q, k\]\), got "
    with pytest.raises(LensprobeError, match=want + r"shape \(4,\)" + fix):
        average_attention_received(torch.ones(4))
    with pytest.raises(LensprobeError, match=want + "list" + fix):
        attention_proportion([[1.0, 0.0], [0.5, 0.5]], [0])
    with pytest.raises(LensprobeError, match=r"^pattern must hold floating-point attention weights, got a "
                                             r"torch\.int64 tensor\.$"):
        average_attention_received(torch.ones(3, 3, dtype=torch.long))


def test_attention_proportion_messages_are_whole():
    """The empty-keys and no-later-query messages are the whole message, not a fragment of a longer one."""
    with pytest.raises(LensprobeError, match=r"^key_positions is empty: pass at least one key position\.$"):
        attention_proportion(A4, [])
    with pytest.raises(LensprobeError, match=r"^no query comes after the last key position; pass query_positions "
                                             r"explicitly\.$"):
        attention_proportion(A4, [3])


def test_attention_by_token_class_counts_key_positions_on_the_last_axis():
    """A [head, 2, 9] step with 8 tokens: the message counts the 9 key columns, not the 2 query rows."""
    step = causal(0, 1, 9)[:, -2:]
    with pytest.raises(LensprobeError, match=r"^pattern has 9 key positions but 8 tokens were given\.$"):
        attention_by_token_class(step, ["a"] * 8)


# ---------------------------------------------------------------- several row blocks


def test_average_attention_received_over_several_row_blocks():
    """A pattern of 150 rows is summed in blocks of 64: every block counts once, none twice."""
    pattern = causal(11, 2, 150)
    got = average_attention_received(pattern)
    assert got.shape == (2, 150)
    for h in range(2):
        want = torch.tensor(received_by_hand(pattern[h]), dtype=torch.float64)
        torch.testing.assert_close(got[h], want, equal_nan=True)
    # plain torch, a second way: the strict lower triangle's column sums over the later-query counts
    counts = torch.arange(149, -1, -1, dtype=torch.float64)
    torch.testing.assert_close(got[:, :-1], (pattern.tril(-1).sum(-2) / counts)[:, :-1])


# ---------------------------------------------------------------- non-finite entries


def test_infinity_read_by_an_attention_metric_gives_nan_not_infinity():
    """An infinite entry that a metric reads makes that value NaN; one it does not read changes nothing."""
    pattern = A4.clone()
    pattern[3, 1] = math.inf  # below the diagonal: key 1 reads it
    pattern[0, 2] = math.inf  # above the diagonal: never read
    got = average_attention_received(pattern)
    want = [(0.6 + 0.2 + 0.1) / 3, math.nan, 0.3, math.nan]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), equal_nan=True)
    # queries 2 and 3 over key 1: query 3 reads the infinity
    assert torch.isnan(attention_proportion(pattern, [1]))
    # key 0 only: the infinity at key 1 is not read -> (0.2 + 0.1) / 2
    assert attention_proportion(pattern, [0], query_positions=[2, 3]).item() == pytest.approx(0.15)
    negative = A4.clone()
    negative[2, 0] = -math.inf
    assert torch.isnan(attention_proportion(negative, [0, 1]))  # queries 2 and 3: -inf read, NaN


def class_means_by_hand(pattern: torch.Tensor, members: list[list[int]]) -> list[float]:
    """Per class: the mean over heads and queries of the summed entries of its keys; NaN if one is not finite."""
    heads, queries, _ = pattern.shape
    out = []
    for keys in members:
        values = [pattern[h, i, j].item() for h in range(heads) for i in range(queries) for j in keys]
        total = sum(values) / (heads * queries)
        out.append(total if all(math.isfinite(v) for v in values) else math.nan)
    return out


def test_attention_by_token_class_makes_nan_only_the_classes_that_read_a_broken_key():
    """A NaN at a '#' key makes the hash class NaN; an infinity at a key of no class changes nothing."""
    tokens = ["#", " ", "*", "a"]  # hash, whitespace, star, none
    pattern = torch.tensor([
        [[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0], [0.2, 0.3, 0.5, 0.0]],
        [[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]],
    ], dtype=torch.float64)  # [head=2, q=3, k=4]
    pattern[0, 1, 0] = math.nan
    pattern[1, 2, 3] = math.inf
    members = [[0], [2], [1]]  # the default classes' order: hash, star, whitespace
    got = attention_by_token_class(pattern, tokens)
    want = torch.tensor(class_means_by_hand(pattern, members), dtype=torch.float64)
    assert got.shape == (3,) and torch.isnan(got[0]) and not torch.isnan(got[1:]).any()
    torch.testing.assert_close(got, want, equal_nan=True)
    # star by hand: keys 2 of every row: (0 + 0 + 0.5 + 0.3 + 0.2 + 0.25) / 6
    assert got[1].item() == pytest.approx(1.25 / 6)
    # several layers: [layer=2, head, q, k] gives [layer, class], each layer on its own
    clean = pattern.nan_to_num(nan=0.0, posinf=0.0)
    stacked = attention_by_token_class(torch.stack([pattern, clean]), tokens)
    assert stacked.shape == (2, 3)
    torch.testing.assert_close(stacked[0], want, equal_nan=True)
    torch.testing.assert_close(stacked[1], torch.tensor(class_means_by_hand(clean, members), dtype=torch.float64))


# ---------------------------------------------------------------- positions given as tensors


def test_positions_as_a_2d_or_small_integer_tensor_are_a_set_of_positions():
    """Key positions in a [n, 1] or [1, n] tensor or a uint8 tensor mean the same as the list of their values."""
    want = 0.1 + 0.3  # query 3 (the one after key 2) over keys 0 and 2 (not contiguous)
    assert attention_proportion(A4, torch.tensor([[0], [2]])).item() == pytest.approx(want)
    assert attention_proportion(A4, torch.tensor([[0, 2]])).item() == pytest.approx(want)
    assert attention_proportion(A4, torch.tensor([2, 0], dtype=torch.uint8)).item() == pytest.approx(want)
    assert attention_proportion(A4, torch.tensor([0, 2], dtype=torch.int16),
                                query_positions=torch.tensor([[3], [1]], dtype=torch.uint8)).item() \
        == pytest.approx((0.6 + 0.0 + 0.1 + 0.3) / 2)


# ---------------------------------------------------------------- logits


def test_nonfinite_rows_row_by_row():
    """Each rule on its own row: a NaN, a +inf, all -inf are broken; one -inf among finite ones is not."""
    inf, nan = math.inf, math.nan
    logits = torch.tensor([[0.0, -inf], [nan, 0.0], [inf, 0.0], [-inf, -inf], [0.0, 1.0]])
    assert nonfinite_rows(logits).tolist() == [False, True, True, True, False]
    assert nonfinite_rows(logits[None]).shape == (1, 5)


def test_entropy_of_a_list_of_numbers():
    """A list of logits is converted: four equal logits have entropy ln 4."""
    assert entropy([0.0, 0.0, 0.0, 0.0]).item() == pytest.approx(math.log(4), abs=1e-6)
    assert entropy([0.0, -math.inf]).item() == 0.0  # one token of probability 1


@pytest.mark.unchecked
def test_entropy_refusals_name_the_problem():
    """What is not numbers, a 0-d tensor, an empty vocabulary and bool or complex logits each have their message."""
    with pytest.raises(LensprobeError, match=r"^entropy needs logits as a tensor \[\.\.\., d_vocab\] \(or a list of "
                                             r"numbers\), got list: "):
        entropy(["a", "b"])
    with pytest.raises(LensprobeError, match=r"^entropy needs logits with a vocabulary axis \[\.\.\., d_vocab\], got "
                                             r"a 0-d tensor; pass a row of logits, e\.g\. logits\[0, -1\]\.$"):
        entropy(torch.tensor(1.0))
    with pytest.raises(LensprobeError, match=r"^entropy got logits of shape \(2, 0\): the vocabulary axis \(last\) "
                                             r"is empty\.$"):
        entropy(torch.zeros(2, 0))
    with pytest.raises(LensprobeError, match=r"^entropy needs real-valued logits, got a torch\.bool tensor\.$"):
        entropy(torch.tensor([True, False]))
    with pytest.raises(LensprobeError, match=r"^entropy needs real-valued logits, got a torch\.complex64 tensor\.$"):
        entropy(torch.tensor([1.0 + 0j, 2.0j]))
