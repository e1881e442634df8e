"""Rows of a KV cache (:mod:`lensprobe.generation.batching.cacherows`) on hand-made caches of both kinds:
a ``transformers`` ``DynamicCache`` (keys and values ``[row, kv_head, pos, d_head]``) and
TransformerLens' ``TransformerLensKeyValueCache`` (``[row, pos, kv_head, d_head]`` and a
``[row, pos]`` attention mask). Every result is compared with the same tensors computed a second
way: plain indexing, slicing, and left padding written into a zero tensor by index assignment."""

from types import SimpleNamespace

import pytest
import torch
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
from transformer_lens.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry
from transformers import DynamicCache, LlamaConfig, StaticCache

from lensprobe.generation.batching import cacherows

N_LAYERS, KV_HEADS, D_HEAD = 2, 2, 3
KINDS = ["dynamic", "transformerlens"]


def tensors_of(seed: int, rows: int, width: int) -> list[torch.Tensor]:
    """Keys and values per layer, ``[row, kv_head, pos, d_head]``, drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, KV_HEADS, width, D_HEAD, generator=g) for _ in range(2 * N_LAYERS)]


def make(kind: str, rows: int, width: int, seed: int = 0, pad: list[int] | None = None):
    """A cache of ``kind`` with ``rows`` rows of ``width`` columns; ``pad[i]`` leading columns of row ``i``
    are padding (zero in the TransformerLens attention mask). The tensors are copies: the cache shares
    no storage with what a test keeps to compare against."""
    kv = tensors_of(seed, rows, width)
    if kind == "dynamic":
        cache = DynamicCache()
        for layer in range(N_LAYERS):
            cache.update(kv[2 * layer].clone(), kv[2 * layer + 1].clone(), layer)
        return cache
    pad = pad or [0] * rows
    mask = torch.tensor([[0] * p + [1] * (width - p) for p in pad], dtype=torch.int)
    entries = [TransformerLensKeyValueCacheEntry(past_keys=kv[2 * layer].transpose(1, 2).clone(),
                                                 past_values=kv[2 * layer + 1].transpose(1, 2).clone())
               for layer in range(N_LAYERS)]
    return TransformerLensKeyValueCache(entries=entries, previous_attention_mask=mask)


def contents(cache) -> list[torch.Tensor]:
    """Every per-row tensor of ``cache``, read by hand, in one layout with positions on axis -2: keys and
    values as ``[row, kv_head, pos, d_head]`` layer by layer, then (TransformerLens) the mask as ``[row, pos, 1]``."""
    if isinstance(cache, DynamicCache):
        return [t for layer in cache.layers for t in (layer.keys, layer.values)]
    out = [t.transpose(1, 2) for e in cache.entries for t in (e.past_keys, e.past_values)]
    return [*out, cache.previous_attention_mask[..., None]]


def stored(cache) -> list[torch.Tensor]:
    """The tensor objects ``cache`` holds, as they are."""
    if isinstance(cache, DynamicCache):
        return [t for layer in cache.layers for t in (layer.keys, layer.values)]
    return [t for e in cache.entries for t in (e.past_keys, e.past_values)] + [cache.previous_attention_mask]


def padded_by_hand(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Rows of ``a`` then rows of ``b``, each written right-aligned into a zero tensor of the wider width."""
    wa, wb = a.shape[-2], b.shape[-2]
    w = max(wa, wb)
    out = torch.zeros(a.shape[0] + b.shape[0], *a.shape[1:-2], w, a.shape[-1], dtype=a.dtype)
    out[: a.shape[0], ..., w - wa:, :] = a
    out[a.shape[0]:, ..., w - wb:, :] = b
    return out


def assert_contents(cache, want: list[torch.Tensor]) -> None:
    got = contents(cache)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape and g.dtype == w.dtype, (i, g.shape, w.shape, g.dtype, w.dtype)
        assert torch.equal(g, w), i


# ----- width ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("width", [1, 4, 7])
def test_width_is_the_count_of_positions(kind, width):
    cache = make(kind, 3, width)
    assert cacherows.width(cache) == width
    assert all(t.shape[-2] == width for t in contents(cache))
    if kind == "dynamic":
        assert cache.get_seq_length() == width  # transformers' own count agrees


# ----- keep_rows ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [[0, 2], [2, 0], [1], [3, 1, 0, 2], []], ids=str)
def test_keep_rows_equals_indexing(kind, rows):
    cache = make(kind, 4, 5, seed=1, pad=[0, 2, 1, 3])
    before = [t.clone() for t in contents(cache)]
    cacherows.keep_rows(cache, torch.tensor(rows, dtype=torch.long))
    assert_contents(cache, [t[rows] for t in before])
    assert cacherows.width(cache) == 5


# ----- drop_columns -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 3, 6])
def test_drop_columns_equals_slicing(kind, n):
    cache = make(kind, 2, 6, seed=2, pad=[3, 4])
    before = [t.clone() for t in contents(cache)]
    cacherows.drop_columns(cache, n)
    assert_contents(cache, [t[..., n:, :] for t in before])
    assert cacherows.width(cache) == 6 - n


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [0, -2])
def test_drop_columns_of_none_or_fewer_changes_nothing(kind, n):
    cache = make(kind, 2, 4, seed=3)
    held = stored(cache)
    cacherows.drop_columns(cache, n)
    assert all(a is b for a, b in zip(stored(cache), held, strict=True))  # not even a new tensor


# ----- join ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("w_running", "w_new"), [(5, 3), (3, 5), (4, 4), (1, 6)])
def test_join_equals_the_hand_padded_concatenation(kind, w_running, w_new):
    running = make(kind, 2, w_running, seed=4, pad=[0, 1] if w_running > 1 else None)
    new = make(kind, 1, w_new, seed=5)
    a, b = [t.clone() for t in contents(running)], [t.clone() for t in contents(new)]
    out = cacherows.join(running, new)
    assert out is running  # changed in place
    want = [padded_by_hand(x, y) for x, y in zip(a, b, strict=True)]
    assert_contents(out, want)
    assert cacherows.width(out) == max(w_running, w_new)
    narrow = slice(0, 2) if w_running < w_new else slice(2, 3)
    for t in contents(out):  # the narrower side's leading columns are zeros
        assert not t[narrow][..., : abs(w_running - w_new), :].any()
    assert_contents(new, b)  # the joining cache is only read


@pytest.mark.parametrize("kind", KINDS)
def test_join_with_no_running_rows_returns_the_new_cache(kind):
    new = make(kind, 2, 3, seed=6, pad=[1, 0])
    held = [t.clone() for t in contents(new)]
    assert cacherows.join(None, new) is new
    assert_contents(new, held)


def test_join_keeps_the_mask_dtype_and_marks_padding_unattended():
    running = make("transformerlens", 1, 2, seed=7)
    new = make("transformerlens", 1, 5, seed=8, pad=[2])
    cacherows.join(running, new)
    mask = running.previous_attention_mask
    assert mask.dtype == torch.int
    assert mask.tolist() == [[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]]


@pytest.mark.parametrize("kind", KINDS)
def test_rows_stay_themselves_through_keep_drop_and_join(kind):
    """The loop's sequence of operations: after every one, each row's own columns sit at the right end
    and every column before them is zero (the invariant continuous batching relies on)."""
    own = {}  # row name -> its unpadded per-tensor contents

    def fresh(name: str, width: int, seed: int):
        cache = make(kind, 1, width, seed=seed)
        own[name] = [t[0].clone() for t in contents(cache)]
        return cache

    def check(cache, names: list[str]) -> None:
        got = contents(cache)
        for i, name in enumerate(names):
            for t, mine in zip(got, own[name], strict=True):
                n = mine.shape[-2]
                assert torch.equal(t[i][..., -n:, :], mine), name
                assert not t[i][..., :-n, :].any(), name

    cache = cacherows.join(None, fresh("a", 6, 10))
    cache = cacherows.join(cache, fresh("b", 3, 11))
    check(cache, ["a", "b"])
    cacherows.keep_rows(cache, torch.tensor([1]))  # "a" ends
    check(cache, ["b"])
    cacherows.drop_columns(cache, 3)  # the columns that only "a" filled
    assert cacherows.width(cache) == 3
    check(cache, ["b"])
    cache = cacherows.join(cache, fresh("c", 8, 12))
    cache = cacherows.join(cache, fresh("d", 2, 13))
    assert cacherows.width(cache) == 8
    check(cache, ["b", "c", "d"])
    cacherows.keep_rows(cache, torch.tensor([2, 0]))
    check(cache, ["d", "b"])


# ----- can_join ---------------------------------------------------------------------------------------
def tiny_config() -> LlamaConfig:
    return LlamaConfig(hidden_size=KV_HEADS * D_HEAD * 2, intermediate_size=8, num_attention_heads=2 * KV_HEADS,
                       num_key_value_heads=KV_HEADS, num_hidden_layers=N_LAYERS, vocab_size=16)


@pytest.mark.parametrize("kind", KINDS)
def test_can_join_a_filled_full_attention_cache(kind):
    assert cacherows.can_join(make(kind, 2, 3)) is True


def test_a_sliding_window_layer_joins_unless_it_records_its_past():
    """Gemma's sliding-window layers join (rows checked against solo runs in tests/families); one that keeps
    its past for a later crop does not."""
    kv = tensors_of(0, 2, 5)
    cache = DynamicCache(ddp_cache_data=[(kv[0], kv[1]), (kv[2], kv[3], torch.tensor(4))])
    assert [type(layer).__name__ for layer in cache.layers] == ["DynamicLayer", "DynamicSlidingWindowLayer"]
    assert cacherows.can_join(cache) is True
    cache.layers[1].activate_past_recording()
    assert cacherows.can_join(cache) is False


def test_cannot_join_a_static_cache():
    cache = StaticCache(config=tiny_config(), max_cache_len=8)
    assert {type(layer).__name__ for layer in cache.layers} == {"StaticLayer"}
    assert cacherows.can_join(cache) is False


def test_cannot_join_a_dynamic_cache_whose_layers_hold_nothing_yet():
    cache = DynamicCache(config=tiny_config())
    assert [type(layer).__name__ for layer in cache.layers] == ["DynamicLayer"] * N_LAYERS
    assert cacherows.can_join(cache) is False
    kv = tensors_of(0, 1, 2)
    for layer in range(N_LAYERS):
        cache.update(kv[2 * layer], kv[2 * layer + 1], layer)
    assert cacherows.can_join(cache) is True


def test_cannot_join_a_frozen_transformerlens_cache():
    cache = make("transformerlens", 2, 3)
    cache.freeze()
    assert cacherows.can_join(cache) is False
    cache.unfreeze()
    assert cacherows.can_join(cache) is True


@pytest.mark.parametrize("obj", [
    None, object(), 3, "cache", {"layers": []}, torch.zeros(2, 3),
    SimpleNamespace(entries=[], previous_attention_mask=torch.ones(1, 2)),  # the attributes, not the type
], ids=["None", "object", "int", "str", "dict", "tensor", "lookalike"])
def test_cannot_join_anything_else(obj):
    assert cacherows.can_join(obj) is False


# ----- errors -------------------------------------------------------------------------------------------
NOT_A_CACHE = "not a KV cache lensprobe can batch: object"


@pytest.mark.parametrize("call", [
    lambda c: cacherows.width(object()),
    lambda c: cacherows.keep_rows(object(), torch.tensor([0])),
    lambda c: cacherows.drop_columns(object(), 1),
    lambda c: cacherows.join(object(), c),
    lambda c: cacherows.join(c, object()),
], ids=["width", "keep_rows", "drop_columns", "join-running", "join-new"])
def test_an_object_that_is_no_cache_is_refused(call):
    cache = make("dynamic", 1, 2)
    held = [t.clone() for t in contents(cache)]
    with pytest.raises(TypeError, match=NOT_A_CACHE):
        call(cache)
    assert_contents(cache, held)


def test_join_refuses_a_cache_of_another_layer_count_and_changes_nothing():
    running = make("dynamic", 1, 2)
    held = [t.clone() for t in contents(running)]
    new = DynamicCache()
    kv = tensors_of(1, 1, 2)
    new.update(kv[0], kv[1], 0)  # one layer, not two
    with pytest.raises(ValueError, match=r"cannot join a DynamicCache of 2 tensors to a DynamicCache of 4"):
        cacherows.join(running, new)
    assert_contents(running, held)


def test_join_refuses_a_cache_of_the_other_kind():
    with pytest.raises(ValueError, match=r"cannot join a TransformerLensKeyValueCache .* to a DynamicCache"):
        cacherows.join(make("dynamic", 1, 2), make("transformerlens", 1, 2))


def test_a_cache_without_layers_cannot_join_and_has_no_width():
    assert cacherows.can_join(DynamicCache()) is False
    with pytest.raises(TypeError, match="the DynamicCache holds no layers"):
        cacherows.width(DynamicCache())
