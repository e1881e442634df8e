"""The settings of one generation: length, sampling, samples per prompt, stop rule, thinking.

:class:`GenerationConfig` is taken by :func:`lensprobe.generate`,
:func:`lensprobe.trace_generation`, the thinking study
(:func:`lensprobe.studies.thinking.compare_thinking`) and, extended with a batch size, by the
evaluations (:class:`lensprobe.EvalConfig`). Every function that takes one also accepts its
fields as keyword arguments (``max_new_tokens=64, do_sample=True``), which override the
config's.
"""

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lensprobe.core.checks import check_annotated, count, finite_number
from lensprobe.core.errors import LensprobeError, SettingError
from lensprobe.core.models.facts import ModelFacts
from lensprobe.generation.thinking.latent import LatentFusion, Pause
from lensprobe.generation.thinking.schedule import check_rule, emitted

__all__ = ["MAX_NEW_TOKENS", "MIN_TEMPERATURE", "GenerationConfig", "check_end_ids", "generation_config"]

MAX_NEW_TOKENS = 10_000_000
"""No model's context holds more tokens: a larger ``max_new_tokens`` is a typo."""

MIN_TEMPERATURE = 1e-3
"""The lowest sampling temperature: logits divided by less overflow float32 (inf/nan probabilities)."""


@dataclass(frozen=True)
class GenerationConfig:
    """How to generate: checked when made, before any forward.

    Attributes:
        max_new_tokens: steps to generate (thinking steps count); the prompt length plus this
            must fit the model's context.
        do_sample: sample instead of greedy decoding (greedy is ``argmax`` of the logits).
        temperature: sampling temperature: the logits are divided by it (ignored when greedy).
        top_p: nucleus sampling threshold: sample among the most probable tokens whose
            probabilities add up to ``top_p`` (ignored when greedy).
        top_k: with sampling, keep only the ``top_k`` most probable tokens (``0``: no cut;
            ``transformers`` 4.x applied 50 when a generation config left it unset).
        min_p: with sampling, drop tokens less probable than ``min_p`` times the most probable
            (``None``: no cut).
        repetition_penalty: divide the logits of tokens already in the row (prompt and
            generated) by it when positive, multiply when negative; greedy too (``1``: off).
            The order and semantics are ``transformers``' (:mod:`lensprobe.generation.sampling`).
        seed: sampling seed. With sampling, each row draws from its own generator seeded with
            ``(seed, j)``, ``j`` its sample index: results are reproducible, a prompt gives the
            same samples alone or in a batch, and sample ``j`` of every prompt (and of every
            condition) uses the same random numbers (common random numbers for paired
            comparisons). ``None``: torch's global generator.
        n_samples: samples (rows) per prompt; rows are ordered prompt by prompt.
        stop_at_eos: a row stops after its end-of-sequence token (recorded as its last step):
            the tokenizer's, the model's generation config's, and ``eos_token_id``'s. A model
            without a tokenizer (token-id prompts) stops only at the ids these name.
        eos_token_id: end-of-sequence token id(s) of this call, besides the model's (an int or
            a tuple of ints).
        thinking: ``None``, :class:`~lensprobe.generation.LatentFusion` or :class:`~lensprobe.generation.Pause`.
        think_when: a rule from :mod:`lensprobe.generation.thinking.schedule`; with ``thinking`` it
            defaults to ``schedule.emitted()`` (the model emits the thinking token).

    Example:
        >>> cfg = lp.GenerationConfig(max_new_tokens=128, do_sample=True, seed=0, n_samples=4)
        >>> lp.generate(model, prompt, cfg).texts
        >>> lp.generate(model, prompt, cfg, temperature=0.7)  # a field overridden for one call
    """

    max_new_tokens: int
    do_sample: bool = field(default=False, metadata={"alias": ["--sample"]})
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    seed: int | None = None
    n_samples: int = 1
    stop_at_eos: bool = True
    # not command-line options ("cmd": False): objects, or ids a command line has no use for
    eos_token_id: int | tuple[int, ...] | None = field(default=None, metadata={"cmd": False})
    thinking: LatentFusion | Pause | None = field(default=None, metadata={"cmd": False})
    think_when: Any = field(default=None, metadata={"cmd": False})

    def __post_init__(self) -> None:
        if isinstance(self.eos_token_id, list):  # a list of ids is taken as the tuple it is kept as
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        check_annotated(self)  # every field by its type: "false" is no bool, True no count, NaN no number
        count("max_new_tokens", self.max_new_tokens, 1, MAX_NEW_TOKENS)
        count("n_samples", self.n_samples, 1, MAX_NEW_TOKENS)
        finite_number("temperature", self.temperature, MIN_TEMPERATURE)  # below it the scaled logits overflow
        finite_number("top_p", self.top_p, 0, 1, lo_open=True)
        object.__setattr__(self, "top_k", count("top_k", self.top_k, 0))
        if self.min_p is not None:
            finite_number("min_p", self.min_p, 0, 1)
        finite_number("repetition_penalty", self.repetition_penalty, 0, lo_open=True)
        if self.eos_token_id is not None:
            ids = self.eos_token_id if isinstance(self.eos_token_id, tuple) else (self.eos_token_id,)
            if not ids:
                raise SettingError("eos_token_id", "expected a token id >= 0 or a tuple of them, got ()")
            object.__setattr__(self, "eos_token_id", tuple(count("eos_token_id", i, 0) for i in ids))
        if self.n_samples > 1 and not self.do_sample:
            raise SettingError("n_samples", f"{{setting}}={self.n_samples} with greedy decoding gives {self.n_samples} "
                                            "identical answers: set do_sample=True (e.g. --sample) or n_samples=1.")
        self._check_thinking()

    def _check_thinking(self) -> None:
        if self.thinking is not None and not isinstance(self.thinking, (LatentFusion, Pause)):
            raise LensprobeError(
                f"thinking must be lp.generation.LatentFusion(...), lp.generation.Pause() or None, got {type(self.thinking).__name__}."
            )
        if self.think_when is not None and self.thinking is None:
            raise LensprobeError("think_when was given without thinking=...: pass lp.generation.LatentFusion() or lp.generation.Pause().")
        if self.thinking is not None:
            if self.think_when is None:
                object.__setattr__(self, "think_when", emitted())
            check_rule(self.think_when)

    def replace(self, **changes) -> "GenerationConfig":
        """A copy with some fields changed (checked again)."""
        _check_names(type(self), changes)
        if changes.get("thinking", self.thinking) is None and "think_when" not in changes:
            changes["think_when"] = None  # a default schedule goes with the thinking it was made for
        return dataclasses.replace(self, **changes)


def check_end_ids(config: GenerationConfig, facts: ModelFacts) -> None:
    """Refuse end ids of ``config`` outside the model's vocabulary (known when a run starts, from its facts):
    such an id can never be generated, so the row would never stop at it.

    Raises:
        SettingError: ``eos_token_id`` holds an id ``>= facts.d_vocab``, named with the vocabulary's size.
    """
    outside = [i for i in config.eos_token_id or () if i >= facts.d_vocab]  # type: ignore[union-attr]
    if outside:
        raise SettingError("eos_token_id", f"end id(s) {outside} lie outside the model's vocabulary of "
                                           f"{facts.d_vocab:,} tokens: give ids below {facts.d_vocab:,}")


def generation_config(config: GenerationConfig | None, settings: Mapping[str, Any]) -> GenerationConfig:
    """``config`` with ``settings`` (field names as keywords) applied; a new config if ``None``.

    Raises:
        LensprobeError: an unknown setting name, a missing ``max_new_tokens``, or a bad value.
    """
    if config is not None and not isinstance(config, GenerationConfig):
        raise LensprobeError(f"config must be an lp.GenerationConfig, got {type(config).__name__}.")
    _check_names(GenerationConfig, settings)
    if config is not None:
        return config.replace(**settings) if settings else config
    if "max_new_tokens" not in settings:
        raise LensprobeError("max_new_tokens is required: pass max_new_tokens=N or config=lp.GenerationConfig(N).")
    return GenerationConfig(**settings)


def _check_names(cls, settings: Mapping[str, Any]) -> None:
    fields = [f.name for f in dataclasses.fields(cls)]
    unknown = [name for name in settings if name not in fields]
    if unknown:
        raise LensprobeError(f"unknown generation setting {unknown[0]!r}: the settings are {', '.join(fields)}.")

