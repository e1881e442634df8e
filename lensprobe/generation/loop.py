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
import dataclasses
import hashlib
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.forward import as_prompts, as_tokens
from lensprobe.core.hooks import StepInfo, current_step, intervene, pattern_hook_name, step_context
from lensprobe.core.models import check_layers
from lensprobe.core.prompts import Prompt
from lensprobe.generation.engines.attention import ATTENTIONS
from lensprobe.generation.engines.hooknames import attached, supports
from lensprobe.generation.engines.threads import decode_threads, layer_threads, one_thread
from lensprobe.generation.engines.view import has_user_hooks, plain_model
from lensprobe.generation.schedule import Rule, StepState, check_rule, emitted
from lensprobe.generation.thinking import LatentFusion, Pause, nucleus_probs, thinking_token_id
from lensprobe.generation.trace import GenerationTrace
from lensprobe.generation.tracking import SPECIAL_SETS, TrackSpec, add_position, resolve_track, set_masks

__all__ = ["SPECIAL_SETS", "StepInfo", "current_step", "generate", "trace_generation"]

Engine = Literal["auto", "bridge", "hf"]


# ----- input normalisation --------------------------------------------------------------
def _as_prompt_list(model, prompts) -> list[tuple[list[int], Prompt | None]]:
    """``(token ids, Prompt or None)`` per prompt (see :func:`lensprobe.core.forward.as_prompts`)."""
    out = [(as_tokens(model, p)[0].tolist(), p if isinstance(p, Prompt) else None) for p in as_prompts(model, prompts)]
    vocab = int(model.cfg.d_vocab)
    for ids, _ in out:
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise LensprobeError(f"token id {bad[0]} is outside the vocabulary (0-{vocab - 1}).")
    return out


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


def _final_hidden_hook(model) -> str:
    names = model.hook_dict
    for name in ("ln_final.hook_out", "ln_final.hook_normalized"):
        if name in names:
            return name
    raise LensprobeError("this model has no ln_final hook point; LatentFusion needs the final hidden state.")


# ----- recorders (hook objects) ---------------------------------------------------------
class _Recorder:
    """Holds the per-step buffers; its hooks reduce activations inside the hook."""
    def __init__(self, layers: list[int], n_rows: int, n_sets: int, n_heads: int, max_steps: int,
                 masks: Tensor | None, want_hidden: str | None, device):
        self.layers = layers
        self.step = 0
        self.masks = masks  # [row, T, set] float, or None
        # [step, layer, row, head, set]: each hook writes one [row, head, set] block in place
        self.attn = (torch.full((max_steps, len(layers), n_rows, n_heads, n_sets), float("nan"), device=device)
                     if masks is not None and layers else None)
        self.want_hidden = want_hidden
        self.latent = want_hidden is not None  # only latent thinking replaces input embeddings
        self.hidden: Tensor | None = None
        self.replace: tuple[Tensor, Tensor] | None = None  # (row index, vectors) for the new position

    def hooks(self, model):
        hooks = [("hook_embed", self._embed_hook)] if self.latent else []
        if self.attn is not None:
            hooks += [(pattern_hook_name(layer), self._pattern_hook(i)) for i, layer in enumerate(self.layers)]
        if self.want_hidden:
            hooks.append((self.want_hidden, self._hidden_hook))
        return hooks

    def _pattern_hook(self, index: int):
        def record(pattern: Tensor, hook) -> None:
            last = pattern[:, :, -1, :]  # newest query: [row, head, key]
            with one_thread():  # one tiny matmul: waking more threads costs more than it
                torch.matmul(last.float(), self.masks[:, : last.shape[-1]], out=self.attn[self.step, index])

        return record

    def _hidden_hook(self, x: Tensor, hook) -> None:
        self.hidden = x[:, -1].detach().clone()

    def _embed_hook(self, x: Tensor, hook):
        if self.replace is None:
            return None
        rows, vectors = self.replace
        x = x.clone()
        x[rows, -1] = vectors.to(x.dtype)
        return x


# ----- the loop -------------------------------------------------------------------------
def generate(model, prompts, *, max_new_tokens: int, interventions: Sequence = (), thinking=None,
             think_when=None, do_sample: bool = False, temperature: float = 1.0, top_p: float = 1.0,
             seed: int | None = None, stop_at_eos: bool = True, n_samples: int = 1,
             track: Mapping[str, TrackSpec] | Sequence[TrackSpec] | None = None,
             layers: Sequence[int] | int | None = None, progress: bool | str = False,
             engine: Engine = "auto") -> GenerationTrace:
    """Generate from one or several prompts with a KV cache; record entropy (and attention if asked).

    Args:
        model: a TransformerLens model with a KV cache (a ``TransformerBridge``).
        prompts: a :class:`Prompt`, token ids (list or 1-D tensor), or a list of those
            (different lengths are left-padded), or a ``[batch, pos]`` tensor.
        max_new_tokens: steps to generate (thinking steps count); prompt length plus this
            must fit the model's context.
        interventions: attached with :func:`lensprobe.intervene` for the whole generation.
        thinking: ``None``, :class:`~lensprobe.LatentFusion` or :class:`~lensprobe.Pause`.
        think_when: a rule from :mod:`lensprobe.generation.schedule` (default with ``thinking``:
            ``schedule.emitted()``, the model emits the thinking token).
        do_sample: sample instead of greedy decoding (greedy is ``argmax`` of the logits).
        temperature, top_p: sampling settings (ignored when greedy).
        seed: with sampling, each row draws from its own generator seeded with ``(seed, j)``,
            ``j`` its sample index: results are reproducible, a prompt gives the same samples
            alone or in a batch, and sample ``j`` of every prompt (and of every condition) uses
            the same random numbers (common random numbers for paired comparisons).
            ``None``: torch's global generator.
        stop_at_eos: a row stops after its end-of-sequence token (recorded as its last step).
        n_samples: rows per prompt; rows are ordered prompt by prompt.
        track: tracked sets ``{name: spec}`` (see the module docstring), or ``None`` for no
            attention recording (cheapest).
        layers: layers to record attention at (default: all).
        progress: show a progress bar with tokens per second (a string: the bar's label).
        engine: which modules run the forwards. ``"bridge"``: the TransformerLens model,
            hook points and all. ``"hf"``: the same weights through the unwrapped Hugging
            Face modules (:mod:`lensprobe.generation.engines.view`), about 1.3x faster per step on a CPU;
            recording works the same, but it takes no interventions. It runs fused sdpa
            attention (same tokens; entropies equal up to float rounding); when attention
            is recorded, each layer also computes the newest query's attention row from
            the cached keys (checked against eager attention when the view is built).
            On a small model, decode steps with few rows run the decoder layers on one
            thread (faster on a CPU; :data:`lensprobe.generation.engines.view.ONE_THREAD_LAYER_BYTES`);
            ``trace.meta["decode_threads"]`` records the count. ``"auto"`` (default):
            ``"hf"`` when there are no interventions and no hooks attached to the model,
            else ``"bridge"``. Both give the same tokens, entropies and attention (tested);
            ``trace.meta["engine"]`` says which ran.

    Returns:
        A :class:`~lensprobe.GenerationTrace` (``texts`` and ``generated_ids`` per row).

    Raises:
        LensprobeError: bad settings, an unknown tracked set, a thinking token missing from
            the vocabulary, or a generation longer than the context, all before any forward.

    Example:
        >>> out = lp.generate(model, [p1, p2], max_new_tokens=256, do_sample=True, seed=0, n_samples=4)
        >>> out.texts[0]
    """
    # ---- validate everything before running anything ----
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise LensprobeError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}.")
    if not isinstance(n_samples, int) or n_samples < 1:
        raise LensprobeError(f"n_samples must be an integer >= 1, got {n_samples!r}.")
    if not isinstance(temperature, (int, float)) or temperature <= 0:
        raise LensprobeError(f"temperature must be > 0, got {temperature!r}.")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise LensprobeError(f"top_p must lie in (0, 1], got {top_p!r}.")
    if engine not in ("auto", "bridge", "hf"):
        raise LensprobeError(f"engine must be 'auto', 'bridge' or 'hf', got {engine!r}.")
    if seed is not None and not isinstance(seed, int):
        raise LensprobeError(f"seed must be an integer or None, got {seed!r}.")
    if thinking is not None and not isinstance(thinking, (LatentFusion, Pause)):
        raise LensprobeError(
            f"thinking must be lp.LatentFusion(...), lp.Pause() or None, got {type(thinking).__name__}."
        )
    if think_when is not None and thinking is None:
        raise LensprobeError("think_when was given without thinking=...: pass lp.LatentFusion() or lp.Pause().")
    if thinking is not None:
        think_when = emitted() if think_when is None else think_when
        check_rule(think_when)
    if interventions is None:
        interventions = []
    elif (not isinstance(interventions, (list, tuple))
          or (len(interventions) == 2 and isinstance(interventions[0], str) and callable(interventions[1]))):
        interventions = [interventions]  # one intervention or one (hook_name, fn) pair
    items = _as_prompt_list(model, prompts)
    n_ctx = int(model.cfg.n_ctx)
    longest = max(len(ids) for ids, _ in items)
    if longest + max_new_tokens > n_ctx:
        raise LensprobeError(
            f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) = {longest + max_new_tokens} "
            f"exceeds the model's context of {n_ctx} tokens: lower max_new_tokens to at most "
            f"{max(n_ctx - longest, 0)} or shorten the prompt."
        )
    think_id = thinking_token_id(model, thinking.token) if thinking is not None else None
    if think_id is None and track is not None:
        with contextlib.suppress(LensprobeError):
            think_id = thinking_token_id(model, "<thinking>")
    sets = resolve_track(model, track, items, think_id, thinking is not None)
    rec_layers = check_layers(model, layers) if sets else []

    with torch.inference_mode():
        return _run(model, items, max_new_tokens=max_new_tokens, interventions=list(interventions),
                    thinking=thinking, think_when=think_when, think_id=think_id, do_sample=do_sample,
                    temperature=float(temperature), top_p=float(top_p), seed=seed, stop_at_eos=stop_at_eos,
                    n_samples=n_samples, sets=sets, layers=rec_layers, progress=progress, track=track,
                    engine=engine)


def trace_generation(model, prompt, *, max_new_tokens: int,
                     track: Mapping[str, TrackSpec] | Sequence[TrackSpec] | None = None,
                     interventions: Sequence = (), thinking=None, think_when=None, do_sample: bool = False,
                     temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None,
                     stop_at_eos: bool = True, n_samples: int = 1, layers: Sequence[int] | int | None = None,
                     progress: bool | str = False, engine: Engine = "auto") -> GenerationTrace:
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
    if track is None:
        track = {}
    elif isinstance(track, (str, int)) or callable(track):
        track = {str(track) if not callable(track) else getattr(track, "__name__", "callable"): track}
    elif not isinstance(track, Mapping):
        track = {str(s) if not callable(s) else getattr(s, "__name__", "callable"): s for s in track}
    track = dict(track)
    if thinking is not None and "thinking" not in track:
        track["thinking"] = "thinking"
    if not track:
        track["prompt"] = "prompt"
    return generate(model, prompt, max_new_tokens=max_new_tokens, interventions=interventions,
                    thinking=thinking, think_when=think_when, do_sample=do_sample, temperature=temperature,
                    top_p=top_p, seed=seed, stop_at_eos=stop_at_eos, n_samples=n_samples, track=track,
                    layers=layers, progress=progress, engine=engine)


def _describe(x) -> Any:
    """A JSON-able description of a setting (thinking input, rule, tracked set, intervention)."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (LatentFusion, Pause, Rule)) and dataclasses.is_dataclass(x):
        return {"type": type(x).__name__,
                **{f.name: _describe(getattr(x, f.name)) for f in dataclasses.fields(x)}}
    if isinstance(x, Mapping):
        return {str(k): _describe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_describe(v) for v in x]
    if callable(x) and hasattr(x, "__name__"):
        return f"{type(x).__name__} {x.__name__}"
    text = repr(x)
    return text if len(text) <= 300 else text[:297] + "..."


def _run(model, items, *, max_new_tokens, interventions, thinking, think_when, think_id, do_sample,
         temperature, top_p, seed, stop_at_eos, n_samples, sets, layers, progress, track,
         engine) -> GenerationTrace:
    device = model.cfg.device if getattr(model.cfg, "device", None) is not None else "cpu"
    tok = model.tokenizer
    rows = [(pi, j) for pi in range(len(items)) for j in range(n_samples)]
    R = len(rows)
    lengths = torch.tensor([len(items[pi][0]) for pi, _ in rows])
    P = int(lengths.max())
    T = P + max_new_tokens
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    ids = torch.full((R, P), int(pad_id), dtype=torch.long)
    mask = torch.zeros((R, T), dtype=torch.long)
    for r, (pi, _) in enumerate(rows):
        seq = items[pi][0]
        ids[r, P - len(seq):] = torch.tensor(seq)
        mask[r, P - len(seq):P] = 1
    ids, mask, lengths = ids.to(device), mask.to(device), lengths.to(device)
    pad_offset = P - lengths  # padded index of each row's first token

    S = len(sets)
    masks = set_masks(items, sets, [pi for pi, _ in rows], P, T, device) if S else None  # [row, T, set]
    hidden_hook = _final_hidden_hook(model) if isinstance(thinking, LatentFusion) else None
    rec = _Recorder(layers, R, S, int(model.cfg.n_heads), max_new_tokens, masks, hidden_hook, device)
    view = _plain_view(model, engine, interventions, [name for name, _ in rec.hooks(model)])
    threads = decode_threads(view, R) if view is not None else torch.get_num_threads()

    def forward(tokens, attention_mask, position_ids, pkv):
        if view is not None:
            out = view(input_ids=tokens, attention_mask=attention_mask, position_ids=position_ids,
                       past_key_values=pkv, use_cache=True, logits_to_keep=1)
            return out.logits, out.past_key_values
        extra = {"logits_to_keep": 1} if pkv is None else {"past_key_values": pkv}
        return model(tokens, attention_mask=attention_mask, position_ids=position_ids,
                     return_type="logits_and_cache", **extra)

    gens = None
    if do_sample and seed is not None:
        gens = []
        for _, j in rows:
            g = torch.Generator(device=device)
            g.manual_seed(_row_seed(seed, j))
            gens.append(g)
    eos = _eos_ids(model) if stop_at_eos else set()
    eos_t = torch.tensor(sorted(eos), dtype=torch.long, device=device)

    token_ids = torch.full((R, max_new_tokens), -1, dtype=torch.long)
    ent_buf = torch.full((R, max_new_tokens), float("nan"))
    prob_buf = torch.full((R, max_new_tokens), float("nan"))
    think_buf = torch.zeros((R, max_new_tokens), dtype=torch.bool)
    active = torch.ones(R, dtype=torch.bool, device=device)
    n_thinking = torch.zeros(R, dtype=torch.long, device=device)
    finish = ["length"] * R
    steps_done = 0

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=R * max_new_tokens, unit="tok", dynamic_ncols=True,
                   desc=progress if isinstance(progress, str) else "generating")
    started = time.perf_counter()
    try:
        with (attached(model, view, rec.hooks(model)) if view is not None
              else intervene(model, rec, *interventions)), \
             (layer_threads(view, threads) if view is not None else contextlib.nullcontext()), \
             step_context() as publish:
            positions = torch.arange(P, device=device)[None, :] - pad_offset[:, None]
            publish(StepInfo(0, positions, lengths))
            logits, pkv = forward(ids, mask[:, :P], positions.clamp(min=0), None)
            for t in range(max_new_tokens):
                last = logits[:, -1].float()
                logp = torch.log_softmax(last, dim=-1)
                probs = logp.exp()
                ent = -torch.where(probs > 0, probs * logp, 0.0).sum(-1)  # as lp.entropy, one softmax
                choice = _choose(last, do_sample, temperature, top_p, gens)
                think = torch.zeros(R, dtype=torch.bool, device=device)
                if thinking is not None:
                    state = StepState(step=t, logits=last, entropy=ent, tokens=choice,
                                      thinking_token_id=think_id, n_thinking=n_thinking)
                    think = torch.as_tensor(think_when(state), dtype=torch.bool, device=device).expand(R) & active
                    choice = torch.where(think, torch.full_like(choice, think_id), choice)
                    n_thinking = n_thinking + think.long()
                choice = torch.where(active, choice, torch.full_like(choice, int(pad_id)))
                act_cpu = active.cpu()
                token_ids[:, t] = torch.where(act_cpu, choice.cpu(), torch.full((R,), -1))
                ent_buf[:, t] = torch.where(act_cpu, ent.cpu(), torch.full((R,), float("nan")))
                prob_buf[:, t] = torch.where(act_cpu, probs.gather(-1, choice[:, None])[:, 0].cpu(),
                                             torch.full((R,), float("nan")))
                think_buf[:, t] = think.cpu()
                if rec.attn is not None:
                    rec.attn[t, :, ~active] = float("nan")
                steps_done = t + 1
                if bar is not None:
                    bar.update(int(act_cpu.sum()))
                if stop_at_eos and eos_t.numel():
                    ended = torch.isin(choice, eos_t) & active & ~think
                    for r in ended.nonzero().flatten().tolist():
                        finish[r] = "eos"
                    active = active & ~ended
                if t == max_new_tokens - 1 or not bool(active.any()):
                    break
                # the chosen token goes in at padded position P + t
                col = P + t
                mask[:, col] = 1
                if S:
                    add_position(masks, sets, col, choice, think, lengths, t, active)
                rec.replace = None
                if thinking is not None and bool(think.any()):
                    rows_idx = think.nonzero().flatten()
                    vec = thinking.input_vectors(model, rec.hidden[rows_idx] if rec.hidden is not None else None,
                                                 last[rows_idx], think_id)
                    if vec is not None:
                        rec.replace = (rows_idx, vec)
                rec.step = t + 1
                pos = (lengths + t)[:, None]
                publish(StepInfo(t + 1, pos, lengths))
                logits, pkv = forward(choice[:, None], mask[:, : col + 1], pos, pkv)
    finally:
        rec.replace = None
        if bar is not None:
            elapsed = max(time.perf_counter() - started, 1e-9)
            bar.set_postfix_str(f"{int((token_ids >= 0).sum())} tokens in {elapsed:.1f}s")
            bar.close()

    n = max(steps_done, 1)
    token_ids, ent_buf, prob_buf, think_buf = token_ids[:, :n], ent_buf[:, :n], prob_buf[:, :n], think_buf[:, :n]
    attention = {}
    if rec.attn is not None:
        a = rec.attn[:n].permute(2, 4, 0, 1, 3).cpu()  # [row, set, step, layer, head]
        attention = {ts.name: a[:, s].contiguous() for s, ts in enumerate(sets)}
    elif sets:  # sets but no layers cannot happen (layers default to all); keep shape sane
        attention = {ts.name: torch.zeros((R, n, 0, int(model.cfg.n_heads))) for ts in sets}
    str_tokens, texts = [], []
    for r in range(R):
        gen = [int(i) for i in token_ids[r] if i >= 0]
        str_tokens.append(tok.batch_decode([[i] for i in gen]) if gen else [])
        body = gen[:-1] if finish[r] == "eos" else gen
        texts.append(tok.decode(body) if body else "")
    meta = {
        "model": getattr(model.cfg, "model_name", None), "max_new_tokens": max_new_tokens,
        "do_sample": do_sample, "temperature": temperature, "top_p": top_p, "seed": seed,
        "stop_at_eos": stop_at_eos, "n_samples": n_samples, "thinking": _describe(thinking),
        "thinking_token_id": think_id if thinking is not None else None,
        "think_when": _describe(think_when), "track": _describe(track),
        "interventions": [_describe(i) for i in interventions],
        "step_0": "last prompt position (its query predicts the first generated token)",
        "engine": "hf" if view is not None else "bridge",
        "attention": _attention_name(view),
        "decode_threads": threads,
    }
    return GenerationTrace(
        token_ids_rows=token_ids, entropy_rows=ent_buf, chosen_prob_rows=prob_buf, thinking_rows=think_buf,
        attention_rows=attention, str_tokens_rows=str_tokens, texts=texts,
        prompt_index=[pi for pi, _ in rows], sample_index=[j for _, j in rows],
        prompt_lengths=[int(x) for x in lengths.cpu()], finish_reasons=finish,
        layers=list(layers), n_heads=int(model.cfg.n_heads), meta=meta,
    )


def _plain_view(model, engine: str, interventions, hook_names: list[str]):
    """The plain view to run on (see :mod:`lensprobe.generation.engines.view`), or ``None`` for the bridge."""
    if engine == "bridge":
        return None
    why = None
    if interventions:
        why = "interventions run on the TransformerLens hook points"
    elif has_user_hooks(model):
        why = "hooks are attached to the model (they would not fire)"
    elif not supports(hook_names):
        why = f"a recorder needs hook points the plain model lacks ({hook_names})"
    # pattern recorders read only the newest query's row: sdpa plus that row ("sdpa_last"),
    # else plain sdpa; eager attention (full weights) is the fallback for both
    attention = "sdpa_last" if any(".hook_pattern" in name for name in hook_names) else "sdpa"
    view = plain_model(model, attention) if why is None else None
    if view is None and why is None:
        view = plain_model(model, "eager")
    if view is None and why is None:
        why = "this model has no plain Hugging Face view with the same logits"
    if view is None and engine == "hf":
        raise LensprobeError(f"engine='hf' cannot run here: {why}; use engine='auto' or 'bridge'.")
    return view


def _attention_name(view) -> str:
    if view is None:
        return "eager"
    names = {v: k for k, v in ATTENTIONS.items()}
    return names.get(view.config._attn_implementation, view.config._attn_implementation)


def _row_seed(seed: int, sample: int) -> int:
    """Seed of sample ``sample``: from the seed and the sample index only (not the batch or prompt)."""
    digest = hashlib.sha256(f"{seed}|{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _choose(logits: Tensor, do_sample: bool, temperature: float, top_p: float, gens) -> Tensor:
    if not do_sample:
        return logits.argmax(-1)
    probs = nucleus_probs(logits, top_p=top_p, temperature=temperature)
    if gens is None:
        return torch.multinomial(probs, 1)[:, 0]
    return torch.stack([torch.multinomial(probs[r], 1, generator=g)[0] for r, g in enumerate(gens)])
