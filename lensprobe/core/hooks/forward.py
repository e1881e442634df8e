"""Running a model on a prompt with interventions and recorders attached."""

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import AttentionRecorder, check_positions, intervene, pattern_hook_name
from lensprobe.core.models.facts import ModelFacts
from lensprobe.core.models.loading import check_layers
from lensprobe.core.prompts.prompt import Prompt, build_prompt


def as_tokens(model, prompt_or_tokens, *, one_row: bool = False, vocabulary: bool = True) -> Int[Tensor, "batch pos"]:
    """Token ids ``[batch, pos]`` from a :class:`Prompt`, a tensor, or a list of ids, on the model's device.

    This is the one place where lensprobe turns a prompt into token ids (lists of prompts go
    through :func:`as_prompts`).

    Args:
        model: a TransformerLens model (its context length and device are used), or its
            :class:`~lensprobe.core.models.facts.ModelFacts` (read once by a run).
        prompt_or_tokens: a :class:`Prompt`, token ids ``[pos]``/``[batch, pos]``, or a list of ints.
        one_row: refuse several rows of tokens (for functions that take one prompt at a time).
        vocabulary: refuse token ids outside the model's vocabulary (``False``: the caller
            checks them per row, as :func:`lensprobe.generate` does with ``on_error="row"``).

    Raises:
        LensprobeError: not a prompt or token ids, longer than the model's context, a token id
            outside the vocabulary, or (with ``one_row``) more than one row.

    Example:
        >>> as_tokens(model, [1, 2, 3]).shape
        torch.Size([1, 3])
    """
    if isinstance(prompt_or_tokens, Prompt):
        tokens = prompt_or_tokens.tokens
    elif isinstance(prompt_or_tokens, torch.Tensor):
        tokens = prompt_or_tokens
    elif isinstance(prompt_or_tokens, (list, tuple)) and all(isinstance(t, int) for t in prompt_or_tokens):
        tokens = torch.tensor([list(prompt_or_tokens)], device="cpu")
    else:
        raise LensprobeError(
            f"expected a Prompt (from build_prompt) or token ids, got {type(prompt_or_tokens).__name__}; "
            "build one with lp.build_prompt(model, question)."
        )
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim == 2 and tokens.shape[-1] == 0:
        raise LensprobeError("a prompt is empty (no tokens): pass at least one token id, or a non-empty question.")
    if tokens.ndim != 2 or tokens.dtype not in (torch.long, torch.int32, torch.int64):
        raise LensprobeError(f"token ids must be an integer tensor [batch, pos], got {tuple(tokens.shape)} {tokens.dtype}.")
    if one_row and tokens.shape[0] != 1:
        raise LensprobeError(f"pass one prompt at a time here, got {tokens.shape[0]} rows of tokens.")
    n_ctx = model.n_ctx if isinstance(model, ModelFacts) else model.cfg.n_ctx
    if tokens.shape[-1] > n_ctx:
        raise LensprobeError(
            f"input is {tokens.shape[-1]} tokens but the model's context is {n_ctx}: shorten the prompt."
        )
    outside = outside_vocabulary(model, tokens) if vocabulary else None
    if outside is not None:
        raise LensprobeError(outside)
    if isinstance(model, ModelFacts):
        return tokens.to(model.device)
    return tokens.to(model.cfg.device) if getattr(model.cfg, "device", None) else tokens


def outside_vocabulary(model, ids) -> str | None:
    """Why token ``ids`` (a tensor or a list of ints) cannot run on ``model``: the first id outside its
    vocabulary (an embedding lookup would fail with an ``IndexError``), or ``None`` when every id is in it.
    ``model`` may be its :class:`~lensprobe.core.models.facts.ModelFacts` (read once by a run).

    Example:
        >>> outside_vocabulary(model, [1, 2, 10**6])
        'token id 1000000 is outside the vocabulary (0-49151).'
    """
    vocab = model.d_vocab if isinstance(model, ModelFacts) else int(model.cfg.d_vocab)
    ids = (ids if isinstance(ids, Tensor) else torch.as_tensor(ids, dtype=torch.long, device="cpu")).reshape(-1)
    outside = (ids < 0) | (ids >= vocab)
    if not bool(outside.any()):
        return None
    return f"token id {int(ids[int(outside.int().argmax())])} is outside the vocabulary (0-{vocab - 1})."


def as_prompts(model, prompts, *, build_strings: bool = False, vocabulary: bool = True
               ) -> list[Prompt | Int[Tensor, "1 pos"]]:
    """One item per prompt: a :class:`Prompt` or ``[1, pos]`` token ids, each checked by :func:`as_tokens`.

    Accepts one prompt (a :class:`Prompt`, token ids as a list or tensor) or a list of them;
    a ``[batch, pos]`` tensor gives one item per row. Question strings are built with
    :func:`lensprobe.build_prompt` when ``build_strings`` is true, else refused. ``vocabulary``: as
    :func:`as_tokens` takes it; ``model`` as :func:`as_tokens` takes it.

    Example:
        >>> [len(p) for p in as_prompts(model, [p1, [1, 2, 3]])]
    """
    if isinstance(prompts, (str, Prompt, Tensor)) or (
            isinstance(prompts, (list, tuple)) and prompts and all(isinstance(i, int) for i in prompts)):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)) or len(prompts) == 0:
        raise LensprobeError("no prompt given: pass a Prompt (lp.build_prompt), token ids, or a list of those.")
    out: list = []
    for p in prompts:
        if isinstance(p, str):
            if not build_strings:
                raise LensprobeError(
                    "got a string prompt: build it first with lp.build_prompt(model, question) (which applies "
                    "the chat template), or pass token ids."
                )
            p = build_prompt(model, p)
        if isinstance(p, Prompt):
            as_tokens(model, p, vocabulary=vocabulary)
            out.append(p)
            continue
        tokens = as_tokens(model, p, vocabulary=vocabulary)
        if tokens.shape[-1] == 0:
            raise LensprobeError("a prompt is empty: pass at least one token.")
        out.extend(tokens[i: i + 1] for i in range(tokens.shape[0]))
    return out


def forward(model, prompt_or_tokens, *interventions, stop_at_layer: int | None = None
            ) -> Float[Tensor, "batch pos d_vocab"] | None:
    """One forward pass with interventions attached; returns logits (``None`` if stopped early).

    The logits are the model's own: on its device and in its dtype.

    Example:
        >>> logits = forward(model, prompt, lp.ablate_heads("L0H3"))  # [batch, pos, d_vocab]
    """
    tokens = as_tokens(model, prompt_or_tokens)
    check_positions(interventions, int(tokens.shape[-1]))
    with torch.inference_mode(), intervene(model, *interventions):
        out = model(tokens) if stop_at_layer is None else model(tokens, stop_at_layer=stop_at_layer)
    return None if stop_at_layer is not None else out


class _PatternsRecorded(Exception):
    """Ends a forward pass once the last requested attention pattern is recorded."""


def _stop_pass(pattern: Tensor, hook) -> None:
    """Hook that ends the forward pass (the patterns asked for are recorded)."""
    raise _PatternsRecorded


def attention_patterns(model, prompt_or_tokens, layers: int | list[int] | None = None,
                       *interventions) -> dict[int, Float[Tensor, "*batch head query_pos key_pos"]]:
    """Attention patterns of the requested layers, and only those.

    Only the requested ``blocks.{l}.attn.hook_pattern`` activations are kept (never a
    full cache), without copies, and the forward pass ends as soon as the last requested
    pattern is recorded: later layers, the final norm and the unembedding never run.

    Args:
        model: a TransformerLens model.
        prompt_or_tokens: a :class:`Prompt` or token ids ``[pos]``/``[batch, pos]``.
        layers: layer index or list (0-based); ``None`` for every layer.
        *interventions: more interventions to attach during the pass (e.g. ablations).

    Returns:
        ``{layer: pattern}`` with pattern ``[head, query_pos, key_pos]`` for one prompt, or
        ``[batch, head, query_pos, key_pos]`` when the tokens have several rows; float32, on the CPU.

    Example:
        >>> pats = attention_patterns(model, prompt, layers=[0])
        >>> pats[0].shape  # [head, query_pos, key_pos]
    """
    layers = check_layers(model, layers)
    tokens = as_tokens(model, prompt_or_tokens)
    # Attached after the interventions, so no later hook can edit a recorded pattern in place.
    rec = AttentionRecorder(layers=layers, copy=False)
    try:
        forward(model, tokens, *interventions, rec, (pattern_hook_name(max(layers)), _stop_pass))
    except _PatternsRecorded:
        pass
    missing = [layer for layer in layers if layer not in rec.patterns]
    if missing:
        raise LensprobeError(
            f"no attention pattern was recorded for layers {missing}: the model does not fire "
            "blocks.{l}.attn.hook_pattern (sdpa or flash attention?). Load it with "
            "lp.load_model(), which uses eager attention."
        )
    squeeze = tokens.shape[0] == 1
    pats = {layer: rec.patterns[layer].float().cpu() for layer in layers}
    return {layer: p[0] if squeeze else p for layer, p in pats.items()}
