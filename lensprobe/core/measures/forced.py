"""Measures over given tokens: a logit difference, and metrics over a teacher-forced continuation.

These complete :mod:`lensprobe.core.measures.measure` for head studies that ask "which heads matter
for *this* answer": the continuation (e.g. a generation's tokens) is fed after the prompt
(teacher forcing) and the measure reads the positions that predict it. Like every measure
they are pure functions of the logits, differentiable (attribution takes their gradient),
and ``NaN`` when the logits they read are not finite.

- :class:`LogitDiff`: ``logit[a] - logit[b]`` at the last position;
- :class:`ContinuationLogProb`: summed log-probability of the continuation's tokens;
- :class:`ContinuationEntropy`: mean next-token entropy over the positions that predict them.

:func:`resolve_measures` is the one vocabulary of metrics (:data:`METRIC_NAMES`): sweeps, patching,
attribution and its verification all turn the metric they are given into one measure per prompt
through it, so every name works wherever the math allows (attribution needs a gradient, so it
refuses the attention metrics, saying why).

Example:
    >>> m = ContinuationEntropy((271, 374, 220))
    >>> values = measure_once(model, m, prompt)   # [1]: mean entropy over 3 positions
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.forward import as_tokens
from lensprobe.core.measures.measure import MEASURE_NAMES, Measure, resolve_measure
from lensprobe.core.measures.metrics import entropy, nonfinite_rows
from lensprobe.core.prompts.special import text_ids

__all__ = ["METRIC_NAMES", "Continuation", "ContinuationEntropy", "ContinuationLogProb", "LogitDiff", "resolve_measures",
           "token_id"]

METRIC_NAMES = MEASURE_NAMES
"""The metric names every head study takes (besides a measure object or a callable), see :func:`resolve_measures`."""


def token_id(model, token: int | str) -> int:
    """The id of one token given as an id or as text that is exactly one token; text that is a control
    token (``"<|im_end|>"``) is refused (:func:`~lensprobe.core.prompts.special.text_ids`): give its id.

    Example:
        >>> token_id(model, " 7")
        1046
    """
    if isinstance(token, int) and not isinstance(token, bool):
        vocab = int(model.cfg.d_vocab)
        if not 0 <= token < vocab:
            raise LensprobeError(f"token id {token} out of range: the vocabulary has {vocab} tokens (0-{vocab - 1}).")
        return token
    if isinstance(token, str):
        ids = text_ids(model.tokenizer, token, "the token")
        if len(ids) != 1:
            raise LensprobeError(
                f"{token!r} is {len(ids)} tokens, not one: pass a string that is a single token (mind the "
                "leading space, e.g. ' 7') or its token id."
            )
        return int(ids[0])
    raise LensprobeError(f"a token must be an id or a one-token string, got {type(token).__name__} {token!r}.")


@dataclass(frozen=True)
class LogitDiff:
    """``logit[a] - logit[b]`` at the last position (token ids; see :func:`token_id`)."""
    a: int
    b: int
    name: str = "logit difference"

    def inputs(self, model, prompt) -> Tensor:
        return as_tokens(model, prompt, one_row=True)

    def recorders(self, model, prompt) -> list:
        return []

    def logits_needed(self, model, prompt) -> int:
        return 1

    def compute(self, logits: Tensor, tokens: Tensor, prompt, recorders: list) -> Tensor:
        last = logits[:, -1].float()
        return (last[:, self.a] - last[:, self.b]).masked_fill(nonfinite_rows(last), torch.nan)


@dataclass(frozen=True)
class Continuation:
    """Base of the continuation measures: the prompt, then ``tokens`` fed after it (teacher forcing)."""
    tokens: tuple[int, ...]

    def inputs(self, model, prompt) -> Tensor:
        if not self.tokens:
            raise LensprobeError("the continuation is empty: pass at least one token (e.g. a generation's tokens).")
        head = as_tokens(model, prompt, one_row=True)
        tail = torch.tensor([list(self.tokens)], dtype=head.dtype, device=head.device)
        return as_tokens(model, torch.cat([head, tail], dim=1))

    def recorders(self, model, prompt) -> list:
        return []

    def logits_needed(self, model, prompt) -> int:
        return len(self.tokens) + 1

    def _read(self, logits: Tensor) -> Tensor:
        """``[batch, k, vocab]``: the logits that predict the ``k`` continuation tokens."""
        return logits[:, -(len(self.tokens) + 1): -1].float()


@dataclass(frozen=True)
class ContinuationLogProb(Continuation):
    """Summed log-probability of the continuation's tokens after the prompt (teacher forcing)."""
    name: str = "continuation log-prob"

    def compute(self, logits: Tensor, tokens: Tensor, prompt, recorders: list) -> Tensor:
        read = self._read(logits)
        logp = torch.log_softmax(read, dim=-1)
        index = torch.tensor(self.tokens, device=logp.device)[None, :, None].expand(logp.shape[0], -1, 1)
        return logp.gather(-1, index)[..., 0].sum(-1).masked_fill(nonfinite_rows(read).any(-1), torch.nan)


@dataclass(frozen=True)
class ContinuationEntropy(Continuation):
    """Mean next-token entropy (nats) over the positions that predict the continuation's tokens."""
    name: str = "continuation entropy"

    def compute(self, logits: Tensor, tokens: Tensor, prompt, recorders: list) -> Tensor:
        return entropy(self._read(logits)).mean(-1)


def _ids(model, continuation) -> tuple[int, ...]:
    if isinstance(continuation, str):
        return tuple(text_ids(model.tokenizer, continuation, "the continuation"))
    if isinstance(continuation, Tensor):
        continuation = continuation.flatten().tolist()
    ids = tuple(int(i) for i in continuation)
    vocab = int(model.cfg.d_vocab)
    if any(not 0 <= i < vocab for i in ids):
        raise LensprobeError(f"continuation token ids must lie in 0..{vocab - 1}.")
    return ids


def _per_prompt(value, n: int, what: str) -> list:
    """``value`` once per prompt: one for all, or a list of ``n``."""
    if value is None or isinstance(value, (str, Tensor)) or (
            isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value)):
        return [value] * n
    value = list(value)
    if len(value) != n:
        raise LensprobeError(f"got {len(value)} {what} for {n} prompts: pass one for all, or one per prompt.")
    return value


def resolve_measures(model, metric: Any, n: int, *, answers: str | Sequence[str] | None = None,
                     tokens: Sequence[int | str] | None = None, continuation: Any = None,
                     gradient: bool = False) -> list[Measure]:
    """One measure per prompt from a metric name, a measure or a callable: the one metric vocabulary
    of sweeps, patching, attribution and verification.

    Args:
        model: the model (its tokenizer turns strings into ids).
        metric: ``"entropy"`` (next-token entropy at the last prompt position, nats),
            ``"logprob"`` (summed log-probability of ``answers`` fed after the prompt),
            ``"logit_diff"`` (``logit[a] - logit[b]`` at the last position, ``tokens=(a, b)``),
            ``"attention:<segment>"`` (attention proportion onto a prompt segment, e.g.
            ``"attention:filler"``; not with ``gradient``),
            a :class:`~lensprobe.core.measures.measure.Measure`, or a callable
            ``fn(logits [batch, pos, vocab], prompt) -> [batch]`` (row by row).
        n: the number of prompts.
        answers: the answer text for ``"logprob"``, one for all or one per prompt.
        tokens: the two tokens of ``"logit_diff"`` (ids or one-token strings).
        continuation: token ids (or text) fed after each prompt, one for all or one per prompt:
            ``"entropy"`` is then the mean entropy over the positions that predict them,
            ``"logprob"`` their summed log-probability (teacher forcing over a generation).
        gradient: the caller differentiates the measure (attribution): attention metrics,
            read from recorded patterns that carry no gradient, are refused.

    Raises:
        LensprobeError: an unknown metric, a missing ``answers``/``tokens``, an attention
            metric with ``gradient``, a list of the wrong length, or an answer, token or continuation
            given as text that is or holds a control token.

    Example:
        >>> resolve_measures(model, "logit_diff", 2, tokens=(" 7", " 8"))
        [LogitDiff(a=1046, b=1047, ...), LogitDiff(a=1046, b=1047, ...)]
    """
    if tokens is not None and metric != "logit_diff":
        raise LensprobeError(f"tokens={tuple(tokens)!r} were given, but only metric 'logit_diff' reads them, not "
                             f"{metric!r}: drop tokens, or use metric='logit_diff'.")
    if continuation is not None:
        if metric not in ("entropy", "logprob"):
            raise LensprobeError(
                f"a continuation works with metric 'entropy' or 'logprob', not {metric!r}: for other metrics put "
                "the continuation into the prompt's token ids and read its positions in a callable."
            )
        cls = ContinuationEntropy if metric == "entropy" else ContinuationLogProb
        return [cls(_ids(model, c)) for c in _per_prompt(continuation, n, "continuations")]
    if metric == "logit_diff":
        if tokens is None or isinstance(tokens, str) or len(tokens) != 2:
            raise LensprobeError("metric 'logit_diff' needs tokens=(a, b): two token ids or one-token strings.")
        return [LogitDiff(token_id(model, tokens[0]), token_id(model, tokens[1]))] * n
    if gradient and isinstance(metric, str) and metric.strip().lower().startswith("attention:"):
        raise LensprobeError(
            f"metric {metric!r} reads recorded attention, which carries no gradient, so attribution cannot "
            "estimate it: use 'entropy', 'logprob', 'logit_diff' or a callable of the logits, or measure it "
            "exactly with lp.ablation_sweep."
        )
    given = _per_prompt(answers, n, "answers")
    measures = [resolve_measure(metric, answer=a) for a in given]
    for text in dict.fromkeys(a for a in given if isinstance(a, str) and a):
        text_ids(model.tokenizer, text, "the answer")  # a control token is refused before any forward
    return measures

