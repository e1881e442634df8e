"""What an ablation or patching run measures: one number per batch row, bound to a prompt.

A measure says which tokens to run (``inputs``: the prompt, plus the answer for answer
log-probabilities), which recorders it needs (``recorders``), and how to turn logits and
recordings into one value per batch row (``compute``). Sweeps and patching run many
variants of the same prompt in one batch and compare each row's value with the clean
row's.

Built in (also by name in :func:`resolve_measure`):

- ``"entropy"``: :class:`NextTokenEntropy`, next-token entropy (nats) at the last prompt position;
- ``"logprob"``: :class:`AnswerLogProb`, summed log-probability of the answer tokens
  given the prompt (needs ``answer``);
- ``"attention:<segment>"``: :class:`AttentionTo`, attention proportion onto a prompt
  segment, averaged over layers, heads and the queries after the segment;
- a callable ``fn(logits, prompt) -> [batch]``: :class:`CallableMeasure`.

**Non-finite values.** A measure never turns NaN or infinity into a number (the rule of
:mod:`lensprobe.core.measures.metrics`): a row whose logits at the positions the measure reads hold a
NaN or ``+inf`` (or only ``-inf``), or whose recorded attention does, measures ``NaN``. A
callable's value is ``NaN`` for every batch row whose logits hold such a position anywhere,
whatever the function returns.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import AttentionRecorder, check_positions, intervene
from lensprobe.core.hooks.forward import as_tokens
from lensprobe.core.measures.metrics import attention_proportion, entropy, nonfinite_rows
from lensprobe.core.models.loading import check_layers
from lensprobe.core.prompts.special import text_ids


@runtime_checkable
class Measure(Protocol):
    """One value per batch row from a forward pass over (copies of) one prompt."""

    @property
    def name(self) -> str:
        """The measure's label in tables (a read-only attribute: frozen dataclasses satisfy it)."""
        ...

    def inputs(self, model, prompt) -> Int[Tensor, "1 pos"]: ...

    def recorders(self, model, prompt) -> list: ...

    def compute(self, logits: Tensor, tokens: Tensor, prompt, recorders: list) -> Float[Tensor, " batch"]: ...


def logits_needed(measure, model, prompt) -> int:
    """How many final positions' logits ``measure`` reads (0 = all); optional on a measure."""
    fn = getattr(measure, "logits_needed", None)
    return int(fn(model, prompt)) if fn is not None else 0


@dataclass(frozen=True)
class NextTokenEntropy:
    """Next-token entropy (nats) at ``position`` (default: the last prompt position)."""
    position: int | None = None
    name: str = "entropy"

    def inputs(self, model, prompt) -> Tensor:
        return as_tokens(model, prompt, one_row=True)

    def recorders(self, model, prompt) -> list:
        return []

    def logits_needed(self, model, prompt) -> int:
        return 1 if self.position is None else 0

    def compute(self, logits: Tensor, tokens: Tensor, prompt, recorders: list) -> Tensor:
        pos = -1 if self.position is None else self.position
        return entropy(logits[:, pos]).float()


@dataclass(frozen=True)
class AnswerLogProb:
    """Summed log-probability of ``answer``'s tokens, fed after the prompt (teacher forcing). An answer
    that is or holds a control token's text is refused (:func:`~lensprobe.core.prompts.special.text_ids`)."""
    answer: str
    name: str = "answer log-prob"

    def _answer_ids(self, model) -> list[int]:
        if not isinstance(self.answer, str) or not self.answer:
            raise LensprobeError("the answer log-prob measure needs a non-empty answer string.")
        ids = text_ids(model.tokenizer, self.answer, "the answer")
        if not ids:
            raise LensprobeError(f"answer {self.answer!r} tokenizes to nothing.")
        return ids

    def inputs(self, model, prompt) -> Tensor:
        tokens = as_tokens(model, prompt, one_row=True)
        ans = torch.tensor([self._answer_ids(model)], dtype=tokens.dtype, device=tokens.device)
        return torch.cat([tokens, ans], dim=1)

    def recorders(self, model, prompt) -> list:
        return []

    def logits_needed(self, model, prompt) -> int:
        return len(self._answer_ids(model)) + 1

    def compute(self, logits: Tensor, tokens: Tensor, prompt, recorders: list) -> Tensor:
        n_prompt = int(prompt.tokens.shape[1] if hasattr(prompt, "tokens") else torch.as_tensor(prompt).shape[-1])
        answer = tokens[0, n_prompt:]
        first = n_prompt - 1 - (tokens.shape[1] - logits.shape[1])  # logits may cover the last positions only
        read = logits[:, first: -1].float()
        logp = torch.log_softmax(read, dim=-1)  # [batch, n_answer, vocab]
        index = answer.to(logp.device)[None, :, None].expand(logp.shape[0], -1, 1)
        return logp.gather(-1, index)[..., 0].sum(-1).masked_fill(nonfinite_rows(read).any(-1), torch.nan)


@dataclass(frozen=True)
class AttentionTo:
    """Attention proportion onto a prompt segment (or key positions).

    Per layer and head: the attention mass each query after the segment puts on the
    segment's keys, averaged over those queries (:func:`lensprobe.core.measures.metrics.attention_proportion`);
    then the mean over ``layers`` (default: all) and heads.
    """

    segment: str | Sequence[int]
    layers: tuple[int, ...] | None = None
    name: str = ""

    def _keys(self, prompt) -> list[int]:
        if isinstance(self.segment, str):
            if not hasattr(prompt, "positions"):
                raise LensprobeError(
                    f"the attention measure names segment {self.segment!r}: pass Prompts (lp.build_prompt), "
                    "not raw token ids."
                )
            return prompt.positions(self.segment)
        return [int(k) for k in self.segment]

    def inputs(self, model, prompt) -> Tensor:
        return as_tokens(model, prompt, one_row=True)

    def logits_needed(self, model, prompt) -> int:
        return 1

    def recorders(self, model, prompt) -> list:
        keys = self._keys(prompt)
        layers = check_layers(model, None if self.layers is None else list(self.layers))

        def reduce(pattern: Tensor) -> Tensor:
            return attention_proportion(pattern, keys)  # [batch, head]

        return [AttentionRecorder(layers=layers, reduce=reduce)]

    def compute(self, logits: Tensor, tokens: Tensor, prompt, recorders: list) -> Tensor:
        rec = recorders[0]
        per_layer = [rec.patterns[layer] for layer in rec.layers]  # [batch, head]; batch 1 where rows agree
        rows = max(p.shape[0] for p in per_layer)
        return torch.stack([p.expand(rows, -1) for p in per_layer]).mean(dim=(0, 2)).float()


@dataclass(frozen=True)
class CallableMeasure:
    """A user function ``fn(logits [batch, pos, vocab], prompt) -> [batch]``."""
    fn: Callable[[Tensor, Any], Tensor]
    name: str = "custom"

    def inputs(self, model, prompt) -> Tensor:
        return as_tokens(model, prompt, one_row=True)

    def recorders(self, model, prompt) -> list:
        return []

    def compute(self, logits: Tensor, tokens: Tensor, prompt, recorders: list) -> Tensor:
        out = _real_values(self.fn(logits, prompt), self.name)
        if out.ndim == 0 and logits.shape[0] == 1:
            out = out[None]
        if out.shape != (logits.shape[0],):
            raise LensprobeError(
                f"the metric function returned shape {tuple(out.shape)}; it must return one value per "
                f"batch row, shape ({logits.shape[0]},), from logits [batch, pos, vocab]."
            )
        broken = nonfinite_rows(logits).reshape(logits.shape[0], -1).any(1).cpu()
        return out.masked_fill(broken, torch.nan)


def _real_values(out: Any, name: str) -> Tensor:
    """What a metric function returned, as float32 on the CPU: real numbers only (``None``, text or a
    complex value is refused, naming the function, rather than failing inside torch or losing the
    imaginary part)."""
    try:
        values = torch.as_tensor(out)
    except (TypeError, ValueError, RuntimeError):
        values = None
    if values is None or values.is_complex() or not (values.is_floating_point() or values.dtype in _REAL_INTS):
        kind = f"{values.dtype} values" if values is not None else f"{type(out).__name__} {str(out)[:40]!r}"
        raise LensprobeError(f"the metric function {name!r} returned {kind}: it must return real numbers, one per "
                             "batch row (a float tensor of shape [batch]).")
    return values.to(device="cpu", dtype=torch.float32)


_REAL_INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)


_ANSWER_NAMES = ("logprob", "answer_logprob", "log-prob", "answer log-prob")

MEASURE_NAMES = ("entropy", "logprob", "logit_diff", "attention:<segment>")
"""The metric names of :func:`lensprobe.core.measures.forced.resolve_measures` (``logit_diff`` needs the model)."""


def resolve_measure(metric: Any, *, answer: str | None = None) -> Measure:
    """A :class:`Measure` from a name, a measure object, or a callable.

    Args:
        metric: ``"entropy"``, ``"logprob"`` (needs ``answer``), ``"attention:<segment>"``
            (e.g. ``"attention:filler"``), a :class:`Measure`, or a callable
            ``fn(logits [batch, pos, vocab], prompt) -> [batch]``.
        answer: the answer text for ``"logprob"``.

    Example:
        >>> resolve_measure("attention:filler")
        AttentionTo(segment='filler', layers=None, name='attention onto filler')
    """
    if isinstance(metric, Measure) and not isinstance(metric, type):
        return metric
    if isinstance(metric, str):
        key = metric.strip()
        if answer is not None and key.lower() not in _ANSWER_NAMES:
            raise LensprobeError(f"metric {metric!r} reads no answer, but one was given ({answer!r}): drop the answer, "
                                 "or use metric 'logprob' to measure it.")
        if key.lower() == "entropy":
            return NextTokenEntropy()
        if key.lower() in _ANSWER_NAMES:
            if answer is None:
                raise LensprobeError(
                    "metric 'logprob' needs the answer: pass answer='...' (or answers=[...] to a sweep)."
                )
            return AnswerLogProb(answer)
        if key.lower() == "logit_diff":
            raise LensprobeError(
                "metric 'logit_diff' needs the model and two tokens: resolve it with "
                "lensprobe.core.measures.forced.resolve_measures(model, 'logit_diff', n, tokens=(a, b))."
            )
        if key.lower().startswith("attention:") and key.split(":", 1)[1].strip():
            seg = key.split(":", 1)[1].strip()
            return AttentionTo(seg, name=f"attention onto {seg}")
    elif callable(metric):
        return CallableMeasure(metric, name=getattr(metric, "__name__", "custom"))
    raise LensprobeError(
        f"unknown metric {metric!r}: use one of {', '.join(MEASURE_NAMES)}, a Measure, or a callable "
        "fn(logits, prompt) -> [batch]."
    )


def run_logits(model, tokens: Tensor, keep: int, *interventions) -> Tensor:
    """Logits of one forward (inference mode) with ``interventions``; only the last ``keep``
    positions when ``keep > 0`` (skips the unembedding elsewhere)."""
    check_positions(interventions, int(tokens.shape[-1]))
    with torch.inference_mode(), intervene(model, *interventions):
        if keep > 0:
            try:
                return model(tokens, logits_to_keep=keep)
            except TypeError:  # a model without logits_to_keep
                return model(tokens)[:, -keep:]
        return model(tokens)


def run_measure(model, measure: Measure, prompt, tokens: Tensor, *interventions) -> tuple[Tensor, Tensor]:
    """``(values [batch], logits)`` of ``measure`` on ``tokens`` (rows of ``measure.inputs``)."""
    recs = measure.recorders(model, prompt)
    logits = run_logits(model, tokens, logits_needed(measure, model, prompt), *interventions, *recs)
    return measure.compute(logits, tokens, prompt, recs).detach().float().cpu(), logits


def measure_once(model, measure: Measure, prompt, *interventions) -> Float[Tensor, " batch"]:
    """Run ``prompt`` once with ``interventions`` attached and return the measure's value."""
    return run_measure(model, measure, prompt, measure.inputs(model, prompt), *interventions)[0]
