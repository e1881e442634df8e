"""Attribution patching on a HookedTransformer: AtP against autograd on the plain transformers twin, AtP*
against the same weights in a TransformerBridge, and no hooks left behind."""

import pytest
import torch
from oracles import hf_head_gradients, hook_snapshot

import lensprobe as lp
from lensprobe.core.models.testing import tiny_model

pytestmark = pytest.mark.hooked


def test_atp_equals_autograd_on_the_plain_twin(hooked, hooked_hf, hooked_prompts):
    p = hooked_prompts[0]
    att = lp.attribute_heads(hooked, p, "entropy")

    def entropy(logits):
        logp = torch.log_softmax(logits[-1].double(), -1)
        return -(logp.exp() * logp).sum()

    zs, grads, _ = hf_head_gradients(hooked_hf, p.tokens, entropy)
    n, d = hooked.cfg.n_heads, hooked.cfg.d_head
    want = torch.stack([(-zs[layer][0] * grads[layer][0]).reshape(-1, n, d).sum((0, 2))
                        for layer in range(hooked.cfg.n_layers)]).double()
    assert torch.linalg.norm(att.grid().double() - want) <= 1e-4 * torch.linalg.norm(want)


def test_atp_star_equals_the_bridge_with_the_same_weights(hooked, hooked_prompts):
    before = hook_snapshot(hooked)
    p = hooked_prompts[1]
    bridge = tiny_model(seed=0)
    for kind in ("head", "kv"):
        got = lp.attribute_heads(hooked, p.tokens, "entropy", method="atp*", unit=kind, batch_size=3)
        want = lp.attribute_heads(bridge, p.tokens, "entropy", method="atp*", unit=kind)
        torch.testing.assert_close(got.estimates, want.estimates, rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(got.scores, want.scores, rtol=1e-4, atol=1e-7)
    assert hook_snapshot(hooked) == before
    assert all(p.grad is None for p in hooked.parameters())
