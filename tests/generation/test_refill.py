"""Continuous batching in ``lp.generate`` (``batch_size`` smaller than the rows, ``refill=True``):
every row's result equals running its prompt alone (the static path, itself oracle-tested
against plain transformers), with greedy and seeded sampling, per-row interventions (head
ablation by position, ARM, latent thinking, a per-row EOS), on both engines; rows land in
prompt order, ``on_row`` hears of each row once as it ends, ``hook.step`` publishes
each batch row's trace row, step and positions; caps, ``batch_size`` checks, error rows,
interrupts and the static fallback."""

import pytest
import torch
from oracles import Counter, assert_rows_equal_solo, assert_same_row, hook_snapshot, solo

import lensprobe as lp
from lensprobe.core.models.testing import tiny_model
from lensprobe.generation.batching import cacherows

# Six prompts of clearly different lengths (the chat template adds the same system prompt to
# each), and per-prompt length caps that differ, so rows end at different steps without EOS.
TEXTS = (
    "What is 12+7?",
    "the cat sat on the mat and the dog sat on the cat",
    "x",
    "The quick brown fox jumps over the lazy dog. A random sentence of real words. 0 1 2 3",
    "0 1 2",
    "Please reason step by step",
)
CAPS = [5, 9, 3, 12, 7, 4]
MAX_NEW = max(CAPS)
TOL = 1e-5
ENGINES = ["hf", "bridge"]


@pytest.fixture(scope="module")
def prompts(tiny):
    ps = [lp.build_prompt(tiny, t) for t in TEXTS]
    assert len({len(p) for p in ps}) == len(ps)  # every length differs: padding and trimming happen
    return ps


@pytest.fixture(scope="module")
def thinker():
    """A fresh tiny model (the ``tiny`` weights) with a ``<thinking>`` token, and prompts for it."""
    m = tiny_model(seed=0)
    lp.generation.add_thinking_token(m, "<thinking>")
    return m, [lp.build_prompt(m, t) for t in TEXTS]


def refill(model, prompts, *, batch_size=2, caps=CAPS, **kw):
    """Continuous batching of ``prompts`` with ``caps``, no EOS stop unless given."""
    kw.setdefault("stop_at_eos", False)
    out = lp.generate(model, prompts, max_new_tokens=MAX_NEW, batch_size=batch_size, caps=caps, **kw)
    assert out.meta["batching"] == "continuous batching" and out.meta["batch_size"] == batch_size
    return out


def step_log(log: list):
    """A hook that appends, per forward, what ``hook.step`` says and how many positions it sees."""
    def hook(x, hook):
        info = hook.step
        log.append({"rows": info.rows.tolist(), "steps": info.steps.tolist(), "step": info.step,
                    "positions": info.positions.tolist(), "lengths": info.prompt_lengths.tolist(),
                    "n_pos": x.shape[1]})

    return ("blocks.0.hook_resid_post", hook)


def finish_order(prompt_lengths: list[int], caps: list[int], batch_size: int) -> list[int]:
    """The order rows end under continuous batching, by hand: longest prompt first (ties by row),
    ``batch_size`` slots; each iteration fills free slots in queue order, then every live row
    makes one step and those at their cap end (in batch-row order) and free their slots."""
    queue = sorted(range(len(caps)), key=lambda r: -prompt_lengths[r])
    live, left, ended = [], {}, []
    while queue or live:
        while queue and len(live) < batch_size:
            r = queue.pop(0)
            live.append(r)
            left[r] = caps[r]
        for r in live:
            left[r] -= 1
        ended += [r for r in live if left[r] == 0]
        live = [r for r in live if left[r] > 0]
    return ended


# ----- each row equals its prompt alone ----------------------------------------------------------
@pytest.mark.parametrize("engine", ENGINES)
def test_greedy_rows_equal_their_prompts_alone(tiny, prompts, engine):
    out = refill(tiny, prompts, engine=engine)
    assert out.meta["engine"] == engine
    assert out.lengths == CAPS and out.finish_reasons == ["length"] * len(CAPS)
    assert out.prompt_index == list(range(len(prompts))) and out.prompt_lengths == [len(p) for p in prompts]
    assert_rows_equal_solo(out, tiny, prompts, CAPS, engine=engine)


def test_greedy_rows_equal_the_plain_transformers_twin(tiny, tiny_hf, prompts):
    """Not relying on lensprobe at all: the plain ``LlamaForCausalLM``'s own cached greedy loop."""
    out = refill(tiny, prompts, batch_size=3)
    for r, (p, cap) in enumerate(zip(prompts, CAPS, strict=True)):
        ids, ents = [], []
        with torch.inference_mode():
            step = tiny_hf(p.tokens, use_cache=True)
            for _ in range(cap):
                logits = step.logits[0, -1].double()
                prob = torch.softmax(logits, -1)
                ents.append(float(-(prob * prob.log()).sum()))
                ids.append(int(logits.argmax()))
                step = tiny_hf(torch.tensor([[ids[-1]]]), past_key_values=step.past_key_values, use_cache=True)
        assert out.generated_ids[r] == ids, r
        assert torch.allclose(out.entropy_rows[r, :cap].double(), torch.tensor(ents, dtype=torch.float64), atol=TOL), r


@pytest.mark.parametrize("engine", ENGINES)
def test_seeded_samples_equal_their_prompts_alone(tiny, prompts, engine):
    kw = dict(do_sample=True, seed=5, temperature=1.3, top_p=0.95, n_samples=2, engine=engine)
    out = refill(tiny, prompts, batch_size=3, **kw)
    n = len(prompts)
    assert out.prompt_index == [pi for pi in range(n) for _ in range(2)]
    assert out.sample_index == [0, 1] * n
    assert out.generated_ids[6] != out.generated_ids[7]  # two samples of one prompt differ
    assert_rows_equal_solo(out, tiny, prompts, CAPS, **kw)


@pytest.mark.parametrize("positions", ["generated", [3, 10, 30]], ids=["generated", "prompt"])
def test_head_ablation_by_position_applies_per_row(tiny, prompts, positions):
    """The ablation finds each row's absolute positions from ``hook.step``: under
    continuous batching the rows of one decode step sit at different positions."""
    abl = lp.ablate_heads("L0H1", positions=positions)
    out = refill(tiny, prompts, interventions=[abl])
    assert out.meta["engine"] == "bridge"
    assert_rows_equal_solo(out, tiny, prompts, CAPS, interventions=[abl])
    plain = refill(tiny, prompts)
    assert not torch.allclose(out.entropy_rows, plain.entropy_rows, atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize("engine", ENGINES)
def test_arm_per_row_draws_equal_their_prompts_alone(tiny, prompts, engine):
    """Each row's ARM statistics cover its own positions only (prefilled alone), and its draws come
    from its own seeded generator, as alone."""
    arm = lp.ARM(layer=0, c=0.5, percentile=90, seed=1, per_row=True)
    out = refill(tiny, prompts, interventions=[arm], engine=engine)
    assert out.meta["engine"] == engine
    assert_rows_equal_solo(out, tiny, prompts, CAPS, interventions=[arm], engine=engine)
    plain = refill(tiny, prompts, engine=engine)
    assert not torch.allclose(out.entropy_rows, plain.entropy_rows, atol=1e-4, equal_nan=True)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("kind", ["latent", "pause"])
def test_thinking_steps_equal_their_prompts_alone(thinker, engine, kind):
    """The schedule is asked per group of rows at one step, so rows at different steps think when
    they would alone; latent inputs come from each row's own final hidden state."""
    m, ps = thinker
    kw = (dict(thinking=lp.generation.LatentFusion(alpha=0.6, top_p=0.9), think_when=lp.generation.schedule.every(3)) if kind == "latent"
          else dict(thinking=lp.generation.Pause(), think_when=lp.generation.schedule.first(2)))
    out = refill(m, ps, engine=engine, **kw)
    assert out.meta["engine"] == engine
    think = out.thinking_rows
    for r, cap in enumerate(CAPS):
        want = [t % 3 == 2 for t in range(cap)] if kind == "latent" else [t < 2 for t in range(cap)]
        assert think[r, :cap].tolist() == want, r
    assert_rows_equal_solo(out, m, ps, CAPS, engine=engine, **kw)


def test_a_per_row_eos_ends_rows_as_alone(tiny, prompts):
    """An intervention that forces EOS by each row's own step (rows told apart by prompt length):
    rows end by EOS at different steps, are refilled, and each equals its prompt alone."""
    eos = tiny.tokenizer.eos_token_id
    at = {len(prompts[0]): 2, len(prompts[3]): 0, len(prompts[5]): 1}  # prompt length -> step of EOS

    def force(logits, hook):
        info = hook.step
        hit = [b for b in range(logits.shape[0])
               if at.get(int(info.prompt_lengths[b])) == int(info.steps[b])]
        if hit:
            logits = logits.clone()
            logits[hit, -1, eos] += 1e4
            return logits
        return None

    kw = dict(interventions=[("hook_unembed", force)], stop_at_eos=True)
    out = refill(tiny, prompts, **kw)
    assert [out.finish_reasons[r] for r in (0, 3, 5)] == ["eos"] * 3
    assert [out.lengths[r] for r in (0, 3, 5)] == [3, 1, 2]
    assert_rows_equal_solo(out, tiny, prompts, CAPS, **kw)


# ----- order, on_row, what hooks see ---------------------------------------------------------------
def test_rows_keep_prompt_order_whatever_the_schedule(tiny, prompts):
    kw = dict(do_sample=True, seed=3, n_samples=2)
    a = refill(tiny, prompts, batch_size=3, longest_first=True, **kw)
    b = refill(tiny, prompts, batch_size=3, longest_first=False, **kw)
    assert a.meta["longest_first"] is True and b.meta["longest_first"] is False
    assert a.generated_ids == b.generated_ids and a.texts == b.texts and a.finish_reasons == b.finish_reasons
    assert torch.allclose(a.entropy_rows, b.entropy_rows, atol=TOL, equal_nan=True)
    for t in (a, b):
        assert t.prompt_index == [pi for pi in range(len(prompts)) for _ in range(2)]
        assert t.sample_index == [0, 1] * len(prompts)
        assert t.prompt_lengths == [len(prompts[pi]) for pi in t.prompt_index]
    static = lp.generate(tiny, prompts, max_new_tokens=MAX_NEW, caps=CAPS, stop_at_eos=False, **kw)
    assert static.meta["batching"] == "static batches"
    assert static.generated_ids == a.generated_ids


def test_on_row_hears_each_row_once_as_it_ends(tiny, prompts):
    heard = []
    out = refill(tiny, prompts, on_row=heard.append, n_samples=1)
    assert sorted(f.row for f in heard) == list(range(len(prompts)))
    for f in heard:
        assert f.token_ids == out.generated_ids[f.row] and f.text == out.texts[f.row]
        assert f.finish_reason == out.finish_reasons[f.row] == "length" and f.error is None
        assert (f.prompt_index, f.sample_index) == (out.prompt_index[f.row], out.sample_index[f.row])
    assert [f.row for f in heard] == finish_order([len(p) for p in prompts], CAPS, 2)
    # one batch of every row: rows with shorter caps end first
    heard_static = []
    lp.generate(tiny, prompts, max_new_tokens=MAX_NEW, caps=CAPS, stop_at_eos=False, on_row=heard_static.append)
    assert [f.row for f in heard_static] == sorted(range(len(CAPS)), key=lambda r: CAPS[r])


def test_current_step_publishes_each_batch_rows_row_step_and_positions(tiny, prompts):
    """Prefills run one row alone over its whole prompt; decode forwards run the live rows, each
    at its own step, its query at position ``prompt_length + step - 1``; live rows change as rows
    end and others join; and per trace row, the positions a hook sees equal those of a solo run."""
    log = []
    out = refill(tiny, prompts, interventions=[step_log(log)])
    assert out.meta["engine"] == "bridge"
    lengths = [len(p) for p in prompts]
    prefills = [e for e in log if e["n_pos"] > 1]
    decodes = [e for e in log if e["n_pos"] == 1]
    assert sorted(e["rows"][0] for e in prefills) == list(range(len(prompts)))
    for e in prefills:
        r = e["rows"][0]
        assert e["steps"] == [0] and e["step"] == 0 and e["positions"] == [list(range(lengths[r]))]
        assert e["lengths"] == [lengths[r]]
    for e in decodes:
        assert 1 <= len(e["rows"]) <= 2 and e["step"] == max(e["steps"])
        assert e["lengths"] == [lengths[r] for r in e["rows"]]
        assert e["positions"] == [[lengths[r] + s - 1] for r, s in zip(e["rows"], e["steps"], strict=True)]
    assert len({tuple(e["rows"]) for e in decodes}) > 2  # the batch's rows change as rows are refilled
    assert any(len(set(e["steps"])) > 1 for e in decodes)  # rows at different steps share a forward
    for r, cap in enumerate(CAPS):  # each row: one prefill and cap - 1 decode forwards, steps in order
        assert [s for e in decodes for rr, s in zip(e["rows"], e["steps"], strict=True) if rr == r] == \
            list(range(1, cap))
    seen = {}
    for e in log:
        for rr, pos in zip(e["rows"], e["positions"], strict=True):
            seen.setdefault(rr, []).append(pos)
    for r, (p, cap) in enumerate(zip(prompts, CAPS, strict=True)):
        alone = []
        solo(tiny, p, cap, interventions=[step_log(alone)])
        assert seen[r] == [e["positions"][0] for e in alone], r


# ----- caps and batch_size ----------------------------------------------------------------------
def test_caps_set_each_prompts_length(tiny, prompts):
    out = refill(tiny, prompts, batch_size=3, n_samples=2, do_sample=True, seed=0)  # two samples: sampled
    assert out.lengths == [c for c in CAPS for _ in range(2)]
    assert out.finish_reasons == ["length"] * out.n_rows and out.meta["caps"] == CAPS  # per prompt, as given
    full = lp.generate(tiny, prompts, max_new_tokens=MAX_NEW, stop_at_eos=False, batch_size=3, n_samples=2,
                       do_sample=True, seed=0)
    for r in range(out.n_rows):  # a cap cuts the row short and changes nothing before it
        assert out.generated_ids[r] == full.generated_ids[r][: out.lengths[r]]


@pytest.mark.parametrize(("caps", "match"), [
    (CAPS[:-1], "caps has 5 entries for 6 prompts"),
    ([0, *CAPS[1:]], r"each cap must be an integer in 1..max_new_tokens \(12\), got 0"),
    ([MAX_NEW + 1, *CAPS[1:]], r"each cap must be an integer in 1..max_new_tokens \(12\), got 13"),
    ([True, *CAPS[1:]], r"each cap must be an integer in 1..max_new_tokens \(12\), got True"),
    ([2.0, *CAPS[1:]], r"each cap must be an integer in 1..max_new_tokens \(12\), got 2.0"),
])
@pytest.mark.unchecked  # bad values on purpose: beartype checks one list item at random, lensprobe checks all
def test_bad_caps_are_refused_before_any_forward(tiny, prompts, caps, match):
    count = Counter()
    with pytest.raises(lp.LensprobeError, match=match):
        lp.generate(tiny, prompts, max_new_tokens=MAX_NEW, caps=caps, batch_size=2,
                    interventions=[("hook_embed", count)])
    assert count.calls == 0


@pytest.mark.unchecked
@pytest.mark.parametrize("batch_size", [0, -1, True, 2.5])
def test_bad_batch_size_is_refused(tiny, prompts, batch_size):
    with pytest.raises(lp.LensprobeError, match=rf"batch_size must be an integer >= 1 .*got {batch_size!r}"):
        lp.generate(tiny, prompts, max_new_tokens=3, batch_size=batch_size)


def test_batch_size_above_the_rows_is_one_static_batch(tiny, prompts):
    big = lp.generate(tiny, prompts, max_new_tokens=MAX_NEW, caps=CAPS, stop_at_eos=False, batch_size=50)
    none = lp.generate(tiny, prompts, max_new_tokens=MAX_NEW, caps=CAPS, stop_at_eos=False)
    assert big.meta["batching"] == none.meta["batching"] == "static batches"
    assert big.meta["batch_size"] == len(prompts)
    assert big.generated_ids == none.generated_ids and big.finish_reasons == none.finish_reasons
    assert torch.equal(big.entropy_rows.isnan(), none.entropy_rows.isnan())
    assert torch.allclose(big.entropy_rows, none.entropy_rows, atol=TOL, equal_nan=True)


def test_static_batches_without_refill_equal_refill(tiny, prompts):
    kw = dict(max_new_tokens=MAX_NEW, caps=CAPS, stop_at_eos=False, batch_size=2)
    static = lp.generate(tiny, prompts, refill=False, **kw)
    assert static.meta["batching"] == "static batches"
    cont = lp.generate(tiny, prompts, **kw)
    assert static.generated_ids == cont.generated_ids
    assert torch.allclose(static.entropy_rows, cont.entropy_rows, atol=TOL, equal_nan=True)


def test_tracking_needs_every_row_in_one_batch(tiny, prompts):
    track = {"question": "question"}
    with pytest.raises(lp.LensprobeError, match=r"attention recording \(track=...\) runs every row in one batch"):
        lp.generate(tiny, prompts, max_new_tokens=4, track=track, batch_size=5)
    one = lp.generate(tiny, prompts, max_new_tokens=4, track=track, batch_size=6, stop_at_eos=False)
    ref = lp.generate(tiny, prompts, max_new_tokens=4, track=track, stop_at_eos=False)
    assert one.meta["batching"] == "static batches"
    assert one.generated_ids == ref.generated_ids
    assert torch.allclose(one.attention_rows["question"], ref.attention_rows["question"], atol=TOL)
    assert not torch.isnan(one.attention_rows["question"]).any()


# ----- faults ------------------------------------------------------------------------------------
def test_a_prompt_too_long_becomes_an_error_row(tiny, prompts):
    long_ids = [5] * (int(tiny.cfg.n_ctx) - MAX_NEW + 1)
    items = [*prompts[:2], long_ids, *prompts[3:]]
    count = Counter()
    with pytest.raises(lp.LensprobeError, match="exceeds the model's context of 256 tokens"):
        lp.generate(tiny, items, max_new_tokens=MAX_NEW, batch_size=2, interventions=[("hook_embed", count)])
    assert count.calls == 0  # refused before any forward
    heard = []
    out = lp.generate(tiny, items, max_new_tokens=MAX_NEW, batch_size=2, stop_at_eos=False, on_error="row",
                      on_row=heard.append)
    assert out.finish_reasons[2] == "error" and out.generated_ids[2] == [] and out.texts[2] == ""
    assert set(out.errors) == {2} and "exceeds the model's context of 256 tokens" in out.errors[2]
    assert torch.isnan(out.entropy_rows[2]).all()
    assert heard[0].row == 2 and heard[0].finish_reason == "error" and heard[0].error == out.errors[2]
    assert sorted(f.row for f in heard) == list(range(len(items)))
    for r in (0, 1, 3, 4, 5):
        assert_same_row(out, r, solo(tiny, prompts[r], MAX_NEW), 0)


BAD_ROW = 3


def prefill_bomb(row: int, error=torch.OutOfMemoryError):
    """A hook that raises ``error`` for one trace row's prompt forward (step 0) only."""
    def hook(x, hook):
        info = hook.step
        if info.step == 0 and row in info.rows.tolist():
            raise error(f"boom in the prefill of row {row}")

    return ("blocks.0.hook_resid_post", hook)


def test_a_failing_prefill_becomes_an_error_row(tiny, prompts):
    before = hook_snapshot(tiny)
    out = refill(tiny, prompts, interventions=[prefill_bomb(BAD_ROW)], on_error="row")
    assert out.finish_reasons[BAD_ROW] == "error" and out.generated_ids[BAD_ROW] == []
    assert set(out.errors) == {BAD_ROW}
    assert "OutOfMemoryError" in out.errors[BAD_ROW] and f"boom in the prefill of row {BAD_ROW}" in out.errors[BAD_ROW]
    for r, (p, cap) in enumerate(zip(prompts, CAPS, strict=True)):
        if r != BAD_ROW:
            assert_same_row(out, r, solo(tiny, p, cap, engine="bridge"), 0)
    with pytest.raises(torch.OutOfMemoryError, match=f"boom in the prefill of row {BAD_ROW}"):
        refill(tiny, prompts, interventions=[prefill_bomb(BAD_ROW)])
    # any other exception is a bug, not a row's fault: it stops the run even with on_error="row"
    with pytest.raises(ValueError, match=f"boom in the prefill of row {BAD_ROW}"):
        refill(tiny, prompts, interventions=[prefill_bomb(BAD_ROW, ValueError)], on_error="row")
    assert hook_snapshot(tiny) == before


def test_keyboard_interrupt_mid_generation_stops_and_leaves_no_hook(tiny, prompts):
    """A KeyboardInterrupt from a hook after two rows ended propagates; the rows reported before are
    intact; no hook is left on the model and a rerun works."""
    ref = refill(tiny, prompts)
    heard = []

    def interrupt(x, hook):
        if len(heard) >= 2:
            raise KeyboardInterrupt("stop after two rows")

    with torch.inference_mode():
        tiny(prompts[0].tokens)  # TransformerLens wires its own block hooks at the first forward
    before = hook_snapshot(tiny)
    with pytest.raises(KeyboardInterrupt, match="stop after two rows"):
        refill(tiny, prompts, interventions=[("blocks.0.hook_resid_post", interrupt)], on_row=heard.append)
    assert 2 <= len(heard) < len(prompts)  # the interrupt came at the first forward after the second row ended
    for f in heard:
        assert f.token_ids == ref.generated_ids[f.row] and f.text == ref.texts[f.row]
        assert f.finish_reason == "length" and len(f.token_ids) == CAPS[f.row]
    assert hook_snapshot(tiny) == before
    again = refill(tiny, prompts, interventions=[("blocks.0.hook_resid_post", lambda x, hook: None)])
    assert again.generated_ids == ref.generated_ids
    assert hook_snapshot(tiny) == before


def test_a_cache_that_cannot_take_rows_runs_static_batches(tiny, prompts, monkeypatch):
    ref = refill(tiny, prompts, do_sample=True, seed=2, n_samples=2, batch_size=3)
    monkeypatch.setattr(cacherows, "can_join", lambda cache: False)
    heard = []
    out = lp.generate(tiny, prompts, max_new_tokens=MAX_NEW, caps=CAPS, stop_at_eos=False, batch_size=3,
                      do_sample=True, seed=2, n_samples=2, on_row=heard.append)
    assert "static batches" in out.meta["batching"] and "DynamicCache" in out.meta["batching"]
    assert out.generated_ids == ref.generated_ids and out.finish_reasons == ref.finish_reasons
    assert torch.allclose(out.entropy_rows, ref.entropy_rows, atol=TOL, equal_nan=True)
    assert sorted(f.row for f in heard) == list(range(out.n_rows))


def test_fallback_with_per_row_interventions_equals_refill(tiny, prompts, monkeypatch):
    """The fallback decides after the first row's prefill, then runs that row again in a static
    batch: per-row state (ARM's generators) must not carry the discarded prefill's draws."""
    arm = lp.ARM(layer=0, c=0.5, percentile=90, seed=1, per_row=True)
    kw = dict(max_new_tokens=MAX_NEW, stop_at_eos=False, interventions=[arm], engine="bridge")
    same = [prompts[0]] * 4  # one length: static batches have no padding, so only the draws can differ
    ref = lp.generate(tiny, same, batch_size=2, **kw)
    assert ref.meta["batching"] == "continuous batching"
    monkeypatch.setattr(cacherows, "can_join", lambda cache: False)
    out = lp.generate(tiny, same, batch_size=2, **kw)
    assert "static batches" in out.meta["batching"]
    assert out.generated_ids == ref.generated_ids
    assert torch.allclose(out.entropy_rows, ref.entropy_rows, atol=TOL)


def test_embedded_model_refill_equals_plain_transformers_alone(smol, smol_hf):
    """SmolLM2 (GQA: 9 query heads on 3 KV heads), five MATH-style prompts of different lengths,
    two live rows: every row's greedy tokens equal plain ``transformers``' cached loop on that
    prompt alone; with a head ablated on generated positions, they equal the solo run."""
    texts = ["What is 2+2?", "Compute 17 * 23. Show your work step by step and box the answer.",
             "Let $x$ satisfy $3x - 7 = 11$. Find $x$.", "Hi", "The sum of two numbers is 10 and their "
             "difference is 4. What is the larger number? Explain each step before you answer it."]
    ps = [lp.build_prompt(smol, t) for t in texts]
    caps = [9, 4, 12, 6, 8]
    out = lp.generate(smol, ps, max_new_tokens=max(caps), caps=caps, batch_size=2, stop_at_eos=False)
    assert out.meta["batching"] == "continuous batching"
    for r, (p, cap) in enumerate(zip(ps, caps, strict=True)):
        ids = []
        with torch.inference_mode():
            step = smol_hf(p.tokens, use_cache=True)
            for _ in range(cap):
                ids.append(int(step.logits[0, -1].argmax()))
                step = smol_hf(torch.tensor([[ids[-1]]]), past_key_values=step.past_key_values, use_cache=True)
        assert out.generated_ids[r] == ids, r
    ablation = lp.ablate_heads("L5H4,L12H0", positions="generated")
    cut = lp.generate(smol, ps, max_new_tokens=max(caps), caps=caps, batch_size=2, stop_at_eos=False,
                      interventions=[ablation])
    for r, (p, cap) in enumerate(zip(ps, caps, strict=True)):
        alone = lp.generate(smol, p, max_new_tokens=cap, stop_at_eos=False, interventions=[ablation])
        assert cut.generated_ids[r] == alone.generated_ids[0], r
        assert torch.allclose(cut.entropy_rows[r, :cap], alone.entropy_rows[0, :cap], atol=1e-4), r
    assert not torch.allclose(cut.entropy_rows.nan_to_num(), out.entropy_rows.nan_to_num(), atol=1e-3)  # it acted
