"""Rows of a KV cache with sliding-window layers (Gemma's), trimmed and joined, and ``can_join`` on the
layers and caches of other library versions. ``transformers``' ``DynamicSlidingWindowLayer`` keeps the last
``sliding_window - 1`` of the columns it was given and counts them all in ``cumulative_length``; every
expected tensor is cut by hand from the full tensors the cache was filled with, and padded with
``test_cacherows.padded_by_hand``."""

from types import SimpleNamespace

import pytest
import torch
from test_cacherows import N_LAYERS, padded_by_hand, tensors_of
from transformers import DynamicCache

from lensprobe.generation.batching import cacherows

WINDOW = 4  # a sliding-window layer keeps the last 3 columns
LAYOUTS = {"full-sliding": (False, True), "sliding-sliding": (True, True), "sliding-full": (True, False)}


def mixed(sliding: tuple[bool, ...], rows: int, width: int, seed: int):
    """A ``DynamicCache`` whose layer ``i`` is a sliding-window layer when ``sliding[i]``, filled with the
    tensors of ``tensors_of(seed, rows, width)``; and those full tensors."""
    kv = tensors_of(seed, rows, width)
    data = [(kv[2 * i].clone(), kv[2 * i + 1].clone()) + ((torch.tensor(WINDOW),) if sliding[i] else ())
            for i in range(N_LAYERS)]
    return DynamicCache(ddp_cache_data=data), kv


def last(t: torch.Tensor, n: int) -> torch.Tensor:
    return t[..., t.shape[-2] - n:, :]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_sliding_window_layer_counts_every_column_it_was_given(layout):
    sliding = LAYOUTS[layout]
    cache, _ = mixed(sliding, 2, 5, seed=1)
    assert [layer.keys.shape[-2] for layer in cache.layers] == [3 if s else 5 for s in sliding]
    assert cacherows.width(cache) == 5  # the padded rows' columns, not the 3 a sliding layer keeps


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", [1, 3])
def test_drop_columns_trims_a_sliding_window_layer_to_what_it_keeps(layout, n):
    sliding = LAYOUTS[layout]
    cache, kv = mixed(sliding, 2, 5, seed=2)
    cacherows.drop_columns(cache, n)
    for i, layer in enumerate(cache.layers):
        for got, full in ((layer.keys, kv[2 * i]), (layer.values, kv[2 * i + 1])):
            # 5 - n columns remain of each row; a sliding layer keeps the last min(5 - n, 3) of them
            want = last(full, min(5 - n, WINDOW - 1)) if sliding[i] else full[..., n:, :]
            assert torch.equal(got, want), (i, n)
        if sliding[i]:
            assert layer.cumulative_length == 5 - n
    assert cacherows.width(cache) == 5 - n


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("w_running", "w_new"), [(5, 2), (2, 5)])
def test_join_pads_a_sliding_window_layer_to_what_it_keeps(layout, w_running, w_new):
    sliding = LAYOUTS[layout]
    running, a = mixed(sliding, 1, w_running, seed=3)
    new, b = mixed(sliding, 1, w_new, seed=4)
    out = cacherows.join(running, new)
    w = max(w_running, w_new)
    for i, layer in enumerate(out.layers):
        for got, x, y in ((layer.keys, a[2 * i], b[2 * i]), (layer.values, a[2 * i + 1], b[2 * i + 1])):
            if sliding[i]:  # each side's kept columns, the narrower padded to the 3 the layer keeps
                x, y = last(x, min(w_running, WINDOW - 1)), last(y, min(w_new, WINDOW - 1))
            assert torch.equal(got, padded_by_hand(x, y)), i
        if sliding[i]:
            assert layer.cumulative_length == w
    assert cacherows.width(out) == w


def test_layers_and_caches_of_other_versions_join_by_their_names():
    # a full-attention and a sliding-window layer of a transformers version without is_initialized or
    # record_past: filled, not recording
    full, window = type("DynamicLayer", (), {})(), type("DynamicSlidingWindowLayer", (), {})()
    assert cacherows.can_join(SimpleNamespace(layers=[full, window])) is True
    window.record_past = True
    assert cacherows.can_join(SimpleNamespace(layers=[full, window])) is False
    # TransformerLens' cache under its former name, without a frozen attribute
    old = type("HookedTransformerKeyValueCache", (), {})()
    assert cacherows.can_join(old) is True
    old.frozen = True
    assert cacherows.can_join(old) is False
