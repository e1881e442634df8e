"""The logit lens computed by hand, for the lens tests (tests/generation/test_lens.py and the HookedTransformer's):
each layer's logits from plain ``transformers``' hidden states through the twin's own final norm and
``lm_head``, and what the lens keeps of them from the definitions, in float64."""

import torch

TOL = 1e-5


def hand_stats(logits: torch.Tensor, model_logits: torch.Tensor, chosen: int, k: int) -> dict[str, torch.Tensor]:
    """What the lens keeps of one layer's logits ``[vocab]``, computed in float64 from the definitions."""
    logp = torch.log_softmax(logits.double(), -1)
    p = logp.exp()
    model_logp = torch.log_softmax(model_logits.double(), -1)
    top = torch.sort(logits.double(), descending=True)
    return {"entropy": -(p * logp).sum(), "top_ids": top.indices[:k], "top_probs": p[top.indices[:k]],
            "chosen_rank": (logits > logits[chosen]).sum(), "chosen_prob": p[chosen],
            "kl": (model_logp.exp() * (model_logp - logp)).sum()}


def twin_lens(twin, norm, head, ids: list[int], cap: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``([layer, pos, vocab], [pos, vocab])``: every layer's lens logits and the model's logits, by hand on the
    twin: ``output_hidden_states`` (entry ``l + 1`` is layer ``l``'s output; the last entry is already through
    the final norm, so the last layer's lens is the model's own logits)."""
    with torch.no_grad():
        o = twin(torch.tensor([ids]), output_hidden_states=True)
        hs = o.hidden_states
        layers = [head(norm(h[0])) for h in hs[1:-1]] + [head(hs[-1][0])]
        lens = torch.stack(layers)
        if cap:
            lens = cap * torch.tanh(lens / cap)
    assert torch.allclose(lens[-1], o.logits[0], atol=1e-5)
    return lens, o.logits[0]


def assert_lens_matches(trace, r: int, lens: torch.Tensor, logits: torch.Tensor, prompt_len: int,
                        tol: float = TOL) -> None:
    """Row ``r``'s lens at every step it ran equals the hand computation at ``prompt_len - 1 + step``."""
    got = trace.lens
    n = int(trace.recorded_rows[r].sum())
    assert n >= 2 and got.recorded_rows[r].tolist() == trace.recorded_rows[r].tolist()
    for t in range(n):
        pos = prompt_len - 1 + t
        chosen = int(trace.token_ids_rows[r, t])
        for i, layer in enumerate(got.layers):
            want = hand_stats(lens[layer, pos], logits[pos], chosen, got.k)
            assert abs(float(got.entropy_rows[r, t, i]) - float(want["entropy"])) < tol, (r, t, layer)
            assert abs(float(got.kl_rows[r, t, i]) - float(want["kl"])) < tol, (r, t, layer)
            assert abs(float(got.chosen_prob_rows[r, t, i]) - float(want["chosen_prob"])) < tol, (r, t, layer)
            assert int(got.chosen_rank_rows[r, t, i]) == int(want["chosen_rank"]), (r, t, layer)
            assert torch.allclose(got.top_probs_rows[r, t, i].double(), want["top_probs"], atol=tol), (r, t, layer)
            assert got.top_ids_rows[r, t, i].tolist() == want["top_ids"].tolist(), (r, t, layer)
    # the step alignment: the position one later (the off-by-one nnsight once shipped) gives other values
    shifted = torch.tensor([[float(hand_stats(lens[layer, prompt_len + t], logits[prompt_len + t],
                                              int(trace.token_ids_rows[r, t]), got.k)["entropy"])
                             for layer in got.layers] for t in range(n - 1)])
    assert not torch.allclose(got.entropy_rows[r, : n - 1].double(), shifted.double(), atol=10 * tol)
    assert torch.isnan(got.entropy_rows[r, n:]).all() and (got.top_ids_rows[r, n:] == -1).all()
    assert (got.chosen_rank_rows[r, n:] == -1).all()
