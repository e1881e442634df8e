"""``lens=`` on a TransformerLens 3.x ``HookedTransformer``: every layer's logit lens per step, through its own
hook points, ``ln_final`` and ``unembed`` (computed without firing their hook points), against the plain
``transformers`` twin on the final sequence, left-padded, under continuous batching, and with the final norm's
weights folded into the unembedding."""

import copy

import pytest
import torch
from lens_oracles import assert_lens_matches, twin_lens

import lensprobe as lp

pytestmark = pytest.mark.hooked


@pytest.mark.parametrize("batch_size", [None, 1])
def test_the_lens_per_step_equals_the_plain_model(hooked, hooked_hf, hooked_prompts, batch_size):
    a, b, _ = hooked_prompts
    out = lp.generate(hooked, [a, b], max_new_tokens=5, stop_at_eos=False, batch_size=batch_size, lens="logit")
    assert out.meta["engine"] == "hooked"
    for r, p in enumerate((a, b)):
        ids = p.tokens[0].tolist()
        lens, logits = twin_lens(hooked_hf, hooked_hf.model.norm, hooked_hf.lm_head, ids + out.generated_ids[r])
        assert_lens_matches(out, r, lens, logits, len(ids), tol=2e-5)
    assert torch.allclose(out.lens.entropy_rows[..., -1][out.recorded_rows], out.entropy_rows[out.recorded_rows],
                          atol=1e-5)


def test_folded_final_norm_weights_give_the_same_lens(hooked, hooked_hf, hooked_prompts):
    folded = copy.deepcopy(hooked)
    folded.process_weights_(fold_ln=True, center_writing_weights=False, center_unembed=False)
    assert str(folded.cfg.normalization_type).endswith("Pre")  # ln_final has no weight: it is in W_U now
    a, _, _ = hooked_prompts
    out = lp.generate(folded, a, max_new_tokens=4, stop_at_eos=False, lens="logit")
    ids = a.tokens[0].tolist()
    lens, logits = twin_lens(hooked_hf, hooked_hf.model.norm, hooked_hf.lm_head, ids + out.generated_ids[0])
    assert_lens_matches(out, 0, lens, logits, len(ids), tol=2e-5)


def test_the_lens_fires_no_hook_point_of_the_final_norm(hooked, hooked_prompts):
    a, _, _ = hooked_prompts
    out = lp.generate(hooked, a, max_new_tokens=3, stop_at_eos=False, lens="logit",
                      record=["ln_final.hook_normalized", "unembed.hook_out"])
    assert out.activations["ln_final.hook_normalized"].shape == (3, hooked.cfg.d_model)
    assert torch.isfinite(out.lens.entropy).all()
