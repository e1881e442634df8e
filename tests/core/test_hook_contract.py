"""One hook contract on every engine: a TransformerLens-style ``(name, fn)`` hook that reads
``hook.name``, ``hook.layer()``, ``hook.ctx`` and the step (``hook.step``) runs unchanged on the
bridge and the plain view (and, in ``tests/hooked``, a ``HookedTransformer``), in prompt forwards,
in manual KV loops and in KV-cached generation, and gives the same results everywhere.

The expected values come from a second, independent way: a plain ``transformers`` twin of the
model with a torch hook on ``down_proj``'s input that applies the same edit, run uncached.
"""

import pytest
import torch
from oracles import EDITED_LAYERS, assert_greedy_with_the_edit, edited_twin_logits, tl_style_pairs

import lensprobe as lp
from lensprobe.core.models.testing import tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=5)


@pytest.fixture(scope="module")
def prompts(model):
    return [lp.build_prompt(model, q) for q in ("What is 2+2?", "Name a prime number larger than ten.")]


def test_the_hook_sees_a_hook_point_and_its_step_in_a_prompt_forward(model, prompts, twin_of):
    log: list = []
    tokens = prompts[0].tokens
    logits = lp.forward(model, tokens, *tl_style_pairs(log))
    n = tokens.shape[-1]
    # the name TransformerLens gives the hook point attached as blocks.{layer}.mlp.hook_post
    assert [(name, layer, step, prefill, pos) for name, layer, step, prefill, pos, _ in log] == [
        (f"blocks.{layer}.mlp.out.hook_in", layer, 0, True, [list(range(n))]) for layer in EDITED_LAYERS]
    expected = edited_twin_logits(twin_of(model), tokens)
    torch.testing.assert_close(logits.float(), expected.float(), rtol=1e-4, atol=1e-4)


def test_a_manual_kv_loop_publishes_the_cached_positions(model, prompts, twin_of):
    log: list = []
    tokens = prompts[1].tokens
    n = tokens.shape[-1]
    with torch.inference_mode(), lp.intervene(model, *tl_style_pairs(log)):
        _, cache = model(tokens[:, : n - 2], return_type="logits_and_cache")
        middle, cache = model(tokens[:, n - 2: n - 1], past_key_values=cache, return_type="logits_and_cache")
        last, _ = model(tokens[:, n - 1:], past_key_values=cache, return_type="logits_and_cache")
    steps = [(step, prefill, pos) for name, _, step, prefill, pos, _ in log if name.startswith("blocks.0.")]
    assert steps == [(0, True, [list(range(n - 2))]), (1, False, [[n - 2]]), (2, False, [[n - 1]])]
    assert [calls for name, *_, calls in log if name.startswith("blocks.1.")] == [1, 2, 3]  # hook.ctx kept
    expected = edited_twin_logits(twin_of(model), tokens)
    torch.testing.assert_close(middle[:, -1].float(), expected[:, n - 2].float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(last[:, -1].float(), expected[:, n - 1].float(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch_size", [None, 2])
def test_the_same_hook_gives_the_same_generation_on_every_engine(model, prompts, twin_of, batch_size):
    """Greedy generation with the hook: identical tokens and logged steps on the plain view and the
    bridge; each step's tokens equal the twin's uncached argmax with the edit at every position."""
    runs = {}
    for engine in ("hf", "bridge"):
        log: list = []
        out = lp.generate(model, prompts, max_new_tokens=4, interventions=tl_style_pairs(log), engine=engine,
                          batch_size=batch_size, stop_at_eos=False)
        assert out.meta["engine"] == engine
        runs[engine] = (out.token_ids_rows.tolist(), sorted(entry[:5] for entry in log))
    assert runs["hf"] == runs["bridge"]
    assert_greedy_with_the_edit(twin_of(model), prompts, runs["bridge"][0])


def test_hooks_attached_without_intervene_get_no_step_and_position_hooks_say_so(model, prompts):
    abl = lp.ablate_heads("L0H1", positions=[2])
    with pytest.raises(lp.LensprobeError, match="lp.intervene"):
        with model.hooks(fwd_hooks=abl.hooks(model)), torch.inference_mode():
            model(prompts[0].tokens)


def test_a_padded_manual_forward_places_positions_per_row(model, prompts):
    """With an ``attention_mask``, each left-padded row's positions count from its first real token:
    the position-dependent ablation of a padded batch equals each prompt's own ablated forward."""
    abl = lp.ablate_heads("L1H0", positions=[3, 4, 5])
    rows = [p.tokens[0] for p in prompts]
    width = max(len(r) for r in rows)
    tokens = torch.stack([torch.cat([torch.zeros(width - len(r), dtype=torch.long), r]) for r in rows])
    mask = torch.stack([torch.cat([torch.zeros(width - len(r)), torch.ones(len(r))]) for r in rows]).long()
    with torch.inference_mode(), lp.intervene(model, abl):
        padded = model(tokens, attention_mask=mask)
    for b, r in enumerate(rows):
        alone = lp.forward(model, r[None], abl)
        torch.testing.assert_close(padded[b, -1].float(), alone[0, -1].float(), rtol=1e-4, atol=1e-4)


def _names_seen(model, attach, spec) -> list[tuple[str, object]]:
    """``(hook.name, hook point)`` of every call of one hook at ``spec`` (a name or a name filter), attached
    with ``attach`` (``"tl"``: ``model.hooks()``; ``"lp"``: ``lp.intervene``), over one forward."""
    seen: list = []

    def note(act, hook):
        seen.append((hook.name, hook if attach == "tl" else hook.hook_point))

    context = model.hooks(fwd_hooks=[(spec, note)]) if attach == "tl" else lp.intervene(model, (spec, note))
    with torch.inference_mode(), context:
        model(torch.tensor([[3, 5, 7, 11]]))
    return seen


@pytest.mark.parametrize("spec", ["blocks.1.mlp.hook_post", "blocks.0.attn.hook_z", "blocks.1.mlp.out.hook_in",
                                  "hook_embed", "blocks.0.hook_resid_pre", "blocks.1.attn.hook_pattern"])
def test_a_hook_sees_the_same_name_and_hook_point_however_it_was_attached(model, spec):
    through_tl = _names_seen(model, "tl", spec)
    through_lp = _names_seen(model, "lp", spec)
    assert len(through_tl) == 1 and through_lp == through_tl
    name, point = through_lp[0]
    assert point is model.hook_dict[spec] and name == point.name
    assert name == {"blocks.1.mlp.hook_post": "blocks.1.mlp.out.hook_in", "blocks.0.attn.hook_z": "blocks.0.attn.o.hook_in",
                    "hook_embed": "embed.hook_out", "blocks.0.hook_resid_pre": "blocks.0.hook_in"}.get(spec, spec)


@pytest.mark.parametrize("name_filter", [lambda n: n.endswith("hook_z"), lambda n: n.endswith("mlp.hook_post"),
                                         lambda n: n.startswith("blocks.1.attn.") and n.endswith(("hook_q", "hook_pattern", "hook_out")),
                                         lambda n: "hook_resid" in n])
def test_a_name_filter_selects_the_hook_points_transformerlens_selects(model, name_filter):
    through_tl = _names_seen(model, "tl", name_filter)
    assert len(through_tl) >= 2
    assert _names_seen(model, "lp", name_filter) == through_tl


def test_a_name_filter_skips_points_that_never_fire_and_says_so(model):
    with pytest.warns(lp.LensprobeWarning, match="never fire"):
        seen = _names_seen(model, "lp", lambda n: n.endswith("mlp_in") or n.endswith("mlp.hook_post"))
    assert [name for name, _ in seen] == ["blocks.0.mlp.out.hook_in", "blocks.1.mlp.out.hook_in"]


def test_the_plain_engine_gives_the_bridges_names_and_no_hook_point(model, prompts):
    """A filter on the plain view's hook points: the same calls, names and steps as on the bridge; no
    TransformerLens hook point fires on the plain view, so ``hook_point`` is ``None`` there."""
    runs = {}
    for engine in ("hf", "bridge"):
        seen: list = []

        def note(act, hook, seen=seen):
            seen.append((hook.name, hook.layer(), hook.step.step, hook.hook_point is None))

        out = lp.generate(model, prompts[:1], max_new_tokens=2, engine=engine, stop_at_eos=False,
                          interventions=[(lambda n: n.endswith("mlp.hook_post"), note)])
        assert out.meta["engine"] == engine
        runs[engine] = seen
    assert [entry[:3] for entry in runs["hf"]] == [entry[:3] for entry in runs["bridge"]]
    assert {entry[0] for entry in runs["hf"]} == {"blocks.0.mlp.out.hook_in", "blocks.1.mlp.out.hook_in"}
    assert all(entry[3] for entry in runs["hf"]) and not any(entry[3] for entry in runs["bridge"])
