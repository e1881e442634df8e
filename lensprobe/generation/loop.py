"""KV-cached generation with interventions, latent thinking steps and per-step recording.

:func:`generate` is lensprobe's one generation loop (evaluations, traces and the CLI all
use it); :func:`trace_generation` is the same loop with attention recording switched on
for the tracked sets. The loop:

- left-pads several prompts (or ``n_samples`` copies of each) into one batch with an
  attention mask and per-row position ids, so each row computes what it would alone;
- runs the prompt once, then **one forward per step over only the new position**, reusing
  the model's KV cache;
- attaches the caller's interventions (anything :func:`lensprobe.intervene` accepts) for
  the whole generation: hooks see ``[batch, pos, ...]`` activations where ``pos`` is the
  whole (padded) prompt at the first forward and the one new position afterwards (see
  :func:`current_step` for the absolute positions);
- records, inside the attention hooks, only the newest query's attention summed over each
  tracked set: a ``[batch, set, head]`` value per layer and step. Memory grows as
  steps x layers x heads x sets, never with steps x sequence length;
- replaces the input embedding at thinking positions (:mod:`lensprobe.generation.thinking`) at
  ``hook_embed``, for the new position only.

**Step 0 is the last prompt position** (its query predicts the first generated token).

**Non-finite logits end a row.** A row whose logits at a step hold a NaN or ``+inf``, or only
``-inf`` (:func:`lensprobe.core.metrics.nonfinite_rows`), stops there with
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
import hashlib
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from lensprobe.core.devices import model_device
from lensprobe.core.errors import LensprobeError
from lensprobe.core.forward import as_prompts, as_tokens
from lensprobe.core.hooks import StepInfo, check_positions, current_step, step_context
from lensprobe.core.jsonable import describe_setting
from lensprobe.core.metrics import nonfinite_rows
from lensprobe.core.models import check_layers
from lensprobe.core.prompts import Prompt
from lensprobe.generation.batch import PaddedBatch, pad_batch
from lensprobe.generation.config import GenerationConfig, generation_config
from lensprobe.generation.engines import ENGINE_NAMES, Engine, EngineName, choose_engine
from lensprobe.generation.recording import StepRecorder, final_hidden_hook
from lensprobe.generation.schedule import Rule, StepState
from lensprobe.generation.thinking import LatentFusion, Pause, nucleus_probs, thinking_token_id
from lensprobe.generation.trace import GenerationTrace
from lensprobe.generation.tracking import (
    SPECIAL_SETS,
    TrackedSet,
    TrackSpec,
    add_position,
    resolve_track,
    set_masks,
)

__all__ = ["SPECIAL_SETS", "StepInfo", "current_step", "generate", "trace_generation"]


# ----- the public functions ---------------------------------------------------------------
def generate(model, prompts, config: GenerationConfig | None = None, *, interventions: Sequence = (),
             track: Mapping[str, TrackSpec] | Sequence[TrackSpec] | None = None,
             layers: Sequence[int] | int | None = None, progress: bool | str = False,
             engine: EngineName = "auto", **settings) -> GenerationTrace:
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
            sdpa attention (same tokens; entropies equal up to float rounding); when
            attention is recorded, each layer also computes the newest query's attention row
            from the cached keys (checked against eager attention when the view is built).
            On a small model, decode steps with few rows run the decoder layers on one
            thread (faster on a CPU; :data:`lensprobe.generation.engines.threads.ONE_THREAD_LAYER_BYTES`);
            ``trace.meta["decode_threads"]`` records the count. ``"auto"`` (default):
            ``"hf"`` when no hooks are attached to the model and every intervention can run
            there, else ``"bridge"``. Both give the same tokens, entropies and attention (tested);
            ``trace.meta["engine"]`` says which ran.
        **settings: :class:`~lensprobe.GenerationConfig` fields as keywords
            (``max_new_tokens=64, do_sample=True, seed=0, n_samples=4, thinking=...,
            think_when=...``); they override ``config``'s. ``max_new_tokens`` is required
            when no ``config`` is given.

    Returns:
        A :class:`~lensprobe.GenerationTrace` (``texts`` and ``generated_ids`` per row). A row
        whose step logits hold a NaN or ``+inf`` (or only ``-inf``) stops at that step with
        ``finish_reason="nonfinite"`` (token -1, entropy NaN), and one ``RuntimeWarning``
        names the step and rows; the other rows go on unaffected.

    Raises:
        LensprobeError: bad settings, an unknown tracked set, a thinking token missing from
            the vocabulary, or a generation longer than the context, all before any forward.

    Example:
        >>> out = lp.generate(model, [p1, p2], max_new_tokens=256, do_sample=True, seed=0, n_samples=4)
        >>> out.texts[0]
    """
    cfg = generation_config(config, settings)
    if engine not in ENGINE_NAMES:
        raise LensprobeError(f"engine must be 'auto', 'bridge' or 'hf', got {engine!r}.")
    interventions = _as_interventions(interventions)
    items = _as_prompt_list(model, prompts)
    _check_context(model, items, cfg.max_new_tokens)
    check_positions(interventions, max(len(ids) for ids, _ in items) + cfg.max_new_tokens, "prompt + max_new_tokens")
    think_id = _thinking_id(model, cfg.thinking, track)
    sets = resolve_track(model, track, items, think_id, cfg.thinking is not None)
    rec_layers = check_layers(model, layers) if sets else []
    run = _Run(model, cfg, items, interventions, sets, rec_layers, think_id, track)
    with torch.inference_mode():
        return run.execute(engine, progress)


def trace_generation(model, prompt, config: GenerationConfig | None = None, *,
                     track: Mapping[str, TrackSpec] | Sequence[TrackSpec] | None = None,
                     interventions: Sequence = (), layers: Sequence[int] | int | None = None,
                     progress: bool | str = False, engine: EngineName = "auto", **settings) -> GenerationTrace:
    """Trace a KV-cached generation: per step, entropy and attention onto tracked token sets.

    Same loop and arguments as :func:`generate`, with attention recording on: with
    ``thinking`` set, a ``"thinking"`` set (positions holding the thinking token and every
    thinking step) is tracked automatically; with no ``track`` and no thinking, the
    ``"prompt"`` set is tracked. Step 0 is the last prompt position (its query predicts the
    first new token).

    Example:
        >>> trace = lp.trace_generation(model, prompt, max_new_tokens=400,
        ...                             track={"system": "system", "thinking": "<thinking>"},
        ...                             thinking=lp.LatentFusion(alpha=0.6, top_p=0.9),
        ...                             think_when=lp.schedule.every(8))
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
                    progress=progress, engine=engine)


# ----- checks and normalisation, before any forward -------------------------------------
def _as_interventions(interventions) -> list:
    if interventions is None:
        return []
    if (not isinstance(interventions, (list, tuple))
            or (len(interventions) == 2 and isinstance(interventions[0], str) and callable(interventions[1]))):
        return [interventions]  # one intervention or one (hook_name, fn) pair
    return list(interventions)


def _as_prompt_list(model, prompts) -> list[tuple[list[int], Prompt | None]]:
    """``(token ids, Prompt or None)`` per prompt (see :func:`lensprobe.core.forward.as_prompts`)."""
    out = [(as_tokens(model, p)[0].tolist(), p if isinstance(p, Prompt) else None) for p in as_prompts(model, prompts)]
    vocab = int(model.cfg.d_vocab)
    for ids, _ in out:
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise LensprobeError(f"token id {bad[0]} is outside the vocabulary (0-{vocab - 1}).")
    return out


def _check_context(model, items, max_new_tokens: int) -> None:
    n_ctx = int(model.cfg.n_ctx)
    longest = max(len(ids) for ids, _ in items)
    if longest + max_new_tokens > n_ctx:
        raise LensprobeError(
            f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) = {longest + max_new_tokens} "
            f"exceeds the model's context of {n_ctx} tokens: lower max_new_tokens to at most "
            f"{max(n_ctx - longest, 0)} or shorten the prompt."
        )


def _thinking_id(model, thinking, track) -> int | None:
    """The thinking token's id: of ``thinking``, else ``<thinking>`` if tracked sets may name it."""
    if thinking is not None:
        return thinking_token_id(model, thinking.token)
    if track is not None:
        with contextlib.suppress(LensprobeError):
            return thinking_token_id(model, "<thinking>")
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


def _eos_ids(model) -> set[int]:
    ids = set()
    eos = getattr(model.tokenizer, "eos_token_id", None)
    if eos is not None:
        ids.add(int(eos))
    gen = getattr(getattr(model, "original_model", None), "generation_config", None)
    extra = getattr(gen, "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, (list, tuple)):
        ids.update(int(i) for i in extra)
    return ids


# ----- per-row state of a running generation ----------------------------------------------
@dataclass
class _Rows:
    """What the loop keeps per row: live flags and thinking counts (on the model's device) and
    the per-step outputs (on the CPU; -1 / NaN once a row has ended)."""

    active: Tensor
    n_thinking: Tensor
    token_ids: Tensor
    entropy: Tensor
    chosen_prob: Tensor
    thinking: Tensor
    finish: list[str]
    steps_done: int = 0

    @classmethod
    def start(cls, n_rows: int, max_steps: int, device) -> "_Rows":
        return cls(active=torch.ones(n_rows, dtype=torch.bool, device=device),
                   n_thinking=torch.zeros(n_rows, dtype=torch.long, device=device),
                   token_ids=torch.full((n_rows, max_steps), -1, dtype=torch.long, device="cpu"),
                   entropy=torch.full((n_rows, max_steps), float("nan"), device="cpu"),
                   chosen_prob=torch.full((n_rows, max_steps), float("nan"), device="cpu"),
                   thinking=torch.zeros((n_rows, max_steps), dtype=torch.bool, device="cpu"),
                   finish=["length"] * n_rows)

    def write(self, t: int, choice: Tensor, ent: Tensor, probs: Tensor, think: Tensor) -> int:
        """Store step ``t`` of the live rows; returns how many rows were live."""
        live = self.active.cpu()
        self.token_ids[:, t] = torch.where(live, choice.cpu(), -1)
        self.entropy[:, t] = torch.where(live, ent.cpu(), float("nan"))
        self.chosen_prob[:, t] = torch.where(live, probs.gather(-1, choice[:, None])[:, 0].cpu(), float("nan"))
        self.thinking[:, t] = think.cpu()
        self.steps_done = t + 1
        return int(live.sum())

    def end(self, ended: Tensor, reason: str) -> None:
        for r in ended.nonzero().flatten().tolist():
            self.finish[r] = reason
        self.active = self.active & ~ended

    def trimmed(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        n = max(self.steps_done, 1)
        return self.token_ids[:, :n], self.entropy[:, :n], self.chosen_prob[:, :n], self.thinking[:, :n]


# ----- the loop -------------------------------------------------------------------------
class _Run:
    """One generation: settings and inputs, checked; :meth:`execute` runs it."""

    def __init__(self, model, cfg: GenerationConfig, items, interventions: list, sets: list[TrackedSet],
                 layers: list[int], think_id: int | None, track) -> None:
        self.model, self.cfg, self.items, self.interventions = model, cfg, items, interventions
        self.sets, self.layers, self.think_id, self.track = sets, layers, think_id, track
        tok = model.tokenizer
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
        device = model_device(model)
        self.batch = pad_batch(items, cfg.n_samples, cfg.max_new_tokens, pad_id, device)
        self.masks = (set_masks(items, sets, self.batch.prompt_rows, self.batch.width,
                                self.batch.width + cfg.max_new_tokens, device) if sets else None)
        hidden = final_hidden_hook(model) if isinstance(cfg.thinking, LatentFusion) else None
        self.rec = StepRecorder(layers, self.batch.n_rows, len(sets), int(model.cfg.n_heads), cfg.max_new_tokens,
                                self.masks, hidden, device)
        self.rows = _Rows.start(self.batch.n_rows, cfg.max_new_tokens, device)
        self.gens = _generators(cfg, self.batch)
        eos = _eos_ids(model) if cfg.stop_at_eos else set()
        self.eos = torch.tensor(sorted(eos), dtype=torch.long, device=device)

    def execute(self, engine_name: str, progress: bool | str) -> GenerationTrace:
        hooks = self.rec.hooks(self.model)
        engine = choose_engine(self.model, engine_name, interventions=self.interventions,
                               hook_names=[name for name, _ in hooks], rows=self.batch.n_rows)
        bar = _progress_bar(progress, self.batch.n_rows * self.cfg.max_new_tokens)
        started = time.perf_counter()
        try:
            with engine.attach(hooks, self.interventions), step_context() as publish:
                self._loop(engine, publish, bar)
        finally:
            self.rec.replace = None
            _close_bar(bar, self.rows.token_ids, started)
        return self._trace(engine)

    def _loop(self, engine: Engine, publish, bar) -> None:
        batch, steps = self.batch, self.cfg.max_new_tokens
        positions = batch.prompt_positions()
        publish(StepInfo(0, positions, batch.lengths))
        logits, past = engine.forward(batch.ids, batch.mask[:, :batch.width], positions.clamp(min=0), None)
        for t in range(steps):
            last = logits[:, -1].float()
            choice, think = self._step(t, last, bar)
            if t == steps - 1 or not bool(self.rows.active.any()):
                break
            col = self._advance(t, choice, think, last)
            pos = (batch.lengths + t)[:, None]
            publish(StepInfo(t + 1, pos, batch.lengths))
            logits, past = engine.forward(choice[:, None], batch.mask[:, : col + 1], pos, past)

    def _step(self, t: int, last: Tensor, bar) -> tuple[Tensor, Tensor]:
        """Choose step ``t``'s tokens from its logits, record the step, end rows at EOS."""
        rows, cfg = self.rows, self.cfg
        broken = nonfinite_rows(last)  # NaN/+inf or all -inf: no distribution (as lp.entropy)
        if bool(broken.any()):
            if bool((broken & rows.active).any()):
                _end_nonfinite(rows, broken & rows.active, t)
            # ended rows (their KV cache may hold NaN now): any finite logits do, nothing is kept
            last = torch.where(broken[:, None], 0.0, last)
        logp = torch.log_softmax(last, dim=-1)
        probs = logp.exp()
        ent = -torch.where(probs > 0, probs * logp, 0.0).sum(-1)  # as lp.entropy, one softmax
        choice = _choose(last, cfg, self.gens)
        think = torch.zeros_like(rows.active)
        if cfg.thinking is not None:
            state = StepState(step=t, logits=last, entropy=ent, tokens=choice,
                              thinking_token_id=self.think_id, n_thinking=rows.n_thinking)
            think = torch.as_tensor(cfg.think_when(state), dtype=torch.bool, device=last.device)
            think = think.expand(rows.active.shape[0]) & rows.active
            choice = torch.where(think, torch.full_like(choice, self.think_id), choice)
            rows.n_thinking = rows.n_thinking + think.long()
        choice = torch.where(rows.active, choice, torch.full_like(choice, self.batch.pad_id))
        live = rows.write(t, choice, ent, probs, think)
        self.rec.end_rows(t, ~rows.active)
        if bar is not None:
            bar.update(live)
        if self.eos.numel():
            rows.end(torch.isin(choice, self.eos) & rows.active & ~think, "eos")
        return choice, think

    def _advance(self, t: int, choice: Tensor, think: Tensor, last: Tensor) -> int:
        """Put step ``t``'s tokens in at padded column ``P + t``: mask, tracked sets, latent inputs."""
        col = self.batch.width + t
        self.batch.mask[:, col] = 1
        if self.sets:
            add_position(self.masks, self.sets, col, choice, think, self.batch.lengths, t, self.rows.active)
        self.rec.replace = None
        if self.cfg.thinking is not None and bool(think.any()):
            rows_idx = think.nonzero().flatten()
            hidden = self.rec.hidden[rows_idx] if self.rec.hidden is not None else None
            vec = self.cfg.thinking.input_vectors(self.model, hidden, last[rows_idx], self.think_id)
            if vec is not None:
                self.rec.replace = (rows_idx, vec)
        self.rec.step = t + 1
        return col

    def _trace(self, engine: Engine) -> GenerationTrace:
        token_ids, entropy, chosen_prob, thinking = self.rows.trimmed()
        n_heads = int(self.model.cfg.n_heads)
        return GenerationTrace(
            token_ids_rows=token_ids, entropy_rows=entropy, chosen_prob_rows=chosen_prob, thinking_rows=thinking,
            attention_rows=self._attention(token_ids.shape[1]), **_texts(self.model.tokenizer, token_ids,
                                                                         self.rows.finish),
            prompt_index=self.batch.prompt_rows, sample_index=[j for _, j in self.batch.rows],
            prompt_lengths=[int(x) for x in self.batch.lengths.cpu()], finish_reasons=self.rows.finish,
            layers=list(self.layers), n_heads=n_heads, meta=self._meta(engine),
        )

    def _attention(self, n_steps: int) -> dict[str, Tensor]:
        if self.rec.attn is None:  # sets but no layers cannot happen (layers default to all)
            return {ts.name: torch.zeros((self.batch.n_rows, n_steps, 0, int(self.model.cfg.n_heads)), device="cpu")
                    for ts in self.sets}
        a = self.rec.attn[:n_steps].permute(2, 4, 0, 1, 3).cpu()  # [row, set, step, layer, head]
        return {ts.name: a[:, s].contiguous() for s, ts in enumerate(self.sets)}

    def _meta(self, engine: Engine) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "model": getattr(self.model.cfg, "model_name", None), "max_new_tokens": cfg.max_new_tokens,
            "do_sample": cfg.do_sample, "temperature": float(cfg.temperature), "top_p": float(cfg.top_p),
            "seed": cfg.seed, "stop_at_eos": cfg.stop_at_eos, "n_samples": cfg.n_samples,
            "thinking": _describe(cfg.thinking),
            "thinking_token_id": self.think_id if cfg.thinking is not None else None,
            "think_when": _describe(cfg.think_when), "track": _describe(self.track),
            "interventions": [_describe(i) for i in self.interventions],
            "step_0": "last prompt position (its query predicts the first generated token)",
            **engine.describe(),
        }


def _end_nonfinite(rows: _Rows, broken: Tensor, t: int) -> None:
    """End the live rows whose step-``t`` logits are not finite (``finish_reason="nonfinite"``),
    with one warning; their token is -1 and their entropy NaN from step ``t`` on."""
    rows.end(broken, "nonfinite")
    which = broken.nonzero().flatten().tolist()
    warnings.warn(
        f"non-finite logits (NaN, +inf, or all -inf) at step {t} in row{'s' if len(which) > 1 else ''} "
        f"{', '.join(map(str, which))}: {'they stop' if len(which) > 1 else 'it stops'} there "
        "(finish_reason 'nonfinite', entropy NaN); check the model's weights and any intervention "
        "that writes activations.",
        RuntimeWarning, stacklevel=2,
    )


def _texts(tokenizer, token_ids: Tensor, finish: list[str]) -> dict[str, list]:
    """Per row: the generated tokens as strings and the text (the final EOS left out)."""
    str_tokens, texts = [], []
    for r in range(token_ids.shape[0]):
        gen = [int(i) for i in token_ids[r] if i >= 0]
        str_tokens.append(tokenizer.batch_decode([[i] for i in gen]) if gen else [])
        body = gen[:-1] if finish[r] == "eos" else gen
        texts.append(tokenizer.decode(body) if body else "")
    return {"str_tokens_rows": str_tokens, "texts": texts}


def _describe(x) -> Any:
    """A setting as JSON: thinking inputs and schedule rules field by field (see :func:`describe_setting`)."""
    return describe_setting(x, structured=(LatentFusion, Pause, Rule))


# ----- sampling and progress ------------------------------------------------------------
def _generators(cfg: GenerationConfig, batch: PaddedBatch) -> list[torch.Generator] | None:
    """One generator per row, seeded from the seed and the row's sample index (see ``seed``)."""
    if not cfg.do_sample or cfg.seed is None:
        return None
    gens = []
    for _, j in batch.rows:
        g = torch.Generator(device=batch.device)
        g.manual_seed(_row_seed(cfg.seed, j))
        gens.append(g)
    return gens


def _row_seed(seed: int, sample: int) -> int:
    """Seed of sample ``sample``: from the seed and the sample index only (not the batch or prompt)."""
    digest = hashlib.sha256(f"{seed}|{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _choose(logits: Tensor, cfg: GenerationConfig, gens) -> Tensor:
    if not cfg.do_sample:
        return logits.argmax(-1)
    probs = nucleus_probs(logits, top_p=cfg.top_p, temperature=cfg.temperature)
    if gens is None:
        return torch.multinomial(probs, 1)[:, 0]
    return torch.stack([torch.multinomial(probs[r], 1, generator=g)[0] for r, g in enumerate(gens)])


def _progress_bar(progress: bool | str, total: int):
    if not progress:
        return None
    return tqdm(total=total, unit="tok", dynamic_ncols=True,
                desc=progress if isinstance(progress, str) else "generating")


def _close_bar(bar, token_ids: Tensor, started: float) -> None:
    if bar is not None:
        elapsed = max(time.perf_counter() - started, 1e-9)
        bar.set_postfix_str(f"{int((token_ids >= 0).sum())} tokens in {elapsed:.1f}s")
        bar.close()
