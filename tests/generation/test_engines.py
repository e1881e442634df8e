"""The plain Hugging Face view generation runs on: shared tensors, same numbers as the bridge, when it is used."""

import contextlib

import pytest
import torch

import lensprobe as lp
from lensprobe.core.models.testing import tiny_model
from lensprobe.generation.engines import attention as kernel
from lensprobe.generation.engines import threads
from lensprobe.generation.engines import view as plain
from lensprobe.generation.engines.view import has_user_hooks, plain_model


@pytest.fixture(scope="module")
def prompts(tiny):
    a = lp.build_prompt(tiny, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT)
    b = lp.build_prompt(tiny, "the cat sat on the mat", system="You answer.")
    return a, b


def _hooks_on(module: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())


def _assert_same(a, b):
    assert a.token_ids_rows.tolist() == b.token_ids_rows.tolist()
    assert a.thinking_rows.tolist() == b.thinking_rows.tolist()
    assert torch.allclose(a.entropy_rows, b.entropy_rows, atol=1e-6, equal_nan=True)
    assert torch.allclose(a.chosen_prob_rows, b.chosen_prob_rows, atol=1e-6, equal_nan=True)
    assert a.attention_rows.keys() == b.attention_rows.keys()
    for name in a.attention_rows:
        assert torch.allclose(a.attention_rows[name], b.attention_rows[name], atol=1e-6, equal_nan=True), name


def test_view_shares_the_bridges_tensors(tiny, tiny_hf):
    view = plain_model(tiny)
    assert view is not None and plain_model(tiny) is view  # built once
    hf = tiny.original_model
    bridge_ptrs = {t.data_ptr() for t in [*hf.parameters(), *hf.buffers()]}
    view_tensors = [*view.parameters(), *view.buffers()]
    assert view_tensors and all(t.data_ptr() in bridge_ptrs for t in view_tensors)  # no copies
    assert not any(t.is_meta for t in view_tensors)
    assert type(view) is type(hf) and view.config._attn_implementation == "eager"
    assert all(type(m).__module__.startswith(("transformers", "torch")) for m in view.modules())
    tokens = torch.tensor([[3, 17, 40, 8, 99]])
    with torch.inference_mode():
        logits = view(input_ids=tokens).logits
        assert torch.equal(logits, tiny(tokens, return_type="logits"))
        assert torch.allclose(logits, tiny_hf(tokens).logits, atol=1e-6)  # and a separately built model's


def test_view_is_rebuilt_after_the_vocabulary_grows():
    model = tiny_model(seed=0)
    before = plain_model(model)
    tid = lp.generation.add_thinking_token(model, "<thinking>")
    after = plain_model(model)
    assert after is not None and after is not before
    assert after.get_input_embeddings().weight.shape[0] == tid + 1


def test_a_view_whose_logits_differ_is_refused(monkeypatch, prompts):
    model = tiny_model(seed=0)
    other = tiny_model(seed=1).original_model  # another model's weights: different logits
    build = plain._build
    monkeypatch.setattr(plain, "_build", lambda hf, attention="eager": build(other, attention))
    assert plain_model(model) is None
    out = lp.generate(model, prompts[0], max_new_tokens=3)
    assert out.meta["engine"] == "bridge"
    with pytest.raises(lp.LensprobeError, match="engine='hf' cannot run here: .*same logits"):
        lp.generate(model, prompts[0], max_new_tokens=3, engine="hf")


def test_model_without_a_hugging_face_model_has_no_view():
    class NotABridge(torch.nn.Module):
        pass

    assert plain_model(NotABridge()) is None


@pytest.mark.parametrize("case", ["batch", "sampling", "fusion", "pause", "entropy"])
def test_engines_give_the_same_trace(tiny, prompts, case):
    model = tiny
    kw = dict(max_new_tokens=14, stop_at_eos=False,
              track={"system": "system", "gen": "generated", "odd": lambda pos, t: pos % 2 == 1})
    if case == "sampling":
        kw.update(do_sample=True, seed=3, temperature=0.8, top_p=0.9, n_samples=2)
    if case in ("fusion", "pause", "entropy"):
        model = tiny_model(seed=0)
        lp.generation.add_thinking_token(model, "<thinking>")
        kw["thinking"] = lp.generation.LatentFusion(alpha=0.6, top_p=0.9) if case != "pause" else lp.generation.Pause()
        kw["think_when"] = (lp.generation.schedule.every(3) if case != "entropy"
                            else lp.generation.schedule.entropy_above(0.0))  # thinks at every step
    a = lp.trace_generation(model, list(prompts), engine="bridge", **kw)
    b = lp.trace_generation(model, list(prompts), engine="hf", **kw)
    assert a.meta["engine"] == "bridge" and b.meta["engine"] == "hf"
    _assert_same(a, b)
    if "thinking" in kw:
        assert b.thinking_rows.any()


def test_auto_uses_the_view_only_when_no_hook_point_is_needed(tiny, prompts):
    p = prompts[0]
    assert lp.generate(tiny, p, max_new_tokens=3).meta["engine"] == "hf"
    calls = []
    hook = ("blocks.0.hook_resid_pre", lambda x, hook: calls.append(x.shape[1]))
    out = lp.generate(tiny, p, max_new_tokens=3, stop_at_eos=False, interventions=[hook])
    assert out.meta["engine"] == "bridge" and calls == [len(p), 1, 1]
    # a hook the user attached to the model must fire: auto leaves the plain view alone
    calls.clear()
    with tiny.hooks(fwd_hooks=[hook]):
        assert has_user_hooks(tiny)
        out = lp.generate(tiny, p, max_new_tokens=3, stop_at_eos=False)
    assert out.meta["engine"] == "bridge" and calls == [len(p), 1, 1]
    # a torch hook of the user's on a wrapped module counts too
    handle = tiny.original_model.get_output_embeddings().register_forward_hook(lambda m, a, o: None)
    try:
        assert lp.generate(tiny, p, max_new_tokens=2).meta["engine"] == "bridge"
    finally:
        handle.remove()
    assert not has_user_hooks(tiny)
    assert lp.generate(tiny, p, max_new_tokens=2).meta["engine"] == "hf"


@pytest.mark.unchecked
def test_engine_errors(tiny, prompts):
    p = prompts[0]
    with pytest.raises(lp.LensprobeError, match="engine must be 'auto', 'bridge' or 'hf'"):
        lp.generate(tiny, p, max_new_tokens=2, engine="fast")
    with pytest.raises(lp.LensprobeError, match="engine='hf' cannot run here: interventions"):
        lp.generate(tiny, p, max_new_tokens=2, engine="hf",
                    interventions=[("blocks.0.hook_resid_pre", lambda x, hook: None)])


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_exception_on_the_view_leaves_no_hook(tiny, prompts, exc):
    p = prompts[0]
    track = {"s": "system"}
    ref = lp.trace_generation(tiny, p, max_new_tokens=6, track=track, stop_at_eos=False)
    assert ref.meta["engine"] == "hf"

    def explode(pos, token):  # a tracked set's callable, called for each new position
        if pos == len(p) + 3:
            raise exc("boom in a tracked set")
        return False

    with pytest.raises(exc, match="boom in a tracked set"):
        lp.trace_generation(tiny, p, max_new_tokens=6, track={**track, "x": explode}, stop_at_eos=False)
    assert _hooks_on(plain_model(tiny, "sdpa_last")) == 0 and _hooks_on(plain_model(tiny)) == 0
    assert not has_user_hooks(tiny)
    again = lp.trace_generation(tiny, p, max_new_tokens=6, track=track, stop_at_eos=False)
    _assert_same(ref, again)


def test_library_hooks_are_not_user_hooks(prompts):
    """transformers installs output-capturing hooks on first output_attentions; they do not count."""
    model = tiny_model(seed=0)
    with torch.inference_mode():
        model.original_model(prompts[0].tokens, output_attentions=True, output_hidden_states=True)
    assert _hooks_on(model.original_model) > 0  # transformers' own hooks are now installed
    assert not has_user_hooks(model)
    assert lp.generate(model, prompts[0], max_new_tokens=2).meta["engine"] == "hf"


@pytest.mark.parametrize("thinking", [None, "fusion"])
def test_generation_without_recording_uses_sdpa_with_the_same_results(tiny, prompts, thinking):
    """No attention recorded: the view uses fused (sdpa) attention; tokens and entropies equal the bridge's."""
    model, kw = tiny, dict(max_new_tokens=14, stop_at_eos=False, n_samples=2, do_sample=True, seed=5)
    if thinking:
        model = tiny_model(seed=0)
        lp.generation.add_thinking_token(model, "<thinking>")
        kw.update(thinking=lp.generation.LatentFusion(alpha=0.5), think_when=lp.generation.schedule.every(4))
    a = lp.generate(model, list(prompts), engine="bridge", **kw)
    b = lp.generate(model, list(prompts), **kw)
    assert (b.meta["engine"], b.meta["attention"]) == ("hf", "sdpa")
    assert plain_model(model, "sdpa").config._attn_implementation == "sdpa"
    assert a.token_ids_rows.tolist() == b.token_ids_rows.tolist()
    assert torch.allclose(a.entropy_rows, b.entropy_rows, atol=1e-5, equal_nan=True)
    # recording attention: sdpa plus the newest query's row, equal to the bridge's eager weights
    c = lp.trace_generation(model, list(prompts), **kw)
    assert (c.meta["engine"], c.meta["attention"]) == ("hf", "sdpa_last")
    _assert_same(lp.trace_generation(model, list(prompts), engine="bridge", **kw), c)


@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
def test_last_query_weights_by_hand(mask_kind):
    """The newest query's GQA attention row equals a per-head softmax written out by hand."""
    g = torch.Generator().manual_seed(0)
    b, h, kv, q_len, k_len, d = 2, 6, 2, 3, 7, 4
    query, key = torch.randn(b, h, q_len, d, generator=g), torch.randn(b, kv, k_len, d, generator=g)
    allowed = torch.ones(b, 1, q_len, k_len, dtype=torch.bool)
    allowed[1, :, :, :2] = False  # row 1 is left-padded by two
    mask = {"none": None, "bool": allowed,
            "additive": torch.where(allowed, 0.0, torch.finfo(torch.float32).min)}[mask_kind]
    got = kernel.last_query_weights(query, key, mask, scaling=0.3)
    assert got.shape == (b, h, 1, k_len)
    for r in range(b):
        for head in range(h):
            kv_head = head // (h // kv)
            scores = [0.3 * float(query[r, head, -1] @ key[r, kv_head, j]) for j in range(k_len)]
            keep = [mask is None or bool(allowed[r, 0, -1, j]) for j in range(k_len)]
            top = max(s for s, k in zip(scores, keep, strict=True) if k)
            e = [torch.tensor(s - top).exp().item() if k else 0.0 for s, k in zip(scores, keep, strict=True)]
            want = torch.tensor([x / sum(e) for x in e])
            assert torch.allclose(got[r, head, 0], want, atol=1e-6), (r, head)


@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive", "per-head"])
def test_last_query_attention_by_hand(mask_kind):
    """One query: output = sum_j w_j v_j per head, written out by hand; weights as last_query_weights."""
    g = torch.Generator().manual_seed(1)
    b, h, kv, k_len, d = 2, 6, 3, 5, 4
    query = torch.randn(b, h, 1, d, generator=g)
    key, value = torch.randn(b, kv, k_len, d, generator=g), torch.randn(b, kv, k_len, d, generator=g)
    allowed = torch.ones(b, 1, 1, k_len, dtype=torch.bool)
    allowed[0, :, :, :1] = False
    bias = torch.randn(b, h, 1, k_len, generator=g)  # a different additive bias per head
    mask = {"none": None, "bool": allowed, "additive": torch.where(allowed, 0.0, torch.finfo(torch.float32).min),
            "per-head": bias}[mask_kind]
    out, weights = kernel.last_query_attention(query, key, value, mask, scaling=0.5)
    assert out.shape == (b, 1, h, d) and weights.shape == (b, h, 1, k_len)
    assert torch.allclose(weights, kernel.last_query_weights(query, key, mask, scaling=0.5), atol=1e-7)
    for r in range(b):
        for head in range(h):
            kvh = head // (h // kv)
            scores = torch.tensor([0.5 * float(query[r, head, 0] @ key[r, kvh, j]) for j in range(k_len)])
            if mask_kind == "per-head":
                scores = scores + bias[r, head, 0]
            elif mask_kind != "none":
                scores = scores.masked_fill(~allowed[r, 0, 0], float("-inf"))
            w = torch.softmax(scores, dim=0)
            assert torch.allclose(weights[r, head, 0], w, atol=1e-6), (r, head)
            want = sum(w[j] * value[r, kvh, j] for j in range(k_len))
            assert torch.allclose(out[r, 0, head], want, atol=1e-6), (r, head)


@contextlib.contextmanager
def _layer1_weights(model, views):
    """{view name: the attention weights layer 1 of that view returned last}; hooks removed on exit."""
    weights = {}
    handles = [plain.attention_modules(model, v)[1].register_forward_hook(
        lambda m, a, out, name=name: weights.__setitem__(name, out[1])) for name, v in views.items()]
    try:
        yield weights
    finally:
        for h in handles:
            h.remove()


def test_sdpa_last_decode_step_uses_its_own_weights_and_matches_eager(tiny, monkeypatch):
    """A cached one-query step on the sdpa_last view: eager's row and logits, via last_query_attention."""
    views = {a: plain_model(tiny, a) for a in ("eager", "sdpa_last")}
    calls = []
    real = kernel.last_query_attention
    monkeypatch.setattr(kernel, "last_query_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    tokens = torch.tensor([[5, 9, 14, 3, 22], [0, 0, 7, 31, 4]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    logits = {}
    with _layer1_weights(tiny, views) as weights, torch.inference_mode():
        for name, view in views.items():
            first = view(input_ids=tokens, attention_mask=mask, use_cache=True)
            calls.clear()
            logits[name] = view(input_ids=torch.tensor([[8], [12]]), past_key_values=first.past_key_values,
                                attention_mask=torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], 1),
                                position_ids=torch.tensor([[5], [3]]), use_cache=True).logits
    assert len(calls) == tiny.cfg.n_layers  # the decode step took the one-query path at every layer
    assert weights["sdpa_last"].shape == weights["eager"].shape == (2, tiny.cfg.n_heads, 1, 6)
    assert torch.allclose(weights["sdpa_last"], weights["eager"], atol=1e-6)
    assert float(weights["sdpa_last"][1, :, 0, :2].abs().max()) == 0.0
    assert torch.allclose(logits["sdpa_last"], logits["eager"], atol=1e-5)


def test_a_view_whose_decode_rows_differ_is_refused(monkeypatch):
    model = tiny_model(seed=0)
    good = kernel.last_query_attention

    def wrong(*a, **k):
        out, w = good(*a, **k)
        return out, torch.softmax(2 * w.log(), dim=-1)

    monkeypatch.setattr(kernel, "last_query_attention", wrong)
    assert plain_model(model, "sdpa_last") is None


def test_sdpa_last_view_returns_eager_last_rows_and_sdpa_output(tiny):
    """The sdpa_last view: output as sdpa, weights = the last row of eager attention's, padded batch."""
    views = {a: plain_model(tiny, a) for a in ("eager", "sdpa", "sdpa_last")}
    assert all(v is not None for v in views.values())
    assert views["sdpa_last"].config._attn_implementation == kernel.ATTENTIONS["sdpa_last"]
    tokens = torch.tensor([[5, 9, 14, 3, 22], [0, 0, 7, 31, 4]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    outs = {}
    with _layer1_weights(tiny, views) as weights, torch.inference_mode():
        for name, view in views.items():
            outs[name] = view(input_ids=tokens, attention_mask=mask).logits
    assert weights["sdpa"] is None and weights["eager"].shape[2] == 5
    assert weights["sdpa_last"].shape == (2, tiny.cfg.n_heads, 1, 5)
    assert torch.allclose(weights["sdpa_last"], weights["eager"][:, :, -1:], atol=1e-6)
    assert float(weights["sdpa_last"][1, :, 0, :2].abs().max()) == 0.0  # padding gets no attention
    assert torch.allclose(outs["sdpa_last"], outs["sdpa"], atol=1e-6)


def test_a_view_whose_rows_differ_falls_back_to_eager(monkeypatch, prompts):
    """sdpa_last rows that do not match eager attention: the view is refused, recording uses eager."""
    model = tiny_model(seed=0)
    good = kernel.last_query_weights
    monkeypatch.setattr(kernel, "last_query_weights",
                        lambda *a, **k: torch.softmax(2 * good(*a, **k).log(), dim=-1))
    assert plain_model(model, "sdpa_last") is None
    kw = dict(max_new_tokens=5, stop_at_eos=False, track={"system": "system"})
    out = lp.trace_generation(model, list(prompts), **kw)
    assert (out.meta["engine"], out.meta["attention"]) == ("hf", "eager")
    _assert_same(lp.trace_generation(model, list(prompts), engine="bridge", **kw), out)


def test_unknown_view_attention_is_an_error(tiny):
    with pytest.raises(lp.LensprobeError, match="attention must be one of"):
        plain_model(tiny, "flash")


def test_one_thread_restores_the_thread_count_also_on_errors():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with threads.one_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError, match="boom"), threads.one_thread():
            raise ValueError("boom")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_decode_threads_rule(tiny, monkeypatch, two_threads):
    view = plain_model(tiny, "sdpa")
    largest = max(m.weight.numel() * m.weight.element_size() for m in view.base_model.modules()
                  if isinstance(m, torch.nn.Linear))
    assert threads.decode_threads(view, 1) == 1  # the tiny model's matrices are far below the limit
    assert threads.decode_threads(view, threads.ONE_THREAD_MAX_ROWS) == 1
    assert threads.decode_threads(view, threads.ONE_THREAD_MAX_ROWS + 1) == 2  # many rows: torch's count
    monkeypatch.setattr(threads, "ONE_THREAD_LAYER_BYTES", largest - 1)  # one matrix too large
    assert threads.decode_threads(view, 1) == 2
    monkeypatch.setattr(threads, "ONE_THREAD_LAYER_BYTES", largest)
    assert threads.decode_threads(view, 1) == 1


def test_the_embedded_model_decodes_its_layers_on_one_thread(smol, two_threads):
    view = plain_model(smol, "sdpa")
    assert threads.decode_threads(view, 1) == 1  # largest layer weight 576 x 1536 floats, 3.4 MiB
    assert threads.decode_threads(view, threads.ONE_THREAD_MAX_ROWS + 1) == 2


def test_layer_threads_cover_only_the_decoder_layers_of_decode_steps(tiny, two_threads):
    view = plain_model(tiny, "sdpa")
    seen = []
    probes = [view.base_model.layers[0].register_forward_hook(lambda *_: seen.append(("layer", torch.get_num_threads()))),
              view.lm_head.register_forward_hook(lambda *_: seen.append(("unembed", torch.get_num_threads())))]
    try:
        with torch.inference_mode(), threads.layer_threads(view, 1):
            out = view(input_ids=torch.tensor([[3, 17, 40]]), use_cache=True)  # prefill: 3 positions
            assert seen == [("layer", 2), ("unembed", 2)]
            seen.clear()
            view(input_ids=torch.tensor([[8]]), past_key_values=out.past_key_values, use_cache=True)
            assert seen == [("layer", 1), ("unembed", 2)]
            assert torch.get_num_threads() == 2
    finally:
        for p in probes:
            p.remove()
    assert _hooks_on(view) == 0


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_layer_threads_restore_the_count_and_hooks_on_errors(tiny, exc, two_threads):
    view = plain_model(tiny, "sdpa")

    def boom(*_):
        assert torch.get_num_threads() == 1
        raise exc("inside a layer")

    handle = view.base_model.layers[-1].register_forward_hook(boom)
    try:
        with pytest.raises(exc, match="inside a layer"), torch.inference_mode(), threads.layer_threads(view, 1):
            view(input_ids=torch.tensor([[8]]))
    finally:
        handle.remove()
    assert torch.get_num_threads() == 2
    assert _hooks_on(view) == 0


@pytest.mark.parametrize("rows", [1, 3])
def test_one_thread_layers_give_the_same_trace(prompts, monkeypatch, two_threads, rows):
    model = tiny_model(seed=0)
    lp.generation.add_thinking_token(model, "<thinking>")
    kw = dict(max_new_tokens=12, track={"system": "system", "generated": "generated"}, stop_at_eos=False,
              thinking=lp.generation.LatentFusion(alpha=0.5), think_when=lp.generation.schedule.every(4), n_samples=rows,
              do_sample=rows > 1, seed=3, engine="hf")
    fast = lp.trace_generation(model, prompts[0], **kw)
    monkeypatch.setattr(threads, "ONE_THREAD_LAYER_BYTES", 0)  # torch's count throughout
    slow = lp.trace_generation(model, prompts[0], **kw)
    assert fast.meta["decode_threads"] == 1 and slow.meta["decode_threads"] == 2
    _assert_same(fast, slow)
    assert fast.thinking_rows.any()
    assert torch.get_num_threads() == 2
