"""The options of the ``lensprobe`` commands that only a command line has, as small frozen dataclasses
read by simple-parsing (:mod:`lensprobe.app.parsing`): the model (:class:`ModelOptions`), the prompt
(:class:`SystemOptions`, :class:`QuestionOptions`, :class:`AnswerOptions`, :class:`FillerOptions`,
:class:`ComparedFillerOptions`, :class:`ReferenceOptions`, :class:`Math500Options`), what an evaluation runs
(:class:`ProblemOptions`, :class:`ConditionOptions`, :class:`EvalRunOptions`, :class:`GraderOptions`), the recipe
(:class:`RecipeOptions`), how many problems (:class:`LimitOptions`), a smoke run (:class:`QuickOptions`), the
filler's length (:class:`FillerCountOptions`), how long and wide ``reproduce`` generates (:class:`RunSizeOptions`),
a report (:class:`ReportOptions`) and the output
(:class:`OutputOptions`). The library's settings are its configuration classes (``EvalSettings``,
``TraceConfig``, ``AttributionConfig``, ...) and the settings several commands share (``HeadSelection``,
``AblationSettings``, ``MetricSettings``, ...), added by each command beside these.
"""

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from lensprobe.app.checks import (
    benchmark_arg,
    filler_condition,
    head_list,
    int_list,
    out_folder,
    positive_int,
    str_list,
    text,
)
from lensprobe.core.errors import LensprobeError, SettingError
from lensprobe.core.fielddocs import field_docs
from lensprobe.core.given import given_settings
from lensprobe.evals.results.verdicts import VERDICT_COLUMNS
from lensprobe.evals.running.config import EvalConfig
from lensprobe.generation.config import GenerationConfig
from lensprobe.studies.filler import MAX_COUNT, FillerSetup

QUICK_HELP = "tiny inputs: a fast smoke run (reproduce: figure recipes)"
LIMIT_HELP = "at most this many problems (reproduce: per benchmark)"
FILLER_COUNT_HELP = field_docs(FillerSetup)["count"]
"""The help of a flag, written once: each is one field of one option class."""

RunSizeSettings: Any = given_settings(
    EvalConfig, "RunSizeSettings",
    exclude=[f.name for f in fields(EvalConfig) if f.name not in ("max_new_tokens", "batch_size")],
    docs={"max_new_tokens": field_docs(GenerationConfig)["max_new_tokens"]})
"""``--max-new-tokens`` and ``--batch-size`` as :data:`~lensprobe.evals.running.settings.EvalSettings` declares
them (the fields of :class:`~lensprobe.evals.running.config.EvalConfig`), each ``None`` when not given."""

__all__ = ["FILLER_COUNT_HELP", "LIMIT_HELP", "QUICK_HELP", "AnswerOptions", "ComparedFillerOptions", "ConditionOptions",
           "EvalRunOptions", "FillerCountOptions", "FillerOptions", "GraderOptions", "LimitOptions", "QuickOptions",
           "RunSizeOptions", "RunSizeSettings",
           "Math500Options", "ModelOptions", "OutputOptions", "ProblemOptions", "QuestionOptions",
           "RecipeOptions", "ReferenceOptions", "ReportOptions", "SystemOptions"]


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
    """The system prompt of the commands that build prompts from a question (and of every ``eval`` condition)."""

    system: str | None = None
    """the system prompt (default: the paper's MATH prompt; eval: each condition's own, '' for none)"""
    no_system: bool = False
    """no system prompt"""


@dataclass(frozen=True)
class QuestionOptions:
    """The questions a command runs.

    Example:
        >>> QuestionOptions(["What is 2+3?"]).one("attention")
        'What is 2+3?'
    """

    question: list[str] | None = field(default=None, metadata={
        "custom_args": {"action": "append", "type": text, "metavar": "TEXT", "nargs": None}})
    """the question text (attention, ablate, mechanism and trace: exactly one; sweep, attribute and find-heads:
    repeat for several, default a level-1 MATH-500 problem)"""

    def one(self, command: str) -> str:
        """The one question of ``command`` (a command that runs one).

        Raises:
            LensprobeError: none given, or several (one would be dropped).
        """
        if not self.question:
            raise LensprobeError(f"{command} needs --question TEXT: the question it runs.")
        if len(self.question) > 1:
            raise LensprobeError(f"{command} runs one question, but --question was given {len(self.question)} "
                                 f"times: give it once (run {command} once per question).")
        return self.question[0]


@dataclass(frozen=True)
class AnswerOptions:
    """The answers of the log-prob metric."""

    answer: list[str] | None = field(default=None, metadata={
        "custom_args": {"action": "append", "metavar": "TEXT", "nargs": None}})
    """the answer for --metric logprob (one, or one per question; --math500: each problem's own)"""


@dataclass(frozen=True)
class Math500Options:
    """MATH-500 problems as the questions."""

    math500: int | None = field(default=None, metadata={"custom_args": {"type": positive_int, "metavar": "N"}})
    """use N MATH-500 problems (seeded draw) instead of --question; --metric logprob reads their answers"""


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
    """The filler condition compared with no filler.

    ``--compare``; ``--filler`` is the condition a prompt is built with."""

    compare: str = field(default="w/ Mless", metadata={
        "custom_args": {"type": filler_condition(), "metavar": "CONDITION"}})
    """filler condition compared with no filler: 'w/ Mless' ('/' x 55), 'w/ Mful' ('he' x 55), 'random
    sentence', or 'w/o' (no filler only); also meaningless, meaningful, random, none (default w/ Mless)"""


@dataclass(frozen=True)
class OutputOptions:
    """Where a command writes, and whether it shows progress bars."""

    out: Path | None = field(default=None, metadata={
        "custom_args": {"type": out_folder, "metavar": "FOLDER"}})
    """output folder (default: lensprobe-COMMAND, e.g. lensprobe-sweep; demo: lensprobe-report, eval-report:
    DIR/report, reproduce: reproduce-RECIPE)"""
    no_progress: bool = False
    """no progress bar"""


@dataclass(frozen=True)
class ProblemOptions:
    """The problems an evaluation runs."""

    data: str | None = None
    """JSONL file with 'problem' and 'answer' per line (default: the MATH-500 copy lensprobe ships; 'hub':
    HuggingFaceH4/MATH-500 from the Hugging Face hub)"""
    problems: Literal["math500", "arithmetic"] = "math500"
    """math500: MATH-500 (or --data); arithmetic: lensprobe's built-in one- and two-step integer problems
    (--limit problems, default 300, drawn with --seed; --levels 1 or 2 keeps one or two operations)"""
    subjects: list[str] | None = field(default=None, metadata={"custom_args": {"type": str_list, "nargs": None}})
    """keep these subjects, e.g. Algebra,Geometry"""
    levels: list[int] | None = field(default=None, metadata={"custom_args": {"type": int_list, "nargs": None}})
    """keep these levels, e.g. 1,2"""
    shuffle_seed: int | None = None
    """the problem set's own seed: MATH-500 is shuffled with it before --limit; the arithmetic set is drawn from it
    (default 0). --seed is the generation's seed only"""


@dataclass(frozen=True)
class ConditionOptions:
    """The conditions an evaluation compares."""

    conditions: str = "w/o,w/ Mless,w/ Mful"
    """comma-separated conditions; also 'random sentence', 'ARM', '<name>+ARM'; the older spellings none,
    meaningless, meaningful, random work too"""
    ablate_heads: str | None = field(default=None, metadata={"custom_args": {"type": head_list, "metavar": "HEADS"}})
    """also run every condition with these heads zero-ablated, e.g. L0H3,L1H2 (0-based)"""
    benchmark: str | None = field(default=None, metadata={"custom_args": {"type": benchmark_arg}})
    """the problems' benchmark, which picks the ARM preset: math500, aime2024, aime2025, gpqa, humaneval or
    livecodebench (default: inferred for lensprobe's MATH-500 copy and aime2025* files)"""


@dataclass(frozen=True)
class GraderOptions:
    """The verdict column an evaluation's summary and figures show (``eval`` and ``eval-report``)."""

    grader: str | None = field(default=None, metadata={"custom_args": {"choices": VERDICT_COLUMNS}})
    """verdict column of the summary and figures (default: paper-exact for the authors' format, i.e.
    --prompt-format paper, a --protocol or their folders, with math-verify beside it; else math-verify)"""


@dataclass(frozen=True)
class EvalRunOptions:
    """How the evaluation's results are kept."""

    no_resume: bool = False
    """refuse a folder that already holds results"""


@dataclass(frozen=True)
class RecipeOptions:
    """The recipe a reproduction runs."""

    recipe: str | None = field(default=None, metadata={"positional": True,
                                                       "custom_args": {"nargs": "?", "metavar": "RECIPE"}})
    """recipe name or .toml file"""
    list: bool = False
    """list the shipped recipes and exit"""


@dataclass(frozen=True)
class LimitOptions:
    """How many problems a command runs (``eval``, ``reproduce``)."""

    limit: int | None = field(default=None, metadata={"custom_args": {"type": positive_int}, "help": LIMIT_HELP})


@dataclass(frozen=True)
class QuickOptions:
    """A smoke run (``demo``, ``reproduce``)."""

    quick: bool | None = field(default=None, metadata={"custom_args": {"const": True}, "help": QUICK_HELP})
    """``None``: not given (``reproduce``: the recipe's)."""


@dataclass(frozen=True)
class FillerCountOptions:
    """The filler's length (``attention``, ``mechanism``)."""

    filler_count: int = field(default=55, metadata={"help": FILLER_COUNT_HELP})

    def __post_init__(self) -> None:
        count = self.filler_count
        if not isinstance(count, int) or isinstance(count, bool) or not 0 < count <= MAX_COUNT:
            raise SettingError("filler_count", f"expected a whole number from 1 to {MAX_COUNT:,}, got {count!r}")


@dataclass(frozen=True)
class RunSizeOptions(RunSizeSettings):
    """How long and how wide ``reproduce`` generates: :class:`~lensprobe.evals.running.config.EvalConfig`'s
    ``max_new_tokens`` and ``batch_size``, as ``eval`` takes them (``None``: not given, the recipe's)."""

    def __post_init__(self) -> None:
        for name, value in self.given().items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SettingError(name, f"expected a whole number >= 1, got {value!r}")


@dataclass(frozen=True)
class ReportOptions:
    """The evaluation folders a report reads, and what it compares."""

    dirs: list[Path] = field(metadata={"positional": True, "custom_args": {"nargs": "+", "metavar": "DIR"}})
    """result folder(s) of lensprobe eval (several: one per model)"""
    baseline: str | None = None
    """condition compared with the others (default: the first)"""
