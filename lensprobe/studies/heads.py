"""Head studies: which heads carry an effect, and where one head's attention goes.

- :func:`head_attention_over_generation`: the paper's "average attention on head H" per
  token position over the prompt *plus generated tokens*, for two conditions (filler span
  dropped, so positions line up);
- :func:`ablation_effect`: how an intervention changes the next-token distribution at the
  last prompt position.

The head-ablation sections of the demo report are built in :mod:`lensprobe.app.sections.heads`.

For the prompt alone use :func:`lensprobe.studies.filler.attention_received_by_condition`; both tables
have the same columns and draw with :func:`lensprobe.viz.head_attention_figure`.
"""

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import check_positions
from lensprobe.core.hooks.forward import as_tokens, attention_patterns
from lensprobe.core.hooks.heads import head_label, resolve_heads
from lensprobe.core.lazy import pandas
from lensprobe.core.measures.measure import run_logits
from lensprobe.core.measures.metrics import average_attention_received, entropy
from lensprobe.core.prompts.conditions import canonical_condition_name
from lensprobe.core.prompts.prompt import Prompt
from lensprobe.generation.loop import generate
from lensprobe.studies.filler import FillerSetup, aligned_positions, condition_prompts

if TYPE_CHECKING:
    import pandas as pd


def one_head(model, head: Any) -> tuple[int, int]:
    """The single ``(layer, head)`` that ``head`` names on ``model`` (e.g. ``"L0H3"`` or ``(0, 3)``)."""
    pairs = resolve_heads(model, head)
    if len(pairs) != 1:
        raise LensprobeError(f"pass exactly one head (e.g. 'L0H3'), got {len(pairs)}: {pairs[:4]}...")
    return pairs[0]


def generate_greedy(model, prompts, max_new_tokens: int, *interventions) -> list[list[int]]:
    """Greedily generated token ids after each prompt (KV-cached, batched; stops at EOS), with
    ``interventions`` attached, through :func:`lensprobe.generate`."""

    out = generate(model, list(prompts), max_new_tokens=max_new_tokens, interventions=list(interventions))
    return out.generated_ids


def generated_tokens(model, prompts: dict[str, Prompt], max_new_tokens: int,
                     given: dict[str, Sequence[int]] | None = None) -> dict[str, list[int]]:
    """Generated token ids per condition: those ``given`` (keys in any spelling), the rest
    generated greedily in one batch."""
    gen = {canonical_condition_name(c): [int(t) for t in ids] for c, ids in (given or {}).items()}
    todo = [c for c in prompts if c not in gen]
    if todo:
        gen.update(zip(todo, generate_greedy(model, [prompts[c] for c in todo], max_new_tokens), strict=True))
    return {c: [int(t) for t in gen[c]] for c in prompts}


def head_rows(model, condition: str, prompt: Prompt, new: list[int], layer: int, head: int) -> "pd.DataFrame":
    """Average attention received on one head over ``prompt`` followed by the ``new`` tokens."""
    pd = pandas()
    tokens = torch.cat([prompt.tokens, torch.tensor([new], dtype=prompt.tokens.dtype, device=prompt.tokens.device)], dim=1)
    pattern = attention_patterns(model, tokens, [layer])[layer][head]
    recv = average_attention_received(pattern.float()).cpu().tolist()
    n = len(prompt)
    kept = aligned_positions(prompt)
    aligned: list[Any] = [pd.NA] * (n + len(new))
    for k, pos in enumerate(kept):
        aligned[pos] = k
    for k in range(len(new)):
        aligned[n + k] = len(kept) + k
    str_new = [model.tokenizer.decode([t]) for t in new]
    return pd.DataFrame({
        "condition": condition, "layer": layer, "head": head, "head_label": head_label(layer, head),
        "position": range(n + len(new)), "aligned_pos": pd.array(aligned, dtype="Int64"),
        "token": list(prompt.str_tokens) + str_new,
        "segment": [prompt.segment_of(p) for p in range(n)] + ["generated"] * len(new),
        "attention": recv,
    })


def head_attention_over_generation(model, question: str, head: Any, *,
                                   conditions: Sequence[str] = ("w/o", "w/ Mless"),
                                   max_new_tokens: int = 48, setup: FillerSetup | None = None,
                                   generated: dict[str, Sequence[int]] | None = None) -> "pd.DataFrame":
    """Average attention on one head per position over prompt + generated tokens, per condition.

    Each condition's prompt is generated from greedily (:func:`lensprobe.generate`: KV-cached,
    the conditions batched with left padding); then one forward pass
    over prompt + generated tokens gives the head's pattern, and
    :func:`~lensprobe.core.measures.metrics.average_attention_received` the mean attention each position
    receives from the later positions. Positions are aligned by dropping the filler span;
    generated tokens follow the prompt and may differ between conditions (the ``token``
    column says which).

    Args:
        model: a TransformerLens model.
        question: the question text.
        head: one head, e.g. ``"L0H3"`` or ``(0, 3)`` (0-based).
        conditions: conditions as in :class:`~lensprobe.studies.filler.FillerSetup`
            (``"w/o"``, ``"w/ Mless"``, ``"w/ Mful"``, ``"random sentence"``, aliases, or
            :class:`~lensprobe.core.prompts.conditions.Condition` objects).
        max_new_tokens: tokens to generate per condition.
        setup: a :class:`~lensprobe.studies.filler.FillerSetup` for the prompt settings.
        generated: already generated token ids per condition (skips generation).

    Returns:
        A DataFrame with columns ``condition``, ``layer``, ``head``, ``head_label``,
        ``position``, ``aligned_pos``, ``token``, ``segment`` (``"generated"`` after the
        prompt) and ``attention``.

    Example:
        >>> t = head_attention_over_generation(model, "What is 12+7?", "L0H3", max_new_tokens=32)
        >>> fig = lp.viz.head_attention_figure(t, 0, 3)
    """
    layer, h = one_head(model, head)
    setup = replace(setup or FillerSetup(), conditions=tuple(conditions))
    prompts = condition_prompts(model, question, setup)
    gen = generated_tokens(model, prompts, max_new_tokens, generated)
    frames = [head_rows(model, cond, prompt, gen[cond], layer, h) for cond, prompt in prompts.items()]
    return pandas().concat(frames, ignore_index=True)


@dataclass(frozen=True)
class AblationEffect:
    """How an intervention changes the next-token prediction at the last prompt position.

    Attributes:
        summary: ``entropy_clean``, ``entropy_ablated``, ``entropy_change`` (nats),
            ``kl`` (KL(clean || ablated), nats), ``max_abs_logit_change``, ``top_token_clean``,
            ``top_token_ablated``.
        tokens: one row per token among the top ``k`` of either run: ``token``, ``token_id``,
            ``p_clean``, ``p_ablated``, ``logit_clean``, ``logit_ablated``, ``logit_change``.
    """

    summary: dict[str, Any]
    tokens: "pd.DataFrame"


def ablation_effect(model, prompt, *interventions, top_k: int = 10) -> AblationEffect:
    """Compare the next-token distribution at the last prompt position with and without ``interventions``.

    Example:
        >>> eff = ablation_effect(model, prompt, lp.ablate_heads("L0H3"))
        >>> eff.summary["entropy_change"], eff.tokens.head()
    """
    pd = pandas()
    tokens = as_tokens(model, prompt)
    check_positions(interventions, int(tokens.shape[-1]))  # before the clean forward too
    clean = run_logits(model, tokens, 1)[0, -1].float()
    after = run_logits(model, tokens, 1, *interventions)[0, -1].float()
    logp_c, logp_a = torch.log_softmax(clean, -1), torch.log_softmax(after, -1)
    ids = sorted(set(clean.topk(top_k).indices.tolist()) | set(after.topk(top_k).indices.tolist()),
                 key=lambda i: -float(logp_c[i]))
    decode = model.tokenizer.decode
    df = pd.DataFrame({
        "token": [decode([i]) for i in ids], "token_id": ids,
        "p_clean": [float(logp_c[i].exp()) for i in ids], "p_ablated": [float(logp_a[i].exp()) for i in ids],
        "logit_clean": [float(clean[i]) for i in ids], "logit_ablated": [float(after[i]) for i in ids],
    })
    df["logit_change"] = df["logit_ablated"] - df["logit_clean"]
    e_c, e_a = float(entropy(clean)), float(entropy(after))
    summary = {
        "entropy_clean": e_c, "entropy_ablated": e_a, "entropy_change": e_a - e_c,
        "kl": float((logp_c.exp() * (logp_c - logp_a)).sum()),
        "max_abs_logit_change": float((after - clean).abs().max()),
        "top_token_clean": decode([int(clean.argmax())]), "top_token_ablated": decode([int(after.argmax())]),
    }
    return AblationEffect(summary, df)
