"""lm-eval's ``loglikelihood`` requests scored on a lensprobe model: left-padded batches, longest first, with
the condition's interventions attached once per batch (:class:`lensprobe.evals.lmeval.LensprobeLM` calls
:func:`continuation_scores`)."""

from collections.abc import Sequence

import torch

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import intervene
from lensprobe.core.models.facts import ModelFacts, model_facts

__all__ = ["continuation_scores"]


def continuation_scores(model, rows: list[list[int]], conts: list[list[int]], interventions: Sequence = (),
                        batch_size: int = 8, *, facts: ModelFacts | None = None) -> list[tuple[float, bool]]:
    """Summed log-probability of each continuation and whether greedy decoding gives it, batched.

    Args:
        model: a TransformerLens bridge.
        rows: per request, the input token ids: context and continuation without its last token.
        conts: per request, the continuation's token ids (the last ``len(cont)`` inputs predict them).
        interventions: attached with :func:`lensprobe.intervene`, once per batch.
        batch_size: requests per forward (longest first, left-padded, with an attention mask).
        facts: the model's facts, read once by the caller (``None``: read here).

    Raises:
        LensprobeError: a request longer than the model's context.

    Example:
        >>> continuation_scores(model, [[5, 6, 7]], [[7, 8]])   # log P(7, 8 | 5, 6)
    """
    facts = facts if facts is not None else model_facts(model)
    n_ctx = facts.n_ctx
    longest = max((len(r) for r in rows), default=0)
    if longest > n_ctx:
        raise LensprobeError(f"a request is {longest} tokens but the model's context is {n_ctx}: lensprobe does "
                             "not truncate it (that would drop the filler); use shorter contexts or fewer few-shot "
                             "examples.")
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
    out: list[tuple[float, bool]] = [(0.0, False)] * len(rows)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        keep = max(len(conts[i]) for i in chunk)
        logp = _last_log_probs(model, facts, [rows[i] for i in chunk], keep, interventions)
        for b, i in enumerate(chunk):
            target = torch.tensor(conts[i], device=logp.device)
            read = logp[b, keep - len(target):]
            out[i] = (float(read.gather(-1, target[:, None]).sum()), bool((read.argmax(-1) == target).all()))
    return out


def _last_log_probs(model, facts: ModelFacts, rows: list[list[int]], keep: int, interventions: Sequence
                    ) -> torch.Tensor:
    """``[batch, keep, d_vocab]`` float32 log-softmax at the last ``keep`` positions of left-padded ``rows``."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), facts.pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[b, width - len(r):] = 1
    ids, mask = ids.to(facts.device), mask.to(facts.device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode(), intervene(model, *interventions):
        logits = model(ids, attention_mask=mask, position_ids=positions, return_type="logits")
    return torch.log_softmax(logits[:, -keep:].float(), dim=-1)
