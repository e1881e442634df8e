"""The hook contract on a TransformerLens 3.x ``HookedTransformer``: the TransformerLens-style hook of
``tests/core/test_hook_contract.py`` (``hook.name``, ``hook.layer()``, ``hook.ctx``, ``hook.step``) runs
unchanged in a prompt forward and in KV-cached generation, and gives what the plain ``transformers``
twin gives with the same edit."""

import pytest
import torch
from oracles import EDITED_LAYERS, assert_greedy_with_the_edit, edited_twin_logits, tl_style_pairs

import lensprobe as lp

pytestmark = pytest.mark.hooked


def test_the_hook_sees_a_hook_point_and_its_step_in_a_prompt_forward(hooked, hooked_hf, hooked_prompts):
    log: list = []
    tokens = hooked_prompts[0].tokens
    logits = lp.forward(hooked, tokens, *tl_style_pairs(log))
    n = tokens.shape[-1]
    assert [entry[:5] for entry in log] == [
        (f"blocks.{layer}.mlp.hook_post", layer, 0, True, [list(range(n))]) for layer in EDITED_LAYERS]
    expected = edited_twin_logits(hooked_hf, tokens.cpu())
    torch.testing.assert_close(logits.float().cpu(), expected.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch_size", [None, 2])
def test_the_same_hook_in_cached_generation_equals_the_twin(hooked, hooked_hf, hooked_prompts, batch_size):
    log: list = []
    prompts = list(hooked_prompts[:2])
    out = lp.generate(hooked, prompts, max_new_tokens=4, interventions=tl_style_pairs(log),
                      batch_size=batch_size, stop_at_eos=False)
    assert out.meta["engine"] == "hooked"
    assert {(name, layer) for name, layer, *_ in log} == {
        (f"blocks.{layer}.mlp.hook_post", layer) for layer in EDITED_LAYERS}
    assert sorted({step for _, _, step, *_ in log}) == [0, 1, 2, 3]
    assert_greedy_with_the_edit(hooked_hf, prompts, out.token_ids_rows.tolist())


@pytest.mark.parametrize("spec", ["blocks.1.mlp.hook_post", lambda name: name.endswith("attn.hook_z")])
def test_a_hook_sees_what_model_hooks_gives_it(hooked, hooked_prompts, spec):
    """The same function through ``model.hooks()`` and ``lp.intervene``: the same ``hook.name`` at the same hook
    points (a name or a name filter), and ``hook.hook_point`` is the ``HookPoint`` that fired."""
    runs = {}
    for attach in ("tl", "lp"):
        seen: list = []

        def note(act, hook, seen=seen, attach=attach):
            seen.append((hook.name, hook if attach == "tl" else hook.hook_point))

        context = hooked.hooks(fwd_hooks=[(spec, note)]) if attach == "tl" else lp.intervene(hooked, (spec, note))
        with torch.inference_mode(), context:
            hooked(hooked_prompts[0].tokens)
        runs[attach] = seen
    assert runs["lp"] == runs["tl"] and runs["tl"]
    assert all(point is hooked.hook_dict[name] for name, point in runs["lp"])
