"""The one way lensprobe attaches hooks (``intervene``), the attention recorder, and ``run``."""

from dataclasses import dataclass

import pytest
import torch

import lensprobe as lp
import lensprobe.core.hooks.forward as lp_run
from lensprobe import LensprobeError, intervene
from lensprobe.core.hooks.attach import Intervention
from lensprobe.core.models.testing import tiny_model
from lensprobe.interventions import AttentionRecorder

PATTERN0 = "blocks.0.attn.hook_pattern"
PATTERN1 = "blocks.1.attn.hook_pattern"


@pytest.fixture
def model():
    """A fresh tiny model: these tests attach user hooks, so they never touch the session fixture."""
    return tiny_model(seed=3)


@pytest.fixture
def tokens(model):
    return lp.build_prompt(model, "What is 12+7?", filler=lp.Filler.meaningless(count=6)).tokens


def n_hooks(model, name=None) -> int:
    """Forward hooks attached to one hook point, or to all of them (TransformerLens and torch side)."""
    points = [model.hook_dict[name]] if name else {id(h): h for h in model.hook_dict.values()}.values()
    total = 0
    for point in points:
        assert len(point.fwd_hooks) == len(point._forward_hooks)
        total += len(point.fwd_hooks)
    return total


@dataclass(frozen=True)
class Scale:
    """A small intervention object: scales an activation (clones first)."""

    name: str
    factor: float

    def hooks(self, model):
        return [(self.name, lambda act, hook: act.clone() * self.factor)]


def test_hooks_removed_on_exit(model, tokens):
    rec = AttentionRecorder(layers=[0, 1])
    assert n_hooks(model) == 0
    with intervene(model, rec, Scale("hook_embed", 2.0)):
        assert n_hooks(model, PATTERN0) == 1 and n_hooks(model, PATTERN1) == 1
        assert n_hooks(model, "hook_embed") == 1
        model(tokens)
    assert n_hooks(model) == 0
    assert set(rec.patterns) == {0, 1}


def test_intervention_changes_output_only_inside(model, tokens):
    plain = lp.forward(model, tokens)
    scaled = lp.forward(model, tokens, Scale("hook_embed", 0.0))
    assert isinstance(Scale("hook_embed", 0.0), Intervention)
    assert not torch.allclose(plain, scaled)
    torch.testing.assert_close(lp.forward(model, tokens), plain, rtol=0, atol=0)


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("permanent", [False, True])
def test_raising_hook_leaves_only_the_users_hooks(model, tokens, exc, permanent):
    calls = []
    model.add_hook(PATTERN0, lambda act, hook: calls.append(hook.name), is_permanent=permanent)
    assert n_hooks(model) == 1

    def boom(act, hook):
        raise exc("raised inside the forward")

    rec = AttentionRecorder(layers=[0, 1])
    with pytest.raises(exc, match="raised inside the forward"):
        with intervene(model, rec, (PATTERN1, boom), Scale("hook_embed", 1.0)):
            assert n_hooks(model) == 5
            model(tokens)
    assert calls == [PATTERN0]  # the user's hook fired during the failed pass
    assert n_hooks(model) == 1 and n_hooks(model, PATTERN0) == 1  # only the user's hook is left
    model(tokens)
    assert calls == [PATTERN0, PATTERN0]  # and it still fires
    assert set(rec.patterns) == {0, 1}  # the recorder's layer-1 hook ran before the raising one


def test_error_while_attaching_leaves_nothing(model):
    with pytest.raises(LensprobeError, match="does not exist on this model"):
        with intervene(model, AttentionRecorder(layers=[0]), ("blocks.0.attn.hook_nope", lambda act, hook: act)):
            pass
    assert n_hooks(model) == 0


def test_nested_intervene_keeps_outer_hooks(model, tokens):
    outer, inner = AttentionRecorder(layers=[0]), AttentionRecorder(layers=[0])
    with intervene(model, outer):
        with intervene(model, inner):
            assert n_hooks(model, PATTERN0) == 2
        assert n_hooks(model, PATTERN0) == 1
        model(tokens)
    assert n_hooks(model) == 0
    assert set(outer.patterns) == {0} and inner.patterns == {}


def test_unknown_hook_name(model):
    with pytest.raises(LensprobeError, match="does not exist on this model") as err:
        with intervene(model, ("blocks.0.attn.hook_patern", lambda act, hook: act)):
            pass
    msg = str(err.value)
    assert "'blocks.0.attn.hook_patern' does not exist on this model" in msg
    assert "blocks.0.attn.hook_pattern" in msg  # the fix is named


@pytest.mark.parametrize("item", ["blocks.0.attn.hook_pattern", ("blocks.0.attn.hook_pattern",), 3])
def test_not_an_intervention(model, item):
    with pytest.raises(LensprobeError, match="cannot attach"):
        with intervene(model, item):
            pass


# ---------------------------------------------------------------- AttentionRecorder


def test_recorder_keeps_a_copy(model, tokens):
    """A later hook that edits the pattern in place does not change what was recorded."""
    rec = AttentionRecorder(layers=[0])

    def zero_in_place(act, hook):
        act.zero_()

    with torch.inference_mode(), intervene(model, rec, (PATTERN0, zero_in_place)):
        model(tokens)
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n == PATTERN0)
    torch.testing.assert_close(rec.patterns[0], cache[PATTERN0])
    assert rec.patterns[0].sum() > 0


def test_recorder_reduce_inside_the_hook(model, tokens, twin_of):
    """The reduction runs on the live pattern: here the average attention each key receives, which
    equals the same average taken by hand over a separately built plain model's attention weights."""
    rec = AttentionRecorder(layers=[1], reduce=lp.metrics.average_attention_received)
    lp.forward(model, tokens, rec)
    with torch.inference_mode():
        full = twin_of(model)(tokens, output_attentions=True).attentions[1][0]  # [head, q, k]
    n = tokens.shape[1]
    want = torch.full((model.cfg.n_heads, n), float("nan"))
    for j in range(n - 1):
        want[:, j] = full[:, j + 1:, j].sum(-1) / (n - 1 - j)  # queries strictly after key j
    assert rec.patterns[1].shape == (1, model.cfg.n_heads, n)
    torch.testing.assert_close(rec.patterns[1][0], want, equal_nan=True, atol=1e-6, rtol=0)


# ---------------------------------------------------------------- attention_patterns / forward


def test_attention_patterns_match_run_with_cache(tiny):
    p = lp.build_prompt(tiny, "What is 3*4?", system=lp.MATH_SYSTEM_PROMPT, filler=lp.Filler.meaningless(count=9))
    names = {PATTERN0, PATTERN1}
    _, cache = tiny.run_with_cache(p.tokens, names_filter=lambda n: n in names)
    for layers in ([0], [1], [0, 1], None, 1):
        pats = lp.attention_patterns(tiny, p, layers=layers)
        want = [0, 1] if layers is None else [layers] if isinstance(layers, int) else layers
        assert list(pats) == want
        for layer in want:
            assert pats[layer].shape == (tiny.cfg.n_heads, len(p), len(p))
            torch.testing.assert_close(pats[layer], cache[f"blocks.{layer}.attn.hook_pattern"][0], rtol=0, atol=0)


def test_attention_patterns_hooks_and_keeps_only_requested_layers(model, tokens, monkeypatch):
    attached, recorders = [], []
    real_hooks = model.hooks

    def spy_hooks(fwd_hooks=(), **kw):
        attached.append([name for name, _ in fwd_hooks])
        return real_hooks(fwd_hooks=fwd_hooks, **kw)

    class SpyRecorder(AttentionRecorder):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            recorders.append(self)

    monkeypatch.setattr(model, "hooks", spy_hooks)
    monkeypatch.setattr(lp_run, "AttentionRecorder", SpyRecorder)
    pats = lp.attention_patterns(model, tokens, layers=[1])
    assert len(attached) == 1 and set(attached[0]) == {PATTERN1}  # one hook point, no full cache
    assert len(recorders) == 1 and list(recorders[0].patterns) == [1]
    assert list(pats) == [1]
    assert n_hooks(model) == 0


def test_attention_patterns_stops_after_last_requested_layer(model, tokens):
    seen = []
    for name in ("blocks.0.attn.hook_z", "blocks.1.attn.hook_z", "ln_final.hook_normalized"):
        model.add_hook(name, lambda act, hook, name=name: seen.append(name))
    lp.attention_patterns(model, tokens, layers=[0])
    assert seen == []  # the pass ended at layer 0's pattern
    lp.attention_patterns(model, tokens, layers=[1])
    assert seen == ["blocks.0.attn.hook_z"]  # block 0 ran; block 1 stopped at its pattern
    lp.forward(model, tokens)
    assert seen[1:] == ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z", "ln_final.hook_normalized"]
    assert n_hooks(model) == 3  # only the hooks added here


def test_attention_patterns_batch_and_token_inputs(tiny):
    a = lp.build_prompt(tiny, "What is 12+7?").tokens
    b = lp.build_prompt(tiny, "What is 3*4?!").tokens[:, : a.shape[1]]
    batch = torch.cat([a, b])
    pats = lp.attention_patterns(tiny, batch, layers=[0])
    assert pats[0].shape == (2, tiny.cfg.n_heads, a.shape[1], a.shape[1])
    single = lp.attention_patterns(tiny, a[0].tolist(), layers=[0])[0]  # a plain list of ids
    torch.testing.assert_close(pats[0][0], single)
    torch.testing.assert_close(lp.attention_patterns(tiny, a[0], layers=[0])[0], single)


def test_forward_returns_logits_or_none(tiny):
    tokens = lp.build_prompt(tiny, "What is 12+7?").tokens
    logits = lp.forward(tiny, tokens)
    assert logits.shape == (1, tokens.shape[1], tiny.cfg.d_vocab)
    with torch.inference_mode():
        torch.testing.assert_close(logits, tiny(tokens), rtol=0, atol=0)
    assert lp.forward(tiny, tokens, stop_at_layer=1) is None


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("What is 12+7?", "expected a Prompt"),
        (torch.zeros(1, 4), "integer tensor"),
        (torch.zeros(1, 2, 3, dtype=torch.long), "integer tensor"),
        (torch.zeros(1, 257, dtype=torch.long), "input is 257 tokens but the model's context is 256"),
    ],
)
def test_bad_token_inputs(tiny, bad, message):
    with pytest.raises(LensprobeError, match=message):
        lp.attention_patterns(tiny, bad, layers=[0])


@pytest.mark.parametrize(
    ("layers", "message"),
    [
        ([2], r"layer 2 out of range: model has 2 layers \(0-1\)"),
        ([-1], r"layer -1 out of range: model has 2 layers \(0-1\)"),
        ([], "no layers"),
    ],
)
def test_bad_layers(tiny, layers, message):
    with pytest.raises(LensprobeError, match=message):
        lp.attention_patterns(tiny, [1, 2, 3], layers=layers)
