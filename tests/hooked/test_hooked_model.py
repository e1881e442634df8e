"""The tiny HookedTransformer itself, telling the model kinds apart, the engine choice and the thinking
token on a HookedTransformer: checked against the plain ``transformers`` twin and by hand."""

import copy

import pytest
import torch
from hooked_oracles import hf_with_thinking_token

import lensprobe as lp
from lensprobe.core.models.kinds import is_bridge, is_hooked_transformer, model_kind, require_bridge
from lensprobe.core.models.testing import tiny_hf_model, tiny_hooked_model
from lensprobe.generation.engines import BridgeEngine, HookedEngine, choose_engine

pytestmark = pytest.mark.hooked


def test_kinds_tell_the_two_models_apart(hooked, tiny):
    assert is_hooked_transformer(hooked) and not is_bridge(hooked) and model_kind(hooked) == "hooked_transformer"
    assert is_bridge(tiny) and not is_hooked_transformer(tiny) and model_kind(tiny) == "bridge"
    assert model_kind(torch.nn.Linear(2, 2)) == "other" and not is_hooked_transformer("gpt2")
    require_bridge(tiny, "engine='hf'", "use engine='auto'")  # a bridge passes
    with pytest.raises(lp.LensprobeError, match=r"engine='hf' needs a TransformerBridge .* HookedTransformer"):
        require_bridge(hooked, "engine='hf'", "use engine='auto'")


def test_tiny_hooked_model_computes_what_its_plain_twin_computes(hooked, hooked_hf, hooked_prompts):
    cfg = hooked.cfg
    assert (cfg.n_heads, cfg.n_key_value_heads, cfg.gated_mlp, cfg.normalization_type) == (4, 2, True, "RMS")
    assert cfg.positional_embedding_type == "rotary"
    tokens = hooked_prompts[0].tokens
    with torch.inference_mode():
        want = hooked_hf(tokens, output_attentions=True)
        logits, cache = hooked.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    torch.testing.assert_close(logits, want.logits, atol=1e-5, rtol=0)
    for layer, attn in enumerate(want.attentions):
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_pattern"], attn, atol=1e-6, rtol=0)
    other = tiny_hf_model(seed=1)[0]  # another seed: other weights, so the comparison can fail
    with torch.inference_mode():
        assert (other(tokens).logits - logits).abs().max() > 1e-2
    assert lp.load_model(hooked) is hooked  # an already loaded HookedTransformer is used as it is


def test_tiny_hooked_model_has_the_same_tokenizer_and_prompts_as_the_bridge(hooked, tiny):
    for text in ("What is 12+7?", "<|im_start|>user\nhi"):
        assert hooked.tokenizer.encode(text) == tiny.tokenizer.encode(text)
    a = lp.build_prompt(hooked, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT, filler=lp.Filler.meaningless(count=4))
    b = lp.build_prompt(tiny, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT, filler=lp.Filler.meaningless(count=4))
    assert a.tokens.tolist() == b.tokens.tolist() and a.text == b.text
    assert a.positions("filler") == b.positions("filler") and len(a.positions("filler")) >= 4


def test_engine_choice_on_a_hooked_transformer(hooked):
    for name in ("auto", "bridge"):
        engine = choose_engine(hooked, name, interventions=[], hook_names=[], rows=1)
        assert isinstance(engine, HookedEngine) and engine.describe()["engine"] == "hooked"
    with pytest.raises(lp.LensprobeError, match=r"engine='hf' needs a TransformerBridge.*engine='auto'"):
        choose_engine(hooked, "hf", interventions=[], hook_names=[], rows=1)
    p = lp.build_prompt(hooked, "hi")
    with pytest.raises(lp.LensprobeError, match="HookedTransformer, which has no Hugging Face modules"):
        lp.generate(hooked, p, max_new_tokens=2, engine="hf")
    assert lp.generate(hooked, p, max_new_tokens=2).meta["engine"] == "hooked"


def test_bridge_engine_choice_is_unchanged(tiny):
    assert isinstance(choose_engine(tiny, "bridge", interventions=[], hook_names=[], rows=1), BridgeEngine)


def test_hooked_engine_refuses_masks_the_model_would_read_otherwise(hooked):
    engine = HookedEngine(hooked)
    tokens = torch.tensor([[5, 6, 7]])
    with pytest.raises(lp.LensprobeError, match="position ids differ"):
        engine.forward(tokens, torch.ones(1, 3, dtype=torch.long), torch.tensor([[1, 2, 3]]), None)
    with pytest.raises(lp.LensprobeError, match="position ids differ"):  # a gap inside the row
        engine.forward(tokens, torch.tensor([[1, 0, 1]]), torch.tensor([[0, 1, 2]]), None)
    with torch.inference_mode():
        logits, cache = engine.forward(tokens, torch.ones(1, 3, dtype=torch.long), torch.tensor([[0, 1, 2]]), None)
        with pytest.raises(lp.LensprobeError, match="must be the cache's mask"):
            engine.forward(torch.tensor([[8]]), torch.ones(1, 5, dtype=torch.long), torch.tensor([[3]]), cache)
        step, _ = engine.forward(torch.tensor([[8]]), torch.ones(1, 4, dtype=torch.long), torch.tensor([[3]]), cache)
        full = hooked(torch.tensor([[5, 6, 7, 8]]))
    torch.testing.assert_close(logits[:, -1], full[:, 2], atol=1e-5, rtol=0)
    torch.testing.assert_close(step[:, -1], full[:, 3], atol=1e-5, rtol=0)


def test_add_thinking_token_grows_a_hooked_transformer_by_the_mean_rows(hooked, hooked_hf):
    model = copy.deepcopy(hooked)
    V = model.cfg.d_vocab
    W_E, W_U, b_U = (t.detach().clone() for t in (model.W_E, model.W_U, model.b_U))
    tid = lp.generation.add_thinking_token(model, "<thinking>")
    assert tid == V and model.cfg.d_vocab == model.cfg.d_vocab_out == V + 1
    assert model.tokenizer.encode("<thinking>", add_special_tokens=False) == [tid]
    torch.testing.assert_close(model.W_E[V], W_E.mean(0))
    torch.testing.assert_close(model.W_U[:, V], W_U.mean(1))
    torch.testing.assert_close(model.b_U[V], b_U.mean())
    assert lp.generation.add_thinking_token(model, "<thinking>") == tid and model.cfg.d_vocab == V + 1  # once only
    assert hooked.cfg.d_vocab == V  # the original is untouched
    grown, grown_id = hf_with_thinking_token(hooked_hf)
    tokens = torch.tensor([[3, 17, tid, 40, tid]])
    with torch.inference_mode():
        torch.testing.assert_close(model(tokens), grown(tokens).logits, atol=1e-5, rtol=0)
    assert grown_id == tid


def test_tiny_hooked_model_needs_a_seed_to_differ():
    a, b = tiny_hooked_model(seed=3), tiny_hooked_model(seed=3)
    assert torch.equal(a.W_Q, b.W_Q) and not torch.equal(a.W_Q, tiny_hooked_model(seed=4).W_Q)
