"""Shared by the tests: latent thinking inputs computed by hand, a hook that counts its calls, a
snapshot of a model's hooks, the solo-run oracle of continuous batching, and a TransformerLens-style
hook with its plain ``transformers`` twin."""

import functools

import torch

import lensprobe as lp


def latent_by_hand(h, logits, E, *, alpha, top_p, exclude, temperature=1.0):
    """alpha * h + (1 - alpha) * sum_w p~(w) E(w), p~ = top-p of the softmax with ``exclude`` masked,
    written as a loop over the sorted probabilities; also the number of tokens kept."""
    scaled = logits.double() / temperature
    p = torch.softmax(scaled.masked_fill(torch.arange(logits.shape[-1]) == exclude, float("-inf")), -1)
    kept, mass = [], 0.0
    for prob, i in sorted(((float(p[i]), i) for i in range(p.shape[0])), reverse=True):
        if mass >= top_p:
            break
        kept.append((prob, i))
        mass += prob
    norm = sum(prob for prob, _ in kept)
    soft = sum((prob / norm) * E[i].double() for prob, i in kept)
    return (alpha * h.double() + (1 - alpha) * soft).float(), len(kept)


class Counter:
    """A hook ``fn(activation, hook)`` that counts its calls and leaves the activation alone."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x, hook):
        self.calls += 1
        return None


def hook_snapshot(model) -> dict[str, tuple[int, int, int, int]]:
    """Per module: how many forward and forward-pre hooks torch holds, and a HookPoint's own lists of
    hook handles (every hook of any kind; TransformerLens wires a few of its own into each block at
    the first forward, and keeps them)."""
    out = {}
    for name, m in model.named_modules():
        counts = (len(m._forward_hooks), len(m._forward_pre_hooks),
                  len(getattr(m, "fwd_hooks", ())), len(getattr(m, "bwd_hooks", ())))
        if any(counts):
            out[name] = counts
    return out


def solo(model, prompt, cap, *, engine_ran=None, **kw):
    """The oracle of continuous batching: one prompt alone (one static batch of its samples), ``cap``
    new tokens, no EOS stop unless given; ``engine_ran``: the engine that must have run."""
    kw.setdefault("stop_at_eos", False)
    out = lp.generate(model, prompt, max_new_tokens=cap, **kw)
    assert out.meta["batching"] == "static batches"
    assert engine_ran is None or out.meta["engine"] == engine_ran
    return out


def assert_same_row(got, r, want, j, tol=1e-5):
    """Row ``r`` of ``got`` equals row ``j`` of ``want``: tokens, text, finish, thinking steps, entropies,
    chosen probabilities, and nothing recorded past its length."""
    n = got.lengths[r]
    assert got.generated_ids[r] == want.generated_ids[j], r
    assert got.texts[r] == want.texts[j] and got.finish_reasons[r] == want.finish_reasons[j], r
    assert got.thinking_rows[r, :n].tolist() == want.thinking_rows[j, :n].tolist(), r
    assert torch.allclose(got.entropy_rows[r, :n], want.entropy_rows[j, :n], atol=tol), r
    assert torch.allclose(got.chosen_prob_rows[r, :n], want.chosen_prob_rows[j, :n], atol=tol), r
    assert torch.isnan(got.entropy_rows[r, n:]).all() and (got.token_ids_rows[r, n:] == -1).all(), r


def assert_rows_equal_solo(out, model, prompts, caps, **kw):
    """Every row of ``out`` equals its prompt run alone with the same settings and its own cap."""
    alone = {}
    for r in range(out.n_rows):
        pi, j = out.prompt_index[r], out.sample_index[r]
        if pi not in alone:
            alone[pi] = solo(model, prompts[pi], caps[pi], **kw)
        assert_same_row(out, r, alone[pi], j)


def hf_head_gradients(hf, tokens, metric, reference=None, logits_to_keep: int = 0):
    """By hand on plain transformers: each layer's o_proj input ``z`` (heads concatenated), the
    metric's gradient there (torch.autograd), and ``z`` on a reference prompt. ``logits_to_keep``
    (``> 0``): the metric sees the logits of the last positions only, computed by transformers."""
    n_layers = hf.config.num_hidden_layers
    leaves, runs = {}, [{}]

    def tap(layer):
        def pre(module, args):
            leaf = torch.zeros_like(args[0], requires_grad=True)
            leaves[layer], runs[-1][layer] = leaf, args[0].detach()
            return (args[0] + leaf,)
        return pre

    handles = [hf.model.layers[i].self_attn.o_proj.register_forward_pre_hook(tap(i)) for i in range(n_layers)]
    try:
        with torch.enable_grad():
            value = metric(hf(tokens, logits_to_keep=logits_to_keep).logits[0])
            grads = torch.autograd.grad(value, [leaves[i] for i in range(n_layers)])
        if reference is not None:
            runs.append({})
            with torch.no_grad():
                hf(reference)
    finally:
        for h in handles:
            h.remove()
    return runs[0], grads, runs[1] if reference is not None else None


# ----- one hook contract on every engine ------------------------------------------------------------
EDITED_LAYERS = (0, 1)


def edit_factor(layer: int, position: torch.Tensor) -> torch.Tensor:
    """The edit: ``hook_post`` scaled by a factor that depends on the layer and the absolute position."""
    return 1.0 + 0.3 * (layer + 1) * torch.cos(0.7 * position.float())


def tl_style(log: list):
    """A hook written for TransformerLens: everything it needs comes from ``hook``."""
    def fn(act, hook):
        ctx = hook.step
        hook.ctx["calls"] = hook.ctx.get("calls", 0) + 1
        log.append((hook.name, hook.layer(), ctx.step, ctx.prefill, ctx.positions.tolist(), hook.ctx["calls"]))
        scale = edit_factor(hook.layer(), ctx.positions.to(act.device))  # [rows, pos]
        return act * scale[..., None].to(act.dtype)
    return fn


def tl_style_pairs(log: list) -> list:
    fn = tl_style(log)
    return [(f"blocks.{layer}.mlp.hook_post", fn) for layer in EDITED_LAYERS]


def edited_twin_logits(twin, tokens: torch.Tensor) -> torch.Tensor:
    """Uncached logits of the plain ``transformers`` twin with the edit applied at each layer's ``down_proj``."""
    handles = []
    positions = torch.arange(tokens.shape[-1])[None]
    for layer in EDITED_LAYERS:
        def pre(_m, args, layer=layer):
            return (args[0] * edit_factor(layer, positions)[..., None].to(args[0].dtype),)
        handles.append(twin.model.layers[layer].mlp.down_proj.register_forward_pre_hook(pre))
    try:
        with torch.no_grad():
            return twin(tokens).logits
    finally:
        for h in handles:
            h.remove()


def assert_greedy_with_the_edit(twin, prompts, token_rows: list[list[int]]) -> None:
    """Each generated token is the twin's uncached argmax with the edit at every position so far."""
    for prompt, generated in zip(prompts, token_rows, strict=True):
        tokens = prompt.tokens.cpu()
        for token in generated:
            assert int(edited_twin_logits(twin, tokens)[0, -1].argmax()) == token
            tokens = torch.cat([tokens, torch.tensor([[token]])], dim=-1)


def layer_io(twin, ids: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each decoder layer's input and output hidden states ``[pos, d_model]`` of ``ids``, one uncached
    forward of the plain model."""
    ins, outs, handles = [], [], []
    for layer in twin.model.layers:
        handles.append(layer.register_forward_pre_hook(
            lambda _m, args, kwargs: ins.append((args[0] if args else kwargs["hidden_states"])[0].detach().clone()),
            with_kwargs=True))
        handles.append(layer.register_forward_hook(
            lambda _m, _a, out: outs.append((out[0] if isinstance(out, tuple) else out)[0].detach().clone())))
    try:
        with torch.no_grad():
            twin(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return ins, outs


@functools.cache
def authors_tokenizer(name_or_path: str):
    """A model's tokenizer as the meaningless-tokens authors and lm-eval's ``hf`` model load it:
    ``AutoTokenizer.from_pretrained(name)`` with no argument (not TransformerLens's ``add_bos_token=True``)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name_or_path)
