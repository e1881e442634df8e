"""When to think: rules that decide, at each generation step, which rows take a thinking step.

A rule is any callable ``rule(state: StepState) -> Bool[Tensor, " batch"]``. At step ``t``
the generation loop has the next-token logits of every row and the token that decoding
chose; the rule marks the rows whose step ``t`` becomes a *thinking step*: the step's token
is recorded as the thinking token and the input at the new position is the thinking input
(a :class:`~lensprobe.generation.thinking.latent.LatentFusion` vector or a :class:`~lensprobe.generation.thinking.latent.Pause`
embedding). Steps count from 0; step 0 is the first generated position.

Built-in rules (combine them with ``|``):

- :func:`emitted`: the model chose the thinking token itself (LT-Tuning's rule, the default);
- :func:`first`: ``k`` latent steps right after the prompt (steps ``0 .. k-1``);
- :func:`every`: one thinking step every ``n`` steps;
- :func:`at`: explicit steps;
- :func:`entropy_above`: next-token entropy above a threshold (confidence-driven);
- :func:`never`: no thinking steps.

Example:
    >>> import lensprobe as lp
    >>> rule = lp.generation.schedule.first(4) | lp.generation.schedule.every(16)
    >>> trace = lp.trace_generation(model, prompt, max_new_tokens=64,
    ...                             thinking=lp.generation.LatentFusion(alpha=0.6), think_when=rule)
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from lensprobe.core.errors import LensprobeError

__all__ = [
    "Rule",
    "StepState",
    "at",
    "check_rule",
    "emitted",
    "entropy_above",
    "every",
    "first",
    "never",
]


@dataclass(frozen=True)
class StepState:
    """What a rule sees at one generation step (one value per batch row).

    Attributes:
        step: the generation step, from 0 (the first generated position).
        logits: next-token logits ``[batch, d_vocab]`` of this step.
        entropy: their entropy in nats ``[batch]``.
        tokens: the tokens decoding chose ``[batch]`` (before any thinking decision).
        thinking_token_id: id of the thinking token.
        n_thinking: thinking steps taken so far by each row ``[batch]``.
    """

    step: int
    logits: Float[Tensor, "batch d_vocab"]
    entropy: Float[Tensor, " batch"]
    tokens: Int[Tensor, " batch"]
    thinking_token_id: int
    n_thinking: Int[Tensor, " batch"]

    def all_rows(self, value: bool) -> Bool[Tensor, " batch"]:
        return torch.full(self.tokens.shape, value, dtype=torch.bool, device=self.tokens.device)


class Rule:
    """Base of the built-in rules: ``rule(state) -> [batch]`` bool, combinable with ``|``."""
    def __call__(self, state: StepState) -> Bool[Tensor, " batch"]:  # pragma: no cover - abstract
        raise NotImplementedError

    def __or__(self, other: "Rule | Callable") -> "AnyOf":
        check_rule(other)
        return AnyOf((self, other))

    def __ror__(self, other: "Rule | Callable") -> "AnyOf":
        check_rule(other)
        return AnyOf((other, self))


@dataclass(frozen=True)
class AnyOf(Rule):
    """A step thinks when any of the rules says so."""
    rules: tuple

    def __call__(self, state: StepState) -> Bool[Tensor, " batch"]:
        out = state.all_rows(False)
        for rule in self.rules:
            out = out | rule(state)
        return out


@dataclass(frozen=True)
class Emitted(Rule):
    """The model chose the thinking token (LT-Tuning's rule)."""
    def __call__(self, state: StepState) -> Bool[Tensor, " batch"]:
        return state.tokens == state.thinking_token_id


@dataclass(frozen=True)
class Steps(Rule):
    """Thinking at a fixed set of steps, or at steps matching ``step % every == offset``."""
    steps: tuple[int, ...] = ()
    period: int = 0
    offset: int = 0
    until: int | None = None

    def __call__(self, state: StepState) -> Bool[Tensor, " batch"]:
        t = state.step
        hit = t in self.steps
        if self.period and t >= self.offset and (self.until is None or t < self.until):
            hit = hit or (t - self.offset) % self.period == 0
        return state.all_rows(hit)


@dataclass(frozen=True)
class EntropyAbove(Rule):
    """Thinking when the next-token entropy (nats) exceeds ``threshold``."""
    threshold: float

    def __call__(self, state: StepState) -> Bool[Tensor, " batch"]:
        return state.entropy > self.threshold


def emitted() -> Rule:
    """Think when the model itself chose the thinking token (LT-Tuning's rule; the default).

    Example:
        >>> lp.trace_generation(model, p, max_new_tokens=64, thinking=lp.generation.LatentFusion(),
        ...                     think_when=lp.generation.schedule.emitted())
    """
    return Emitted()


def first(k: int) -> Rule:
    """``k`` thinking steps right after the prompt: steps ``0 .. k-1``.

    Example:
        >>> lp.generation.schedule.first(4)  # 4 latent steps, then ordinary decoding
    """
    if not isinstance(k, int) or k < 1:
        raise LensprobeError(f"schedule.first(k) needs an integer k >= 1, got {k!r}.")
    return Steps(steps=tuple(range(k)))


def every(n: int, *, offset: int | None = None, until: int | None = None) -> Rule:
    """One thinking step every ``n`` steps.

    Args:
        n: the period (>= 2: ``n = 1`` would make every step a thinking step).
        offset: the first thinking step; default ``n - 1``, so each block of ``n`` steps is
            ``n - 1`` ordinary tokens followed by one thinking step.
        until: no thinking steps from this step on (default: none).

    Example:
        >>> lp.generation.schedule.every(8)  # steps 7, 15, 23, ... are thinking steps
    """
    if not isinstance(n, int) or n < 2:
        raise LensprobeError(f"schedule.every(n) needs an integer n >= 2, got {n!r}.")
    offset = n - 1 if offset is None else offset
    if not isinstance(offset, int) or offset < 0:
        raise LensprobeError(f"schedule.every: offset must be an integer >= 0, got {offset!r}.")
    return Steps(period=n, offset=offset, until=until)


def at(steps: Sequence[int]) -> Rule:
    """Thinking at exactly these steps (0-based).

    Example:
        >>> lp.generation.schedule.at([0, 1, 10])
    """
    steps = tuple(steps)
    if not steps or not all(isinstance(s, int) and s >= 0 for s in steps):
        raise LensprobeError(f"schedule.at needs a non-empty list of steps >= 0, got {steps!r}.")
    return Steps(steps=steps)


def entropy_above(threshold: float) -> Rule:
    """Think when the model is unsure: next-token entropy above ``threshold`` nats.

    Example:
        >>> lp.generation.schedule.entropy_above(2.5)
    """
    if not isinstance(threshold, (int, float)) or not 0 <= threshold < float("inf"):  # NaN would never fire
        raise LensprobeError(f"entropy threshold must be a finite number >= 0 (nats), got {threshold!r}.")
    return EntropyAbove(float(threshold))


def never() -> Rule:
    """No thinking steps (useful to keep the thinking set tracked without thinking)."""
    return Steps()


def check_rule(rule) -> None:
    """Raise a clear error unless ``rule`` is callable."""
    if not callable(rule):
        raise LensprobeError(
            f"think_when must be a rule such as lp.generation.schedule.every(8) or a callable "
            f"state -> bool[batch], got {type(rule).__name__}."
        )


def parse_schedule(text: str):
    """A schedule from text: ``every:8``, ``first:4``, ``at:0,1,5``, ``entropy:2.5``, ``emitted``,
    ``never``, or several joined with ``+`` (any of them).

    Example:
        >>> parse_schedule("first:4+every:16")
    """
    if not isinstance(text, str) or not text.strip():
        raise LensprobeError("empty schedule: use e.g. 'every:8', 'first:4', 'entropy:2.5' or 'emitted'.")
    rules = []
    for part in text.replace(" ", "").split("+"):
        name, _, arg = part.partition(":")
        try:
            if name == "every":
                rules.append(every(int(arg)))
            elif name == "first":
                rules.append(first(int(arg)))
            elif name == "at":
                rules.append(at([int(v) for v in arg.split(",") if v]))
            elif name == "entropy":
                rules.append(entropy_above(float(arg)))
            elif name == "emitted" and not arg:
                rules.append(emitted())
            elif name == "never" and not arg:
                rules.append(never())
            else:
                raise ValueError(part)
        except ValueError:
            raise LensprobeError(
                f"cannot read schedule part {part!r}: use every:N, first:K, at:S1,S2, entropy:NATS, emitted "
                "or never, joined with '+'."
            ) from None
    rule = rules[0]
    for r in rules[1:]:
        rule = rule | r
    return rule
