"""Batch-proof interventions and the generation loop's edge cases: ARM's per-row default gives each
row what it gets alone (any batch size, refill order, engine; padding left out of its statistics),
a batch-dependent intervention turns continuous batching off and says so, caps count in position
checks, the static fallback finishes live rows, tokenizer-free models generate, a freed slot is
refilled before the next decode forward, failures while joining rows become error rows, hooks learn
``prefill`` from the step context and refuse activations they cannot place."""

import numpy as np
import pytest
import torch
from oracles import assert_rows_equal_solo, assert_same_row, solo

import lensprobe as lp
from lensprobe.core.hooks.attach import StepContext, Steps, batch_dependent, with_default_seed
from lensprobe.core.models.testing import tiny_model
from lensprobe.generation.batching import cacherows
from lensprobe.interventions.arm import BatchDependenceWarning

TEXTS = ("What is 12+7?", "the cat sat on the mat and the dog sat on the cat", "x", "0 1 2 3 4 5 6 7",
         "Please reason step by step", "a b")
CAPS = [5, 9, 3, 8, 6, 4]
MAX_NEW = max(CAPS)
ARM_SEEDED = dict(layer=0, c=0.5, percentile=90, seed=3)


@pytest.fixture(scope="module")
def prompts(tiny):
    ps = [lp.build_prompt(tiny, t) for t in TEXTS]
    assert len({len(p) for p in ps}) == len(ps)
    return ps


def run(model, prompts, **kw):
    kw.setdefault("stop_at_eos", False)
    kw.setdefault("caps", CAPS[:len(prompts)])
    return lp.generate(model, prompts, max_new_tokens=MAX_NEW, **kw)


def step_log(log: list):
    """A hook recording, per forward, ``prefill``, the rows and their steps."""
    def hook(x, hook):
        info = hook.step
        log.append({"prefill": info.prefill, "rows": info.rows.tolist(), "steps": info.steps.tolist(),
                    "n_pos": x.shape[1]})

    return ("blocks.0.hook_resid_post", hook)


# ----- ARM is batch-proof by default --------------------------------------------------------------
def test_arm_defaults_to_per_row_and_declares_its_capabilities():
    arm = lp.ARM(c=0.1, percentile=95)
    assert arm.per_row and not arm.capabilities.batch_dependent and lp.ARM.preset("Qwen/Qwen2.5-Math-7B").per_row
    whole = lp.ARM(c=0.1, percentile=95, per_row=False)
    assert whole.capabilities.batch_dependent and batch_dependent([arm, whole, ("x", print)]) == [whole]
    assert arm.capabilities == lp.interventions.Capabilities(rounding_sensitive_layer=0, seeded=True)
    seeded = with_default_seed([arm, lp.ARM(c=0.1, percentile=95, seed=7), ("x", print)], 5)
    assert [getattr(i, "seed", None) for i in seeded] == [5, 7, None]


@pytest.mark.parametrize("engine", ["hf", "bridge"])
@pytest.mark.parametrize("longest_first", [True, False])
def test_default_arm_rows_equal_their_prompts_alone_under_any_batch_size(tiny, prompts, engine, longest_first):
    """Seeded sampling and a seeded default ARM: each (prompt, sample) row equals its prompt run alone,
    under continuous batching at several batch sizes and both refill orders."""
    arm = lp.ARM(**ARM_SEEDED)
    kw = dict(do_sample=True, seed=1, n_samples=2, interventions=[arm], engine=engine)
    for batch_size in (2, 5):
        out = run(tiny, prompts, batch_size=batch_size, longest_first=longest_first, **kw)
        assert out.meta["batching"] == "continuous batching" and out.meta["engine"] == engine
        assert_rows_equal_solo(out, tiny, prompts, CAPS, **kw)
    plain = run(tiny, prompts, batch_size=2, do_sample=True, seed=1, n_samples=2, engine=engine)
    assert plain.generated_ids != out.generated_ids  # ARM changed something


def test_default_arm_leaves_padding_out_of_a_static_batchs_statistics(tiny, prompts):
    """One left-padded static batch of prompts of different lengths: with per-row statistics over
    each row's own positions, every row equals its prompt alone; over the whole batch they do not."""
    arm = lp.ARM(**ARM_SEEDED)
    out = run(tiny, prompts, interventions=[arm], engine="bridge")
    assert out.meta["batching"] == "static batches"
    assert_rows_equal_solo(out, tiny, prompts, CAPS, interventions=[arm], engine="bridge")
    whole = lp.ARM(**ARM_SEEDED, per_row=False)
    with pytest.warns(BatchDependenceWarning, match="per_row=False"):
        pooled = run(tiny, prompts, interventions=[whole], engine="bridge")
    alone = [solo(tiny, p, c, interventions=[whole], engine="bridge") for p, c in zip(prompts, CAPS, strict=True)]
    assert any(pooled.generated_ids[r] != alone[r].generated_ids[0] for r in range(len(prompts)))


def test_a_batch_dependent_intervention_runs_static_batches_and_warns_once(tiny, prompts):
    whole = lp.ARM(**ARM_SEEDED, per_row=False)
    with pytest.warns(BatchDependenceWarning) as caught:
        out = run(tiny, prompts, batch_size=2, interventions=[whole])
    assert len([w for w in caught if issubclass(w.category, BatchDependenceWarning)]) == 1
    assert out.meta["batching"].startswith("static batches (ARM depends on the batch")
    # static batches of two rows, longest prompts first: the first batch is those two rows run together
    pair = sorted(range(len(prompts)), key=lambda r: -len(prompts[r]))[:2]
    with pytest.warns(BatchDependenceWarning):
        ref = run(tiny, [prompts[r] for r in pair], caps=[CAPS[r] for r in pair], interventions=[whole])
    for j, r in enumerate(pair):
        assert_same_row(out, r, ref, j)


def test_one_row_forwards_do_not_warn(tiny, prompts):
    out = run(tiny, prompts[:1], interventions=[lp.ARM(**ARM_SEEDED, per_row=False)])  # no warning: one row
    assert out.finish_reasons == ["length"]


# ----- the step context ------------------------------------------------------------------------
@pytest.mark.parametrize("batch_size", [None, 2])
def test_prefill_is_a_field_of_the_step_context(tiny, prompts, batch_size):
    log = []
    run(tiny, prompts, batch_size=batch_size, interventions=[step_log(log)])
    prefills = [e for e in log if e["prefill"]]
    assert all(e["n_pos"] > 1 and set(e["steps"]) == {0} for e in prefills)
    assert all(not e["prefill"] and e["n_pos"] == 1 and 0 not in e["steps"] for e in log if e not in prefills)
    assert sorted(r for e in prefills for r in e["rows"]) == list(range(len(prompts)))


def test_a_position_hook_refuses_an_activation_the_step_does_not_describe(tiny, prompts):
    abl = lp.ablate_heads("L0H1", positions=[2])
    tokens = prompts[0].tokens
    steps = Steps()
    steps.publish(StepContext(0, torch.arange(tokens.shape[1] + 4)[None], torch.tensor([tokens.shape[1] + 4])))
    with lp.intervene(tiny, abl, steps=steps), torch.inference_mode():
        with pytest.raises(lp.LensprobeError, match="cannot be placed"):
            tiny(tokens)


# ----- continuous batching: slots, caps, fallback, failures --------------------------------------
def test_a_freed_slot_is_refilled_before_the_next_decode_forward(tiny):
    """Ten jobs, three slots: while jobs wait, every decode forward runs three rows."""
    ps = [[5 + i] * (3 + i) for i in range(10)]
    caps = [2, 5, 3, 7, 2, 4, 6, 3, 2, 5]
    log = []
    out = run(tiny, ps, caps=caps, batch_size=3, interventions=[step_log(log)])
    assert out.lengths == caps
    started = 0
    for e in log:
        if e["prefill"]:
            started += 1
        elif started < len(ps):
            assert len(e["rows"]) == 3, e
    assert_rows_equal_solo(out, tiny, ps, caps)


def test_caps_count_in_the_position_check(tiny):
    p10, p1 = list(range(5, 15)), [7]
    abl = lp.ablate_heads("all", positions=[40])
    with pytest.raises(lp.LensprobeError, match="40"):
        lp.generate(tiny, [p10, p1], max_new_tokens=50, caps=[2, 2], interventions=[abl])
    with pytest.raises(lp.LensprobeError, match="40"):
        lp.generate(tiny, [p10], max_new_tokens=2, interventions=[abl])
    ok = lp.generate(tiny, [p10, p1], max_new_tokens=50, caps=[31, 2], interventions=[abl])  # p10 reaches 41
    assert ok.lengths[0] <= 31


def test_numpy_caps_are_integers_and_meta_caps_are_per_prompt(tiny, prompts):
    ref = run(tiny, prompts[:3], batch_size=2, caps=[5, 9, 3])
    for caps in (np.array([5, 9, 3]), [np.int64(5), np.int32(9), 3]):
        out = run(tiny, prompts[:3], batch_size=2, caps=caps, n_samples=2, do_sample=True, seed=0)
        assert out.meta["caps"] == [5, 9, 3] and out.lengths == [5, 5, 9, 9, 3, 3]
    assert ref.generated_ids == run(tiny, prompts[:3], batch_size=2, caps=np.array([5, 9, 3])).generated_ids


def test_an_empty_prompt_is_named(tiny):
    with pytest.raises(lp.LensprobeError, match="a prompt is empty"):
        lp.generate(tiny, [[1, 2], []], max_new_tokens=3)


def test_the_static_fallback_finishes_and_reports_the_live_rows(tiny, prompts, monkeypatch):
    """A cache that stops being joinable while rows are live: those rows run to their end and are
    reported; the queue then runs as static batches; every row equals its prompt alone."""
    joinable = cacherows.can_join
    seen = []

    def third_refuses(cache):
        seen.append(1)
        return joinable(cache) and len(seen) < 3

    monkeypatch.setattr(cacherows, "can_join", third_refuses)
    heard = []
    out = run(tiny, prompts, batch_size=2, on_row=heard.append)
    assert "static batches" in out.meta["batching"] and "cannot take rows" in out.meta["batching"]
    assert sorted(f.row for f in heard) == list(range(len(prompts))) and len(heard) == len(prompts)
    assert out.lengths == CAPS and out.finish_reasons == ["length"] * len(prompts)
    monkeypatch.setattr(cacherows, "can_join", joinable)
    assert_rows_equal_solo(out, tiny, prompts, CAPS)


@pytest.mark.parametrize("where", ["join", "keep_rows"])
def test_running_out_of_memory_while_moving_rows_makes_error_rows(tiny, prompts, monkeypatch, where):
    real = getattr(cacherows, where)
    calls = []

    def second_fails(*args):
        calls.append(1)
        if len(calls) == 2:
            raise torch.OutOfMemoryError(f"boom in {where}")
        return real(*args)

    monkeypatch.setattr(cacherows, where, second_fails)
    out = run(tiny, prompts, batch_size=2, on_error="row")
    bad = [r for r, f in enumerate(out.finish_reasons) if f == "error"]
    assert bad and all(f"boom in {where}" in out.errors[r] for r in bad)
    good = [r for r in range(len(prompts)) if r not in bad]
    assert len(good) >= len(prompts) - 2
    monkeypatch.setattr(cacherows, where, real)
    for r in good:
        assert_same_row(out, r, solo(tiny, prompts[r], CAPS[r]), 0)
    calls.clear()
    monkeypatch.setattr(cacherows, where, second_fails)
    with pytest.raises(torch.OutOfMemoryError, match=f"boom in {where}"):
        run(tiny, prompts, batch_size=2)


# ----- models without a tokenizer --------------------------------------------------------------
@pytest.fixture(scope="module")
def no_tokenizer():
    m = tiny_model(seed=0)
    m.tokenizer = None
    return m


def test_a_model_without_a_tokenizer_generates_from_token_ids(no_tokenizer, tiny, tiny_hf):
    ids = [[5, 9, 2, 40], [7, 7], [300, 1, 2]]
    out = lp.generate(no_tokenizer, ids, max_new_tokens=6, batch_size=2)
    assert out.finish_reasons == ["length"] * 3 and out.texts == ["", "", ""]
    for r, p in enumerate(ids):  # greedy tokens as plain transformers' generate on the same weights
        want = tiny_hf.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False, eos_token_id=None,
                                pad_token_id=0)[0, len(p):].tolist()
        assert out.generated_ids[r] == want
    stop = out.generated_ids[0][2]  # EOS only where the call names one
    named = lp.generate(no_tokenizer, ids[:1], max_new_tokens=6, eos_token_id=stop)
    assert named.generated_ids[0] == out.generated_ids[0][:3] and named.finish_reasons == ["eos"]
    trace = lp.trace_generation(no_tokenizer, ids[0], max_new_tokens=4)
    assert trace.generated_ids[0] == out.generated_ids[0][:4]
    with pytest.raises(lp.LensprobeError, match="thinking tokens need a tokenizer"):
        lp.generate(no_tokenizer, ids[0], max_new_tokens=3, thinking=lp.generation.Pause())


@pytest.mark.unchecked
@pytest.mark.parametrize("bad", [-1, (), (3, "x"), 2.5])
def test_bad_eos_ids_are_refused(bad):
    with pytest.raises(lp.LensprobeError, match="eos_token_id"):
        lp.GenerationConfig(max_new_tokens=3, eos_token_id=bad)


def test_latent_inputs_reach_the_embedding_through_the_step_context():
    """Thinking steps publish their latent vectors as ``inputs`` of the step context, and the input
    embedding of those rows' newest position holds exactly them (no other channel)."""
    m = tiny_model(seed=0)
    lp.generation.add_thinking_token(m, "<thinking>")
    prompts = [lp.build_prompt(m, t) for t in TEXTS[:3]]
    seen = []

    def after_embed(x, hook):
        ctx = hook.step
        if ctx.inputs is not None:
            rows, vectors = ctx.inputs
            seen.append((ctx.rows[rows].tolist(), torch.equal(x[rows, -1], vectors.to(x.dtype))))

    out = lp.generate(m, prompts, max_new_tokens=6, stop_at_eos=False, batch_size=2, engine="bridge",
                      thinking=lp.generation.LatentFusion(), think_when=lp.generation.schedule.every(2),
                      interventions=[("hook_embed", after_embed)])
    assert seen and all(same for _, same in seen)
    thinking_steps = int(out.thinking_rows.sum())
    assert sum(len(rows) for rows, _ in seen) == thinking_steps - int(out.thinking_rows[:, -1].sum())
