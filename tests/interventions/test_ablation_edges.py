"""Head ablation at its edges: the hook on hand-made tensors, positions in a batch of rows and in a
generation, what ``bind`` and ``ablate_kv_group`` keep, the exact ``repr`` (evaluations hash it) and the
refusals' exact messages. Expected values come from a plain ``transformers`` forward or by hand."""

import hashlib

import pytest
import torch
from test_ablation import hf_logits, zero_slice

import lensprobe as lp
from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.heads import Positions, resolve_positions
from lensprobe.core.hooks.hookpoint import StepContext
from lensprobe.interventions.ablation import (
    HeadAblation,
    RowHeadAblation,
    ZAblationHook,
    ablate_heads,
    ablate_kv_group,
    check_ablation_positions,
)
from lensprobe.interventions.replacement import HeadMeans


@pytest.fixture(scope="module")
def prompt(tiny):
    return lp.build_prompt(tiny, "What is 12+7?", system="Please reason step by step.")


def sha(*texts: bytes) -> str:
    return hashlib.sha256(b"".join(texts)).hexdigest()[:12]


# ------------------------------------------------------------------ the hook on hand-made tensors


def test_the_hook_zeroes_each_rows_own_heads_and_names_a_batch_mismatch():
    """Row b of a [2, head] mask zeroes its own heads at every position; another batch size is refused."""
    z = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(0))  # [batch, pos, head, d_head]
    mask = torch.tensor([[True, False, False, False], [False, False, True, True]])
    got = ZAblationHook(0, mask)(z, None)
    want = z.clone()
    want[0, :, 0] = 0
    want[1, :, 2:] = 0
    assert torch.equal(got, want)
    one = z[:1].clone()  # a one-row mask on a one-row batch: one row back
    one[:, :, 2:] = 0
    assert torch.equal(ZAblationHook(0, mask[1:])(z[:1], None), one)
    with pytest.raises(LensprobeError, match=r"^this ablation was built for 2 batch rows but the input has 3\.$"):
        ZAblationHook(0, mask)(torch.zeros(3, 3, 4, 5), None)


def test_a_position_dependent_hook_without_a_step_names_its_layer():
    """Outside lp.intervene no positions are published; the message names the ablation and its layer."""
    hook = ZAblationHook(1, torch.ones(1, 4, dtype=torch.bool), Positions(frozenset({0})), by_position=True)
    with pytest.raises(LensprobeError, match=r"^head ablation at layer 1: no token positions were published"):
        hook(torch.zeros(1, 3, 4, 5), None)


def test_a_zero_ablation_of_every_position_needs_no_step(tiny):
    """Zero ablation at every position looks up no positions: its hook runs outside lp.intervene and keeps a
    one-row batch one row."""
    ((name, hook),) = ablate_heads("L1H2").hooks(tiny)
    assert name == "blocks.1.attn.hook_z"
    z = torch.randn(1, 3, tiny.cfg.n_heads, tiny.cfg.d_head, generator=torch.Generator().manual_seed(1))
    want = z.clone()
    want[:, :, 2] = 0
    assert torch.equal(hook(z, None), want)


def test_left_padded_rows_place_positions_row_by_row():
    """A step describing each row's positions (row 1 left-padded by one) is used row by row: position 0 is
    index 0 in row 0 and index 1 in row 1."""
    z = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(2))
    site = type("Site", (), {"step": StepContext(0, torch.tensor([[0, 1, 2], [-1, 0, 1]]))})()
    hook = ZAblationHook(0, torch.tensor([[False, True, False, False]]), Positions(frozenset({0})), by_position=True)
    want = z.clone()
    want[0, 0, 1] = 0
    want[1, 1, 1] = 0
    assert torch.equal(hook(z, site), want)


# ------------------------------------------------------------------ positions in a batch, in a generation


def test_positions_in_a_batch_of_two_rows_equal_plain_zeroing(tiny, tiny_hf, prompt):
    """Fixed positions are placed in every row of a two-row batch (the plain model zeroes the same slices)."""
    a = prompt.tokens
    batch = torch.cat([a, a.flip(-1)])
    d = tiny.cfg.d_head
    got = lp.forward(tiny, batch, ablate_heads("L0H1,L1H2", positions=[1, 3]))
    want = hf_logits(tiny_hf, batch, {0: zero_slice([1], d, [1, 3]), 1: zero_slice([2], d, [1, 3])})
    assert (got - want).abs().max() <= 1e-5
    assert (got - hf_logits(tiny_hf, batch, {})).abs().max() > 1e-3


def test_generated_positions_without_a_prompt_are_placed_by_the_generation(tiny, tiny_hf, prompt):
    """'generated' not bound to a prompt is placed per row by lp.generate: each greedy token is the argmax
    of a plain forward over prompt + generated tokens with the generated positions zeroed."""
    n, new = len(prompt), 3
    out = lp.generate(tiny, prompt, max_new_tokens=new, stop_at_eos=False,
                      interventions=[ablate_heads("L0H1,L1H3", positions="generated")])
    ids = list(out.generated_ids[0])
    assert len(ids) == new
    tokens = torch.cat([prompt.tokens, torch.tensor([ids])], dim=1)
    d = tiny.cfg.d_head
    gen = list(range(n, n + new))
    want = hf_logits(tiny_hf, tokens, {0: zero_slice([1], d, gen), 1: zero_slice([3], d, gen)})
    assert want[0, n - 1:n - 1 + new].argmax(-1).tolist() == ids


def test_row_head_ablation_ablates_per_row_and_checks_positions_with_what_the_run_counts(tiny, tiny_hf, prompt):
    """Row 0 ablates L0H1, row 1 nothing; its position check names what its caller counts."""
    a = prompt.tokens
    batch = torch.cat([a, a])
    got = lp.forward(tiny, batch, RowHeadAblation(((0, 1), None)))
    d = tiny.cfg.d_head
    assert (got[0] - hf_logits(tiny_hf, a, {0: zero_slice([1], d)})[0]).abs().max() <= 1e-5
    assert (got[1] - hf_logits(tiny_hf, a, {})[0]).abs().max() <= 1e-5
    row = RowHeadAblation(((0, 1),), positions=resolve_positions([7]))
    with pytest.raises(LensprobeError, match=r"lie outside the prompt \+ max_new_tokens \(5 tokens"):
        row.check_positions(5, "prompt + max_new_tokens")
    with pytest.raises(LensprobeError, match=r"lie outside the prompt \(5 tokens"):
        row.check_positions(5)


def test_row_head_ablation_passes_on_its_positions_and_its_source(tiny, tiny_hf, prompt):
    """Positions: row 0 zeroes L0H1 at positions 1 and 3 only (the plain model zeroes that slice). A source
    after an unablated row: row 1's L0H1 becomes the head mean, at every position; row 0 is untouched."""
    a = prompt.tokens
    d = tiny.cfg.d_head
    got = lp.forward(tiny, torch.cat([a, a]), RowHeadAblation(((0, 1), None), positions=resolve_positions([1, 3])))
    assert (got[0] - hf_logits(tiny_hf, a, {0: zero_slice([1], d, [1, 3])})[0]).abs().max() <= 1e-5
    assert (got[1] - hf_logits(tiny_hf, a, {})[0]).abs().max() <= 1e-5
    v = torch.arange(4.0 * d).reshape(4, d)  # [head, d_head]
    row = RowHeadAblation((None, (0, 1)), "mean", source=HeadMeans({0: v}, per_position=False, n_prompts=1))
    ((name, hook),) = row.hooks(tiny)
    z = torch.randn(2, 3, 4, d, generator=torch.Generator().manual_seed(3))
    want = z.clone()
    want[1, :, 1] = v[1]
    assert name == "blocks.0.attn.hook_z" and torch.equal(hook(z, None), want)


# ------------------------------------------------------------------ bind, ablate_kv_group


def test_bind_keeps_everything_but_the_segment_names(prompt):
    """Resolving segment names keeps the method, reference, per_position and KV groups."""
    ref = [prompt, prompt]
    abl = ablate_kv_group("L0KV1", method="mean", reference=ref, per_position=True, positions="question")
    assert abl.positions == "question"  # a name waits for its prompt
    bound = abl.bind(prompt)
    assert bound.positions == Positions(frozenset(prompt.positions("question")))
    assert (bound.heads, bound.method, bound.reference, bound.per_position, bound.kv_groups) \
        == ((), "mean", ref, True, ((0, 1),))


def test_ablate_kv_group_keeps_its_arguments(prompt):
    """Every argument of ablate_kv_group reaches the ablation; positions are resolved as in ablate_heads."""
    plain = ablate_kv_group("L0KV1,L1KV0")
    assert (plain.heads, plain.method, plain.positions, plain.reference, plain.per_position, plain.kv_groups) \
        == ((), "zero", None, None, False, ((0, 1), (1, 0)))
    assert ablate_kv_group("L0KV1", positions=[2, 5]).positions == Positions(frozenset({2, 5}))
    q = prompt.positions("question")
    assert ablate_kv_group("L0KV1", positions="question", prompt=prompt).positions == Positions(frozenset(q))
    assert ablate_kv_group("L0KV1", prompt=prompt).positions is None
    ref = [prompt]
    mean = ablate_kv_group("L1KV0", method="mean", reference=ref)
    assert mean.method == "mean" and mean.reference is ref
    with pytest.raises(LensprobeError, match=r"^KV group L1KV0 is given twice; name each group once\.$"):
        ablate_kv_group("L0KV1,L1KV0,L1KV0")


def test_a_head_named_alone_and_in_its_kv_group_is_refused_by_name(tiny):
    """The tiny model's 4 query heads share 2 KV heads: group 0 of layer 0 holds L0H0 and L0H1."""
    with pytest.raises(LensprobeError, match=r"^head L0H1 is given twice; name each head once\.$"):
        HeadAblation(((0, 1),), kv_groups=((0, 0),)).resolve(tiny)


def test_an_empty_selection_is_refused_with_the_first_word_of_what_is_due():
    """'head' and 'KV group': the words before the example, whole."""
    tail = r": pass at least one {}, e\.g\. '{}'; to run without ablation pass no intervention\.$"
    with pytest.raises(LensprobeError, match=r"^no head to ablate in ' , '" + tail.format("head", "L0H1")):
        ablate_heads(" , ")
    with pytest.raises(LensprobeError, match=r"^no KV group to ablate in \[\]" + tail.format("KV group", "L0KV1")):
        ablate_kv_group([])


# ------------------------------------------------------------------ repr


def test_repr_names_heads_groups_positions_and_options():
    """The repr is what evaluations hash: every part of it, written out."""
    assert repr(ablate_heads("all")) == "HeadAblation(heads='all', method='zero')"
    assert repr(ablate_heads("L0H1,H2")) == "HeadAblation(heads='L0H1,L*H2', method='zero')"
    assert repr(ablate_kv_group("L0KV1,L1KV0")) == "HeadAblation(kv_groups='L0KV1,L1KV0', method='zero')"
    assert repr(ablate_heads("L0H1", positions=[1, 2, 3, 7])) \
        == "HeadAblation(heads='L0H1', method='zero', positions=[1-3,7])"
    assert repr(ablate_heads("L0H1", positions=slice(5, None))) \
        == "HeadAblation(heads='L0H1', method='zero', positions=from 5)"
    both = HeadAblation(((0, 1),), positions=Positions(frozenset({1}), start=9))
    assert repr(both) == "HeadAblation(heads='L0H1', method='zero', positions=[1] + from 9)"
    gen = HeadAblation(((0, 1),), positions=Positions(start=12, generated=True))
    assert repr(gen) == "HeadAblation(heads='L0H1', method='zero', positions=generated)"
    assert repr(ablate_heads("L0H1", positions="question")) \
        == "HeadAblation(heads='L0H1', method='zero', positions='question')"
    means = HeadAblation(((0, 1),), "mean", reference=[[1, 2], [3]], per_position=True)
    assert repr(means) == (f"HeadAblation(heads='L0H1', method='mean', reference=<2 prompts, sha256 "
                           f"{sha(b'1,2;', b'3;')}>, per_position=True)")


def test_repr_describes_each_kind_of_reference_by_its_content(prompt):
    """A prompt, a list of token ids, token tensors and head means: the count and the SHA-256 of the content."""
    ids = prompt.tokens[0].tolist()
    text = ",".join(str(i) for i in ids).encode() + b";"
    one = HeadAblation(((0, 1),), "resample", reference=prompt)
    assert repr(one).endswith(f"reference=<1 prompt, sha256 {sha(text)}>)")
    assert repr(HeadAblation(((0, 1),), "resample", reference=ids)).endswith(f"reference=<1 prompt, sha256 {sha(text)}>)")
    tensors = HeadAblation(((0, 1),), "mean", reference=[torch.tensor([[4, 5]]), torch.tensor([6])])
    assert repr(tensors).endswith(f"reference=<2 prompts, sha256 {sha(b'4,5;', b'6;')}>)")
    v0, v1 = torch.arange(6.0).reshape(2, 3), torch.ones(2, 3)
    means = HeadMeans({1: v1, 0: v0}, per_position=False, n_prompts=3)
    chunks = v0.numpy().tobytes() + v1.numpy().tobytes()  # layers in ascending order
    assert repr(HeadAblation(((0, 1),), "mean", reference=means)).endswith(
        f"reference=<HeadMeans over 3 prompts, sha256 {sha(chunks)}>)")


# ------------------------------------------------------------------ position checks


def test_position_check_messages_are_whole():
    """Each refusal is the whole message, with the run's length and last position, and 'prompt' by default."""
    with pytest.raises(LensprobeError, match=r"^no ablation positions given \(an empty list\): the ablation would "
                       r"ablate nothing and show no effect\. Pass at least one position, a segment name such as "
                       r"'question', or positions=None for every position\.$"):
        check_ablation_positions(Positions(), 5)
    generated = Positions(start=5, generated=True)
    check_ablation_positions(generated, 6)  # one generated position: fine
    with pytest.raises(LensprobeError, match=r"^positions='generated' were resolved against a prompt of 5 tokens, "
                       r"and this run processes 5 positions \(the prompt\), none generated: the ablation would ablate "
                       r"nothing and show no effect\. Ablate 'generated' positions during a generation \(lp\.generate, "
                       r"lp\.trace_generation, lp\.evaluate\), or choose prompt positions or a segment name such as "
                       r"'question'\.$"):
        check_ablation_positions(generated, 5)
    with pytest.raises(LensprobeError, match=r"^ablation positions 7 lie outside the prompt \(5 tokens, positions "
                       r"0-4\): they would ablate nothing and show no effect\. Choose positions below 5, or a segment "
                       r"name such as 'question'\.$"):
        ablate_heads("L0H1", positions=[7]).check_positions(5)


@pytest.mark.parametrize("method", ["mean", "resample"])
def test_reference_activations_are_computed_once_per_model(tiny, prompt, method, monkeypatch):
    """Would catch the cache of reference activations left unused (each use recomputing them: a forward over
    the reference per forward ablated) or shared across models (one model's activations replacing another's
    heads)."""
    from lensprobe.core.models.testing import tiny_model
    from lensprobe.interventions import ablation as module

    calls = []
    real = module.replacement_source

    def counted(model, *args):
        calls.append(model)
        return real(model, *args)

    monkeypatch.setattr(module, "replacement_source", counted)
    other = tiny_model(seed=1)  # the same shape, other weights
    abl = ablate_heads("L0H1,L1H2", method=method, reference=prompt)
    sources = []
    for model in (tiny, tiny, other, other, tiny):
        abl.hooks(model)
        sources.append(vars(abl)["_cache"][model])
    assert calls == [tiny, other]  # once per model, in the order first used
    assert sources[0] is sources[1] is sources[4] and sources[2] is sources[3]

    def by_layer(source):  # HeadMeans keeps its tensors in .values, resample's source is {layer: z}
        return source.values if method == "mean" else source

    want = by_layer(real(other, method, prompt, [0, 1], False))  # computed again, without the cache
    assert all(torch.equal(by_layer(sources[2])[layer], want[layer]) for layer in (0, 1))
    assert not all(torch.equal(by_layer(sources[0])[layer], want[layer]) for layer in (0, 1))  # tiny's differ


@pytest.mark.parametrize("method", ["mean", "resample"])
def test_a_model_that_cannot_be_weakly_referenced_gets_its_reference_activations_each_time(tiny, prompt, method,
                                                                                           monkeypatch):
    """The cache is keyed by weak references; for a model that cannot be weakly referenced (its lookups raise
    TypeError, as ``weakref`` does for such an object) the reference activations are computed at each use, the
    same values as a cached model gets, and nothing is kept."""
    from lensprobe.interventions import ablation as module

    class NoWeakReferences(dict):
        def get(self, key, default=None):
            raise TypeError(f"cannot create weak reference to {type(key).__name__!r} object")

        def __setitem__(self, key, value):
            raise TypeError(f"cannot create weak reference to {type(key).__name__!r} object")

    calls = []
    real = module.replacement_source

    def counted(model, *args):
        calls.append(model)
        return real(model, *args)

    cached = ablate_heads("L0H1,L1H2", method=method, reference=prompt)
    with lp.intervene(tiny, cached):
        want = tiny(prompt.tokens)
    monkeypatch.setattr(module, "replacement_source", counted)
    abl = ablate_heads("L0H1,L1H2", method=method, reference=prompt)
    vars(abl)["_cache"] = NoWeakReferences()
    for _ in range(2):
        with lp.intervene(tiny, abl):
            torch.testing.assert_close(tiny(prompt.tokens), want, rtol=0, atol=0)
    assert calls == [tiny, tiny] and not dict(vars(abl)["_cache"])
