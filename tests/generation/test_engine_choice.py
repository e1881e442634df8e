"""The engine protocol: which engine runs a generation, and the checks an engine makes first."""

import pytest
import torch

import lensprobe as lp
from lensprobe.core.hooks.attach import Steps
from lensprobe.core.models.testing import tiny_model
from lensprobe.generation.engines import BridgeEngine, Engine, PlainEngine, choose_engine
from lensprobe.generation.engines.bridge import check_cached_steps


def _choose(model, engine="auto", interventions=(), hook_names=()):
    return choose_engine(model, engine, interventions=list(interventions), hook_names=list(hook_names), rows=1)


def test_both_engines_implement_the_protocol(tiny):
    bridge, plain = _choose(tiny, "bridge"), _choose(tiny, "hf")
    assert isinstance(bridge, BridgeEngine) and isinstance(plain, PlainEngine)
    assert isinstance(bridge, Engine) and isinstance(plain, Engine)
    assert bridge.describe()["engine"] == "bridge" and plain.describe()["engine"] == "hf"
    assert plain.describe()["attention"] == "sdpa"
    assert _choose(tiny, "hf", hook_names=["blocks.0.attn.hook_pattern"]).describe()["attention"] == "sdpa_last"


def test_auto_takes_the_bridge_for_interventions_and_unserved_hooks(tiny):
    ablation = lp.ablate_heads("L0H1")
    assert isinstance(_choose(tiny), PlainEngine)
    assert isinstance(_choose(tiny, interventions=[ablation]), BridgeEngine)
    assert isinstance(_choose(tiny, hook_names=["blocks.0.attn.hook_z"]), BridgeEngine)
    assert isinstance(_choose(tiny, hook_names=["blocks.0.hook_resid_post", "blocks.1.hook_out"]), PlainEngine)
    with pytest.raises(lp.LensprobeError, match="engine='hf' cannot run here: interventions run on"):
        _choose(tiny, "hf", interventions=[ablation])
    with pytest.raises(lp.LensprobeError, match="engine must be 'auto', 'bridge' or 'hf', got 'vllm'"):
        _choose(tiny, "vllm")


def test_the_plain_engine_refuses_interventions(tiny):
    with pytest.raises(lp.LensprobeError, match="applies interventions only at hook_embed"), \
            _choose(tiny, "hf").attach([], [lp.ablate_heads("L0H1")], Steps()):
        pass


def test_engines_run_the_same_cached_steps(tiny):
    p = lp.build_prompt(tiny, "the cat sat", system="be brief")
    for engine in (_choose(tiny, "bridge"), _choose(tiny, "hf")):
        n = len(p)
        with engine.attach([], [], Steps()):
            full, _ = engine.forward(p.tokens, p.tokens.new_ones(1, n), torch.arange(n)[None], None)
            _, cache = engine.forward(p.tokens[:, :-1], p.tokens.new_ones(1, n - 1),
                                      torch.arange(n - 1)[None], None)
            step, _ = engine.forward(p.tokens[:, -1:], p.tokens.new_ones(1, n),
                                     torch.arange(n)[None, -1:], cache)
        assert (step[:, -1] - full[:, -1]).abs().max() < 1e-4


def test_a_bridge_whose_cached_steps_ignore_the_cache_is_refused(monkeypatch):
    model = tiny_model(seed=0)
    real = model.forward

    def forgets_the_cache(tokens, *args, past_key_values=None, **kwargs):
        return real(tokens, *args, **kwargs)  # a cached step then sees only its own position

    monkeypatch.setattr(model, "forward", forgets_the_cache)
    with pytest.raises(lp.LensprobeError, match=r"compute wrong KV-cached steps.*transformers<5\.24"):
        check_cached_steps(model)
    with pytest.raises(lp.LensprobeError, match="compute wrong KV-cached steps"):
        lp.generate(model, [1, 2, 3], max_new_tokens=2, engine="bridge")


def test_mlp_interventions_run_on_the_plain_engine_with_the_bridge_numbers(tiny):
    arm = lp.ARM(layer=0, c=0.5, percentile=95, seed=3)
    assert isinstance(_choose(tiny, interventions=[arm]), PlainEngine)
    p = lp.build_prompt(tiny, "the cat sat", system="be brief")
    kw = dict(max_new_tokens=6, stop_at_eos=False, interventions=[arm], track={"question": "question"})
    plain = lp.trace_generation(tiny, p, engine="auto", **kw)
    bridge = lp.trace_generation(tiny, p, engine="bridge", **kw)
    clean = lp.trace_generation(tiny, p, max_new_tokens=6, stop_at_eos=False, track={"question": "question"})
    assert plain.meta["engine"] == "hf" and bridge.meta["engine"] == "bridge"
    assert plain.token_ids_rows.tolist() == bridge.token_ids_rows.tolist()
    assert torch.allclose(plain.entropy_rows, bridge.entropy_rows, atol=1e-5)
    assert torch.allclose(plain.attention["question"], bridge.attention["question"], atol=1e-5)
    assert not torch.allclose(plain.entropy_rows, clean.entropy_rows, atol=1e-4)  # ARM did act


def test_an_edit_at_a_hook_point_the_view_cannot_apply_keeps_the_bridge(tiny):
    def double(pattern, hook):
        return pattern * 2

    assert isinstance(_choose(tiny, interventions=[("blocks.0.attn.hook_pattern", double)]), BridgeEngine)
    assert isinstance(_choose(tiny, interventions=[("blocks.1.mlp.hook_post", lambda x, hook: x)]), PlainEngine)
