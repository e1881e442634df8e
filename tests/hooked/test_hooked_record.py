"""``record=`` on a TransformerLens 3.x ``HookedTransformer``: every layer's residual stream and a head's
``z`` per step, through its own hook points and KV cache, against the plain ``transformers`` twin on the
final sequence (position ``prompt length - 1 + step``), left-padded and under continuous batching."""

import pytest
import torch
from hooked_oracles import o_proj_inputs
from oracles import layer_io

import lensprobe as lp

pytestmark = pytest.mark.hooked

TOL = 1e-5


@pytest.mark.parametrize("batch_size", [None, 1])
def test_recorded_values_per_step_equal_the_plain_model(hooked, hooked_hf, hooked_prompts, batch_size):
    a, b, _ = hooked_prompts
    out = lp.generate(hooked, [a, b], max_new_tokens=5, stop_at_eos=False, batch_size=batch_size,
                      record=["blocks.*.hook_resid_post", "blocks.1.attn.hook_z"])
    assert out.meta["engine"] == "hooked"
    for r, p in enumerate((a, b)):
        ids = p.tokens[0].tolist()
        seq = ids + out.generated_ids[r]
        _, outs = layer_io(hooked_hf, seq)
        z = o_proj_inputs(hooked_hf, torch.tensor([seq]), 1)[0]
        at = len(ids) - 1 + torch.arange(5)
        for layer in range(len(outs)):
            got = out.activations_rows[f"blocks.{layer}.hook_resid_post"][r]
            assert torch.allclose(got, outs[layer][at], atol=TOL), (r, layer)
            assert not torch.allclose(got[:-1], outs[layer][at[:-1] + 1], atol=1e-3)  # the step alignment
        assert torch.allclose(out.activations_rows["blocks.1.attn.hook_z"][r], z[at], atol=TOL), r
