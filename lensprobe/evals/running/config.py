"""The settings of an evaluation run: :class:`EvalConfig` (a :class:`~lensprobe.GenerationConfig`
plus batch size, prompt format, answer extraction and protocol) and the authors' generation
settings (:func:`paper_generation_settings`). The harness (:mod:`lensprobe.evals.running.harness`) and the
runner (:mod:`lensprobe.evals.running.execute`) both import it from here.

Example:
    >>> cfg = EvalConfig(max_new_tokens=256, batch_size=4)
    >>> identity(cfg)["batch_size"]          # every setting is in the identity, defaults included
    4
"""

import dataclasses
from dataclasses import dataclass
from typing import Any

from lensprobe.core.checks import check_annotated, choice, count
from lensprobe.core.errors import SettingError
from lensprobe.core.prompts.conditions import (
    PROMPT_FORMATS,
    PromptFormat,
)
from lensprobe.evals.grading.extract import check_extract
from lensprobe.evals.grading.mathverify import GRADE_TIMEOUT, check_timeout
from lensprobe.evals.running.protocols import get_protocol
from lensprobe.generation.config import GenerationConfig

__all__ = ["PAPER_MAX_NEW_TOKENS", "TRANSFORMERS4_TOP_K", "EvalConfig", "applied_sampling", "loaded_generation_config",
           "model_samples", "paper_generation_settings", "with_format_defaults"]

PAPER_MAX_NEW_TOKENS = 2048

MAX_BATCH_SIZE = 1_000_000
"""No device holds more rows at once: a larger ``batch_size`` is a typo."""


@dataclass(frozen=True)
class EvalConfig(GenerationConfig):
    """Generation settings of an evaluation run: a :class:`~lensprobe.GenerationConfig` plus a batch size.

    Attributes:
        max_new_tokens: generated tokens per answer at most (default 512).
        batch_size: rows generated at once; a finished row's slot takes the next prompt
            (continuous batching). In the run's identity: a row run in a batch equals the row run
            alone only up to float rounding (the batch's padding and shapes change the order of
            sums), so a folder is resumed only with the batch size it was written with.
        seed: base seed of sampling (default 0; used only when sampling).
        n_samples: answers per problem, for pass@k (more than one needs sampling: ``do_sample=True``,
            ``--sample``).
        prompt_format: how the built-in conditions build their prompts: ``"chat"``, the model's
            chat template (default), or ``"paper"``, the authors' raw string (no chat template;
            their system prompt + filler + problem as one string), generating up to 2048 new
            tokens with the model's own sampling settings unless given. The generation defaults of the paper format are applied by
            :func:`evaluate` when settings are passed as keywords, or by
            :meth:`EvalConfig.paper`.
        extract: how the answer is read from the generated text: ``"boxed"`` (the last
            ``\\boxed{...}``, default) or ``"last-number"`` (the last number, lm-eval's flexible
            extraction; :func:`~lensprobe.evals.grading.extract.extract_last_number`).
        protocol: one of the authors' protocols; its settings (prompt format, tokens, sampling, samples) apply where none are given.
            The protocols are :data:`~lensprobe.evals.running.protocols.PROTOCOLS`; :func:`evaluate` and
            :meth:`EvalConfig.paper` apply their settings.
        grade_timeout: whole seconds math-verify may spend on each step of grading an answer
            (default 5); a timeout is no verdict, counted and reported. The default is
            :data:`~lensprobe.evals.grading.mathverify.GRADE_TIMEOUT`, ``None`` sets no limit, and a
            timed-out verdict is ``None``.

    The run's identity (:func:`~lensprobe.core.storage.identity.identity`) holds every field, defaults
    included, so a folder written under an old default never matches a run under a new one.

    The other fields (``do_sample``, ``temperature``, ``top_p``, ``stop_at_eos``, ``thinking``,
    ``think_when``) are :class:`~lensprobe.GenerationConfig`'s.
    """

    max_new_tokens: int = 512
    seed: int = 0
    batch_size: int = 8
    prompt_format: PromptFormat = "chat"
    extract: str = "boxed"
    protocol: str | None = None
    grade_timeout: int | None = GRADE_TIMEOUT

    @classmethod
    def paper(cls, model, **settings) -> "EvalConfig":
        """The authors' generation settings for ``model`` with ``prompt_format="paper"``;
        ``settings`` given here win (see :func:`paper_generation_settings`).

        Example:
            >>> cfg = EvalConfig.paper(model, batch_size=4)
            >>> cfg.max_new_tokens, cfg.prompt_format
            (2048, 'paper')
        """
        return cls(**with_format_defaults(model, {**settings, "prompt_format": "paper"}))

    def __post_init__(self) -> None:
        check_annotated(self)  # every field by its type, then the bounds
        choice("prompt_format", self.prompt_format, PROMPT_FORMATS)
        check_extract(self.extract)
        check_timeout(self.grade_timeout, "grade_timeout")
        if self.protocol is not None and get_protocol(self.protocol).settings["prompt_format"] != self.prompt_format:
            raise SettingError("protocol", f"{{setting}} {self.protocol!r} uses prompt_format='paper', got "
                                           f"{self.prompt_format!r}: drop prompt_format (the protocol sets it).")
        count("batch_size", self.batch_size, 1, MAX_BATCH_SIZE)
        super().__post_init__()

    def generation(self) -> GenerationConfig:
        """The settings :func:`lensprobe.generate` runs with (the seed only when sampling)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(GenerationConfig)}
        return GenerationConfig(**{**fields, "seed": self.seed if self.do_sample else None})


TRANSFORMERS4_TOP_K = 50
"""``transformers``' ``top_k`` when a generation config leaves it unset (4.x, the authors' version, and 5.x)."""


def loaded_generation_config(model) -> Any:
    """The generation configuration ``model`` was loaded with (``model.original_model.generation_config``:
    the model's ``generation_config.json``), or ``None`` when it has none (a TransformerLens 3.x
    ``HookedTransformer``, a model built without one)."""
    return getattr(getattr(model, "original_model", None), "generation_config", None)


def model_samples(model) -> bool:
    """Whether ``model`` samples by its loaded generation configuration (its ``do_sample``); a model with no
    generation configuration decodes greedily, as ``transformers``' ``generate`` does then.

    Example:
        >>> model_samples(lp.load_model())   # SmolLM2's generation_config.json has no do_sample
        False
    """
    gen = loaded_generation_config(model)
    return bool(getattr(gen, "do_sample", False)) if gen is not None else False


def paper_generation_settings(model, do_sample: bool | None = None) -> dict:
    """How the authors generate: ``max_new_tokens=2048`` and the model's own generation config.

    Every setting of the loaded generation config (:func:`loaded_generation_config`) that changes the
    next-token distribution is taken (greedy when there is none): ``do_sample``, ``repetition_penalty``
    (greedy too) and, with sampling, ``temperature``, ``top_p``, ``top_k`` and ``min_p``. The authors ran
    ``transformers`` 4.x, whose ``generate`` applies ``top_k=50`` when the generation config leaves
    ``top_k`` unset (so does 5.x): so does this (only an explicit ``0`` turns it off).

    Args:
        model: the model.
        do_sample: ``generate(do_sample=...)`` of the authors' call (their pass@3 script passes
            ``True``); ``None``: the generation config's. Sampling forced on a greedy configuration takes
            the configuration's sampling fields and ``transformers``' defaults for the others
            (``top_k=50``), as ``generate(do_sample=True)`` does.

    Example:
        >>> paper_generation_settings(model)
        {'max_new_tokens': 2048, 'do_sample': False}
        >>> paper_generation_settings(model, do_sample=True)["top_k"]   # a greedy config, sampled
        50
    """
    out: dict[str, Any] = {"max_new_tokens": PAPER_MAX_NEW_TOKENS,
                           "do_sample": model_samples(model) if do_sample is None else bool(do_sample)}
    gen = loaded_generation_config(model)
    penalty = getattr(gen, "repetition_penalty", None)
    if penalty not in (None, 1.0):
        out["repetition_penalty"] = float(penalty)
    if out["do_sample"]:
        for name in ("temperature", "top_p", "min_p"):
            value = getattr(gen, name, None)
            if value is not None:
                out[name] = float(value)
        top_k = getattr(gen, "top_k", None)
        out["top_k"] = TRANSFORMERS4_TOP_K if top_k is None else int(top_k)
    return out


def applied_sampling(model, config: GenerationConfig | None = None) -> dict[str, Any]:
    """The sampling fields as the generation applies them: ``do_sample``, ``temperature``, ``top_p``,
    ``top_k`` and ``min_p`` (``None`` where a field does not apply: every one when greedy, ``top_k`` and
    ``top_p`` when they cut nothing), and ``repetition_penalty`` (greedy too; ``None`` when off).

    Args:
        model: the model, whose generation config gives the settings when ``config`` is ``None``.
        config: the run's settings (an :class:`EvalConfig` or :class:`~lensprobe.GenerationConfig`);
            ``None``: the authors' format on ``model`` (:func:`paper_generation_settings`).

    Example:
        >>> applied_sampling(model, EvalConfig(do_sample=True, top_k=50))
        {'do_sample': True, 'temperature': 1.0, 'top_p': None, 'top_k': 50, 'min_p': None, 'repetition_penalty': None}
    """
    if config is None:
        config = GenerationConfig(**paper_generation_settings(model))
    sampled = bool(config.do_sample)
    return {"do_sample": sampled,
            "temperature": float(config.temperature) if sampled else None,
            "top_p": float(config.top_p) if sampled and config.top_p < 1 else None,
            "top_k": int(config.top_k) if sampled and config.top_k > 0 else None,
            "min_p": float(config.min_p) if sampled and config.min_p else None,
            "repetition_penalty": float(config.repetition_penalty) if config.repetition_penalty != 1 else None}


def with_format_defaults(model, settings: dict) -> dict:
    """``settings`` with the defaults of the ``"paper"`` format (:func:`paper_generation_settings`)
    and of ``settings["protocol"]`` filled in; the settings given win.

    Example:
        >>> with_format_defaults(model, {"protocol": "arm-aime-pass3"})["n_samples"]
        20
    """
    name = settings.get("protocol")
    if name is None and settings.get("prompt_format") != "paper":
        return settings
    fixed = {**(get_protocol(name).settings if name is not None else {}), **settings}
    return {**paper_generation_settings(model, fixed.get("do_sample")), **fixed}
