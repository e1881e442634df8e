"""The plain engine and the bridge differ in their attention kernel only (docs/numerics.md): with the plain
view forced to eager attention, a seeded ARM generation gives the bridge's tokens and entropies bit for bit,
so the difference with fused sdpa is that kernel's rounding, which ARM's ranking of near-zero activations
can amplify."""

import torch

import lensprobe as lp
import lensprobe.generation.engines.choose as choose


def test_with_eager_attention_the_plain_engine_equals_the_bridge_under_arm(tiny, monkeypatch):
    prompt = lp.build_prompt(tiny, "What is 2+3?")
    arm = lp.ARM(c=0.1, percentile=95, seed=0)
    view = choose.plain_model
    monkeypatch.setattr(choose, "plain_model", lambda model, attention: view(model, "eager"))
    plain = lp.generate(tiny, [prompt], max_new_tokens=12, interventions=[arm], engine="hf")
    bridge = lp.generate(tiny, [prompt], max_new_tokens=12, interventions=[arm], engine="bridge")
    assert plain.meta["engine"] == "hf" and plain.meta["attention"] == "eager" and bridge.meta["engine"] == "bridge"
    assert torch.equal(plain.token_ids, bridge.token_ids)
    assert torch.equal(plain.entropy, bridge.entropy)
