"""The option groups several ``lensprobe`` commands share, each declared once and made into options by
:func:`~lensprobe.app.options.add_options`.

- What only the command line has, as small dataclasses whose field docstrings are the help:
  :class:`ModelOptions` (which model, where, in which dtype), :class:`SystemOptions` (the system
  prompt), :class:`QuestionOptions`, :class:`SiteOptions` (the layers and heads to record) and
  :class:`OutputOptions` (where to write, whether to show progress).
- The library's settings, as tables of what the command line adds to a configuration's fields (a
  stricter argparse type, a flag of its own): :data:`GENERATION_OPTIONS` (fields of
  :class:`~lensprobe.GenerationConfig`), :data:`EVAL_OPTIONS` (:class:`~lensprobe.EvalConfig`) and
  :data:`FILLER_OPTIONS` (:class:`~lensprobe.studies.filler.FillerSetup`). The names, defaults, choices
  and help come from the fields.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from lensprobe.app.checks import (
    MAX_TOKENS,
    filler_condition,
    int_list,
    layer_list,
    out_folder,
    positive_int,
    probability,
    temperature,
    text,
    whole,
)
from lensprobe.app.options import Option, option
from lensprobe.evals.grading import EXTRACT_METHODS
from lensprobe.evals.protocols import PROTOCOLS
from lensprobe.evals.verdicts import VERDICT_COLUMNS

__all__ = ["EVAL_OPTIONS", "ComparedFillerOptions", "DemoOptions", "ReportOptions", "FillerOptions", "Math500Options", "QuestionsOptions", "ReferenceOptions", "FILLER_OPTIONS", "GENERATION_OPTIONS", "ModelOptions", "OutputOptions", "QuestionOptions",
           "SiteOptions", "SystemOptions"]


@dataclass(frozen=True)
class ModelOptions:
    """The model a command loads (every command that runs one)."""

    model: str | None = None
    """model path (.gguf or HF folder) or hub name; default: the embedded SmolLM2-135M-Instruct; 'tiny': a tiny
    random test model"""
    device: str | None = None
    """device for the weights, e.g. cuda, cuda:1, mps, cpu (default: CUDA, then MPS, else CPU)"""
    dtype: Literal["fp32", "bf16", "fp16"] | None = field(default=None, metadata={
        "custom_args": {"choices": ("fp32", "bf16", "fp16")}})
    """weight dtype (default: fp32); attention and entropy are recorded in fp32 either way"""


@dataclass(frozen=True)
class SystemOptions:
    """The system prompt of the commands that build prompts from a question."""

    system: str | None = None
    """system prompt (default: the paper's MATH prompt)"""
    no_system: bool = False
    """no system prompt"""


@dataclass(frozen=True)
class QuestionOptions:
    """The one question a command runs."""

    question: str = field(metadata={**option(type=text), "custom_args": {"type": text, "metavar": "TEXT"}})
    """the question text"""


@dataclass(frozen=True)
class QuestionsOptions:
    """The questions a command runs, and their answers."""

    question: list[str] | None = field(default=None, metadata={
        "custom_args": {"action": "append", "type": text, "metavar": "TEXT", "nargs": None}})
    """a question (repeat for several; default: a level-1 MATH-500 problem)"""
    answer: list[str] | None = field(default=None, metadata={
        "custom_args": {"action": "append", "metavar": "TEXT", "nargs": None}})
    """the answer for --metric logprob (one, or one per question)"""


@dataclass(frozen=True)
class Math500Options:
    """MATH-500 problems as the questions."""

    math500: int | None = field(default=None, metadata={"custom_args": {"type": positive_int, "metavar": "N"}})
    """use N MATH-500 problems (seeded draw) instead of --question"""


@dataclass(frozen=True)
class ReferenceOptions:
    """The reference questions of a mean or resample ablation."""

    reference: list[str] | None = field(default=None, metadata={
        "custom_args": {"action": "append", "type": text, "metavar": "TEXT", "nargs": None}})
    """a reference question for --ablation mean (repeat for several) or resample (once)"""


@dataclass(frozen=True)
class FillerOptions:
    """The filler condition of the prompt."""

    filler: str = field(default="w/o", metadata={"custom_args": {"type": filler_condition(), "metavar": "CONDITION"}})
    """filler between system prompt and question: 'w/o' (none), 'w/ Mless' ('/' x 55), 'w/ Mful' ('he' x 55) or
    'random sentence'; also none, meaningless, meaningful, random (default w/o)"""


@dataclass(frozen=True)
class ComparedFillerOptions:
    """The filler condition compared with no filler."""

    filler: str = field(default="w/ Mless", metadata={
        "custom_args": {"type": filler_condition(), "metavar": "CONDITION"}})
    """filler condition compared with no filler: 'w/ Mless' ('/' x 55), 'w/ Mful' ('he' x 55), 'random
    sentence', or 'w/o' (no filler only); also meaningless, meaningful, random, none (default w/ Mless)"""


@dataclass(frozen=True)
class SiteOptions:
    """The layers and heads a command records (0-based, as in TransformerLens)."""

    layers: list[int] | None = field(default_factory=lambda: [0], metadata=option(type=layer_list))
    """0-based layers, e.g. 0 or 0,5,29 or all (default 0)"""
    heads: list[int] | None = field(default=None, metadata=option(type=int_list))
    """0-based heads, e.g. 0,1,7 (default: all)"""


@dataclass(frozen=True)
class OutputOptions:
    """Where a command writes, and whether it shows progress bars."""

    out: Path | None = field(default=None, metadata={
        **option(type=out_folder), "custom_args": {"type": out_folder, "metavar": "FOLDER"}})
    """output folder (default: lensprobe-COMMAND, e.g. lensprobe-sweep; demo: lensprobe-report, eval-report:
    DIR/report, reproduce: reproduce-RECIPE)"""
    no_progress: bool = False
    """no progress bar"""


@dataclass(frozen=True)
class DemoOptions:
    """What the demo runs."""

    quick: bool = False
    """tiny inputs: a fast smoke run"""


@dataclass(frozen=True)
class ReportOptions:
    """The evaluation folders a report reads, and what it compares."""

    dirs: list[Path] = field(metadata={"positional": True, "custom_args": {"nargs": "+", "metavar": "DIR"}})
    """result folder(s) of lensprobe eval (several: one per model)"""
    grader: str | None = field(default=None, metadata={"custom_args": {"choices": VERDICT_COLUMNS}})
    """verdict column of the figures (default: paper-exact for folders in the authors' format)"""
    baseline: str | None = None
    """condition compared with the others (default: the first)"""


GENERATION_OPTIONS: dict[str, Option] = {
    "max_new_tokens": Option(type=whole(1, MAX_TOKENS)),
    "do_sample": Option(flag="--sample"),
    "temperature": Option(type=temperature),
    "top_p": Option(type=probability),
    "n_samples": Option(type=positive_int),
    "seed": Option(),
}
"""The :class:`~lensprobe.GenerationConfig` fields on the command line (``trace``, ``eval``)."""

EVAL_OPTIONS: dict[str, Option] = {
    "prompt_format": Option(),
    "protocol": Option(choices=tuple(PROTOCOLS)),
    "extract": Option(choices=EXTRACT_METHODS),
    **GENERATION_OPTIONS,
    "batch_size": Option(type=positive_int),
    "grade_timeout": Option(type=whole(1, 86_400), metavar="SECONDS"),
}
"""The :class:`~lensprobe.EvalConfig` fields on the command line (``eval``; ``reproduce`` takes two)."""

FILLER_OPTIONS: dict[str, Option] = {
    "count": Option(type=whole(1, MAX_TOKENS)),
    "placement": Option(),
    "seed": Option(),
}
"""The :class:`~lensprobe.studies.filler.FillerSetup` fields on the command line (``attention``; ``mechanism``
takes ``count``)."""
