"""A HookedTransformer with ``device_map``: ``"auto"`` spreads its blocks over the visible GPUs (``cfg.n_devices``;
without a GPU it stays where it is), every other placement is refused before anything moves. Checked against
the plain ``transformers`` twin; the ``cuda`` case spreads the blocks over every visible GPU."""

import pytest
import torch

import lensprobe as lp
from lensprobe.core.models.testing import tiny_hooked_model

pytestmark = pytest.mark.hooked


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(device_map={"": "cpu"}), r"a HookedTransformer spreads its blocks over GPUs only .* device_map='auto'"),
    (dict(device_map="balanced"), "a HookedTransformer spreads its blocks over GPUs only"),
    (dict(device_map="auto", max_memory={0: "10GiB"}), "max_memory cannot be given with a HookedTransformer"),
    (dict(device_map="auto", offload_folder="/tmp"), "offload_folder cannot be given with a HookedTransformer"),
    (dict(device_map="auto", device="cpu"), "device cannot be given with a HookedTransformer"),
    (dict(max_memory={0: "10GiB"}), "loaded already: pass its name or folder"),
])
def test_placements_a_hooked_transformer_cannot_take_are_refused(kwargs, message):
    model = tiny_hooked_model(seed=0)
    before = {n: p.device for n, p in model.named_parameters()}
    with pytest.raises(lp.LensprobeError, match=message):
        lp.load_model(model, **kwargs)
    assert {n: p.device for n, p in model.named_parameters()} == before


def test_auto_keeps_the_logits_and_greedy_tokens_of_the_plain_twin(hooked_hf, hooked_prompts):
    model = lp.load_model(tiny_hooked_model(seed=0), device_map="auto")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert int(model.cfg.n_devices) == max(1, min(count, model.cfg.n_layers))
    p = hooked_prompts[0]
    twin = hooked_hf.to(next(model.embed.parameters()).device)
    with torch.inference_mode():
        want = twin(p.tokens.to(twin.device)).logits.cpu()
    torch.testing.assert_close(lp.forward(model, p).cpu(), want, atol=1e-4, rtol=0)
    out = lp.generate(model, list(hooked_prompts[:2]), max_new_tokens=5, stop_at_eos=False, batch_size=1,
                      record="blocks.1.hook_resid_post")
    assert out.meta["engine"] == "hooked"
    for p, ids in zip(hooked_prompts[:2], out.generated_ids, strict=True):
        with torch.inference_mode():
            made = twin.generate(p.tokens.to(twin.device), max_new_tokens=5, min_new_tokens=5, do_sample=False,
                                 pad_token_id=twin.config.pad_token_id)
        assert made[0, p.tokens.shape[1]:].tolist() == ids
    assert torch.isfinite(out.activations_rows["blocks.1.hook_resid_post"]).all()


@pytest.mark.cuda
def test_auto_spreads_the_blocks_over_the_gpus(hooked_prompts):
    model = lp.load_model(tiny_hooked_model(seed=0), device_map="auto")
    count = torch.cuda.device_count()
    blocks = [next(b.parameters()).device for b in model.blocks]
    assert blocks[0] == torch.device("cuda:0") and blocks[-1] == torch.device(f"cuda:{min(count, 2) - 1}")
    assert next(model.unembed.parameters()).device == blocks[-1]
    whole = lp.load_model(tiny_hooked_model(seed=0), device="cuda:0")
    kw = dict(max_new_tokens=5, stop_at_eos=False, batch_size=1)
    got = lp.generate(model, list(hooked_prompts[:2]), **kw)
    assert got.generated_ids == lp.generate(whole, list(hooked_prompts[:2]), **kw).generated_ids
