"""Shared by the tests: latent thinking inputs computed by hand, a hook that counts its calls, a
snapshot of a model's hooks, and the solo-run oracle of continuous batching."""

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
