"""Capabilities declared in one typed object and read in one place: what is declared is what generic
code does; a capability written the old way, or a declared method that is missing, is refused."""

import pytest
import torch

import lensprobe as lp
from lensprobe.core.hooks.attach import (
    batch_dependent,
    check_positions,
    rounding_sensitive_layer,
    with_default_seed,
)
from lensprobe.core.hooks.capabilities import NONE, bind_interventions, capabilities


class Noise:
    """A seeded intervention that adds noise at layer 0's MLP output: declares what it can do."""

    capabilities = lp.interventions.Capabilities(seeded=True, rounding_sensitive_layer=1)

    def __init__(self, seed=None):
        self.seed = seed

    def with_default_seed(self, seed):
        return self if self.seed is not None else Noise(seed)

    def hooks(self, model):
        def add(act, hook):
            gen = torch.Generator().manual_seed(self.seed or 0)
            return act + torch.randn(act.shape, generator=gen).to(act.dtype)
        return [("blocks.0.mlp.hook_post", add)]


class OldStyle:
    batch_dependent = True

    def hooks(self, model):
        return []


class UndeclaredSeed:
    def with_default_seed(self, seed):
        return self

    def hooks(self, model):
        return []


class MissingMethod:
    capabilities = lp.interventions.Capabilities(positions=True)

    def hooks(self, model):
        return []


def test_what_is_declared_is_what_generic_code_reads():
    noise, pair = Noise(), ("blocks.0.hook_resid_pre", lambda a, h: None)
    assert capabilities(pair) is NONE and capabilities(lp.interventions.AttentionRecorder(layers=[0])) is NONE
    assert rounding_sensitive_layer([noise, pair, lp.ARM(c=0.1, percentile=95, layer=0)]) == 1
    assert [i.seed for i in with_default_seed([noise, Noise(3)], 7)] == [7, 3]
    assert batch_dependent([noise, lp.ARM(c=0.1, percentile=95, per_row=False)])[0].per_row is False


def test_binding_and_positions_follow_the_declaration(tiny):
    prompt = lp.build_prompt(tiny, "What is 2+2?", filler=lp.Filler.meaningless(count=4))
    by_segment = lp.ablate_heads("L0H1", positions="filler")
    bound, changed = bind_interventions((by_segment, Noise()), prompt)
    assert changed and bound[0].positions.fixed == frozenset(prompt.positions("filler"))
    with pytest.raises(lp.LensprobeError, match="position"):
        check_positions([lp.ablate_heads("L0H1", positions=[500])], 40)


@pytest.mark.parametrize("item, match", [(OldStyle(), "batch_dependent but declares no capabilities"),
                                         (UndeclaredSeed(), "with_default_seed but declares no capabilities"),
                                         (MissingMethod(), "positions=True but has no check_positions")])
def test_an_undeclared_or_inconsistent_capability_is_refused(tiny, item, match):
    with pytest.raises(lp.LensprobeError, match=match):
        capabilities(item)
    prompt = lp.build_prompt(tiny, "What is 2+2?")
    with pytest.raises(lp.LensprobeError, match=match):  # before any forward
        lp.generate(tiny, prompt, max_new_tokens=2, interventions=[item])


def test_the_declaration_is_checked():
    with pytest.raises(lp.LensprobeError, match="rounding_sensitive_layer"):
        lp.interventions.Capabilities(rounding_sensitive_layer=-1)
