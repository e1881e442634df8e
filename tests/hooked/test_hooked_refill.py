"""Continuous batching on a HookedTransformer (TransformerLens' own KV cache, its rows joined, kept
and trimmed by :mod:`lensprobe.generation.batching.cacherows`): every row equals its prompt run alone (the
static path, oracle-tested against the plain ``transformers`` twin in test_hooked_generation.py)
with greedy and seeded sampling and a head ablation on generated positions; no hook outlives the run."""

import pytest
import torch
from oracles import assert_rows_equal_solo, hook_snapshot

import lensprobe as lp
from lensprobe.generation.batching import cacherows

pytestmark = pytest.mark.hooked

# Five prompts of different lengths (the chat template adds the same system prompt to each), and
# per-prompt caps that differ, so rows end at different steps without EOS and others join.
TEXTS = (
    "What is 12+7?",
    "the cat sat on the mat and the dog sat on the cat",
    "x",
    "The quick brown fox jumps over the lazy dog. 0 1 2 3",
    "0 1 2",
)
CAPS = [5, 9, 3, 8, 6]
MAX_NEW = max(CAPS)
TOL = 1e-5


@pytest.fixture(scope="module")
def prompts(hooked):
    ps = [lp.build_prompt(hooked, t) for t in TEXTS]
    assert len({len(p) for p in ps}) == len(ps)  # every length differs: padding and trimming happen
    return ps


def refill(model, prompts, *, batch_size=2, **kw):
    """Continuous batching of ``prompts`` with :data:`CAPS`, no EOS stop."""
    out = lp.generate(model, prompts, max_new_tokens=MAX_NEW, batch_size=batch_size, caps=CAPS,
                      stop_at_eos=False, **kw)
    assert out.meta["batching"] == "continuous batching" and out.meta["batch_size"] == batch_size
    assert out.meta["engine"] == "hooked"
    return out


def test_greedy_rows_equal_their_prompts_alone(hooked, prompts, monkeypatch):
    calls = {"join": [], "drop": []}
    join, drop = cacherows.join, cacherows.drop_columns

    def spy_join(running, new):
        calls["join"].append((None if running is None else cacherows.width(running), cacherows.width(new)))
        return join(running, new)

    def spy_drop(cache, n):
        calls["drop"].append(n)
        return drop(cache, n)

    monkeypatch.setattr(cacherows, "join", spy_join)
    monkeypatch.setattr(cacherows, "drop_columns", spy_drop)
    out = refill(hooked, prompts)
    assert out.lengths == CAPS and out.finish_reasons == ["length"] * len(CAPS)
    assert out.prompt_index == list(range(len(prompts))) and out.prompt_lengths == [len(p) for p in prompts]
    # TransformerLens caches of different widths were joined, and columns dropped as long rows ended
    assert len(calls["join"]) == len(prompts) - 1  # each row after the first joins the running batch (never empty here)
    assert any(w is not None and w != v for w, v in calls["join"])
    assert calls["drop"] and all(n > 0 for n in calls["drop"])
    assert_rows_equal_solo(out, hooked, prompts, CAPS, engine_ran="hooked")


def test_rows_at_different_steps_share_a_decode_forward(hooked, prompts):
    log = []

    def spy(x, hook):
        info = hook.step
        log.append((x.shape[0], x.shape[1], info.steps.tolist(), info.prompt_lengths.tolist(),
                    info.positions[:, -1].tolist()))

    refill(hooked, prompts, interventions=[("blocks.0.hook_resid_pre", spy)])
    prefills = [e for e in log if e[1] > 1]
    decodes = [e for e in log if e[1] == 1]
    assert len(prefills) == len(prompts) and all(e[0] == 1 for e in prefills)  # each row prefilled alone
    assert all(1 <= e[0] <= 2 for e in decodes)
    assert any(len(set(e[2])) > 1 and len(set(e[3])) > 1 for e in decodes)
    for _, _, steps, lengths, last in decodes:  # each row's query at its own absolute position
        assert last == [n + s - 1 for n, s in zip(lengths, steps, strict=True)]


def test_seeded_samples_equal_their_prompts_alone(hooked, prompts):
    kw = dict(do_sample=True, seed=5, temperature=1.3, n_samples=2)
    out = refill(hooked, prompts, batch_size=3, **kw)
    n = len(prompts)
    assert out.prompt_index == [pi for pi in range(n) for _ in range(2)]
    assert out.sample_index == [0, 1] * n
    assert any(out.generated_ids[2 * pi] != out.generated_ids[2 * pi + 1] for pi in range(n))  # samples differ
    assert_rows_equal_solo(out, hooked, prompts, CAPS, engine_ran="hooked", **kw)


def test_head_ablation_on_generated_positions_equals_alone(hooked, prompts):
    """The ablation finds each row's generated positions from ``hook.step``: the rows of one
    decode step sit at different positions."""
    abl = lp.ablate_heads("L0H1", positions="generated")
    out = refill(hooked, prompts, interventions=[abl])
    assert_rows_equal_solo(out, hooked, prompts, CAPS, engine_ran="hooked", interventions=[abl])
    plain = refill(hooked, prompts)
    assert not torch.allclose(out.entropy_rows, plain.entropy_rows, atol=TOL, equal_nan=True)


def test_a_refill_run_leaves_the_hook_registry_as_it_found_it(hooked, prompts):
    before = hook_snapshot(hooked)
    during = []

    def spy(x, hook):
        during.append(hook_snapshot(hooked))

    abl = lp.ablate_heads("L1H0", positions="generated")
    out = refill(hooked, prompts, interventions=[abl, ("blocks.1.hook_resid_post", spy)])
    assert during and all(d != before for d in during)  # hooks were attached while it ran
    assert hook_snapshot(hooked) == before
    again = refill(hooked, prompts, interventions=[abl])
    assert again.generated_ids == out.generated_ids
    assert torch.allclose(again.entropy_rows, out.entropy_rows, atol=TOL, equal_nan=True)
    assert hook_snapshot(hooked) == before
