"""KV-cached generation with interventions, latent thinking steps and per-step recording.

:func:`generate` is lensprobe's one generation loop (evaluations, traces and the CLI all
use it); :func:`trace_generation` is the same loop with attention recording switched on
for the tracked sets. This module checks their inputs before any forward and builds the trace; a
:class:`~lensprobe.generation.run.Run` runs the rows (its parts: :mod:`~lensprobe.generation.batching.scheduler`,
:mod:`~lensprobe.generation.step`, :mod:`~lensprobe.generation.batching.rowstate`). The loop:

- left-pads several prompts (or ``n_samples`` copies of each) into one batch with an
  attention mask and per-row position ids, so each row computes what it would alone; or,
  with ``batch_size``, keeps that many rows live and **refills** a finished row's place with
  the next prompt (continuous batching, :mod:`lensprobe.generation.run`);
- runs the prompt once, then **one forward per step over only the new position**, reusing
  the model's KV cache;
- attaches the caller's interventions (anything :func:`lensprobe.intervene` accepts) for
  the whole generation: hooks see ``[batch, pos, ...]`` activations where ``pos`` is the
  whole (padded) prompt at the first forward and the one new position afterwards (see
  ``hook.step``, the :class:`~lensprobe.core.hooks.hookpoint.StepContext` every hook receives, for the
  absolute positions);
- records, inside the attention hooks, only the newest query's attention summed over each
  tracked set: a ``[batch, set, head]`` value per layer and step. Memory grows as
  steps x layers x heads x sets, never with steps x sequence length;
- replaces the input embedding at thinking positions (:mod:`lensprobe.generation.thinking.latent`) at
  ``hook_embed``, for the new position only.

**Step 0 is the last prompt position** (its query predicts the first generated token).

**Non-finite logits end a row.** A row whose logits at a step hold a NaN or ``+inf``, or only
``-inf`` (:func:`lensprobe.core.measures.metrics.nonfinite_rows`), stops there with
``finish_reason="nonfinite"``: no token, entropy NaN, and one warning naming the step and rows.
A broken run never looks like a confident one.

Tracked sets (``track={name: spec}``), resolved before anything runs:

- a prompt segment name (``"system"``, ``"question"``, ...; needs :class:`Prompt` inputs);
- ``"prompt"`` (every prompt token), ``"generated"`` (every generated position, the newest
  included), ``"thinking"`` (positions holding the thinking token plus every thinking step);
- a token string that is one token (``"<thinking>"``), or a token id: every position holding
  it, prompt and generated, so the set grows during generation;
- a callable ``fn(position, token_id) -> bool``, called once per position of each row
  (``position`` counts from the row's first prompt token; generated positions continue
  after the prompt).

Example:
    >>> import lensprobe as lp
    >>> model = lp.load_model()
    >>> p = lp.build_prompt(model, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT)
    >>> out = lp.generate(model, [p, p], max_new_tokens=32)
    >>> out.texts
    >>> trace = lp.trace_generation(model, p, max_new_tokens=64, track={"system": "system"})
    >>> trace.attention["system"].shape  # [step, layer, head]
"""
import contextlib
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, SupportsIndex

import torch
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import (
    ActivationRecorder,
    AttentionRecorder,
    HookSite,
    StepContext,
    check_positions,
)
from lensprobe.core.hooks.forward import as_prompts, as_tokens, outside_vocabulary
from lensprobe.core.models.facts import ModelFacts, model_facts
from lensprobe.core.models.loading import check_layers
from lensprobe.core.prompts.prompt import Prompt
from lensprobe.core.storage.jsonable import describe_setting
from lensprobe.generation.config import GenerationConfig, check_end_ids, generation_config
from lensprobe.generation.engines import ENGINE_NAMES, EngineName
from lensprobe.generation.lens import logit_lens
from lensprobe.generation.rows import FinishedRow, row_text
from lensprobe.generation.run import Run
from lensprobe.generation.thinking.latent import LatentFusion, Pause, thinking_token_id
from lensprobe.generation.thinking.schedule import Rule
from lensprobe.generation.traces.activations import (
    ActivationSteps,
    as_records,
    kept_prompt_positions,
    ran_steps,
    resolve_names,
)
from lensprobe.generation.traces.trace import GenerationTrace
from lensprobe.generation.traces.tracking import SPECIAL_SETS, TrackSpec, resolve_track

__all__ = ["SPECIAL_SETS", "FinishedRow", "HookSite", "StepContext", "generate", "trace_generation"]


# ----- the public functions ---------------------------------------------------------------
def generate(model, prompts, config: GenerationConfig | None = None, *, interventions: Sequence = (),
             track: Mapping[str, TrackSpec] | Sequence[TrackSpec] | None = None,
             layers: Sequence[int] | int | None = None, progress: bool | str = False,
             engine: EngineName = "auto", batch_size: int | None = None, refill: bool = True,
             longest_first: bool = True, caps: Iterable[SupportsIndex] | None = None,
             on_row: Callable[[FinishedRow], Any] | None = None,
             on_error: Literal["raise", "row"] = "raise", facts: ModelFacts | None = None,
             record=None, lens: str | Callable | None = None, lens_top_k: int = 5,
             lens_layers: Sequence[int] | int | None = None, **settings) -> GenerationTrace:
    """Generate from one or several prompts with a KV cache; record entropy (and attention if asked).

    Args:
        model: a TransformerLens model with a KV cache: a ``TransformerBridge``, or a 3.x
            ``HookedTransformer`` (run on its own hook points and KV cache, engine ``"hooked"``).
        prompts: a :class:`Prompt`, token ids (list or 1-D tensor), or a list of those
            (different lengths are left-padded), or a ``[batch, pos]`` tensor.
        config: a :class:`~lensprobe.GenerationConfig` (length, sampling, seed, samples per
            prompt, stop rule, thinking input and schedule).
        interventions: attached with :func:`lensprobe.intervene` for the whole generation.
        track: tracked sets ``{name: spec}`` (see the module docstring), or ``None`` for no
            attention recording (cheapest).
        layers: layers to record attention at (default: all).
        progress: show a progress bar with tokens per second (a string: the bar's label).
        engine: which modules run the forwards (:mod:`lensprobe.generation.engines`).
            ``"bridge"``: the TransformerLens model, hook points and all. ``"hf"``: the same
            weights through the unwrapped Hugging Face modules, about 1.3x faster per step
            on a CPU; recording works the same, and it takes only interventions that edit
            ``hook_embed`` or a gated MLP's activations (such as :class:`~lensprobe.ARM`). It runs fused
            sdpa attention (see below for how its numbers differ from the bridge's); when
            attention is recorded, each layer also computes the newest query's attention row
            from the cached keys (checked against eager attention when the view is built).
            On a small model, decode steps with few rows run the decoder layers on one
            thread (faster on a CPU; :data:`lensprobe.generation.engines.threads.ONE_THREAD_LAYER_BYTES`);
            ``trace.meta["decode_threads"]`` records the count. ``"auto"`` (default):
            ``"hf"`` when no hooks are attached to the model and every intervention can run
            there, else ``"bridge"``. The two differ in their attention kernel only (fused sdpa
            against eager), so without ARM their entropies and attention agree up to float
            rounding (within 1e-5 nats on the prompts measured, with the same tokens; tested);
            :class:`~lensprobe.ARM` ranks near-zero activations, and that rounding can move
            which of them gets which random draw: entropies then differ by more (up to 5.6e-2
            nats on the embedded model, and greedy tokens parted on 1 of 8 prompts;
            ``docs/numerics.md``). ``trace.meta["engine"]`` says which ran, and an evaluation
            records it in ``config.json`` and in every row.
        batch_size: rows (prompt x sample) live at once; ``None`` (default): every row in one
            batch. With fewer than the rows, finished rows are refilled from the queue
            (continuous batching, see :mod:`lensprobe.generation.run`): each row gives what it
            gives alone. A value above the row count means every row; below 1 is refused.
            Attention recording (``track``) runs every row in one batch, so it takes no
            smaller ``batch_size`` (trace many prompts with :func:`lensprobe.generation.trace_prompts`).
        refill: ``False`` runs static batches of ``batch_size`` rows instead, each stepping
            until its longest row ends (for comparison; slower when lengths differ).
        longest_first: schedule the longest prompts first (results keep the row order).
        caps: per prompt, its own length cap (``1 .. max_new_tokens``): its rows stop there
            with ``finish_reason="length"``.
        on_row: called with a :class:`~lensprobe.generation.rows.FinishedRow` as soon as each
            row has ended (in the order rows end); an exception it raises stops the generation.
        on_error: ``"raise"`` (default): a bad row (a prompt + ``max_new_tokens`` beyond the
            context, a token outside the vocabulary) raises before any forward.
            ``"row"``: such a row, or one whose prompt forward fails with a
            :class:`LensprobeError` or runs out of memory (under continuous batching, also
            the live rows of a decode step that fails so), gets ``finish_reason="error"`` and
            its message in ``trace.errors``, and the others go on. Any other exception (a bug
            in an intervention, say) and a ``KeyboardInterrupt`` stop the generation (rows
            already reported to ``on_row`` stay reported; hooks are removed).
        facts: the model's facts (:func:`~lensprobe.core.models.facts.model_facts`: tokenizer, context
            length, vocabulary, end ids, device), when the caller has read them once for a run, as
            :func:`lensprobe.evaluate` does for all its generations; ``None`` (default): read here.
        record: activations to keep at every step, at each row's newest position: hook names or
            patterns (``"blocks.*.hook_resid_post"``), a :class:`~lensprobe.Record` (with ``reduce=``
            applied inside the hook, and prompt positions kept once), or a list of those; the trace's
            ``activations_rows[name]`` is ``[row, step, ...]`` (:mod:`lensprobe.generation.traces.activations`).
            The plain engine serves ``hook_resid_pre``/``hook_resid_post``; other hook points run on the bridge.
        lens: the logit lens at every step (:mod:`lensprobe.generation.lens`): ``"logit"`` (each layer's
            residual stream through the model's own final norm and unembedding), a translator
            ``fn(layer, resid) -> resid`` applied before the final norm (a tuned lens, e.g.
            :class:`~lensprobe.generation.lens.AffineLens`), or ``None`` (default): ``trace.lens``.
        lens_top_k: tokens the lens keeps per row, step and layer (default 5).
        lens_layers: layers the lens reads (default: all).
        **settings: :class:`~lensprobe.GenerationConfig` fields as keywords
            (``max_new_tokens=64, do_sample=True, seed=0, n_samples=4, thinking=...,
            think_when=...``); they override ``config``'s. ``max_new_tokens`` is required
            when no ``config`` is given.

    Returns:
        A :class:`~lensprobe.generation.GenerationTrace` (``texts`` and ``generated_ids`` per row, rows
        prompt by prompt whatever the schedule). A row whose step logits hold a NaN or ``+inf``
        (or only ``-inf``) stops at that step with ``finish_reason="nonfinite"`` (token -1,
        entropy NaN), and one ``RuntimeWarning`` names the step and rows; the other rows go on
        unaffected.

    Raises:
        LensprobeError: bad settings, an unknown tracked set, a thinking token missing from
            the vocabulary, or (with ``on_error="raise"``) a generation longer than the
            context, all before any forward.

    Example:
        >>> out = lp.generate(model, [p1, p2], max_new_tokens=256, do_sample=True, seed=0, n_samples=4)
        >>> out.texts[0]
        >>> out = lp.generate(model, prompts, max_new_tokens=512, batch_size=8)  # continuous batching
    """
    cfg = generation_config(config, settings)
    if engine not in ENGINE_NAMES:
        raise LensprobeError(f"engine must be 'auto', 'bridge' or 'hf', got {engine!r}.")
    if on_error not in ("raise", "row"):
        raise LensprobeError(f"on_error must be 'raise' or 'row', got {on_error!r}.")
    if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1):
        raise LensprobeError(f"batch_size must be an integer >= 1 (rows live at once) or None (all rows), "
                             f"got {batch_size!r}.")
    interventions = _as_interventions(interventions)
    facts = facts if facts is not None else model_facts(model)
    check_end_ids(cfg, facts)
    items = _as_prompt_list(facts, prompts)
    prompt_caps = _caps(caps, len(items), cfg.max_new_tokens)
    rows = [(pi, j) for pi in range(len(items)) for j in range(cfg.n_samples)]
    bad = _row_problems(facts, items, prompt_caps)
    if bad and on_error == "raise":
        raise LensprobeError(next(iter(bad.values())))
    failed = {r: bad[pi] for r, (pi, _) in enumerate(rows) if pi in bad}
    reach = [len(ids) + prompt_caps[pi] for pi, (ids, _) in enumerate(items) if pi not in bad]
    if reach:
        check_positions(interventions, max(reach), "prompt + max_new_tokens" if caps is None else "prompt + cap")
    think_id = _thinking_id(facts, cfg.thinking, track)
    sets = resolve_track(facts, track, items, think_id, cfg.thinking is not None)
    if sets and batch_size is not None and batch_size < len(rows) - len(failed):
        raise LensprobeError(
            f"attention recording (track=...) runs every row in one batch, but batch_size={batch_size} is smaller "
            f"than the {len(rows) - len(failed)} rows: leave batch_size unset, or trace the prompts one by one "
            "with lp.generation.trace_prompts."
        )
    rec_layers = check_layers(model, layers) if sets else []
    wanted = resolve_names(model, as_records(record))
    acts = (ActivationSteps(wanted, len(rows), cfg.max_new_tokens, kept_prompt_positions(wanted, items, rows))
            if wanted else None)
    lens_rec = logit_lens(model, lens, lens_top_k, lens_layers, len(rows), cfg.max_new_tokens)
    run = Run(model, cfg, items, rows, prompt_caps, failed, interventions, sets, rec_layers,
              think_id, batch_size, refill, longest_first, on_row, keep_going=on_error == "row", facts=facts,
              acts=acts, lens=lens_rec)
    with torch.inference_mode():
        ran = run.execute(engine, progress)
    return _trace(model, cfg, run, ran.describe(), think_id, track, interventions, caps is not None)


def trace_generation(model, prompt, config: GenerationConfig | None = None, *,
                     track: Mapping[str, TrackSpec] | Sequence[TrackSpec] | None = None,
                     interventions: Sequence = (), layers: Sequence[int] | int | None = None,
                     progress: bool | str = False, engine: EngineName = "auto", facts: ModelFacts | None = None,
                     record=None, lens: str | Callable | None = None, lens_top_k: int = 5,
                     lens_layers: Sequence[int] | int | None = None, **settings) -> GenerationTrace:
    """Trace a KV-cached generation: per step, entropy and attention onto tracked token sets.

    Same loop and arguments as :func:`generate`, with attention recording on: with
    ``thinking`` set, a ``"thinking"`` set (positions holding the thinking token and every
    thinking step) is tracked automatically; with no ``track`` and no thinking, the
    ``"prompt"`` set is tracked. Step 0 is the last prompt position (its query predicts the
    first new token).

    A trace runs every row (prompt x sample) in one static batch (no continuous batching:
    the recorder keeps one block per row and step); for many prompts use
    :func:`lensprobe.generation.trace_prompts`, which traces them one by one (reading the model's
    ``facts`` once for all of them: see :func:`generate`).

    Example:
        >>> trace = lp.trace_generation(model, prompt, max_new_tokens=400,
        ...                             track={"system": "system", "thinking": "<thinking>"},
        ...                             thinking=lp.generation.LatentFusion(alpha=0.6, top_p=0.9),
        ...                             think_when=lp.generation.schedule.every(8))
        >>> trace.entropy                # [step]
        >>> trace.attention["thinking"]  # [step, layer, head]
    """
    cfg = generation_config(config, settings)
    track = _as_track_dict(track)
    if cfg.thinking is not None and "thinking" not in track:
        track["thinking"] = "thinking"
    if not track:
        track["prompt"] = "prompt"
    return generate(model, prompt, cfg, interventions=interventions, track=track, layers=layers,
                    progress=progress, engine=engine, facts=facts, record=record, lens=lens, lens_top_k=lens_top_k,
                    lens_layers=lens_layers)

# ----- checks and normalisation, before any forward -------------------------------------
def _as_interventions(interventions) -> list:
    if interventions is None:
        return []
    if (not isinstance(interventions, (list, tuple))
            or (len(interventions) == 2 and isinstance(interventions[0], str) and callable(interventions[1]))):
        interventions = [interventions]  # one intervention or one (hook_name, fn) pair
    for item in interventions:
        if isinstance(item, (ActivationRecorder, AttentionRecorder)):
            raise LensprobeError(
                f"{type(item).__name__} keeps one forward, and a generation runs one per step: pass "
                "record=[hook names] to lp.generate / lp.trace_generation (every step of every row, "
                "trace.activations_rows), or track=... for attention onto token sets."
            )
    return list(interventions)


def _as_prompt_list(facts: ModelFacts, prompts) -> list[tuple[list[int], Prompt | None]]:
    """``(token ids, Prompt or None)`` per prompt (see :func:`lensprobe.core.hooks.forward.as_prompts`)."""
    return [(as_tokens(facts, p, vocabulary=False)[0].tolist(), p if isinstance(p, Prompt) else None)  # ids: per row
            for p in as_prompts(facts, prompts, vocabulary=False)]


def _caps(caps, n_prompts: int, max_new_tokens: int) -> list[int]:
    """Each prompt's length cap: ``caps`` checked, or ``max_new_tokens`` for all."""
    if caps is None:
        return [max_new_tokens] * n_prompts
    caps = list(caps.tolist() if hasattr(caps, "tolist") else caps)
    if len(caps) != n_prompts:
        raise LensprobeError(f"caps has {len(caps)} entries for {n_prompts} prompts: give one per prompt.")
    for c in caps:
        if not isinstance(c, numbers.Integral) or isinstance(c, bool) or not 1 <= int(c) <= max_new_tokens:
            raise LensprobeError(f"each cap must be an integer in 1..max_new_tokens ({max_new_tokens}), got {c!r}.")
    return [int(c) for c in caps]


def _row_problems(facts: ModelFacts, items, caps: list[int]) -> dict[int, str]:
    """Prompt index -> why it cannot run (a token outside the vocabulary, or too long for the context)."""
    n_ctx = facts.n_ctx
    bad = {}
    for pi, ((ids, _), cap) in enumerate(zip(items, caps, strict=True)):
        outside = outside_vocabulary(facts, ids)
        if outside is not None:
            bad[pi] = outside
        elif len(ids) + cap > n_ctx:
            bad[pi] = (f"prompt ({len(ids)} tokens) + max_new_tokens ({cap}) = {len(ids) + cap} exceeds the "
                       f"model's context of {n_ctx} tokens: lower max_new_tokens to at most "
                       f"{max(n_ctx - len(ids), 0)} or shorten the prompt.")
    return bad


def _thinking_id(facts: ModelFacts, thinking, track) -> int | None:
    """The thinking token's id: of ``thinking``, else ``<thinking>`` if tracked sets may name it."""
    if thinking is not None:
        return thinking_token_id(facts, thinking.token)
    if track is not None:
        with contextlib.suppress(LensprobeError):
            return thinking_token_id(facts, "<thinking>")
    return None


def _as_track_dict(track) -> dict:
    def name(spec) -> str:
        return getattr(spec, "__name__", "callable") if callable(spec) else str(spec)

    if track is None:
        return {}
    if isinstance(track, (str, int)) or callable(track):
        return {name(track): track}
    if not isinstance(track, Mapping):
        return {name(s): s for s in track}
    return dict(track)

# ----- the result -----------------------------------------------------------------------
def _trace(model, cfg: GenerationConfig, run: Run, engine_meta: dict, think_id, track, interventions,
           has_caps: bool) -> GenerationTrace:
    out = run.out
    token_ids, entropy, chosen_prob, thinking = out.trimmed()
    meta = {
        "model": getattr(model.cfg, "model_name", None), "max_new_tokens": cfg.max_new_tokens,
        "do_sample": cfg.do_sample, "temperature": float(cfg.temperature), "top_p": float(cfg.top_p),
        "top_k": cfg.top_k, "min_p": cfg.min_p, "repetition_penalty": float(cfg.repetition_penalty),
        "seed": cfg.seed, "stop_at_eos": cfg.stop_at_eos, "n_samples": cfg.n_samples,
        "thinking": _describe(cfg.thinking), "thinking_token_id": think_id if cfg.thinking is not None else None,
        "think_when": _describe(cfg.think_when), "track": _describe(track),
        "interventions": [_describe(i) for i in interventions],
        "step_0": "last prompt position (its query predicts the first generated token)",
        **engine_meta, **run.describe(),
    }
    if has_caps:
        meta["caps"] = list(run.prompt_caps)
    if out.errors:
        meta["errors"] = {str(r): m for r, m in sorted(out.errors.items())}
    lengths = [len(run.items[pi][0]) for pi, _ in run.rows]
    recorded: dict[str, Any] = {}
    if run.acts is not None:
        steps, prompt = run.acts.results(ran_steps(token_ids, out.finish))
        recorded = {"activations_rows": steps, "prompt_activations": prompt,
                    "prompt_positions": {n: run.acts.prompt_positions[n] for n in prompt}}
        meta["record"] = [{"name": n, "reduce": _describe(r.reduce), "prompt": r.prompt} for n, r in run.acts.wanted]
    if run.lens is not None:
        recorded["lens"] = run.lens.results(ran_steps(token_ids, out.finish), run.facts.tokenizer)
        meta["lens"] = run.lens.describe()
    return GenerationTrace(
        token_ids_rows=token_ids, entropy_rows=entropy, chosen_prob_rows=chosen_prob, thinking_rows=thinking,
        attention_rows=run.attention(token_ids.shape[1]), **_texts(run.facts.tokenizer, token_ids, out.finish),
        prompt_index=[pi for pi, _ in run.rows], sample_index=[j for _, j in run.rows],
        prompt_lengths=lengths, finish_reasons=list(out.finish), layers=list(run.layers),
        n_heads=run.facts.n_heads, meta=meta, **recorded,
    )


def _texts(tokenizer, token_ids: Tensor, finish: list[str]) -> dict[str, Any]:
    """Per row: the generated tokens as strings and the text (the final EOS left out)."""
    str_tokens, texts = [], []
    for r in range(token_ids.shape[0]):
        gen = [int(i) for i in token_ids[r] if i >= 0]
        str_tokens.append(tokenizer.batch_decode([[i] for i in gen]) if gen and tokenizer is not None else [])
        texts.append(row_text(tokenizer, gen, finish[r]))
    return {"str_tokens_rows": str_tokens, "texts": texts}


def _describe(x) -> Any:
    """A setting as JSON: thinking inputs and schedule rules field by field (see :func:`describe_setting`)."""
    return describe_setting(x, structured=(LatentFusion, Pause, Rule))
