"""The settings of an evaluation as given: :data:`EvalSettings`, the fields of
:class:`~lensprobe.evals.running.config.EvalConfig`, each ``None`` when not given.

A setting not given comes from the protocol (``protocol=``), the paper format's defaults and the
model's own generation config (``prompt_format="paper"``), else :class:`EvalConfig`'s default:
:meth:`EvalSettingsBase.resolve` fills them in, with
:func:`~lensprobe.evals.running.config.with_format_defaults`, the same rule :func:`lensprobe.evaluate` applies
to keyword settings. ``lensprobe eval`` reads its options into an :data:`EvalSettings`; the generation
fields keep :class:`~lensprobe.GenerationConfig`'s help, as every command's generation options do.

Example:
    >>> s = EvalSettings(prompt_format="paper", batch_size=4)
    >>> s.given()
    {'batch_size': 4, 'prompt_format': 'paper'}
    >>> s.resolve(model).max_new_tokens  # the paper format's, and the model's sampling settings
    2048
"""

from typing import Any

from lensprobe.core.fielddocs import field_docs
from lensprobe.core.given import Given, given_settings
from lensprobe.evals.grading.extract import EXTRACT_METHODS
from lensprobe.evals.running.config import EvalConfig, with_format_defaults
from lensprobe.evals.running.protocols import PROTOCOLS
from lensprobe.generation.config import GenerationConfig

__all__ = ["EvalSettings", "EvalSettingsBase"]


class EvalSettingsBase(Given):
    """What :data:`EvalSettings` adds to its fields: the check when made, and :meth:`resolve`."""

    def __post_init__(self) -> None:
        super().__post_init__()
        given = self.given()
        if given.get("protocol") is None and given.get("prompt_format", "chat") == "chat":
            EvalConfig(**given)  # every setting is known: check them all
            return
        probe = with_format_defaults(None, given)  # the protocol's; the model's sampling is not known yet
        if "do_sample" not in given:
            probe["do_sample"] = True  # the model may sample: a sampling setting given is checked as such
        EvalConfig(**probe)

    def resolve(self, model: Any) -> EvalConfig:
        """The :class:`EvalConfig` of these settings on ``model``: the settings given, the others from
        the protocol, the paper format and the model's generation config, else :class:`EvalConfig`'s.

        Example:
            >>> EvalSettings(n_samples=4, do_sample=True).resolve(model).max_new_tokens
            512
        """
        return EvalConfig(**with_format_defaults(model, self.given()))


EvalSettings: Any = given_settings(
    EvalConfig, "EvalSettings", base=EvalSettingsBase,
    metadata={"protocol": {"custom_args": {"choices": tuple(PROTOCOLS)}},
              "extract": {"custom_args": {"choices": EXTRACT_METHODS}},
              "grade_timeout": {"custom_args": {"metavar": "SECONDS"}}},
    docs={**{name: field_docs(GenerationConfig)[name] for name in ("max_new_tokens", "seed", "n_samples")},
          "protocol": "one of the authors' protocols: arm-math500 (raw prompt, 2048 tokens, the model's "
                      "generation config, paper-exact grading), arm-aime-pass3 (their pass@3 code: single-brace "
                      "prompt, 512 tokens, sampling with top_k 50 where the config sets none, 20 samples, pass@3, "
                      "ARM at the decoder layers' defaults c=0.13, 99.5) or arm-aime-pass3-text (the same with "
                      "ARM at the benchmark's preset, as the paper's text); the settings given still win"})
"""The :class:`~lensprobe.evals.running.config.EvalConfig` fields, each ``None`` when not given (see the module docs)."""
