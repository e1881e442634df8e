"""Metrics on hand-made tensors: hand-computed values and hypothesis property tests."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lensprobe import LensprobeError
from lensprobe.core.measures.metrics import (
    DEFAULT_TOKEN_CLASSES,
    attention_by_token_class,
    attention_proportion,
    average_attention_received,
    entropy,
    token_class_mask,
)

# A causal 4x4 pattern with rows that sum to 1, small enough to check by hand.
A4 = torch.tensor([
    [1.0, 0.0, 0.0, 0.0],
    [0.6, 0.4, 0.0, 0.0],
    [0.2, 0.3, 0.5, 0.0],
    [0.1, 0.2, 0.3, 0.4],
])

PROPS = settings(max_examples=60, deadline=None)


def causal_pattern(seed: int, heads: int, pos: int, scale: float = 3.0) -> torch.Tensor:
    """A random causal softmax pattern [head, pos, pos] (rows sum to 1, zeros above the diagonal)."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(heads, pos, pos, generator=gen, dtype=torch.float64) * scale
    upper = torch.ones(pos, pos, dtype=torch.bool).triu(1)
    return scores.masked_fill(upper, -math.inf).softmax(-1)


patterns = st.builds(
    causal_pattern,
    seed=st.integers(0, 2**31 - 1),
    heads=st.integers(1, 4),
    pos=st.integers(2, 12),
    scale=st.sampled_from([0.1, 3.0, 30.0]),
)


# ---------------------------------------------------------------- average_attention_received


def test_average_attention_received_by_hand():
    recv = average_attention_received(A4)
    # key 0: queries 1, 2, 3 -> (0.6 + 0.2 + 0.1) / 3; key 1: queries 2, 3 -> (0.3 + 0.2) / 2;
    # key 2: query 3 -> 0.3; key 3: no later query -> NaN. The diagonal never counts.
    torch.testing.assert_close(recv[:3], torch.tensor([0.3, 0.25, 0.3]))
    assert torch.isnan(recv[3])


def test_average_attention_received_keeps_leading_dims():
    stacked = torch.stack([A4, A4.flip(0).tril()])  # [head=2, 4, 4]; second is not a softmax, fine
    recv = average_attention_received(stacked[None])  # [batch=1, head=2, key]
    assert recv.shape == (1, 2, 4)
    torch.testing.assert_close(recv[0, 0, :3], torch.tensor([0.3, 0.25, 0.3]))
    # second head by hand: rows [.1 .2 .3 .4], [.2 .3 .5 0] -> lower part [[.1,0,0,0],[.2,.3,0,0],
    # [.6,.4,.5,0],[1,0,0,0]]: key 0 <- (.2 + .6 + 1) / 3, key 1 <- (.4 + 0) / 2, key 2 <- 0
    torch.testing.assert_close(recv[0, 1, :3], torch.tensor([0.6, 0.2, 0.0]))


@PROPS
@given(patterns)
def test_average_attention_received_matches_loop(pattern):
    heads, pos, _ = pattern.shape
    recv = average_attention_received(pattern)
    assert recv.shape == (heads, pos)
    for h in range(heads):
        for j in range(pos - 1):
            later = [pattern[h, i, j].item() for i in range(j + 1, pos)]
            assert recv[h, j].item() == pytest.approx(sum(later) / len(later), abs=1e-12)
    assert torch.isnan(recv[:, -1]).all()
    finite = recv[:, :-1]
    assert ((finite >= 0) & (finite <= 1 + 1e-12)).all()


@pytest.mark.unchecked
def test_average_attention_received_rejects_non_square():
    with pytest.raises(LensprobeError, match="square"):
        average_attention_received(A4[2:])
    with pytest.raises(LensprobeError, match="pattern must be a tensor"):
        average_attention_received(torch.ones(4))


# ---------------------------------------------------------------- attention_proportion


def test_attention_proportion_by_hand():
    # S = {0, 1}; default queries: after key 1 -> queries 2 and 3: (0.2+0.3 + 0.1+0.2) / 2
    assert attention_proportion(A4, [0, 1]).item() == pytest.approx(0.4)
    # explicit queries, including one whose causal mask hides part of S
    assert attention_proportion(A4, [0, 1], query_positions=[1]).item() == pytest.approx(1.0)
    assert attention_proportion(A4, [2], query_positions=[0, 3]).item() == pytest.approx(0.15)
    # a tensor of positions works the same as a list
    assert attention_proportion(A4, torch.tensor([0, 1])).item() == pytest.approx(0.4)


def test_attention_proportion_per_head_and_set_semantics():
    pattern = torch.stack([A4, torch.eye(4)])  # [head=2, 4, 4]
    prop = attention_proportion(pattern, [0])  # queries 1..3
    torch.testing.assert_close(prop, torch.tensor([0.3, 0.0]))
    # a key listed twice counts once (S is a set)
    torch.testing.assert_close(attention_proportion(pattern, [0, 0, 1, 1]), attention_proportion(pattern, [0, 1]))
    torch.testing.assert_close(
        attention_proportion(pattern, [0], query_positions=[3, 3, 2]),
        attention_proportion(pattern, [0], query_positions=[2, 3]),
    )


@PROPS
@given(patterns, st.data())
def test_attention_proportion_in_unit_interval_and_complements_sum_to_one(pattern, data):
    pos = pattern.shape[-1]
    keys = data.draw(st.sets(st.integers(0, pos - 1), min_size=1, max_size=pos - 1), label="keys")
    rest = sorted(set(range(pos)) - keys)
    queries = data.draw(st.sets(st.integers(0, pos - 1), min_size=1), label="queries")
    prop = attention_proportion(pattern, sorted(keys), query_positions=sorted(queries))
    other = attention_proportion(pattern, rest, query_positions=sorted(queries))
    assert prop.shape == (pattern.shape[0],)
    assert ((prop >= 0) & (prop <= 1 + 1e-12)).all()
    assert ((other >= 0) & (other <= 1 + 1e-12)).all()
    torch.testing.assert_close(prop + other, torch.ones_like(prop), atol=1e-10, rtol=0)
    # independent: mean over chosen rows of the summed columns
    for h in range(pattern.shape[0]):
        per_query = [sum(pattern[h, i, j].item() for j in keys) for i in queries]
        assert prop[h].item() == pytest.approx(sum(per_query) / len(per_query), abs=1e-12)


@PROPS
@given(patterns, st.data())
def test_attention_proportion_on_kv_step_rows(pattern, data):
    """A [head, Q, K] pattern with Q < K holds the last Q queries: row r is position K - Q + r."""
    pos = pattern.shape[-1]
    n_rows = data.draw(st.integers(1, pos), label="rows")
    keys = sorted(data.draw(st.sets(st.integers(0, pos - 1), min_size=1), label="keys"))
    step = pattern[:, pos - n_rows:, :]

    def by_hand(queries):  # mean over the (absolute) queries of the attention summed over the keys
        return torch.tensor([sum(sum(pattern[h, i, j].item() for j in keys) for i in queries) / len(queries)
                             for h in range(pattern.shape[0])], dtype=pattern.dtype)

    first_query = max(keys[-1] + 1, pos - n_rows)
    if first_query >= pos:
        with pytest.raises(LensprobeError, match="no query comes after"):
            attention_proportion(step, keys)
    else:
        torch.testing.assert_close(attention_proportion(step, keys), by_hand(range(first_query, pos)))
    # explicit absolute query positions inside the step's rows
    queries = sorted(data.draw(st.sets(st.integers(pos - n_rows, pos - 1), min_size=1), label="queries"))
    torch.testing.assert_close(attention_proportion(step, keys, query_positions=queries), by_hand(queries))


def test_attention_proportion_single_generation_step_by_hand():
    step = torch.tensor([[[0.1, 0.2, 0.3, 0.4]], [[0.25, 0.25, 0.25, 0.25]]])  # [head=2, q=1, k=4]
    torch.testing.assert_close(attention_proportion(step, [0, 2]), torch.tensor([0.4, 0.5]))
    # the newest query itself is in S: say which queries to use
    torch.testing.assert_close(attention_proportion(step, [3], query_positions=[3]), torch.tensor([0.4, 0.25]))


@pytest.mark.unchecked
@pytest.mark.parametrize(
    ("keys", "queries", "message"),
    [
        ([], None, "key_positions is empty"),
        ([4], None, "key positions must lie in 0..3"),
        ([-1], None, "key positions must lie in 0..3"),
        ([3], None, "no query comes after"),
        ([0], [4], "query positions must lie in 0..3"),
        ([0], [], "query positions must lie"),
        ([0.5], None, "positions must be integers"),
    ],
)
def test_attention_proportion_errors(keys, queries, message):
    with pytest.raises(LensprobeError, match=message):
        attention_proportion(A4, keys, query_positions=queries)


def test_attention_proportion_rejects_queries_before_a_kv_step():
    step = A4[None, 3:]  # [1, 1, 4]: only absolute query 3 exists
    with pytest.raises(LensprobeError, match="query positions must lie in 3..3"):
        attention_proportion(step, [0], query_positions=[2])


# ---------------------------------------------------------------- attention_by_token_class

TOKENS = ["<s>", "#", " ", "*", " ##", "a", "\n", "#a", ""]
# membership written out by hand for the default classes
HASH, STAR, SPACE = [1, 4], [3], [2, 6]


def by_hand(pattern: torch.Tensor, members: list[list[int]]) -> torch.Tensor:
    """Mean over heads and queries of the summed attention onto each class, by explicit loops."""
    heads, queries, _ = pattern.shape
    out = []
    for cls in members:
        total = 0.0
        for h in range(heads):
            for i in range(queries):
                total += sum(pattern[h, i, j].item() for j in cls)
        out.append(total / (heads * queries))
    return torch.tensor(out, dtype=pattern.dtype)


def test_token_class_mask_default_rules():
    mask = token_class_mask(TOKENS)
    assert mask.shape == (3, len(TOKENS))
    assert list(DEFAULT_TOKEN_CLASSES) == ["# (hash)", "* (star)", "whitespace"]
    for row, members in zip(mask, [HASH, STAR, SPACE], strict=True):
        assert row.nonzero().flatten().tolist() == members


@PROPS
@given(st.integers(0, 2**31 - 1), st.integers(1, 3))
def test_attention_by_token_class_default_classes_by_hand(seed, heads):
    pattern = causal_pattern(seed, heads, len(TOKENS))
    got = attention_by_token_class(pattern, TOKENS)
    torch.testing.assert_close(got, by_hand(pattern, [HASH, STAR, SPACE]))
    assert got.sum() <= 1 + 1e-12 and (got >= 0).all()


def test_attention_by_token_class_custom_callables_and_strings():
    pattern = causal_pattern(7, 2, len(TOKENS))
    classes = {
        "letters": lambda t: t.strip().isalpha() and not t.startswith("<"),
        "markup": lambda t: t.startswith("<"),
        "hash-or-star": "#*",
        "everything": lambda t: True,
    }
    got = attention_by_token_class(pattern, TOKENS, classes)
    # letters: "a" (5); markup: "<s>" (0); hash-or-star: 1, 3, 4 ("#a" has a letter); everything
    # except the empty string (8), which no rule takes
    everything = list(range(len(TOKENS) - 1))
    torch.testing.assert_close(got, by_hand(pattern, [[5], [0], [1, 3, 4], everything]))


def test_attention_by_token_class_layers_dict_and_stack():
    p0, p1 = causal_pattern(1, 2, len(TOKENS)), causal_pattern(2, 2, len(TOKENS))
    from_dict = attention_by_token_class({5: p1, 0: p0}, TOKENS)  # stacked in layer order 0, 5
    assert from_dict.shape == (2, 3)
    torch.testing.assert_close(from_dict[0], by_hand(p0, [HASH, STAR, SPACE]))
    torch.testing.assert_close(from_dict[1], by_hand(p1, [HASH, STAR, SPACE]))
    torch.testing.assert_close(attention_by_token_class(torch.stack([p0, p1]), TOKENS), from_dict)


def test_attention_by_token_class_kv_step_rows():
    pattern = causal_pattern(3, 2, len(TOKENS))
    step = pattern[:, -2:]  # two newest queries against all keys
    torch.testing.assert_close(attention_by_token_class(step, TOKENS), by_hand(step, [HASH, STAR, SPACE]))


@pytest.mark.unchecked
def test_attention_by_token_class_errors():
    pattern = causal_pattern(0, 2, len(TOKENS))
    with pytest.raises(LensprobeError, match="9 key positions but 8 tokens"):
        attention_by_token_class(pattern, TOKENS[:-1])
    with pytest.raises(LensprobeError, match="add a head dimension"):
        attention_by_token_class(pattern[0], TOKENS)


# ---------------------------------------------------------------- entropy


def test_entropy_by_hand():
    probs = torch.tensor([0.5, 0.25, 0.25])
    assert entropy(probs.log()).item() == pytest.approx(1.5 * math.log(2), abs=1e-6)
    assert entropy(torch.zeros(7)).item() == pytest.approx(math.log(7), abs=1e-6)
    assert entropy(torch.tensor([0.0, -math.inf, -math.inf])).item() == 0.0  # masked logits
    assert entropy(torch.tensor([100.0, 0.0, 0.0])).item() == pytest.approx(0.0, abs=1e-6)
    out = entropy(torch.zeros(2, 5, 11))  # per position
    assert out.shape == (2, 5)
    torch.testing.assert_close(out, torch.full((2, 5), math.log(11)))


def test_entropy_dtypes():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    assert entropy(logits.double()).dtype == torch.float64
    assert entropy(logits.half()).dtype == torch.float32
    p = logits.half().double().softmax(-1)  # half logits are computed on in float32
    torch.testing.assert_close(entropy(logits.half()).double(), -(p * p.log()).sum(-1), atol=1e-5, rtol=0)


@PROPS
@given(
    st.integers(0, 2**31 - 1),
    st.integers(1, 300),
    st.sampled_from([1e-3, 1.0, 10.0, 100.0]),
)
def test_entropy_between_zero_and_log_vocab(seed, vocab, scale):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, vocab, generator=gen) * scale
    h = entropy(logits)
    assert h.shape == (4,)
    assert (h >= -1e-6).all()
    assert (h <= math.log(vocab) + 1e-5).all()
    p = logits.double().softmax(-1)
    torch.testing.assert_close(h.double(), -(p * p.clamp_min(1e-300).log()).sum(-1), atol=1e-5, rtol=1e-5)
