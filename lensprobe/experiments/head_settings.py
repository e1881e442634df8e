"""The settings of the head studies. Those several commands share are declared once, each a small frozen
dataclass: :class:`HeadSelection` (``--heads``), :class:`AblationSettings` (``--ablation``),
:class:`MetricSettings` (``--metric``, ``--tokens``), :class:`AblationBatch` (``--heads-per-forward``) and
:class:`RecallCheck` (``--random-heads``). Each study's own are one frozen dataclass each: :class:`AblateConfig`
(:func:`~lensprobe.interventions.ablation.ablate_heads` on one question), :class:`AttributionConfig`
(:func:`~lensprobe.experiments.attribution.attribute_heads`, then
:func:`~lensprobe.experiments.verify.verify_attribution`) and :class:`FindHeadsConfig`
(:func:`~lensprobe.experiments.findheads.find_heads`). Their defaults are the functions';
``lensprobe ablate``, ``sweep`` (the shared ones only), ``attribute`` and ``find-heads`` read their options
from these fields.

Example:
    >>> heads, ablation, metric = HeadSelection("L0H0,L0H1"), AblationSettings("mean"), MetricSettings()
    >>> lp.ablation_sweep(model, prompts, metric.metric, heads=heads.spec(), method=ablation.ablation,
    ...                   batch_size=AblationBatch().heads_per_forward, reference=refs)
"""

from dataclasses import dataclass, field
from typing import Literal

from lensprobe.core.checks import check_annotated, choice, count, finite_number
from lensprobe.core.errors import LensprobeError, SettingError
from lensprobe.core.hooks.heads import parse_heads

__all__ = ["ABLATION_METHODS", "ATTRIBUTION_METHODS", "GRADIENT_METRICS", "HEADS", "AblateConfig", "AblationBatch",
           "AblationMethod", "AblationSettings", "AttributionConfig", "AttributionMethod", "FindHeadsConfig",
           "HeadSelection", "MetricSettings", "RecallCheck", "check_heads_setting", "head_spec"]

AblationMethod = Literal["zero", "mean", "resample"]
"""How a head is ablated: its output at ``hook_z`` set to 0, to its mean over reference prompts, or to its
output on a reference prompt."""
ABLATION_METHODS: tuple[str, ...] = ("zero", "mean", "resample")

AttributionMethod = Literal["atp", "atp*"]
"""AtP (one forward and one backward pass) or AtP* (with the QK fix and GradDrop)."""
ATTRIBUTION_METHODS: tuple[str, ...] = ("atp", "atp*")

TOP_K_MAX = 10_000


def head_spec(text: str) -> str:
    """A head list as typed on a command line: plain numbers are heads in every layer (``"0,7"`` ->
    ``"H0,H7"``, the older ``--heads`` of ``attention`` and ``mechanism``); labels stay as they are.

    Example:
        >>> head_spec("0,L1H2")
        'H0,L1H2'
    """
    return ",".join(f"H{p.strip()}" if p.strip().isascii() and p.strip().isdigit() else p for p in text.split(","))


HEADS = {"custom_args": {"type": head_spec, "metavar": "HEADS"}}
"""The metadata of a ``heads`` field: on the command line plain numbers are heads in every layer."""


def check_heads_setting(heads: str) -> str:
    """``heads`` checked as :func:`~lensprobe.core.hooks.heads.parse_heads` reads it (no model needed).

    Raises:
        SettingError: an empty list, a label that is not one, or a head named twice.

    Example:
        >>> check_heads_setting("L0H3,L1H2")
        'L0H3,L1H2'
    """
    if not isinstance(heads, str) or not heads.replace(",", "").strip():
        raise SettingError("heads", f"expected at least one head, e.g. L0H1, got {heads!r} (an empty list would "
                                    "ablate nothing; to run without ablation leave it out)")
    try:
        selectors = parse_heads(heads)
    except LensprobeError as err:
        raise SettingError("heads", str(err)) from None
    twice = sorted({s for s in selectors if selectors.count(s) > 1}, key=str)
    if twice:
        raise SettingError("heads", f"{heads!r} names a head twice ({twice[0]}): name each once")
    return heads


def _check_tokens(metric: str, tokens: str | None) -> None:
    """``tokens`` is given exactly for ``logit_diff``, as two comma-separated tokens."""
    if metric == "logit_diff" and not tokens:
        raise SettingError("tokens", "metric logit_diff needs {setting} A,B (the two tokens compared, e.g. 7,8)")
    if tokens is not None and metric != "logit_diff":
        raise SettingError("tokens", f"metric {metric} reads no tokens, only logit_diff does: drop {{setting}} (got "
                                     f"{tokens!r}) or use metric logit_diff")
    if tokens is not None and len(tokens.split(",")) != 2:
        raise SettingError("tokens", f"{{setting}} takes two tokens separated by a comma (e.g. 7,8 or ' 7',' 8'), got "
                                     f"{tokens!r}")


def token_pair(tokens: str | None) -> tuple[int | str, ...] | None:
    """``"7,8"`` -> ``(7, 8)``: the two tokens of ``logit_diff`` as the experiments take them (ids or text).

    Example:
        >>> token_pair("7, 8")
        (7, 8)
    """
    if tokens is None:
        return None
    return tuple(int(s) if s.strip().isdigit() else s for s in tokens.split(","))


@dataclass(frozen=True)
class HeadSelection:
    """The heads a command ablates, sweeps or records.

    ``--heads``, declared once for every command that takes it.

    Example:
        >>> HeadSelection("L0H3,L1H2").spec()
        'L0H3,L1H2'
    """

    heads: str | None = field(default=None, metadata=HEADS)
    """heads, e.g. L0H3,L1H2 (0-based), H13 or 13 (head 13 in every layer recorded), or all (the default; ablate
    needs them named)"""

    def __post_init__(self) -> None:
        check_annotated(self)
        if self.heads is not None:
            check_heads_setting(self.heads)

    def spec(self, default: str = "all") -> str:
        """The heads given, else ``default``."""
        return self.heads if self.heads is not None else default


@dataclass(frozen=True)
class AblationSettings:
    """How a head is ablated.

    ``--ablation``, declared once for every command that takes it.

    Example:
        >>> AblationSettings("mean").ablation
        'mean'
    """

    ablation: AblationMethod = "zero"
    """ablation method: zero, mean (over the --reference questions) or resample (one --reference question)"""

    def __post_init__(self) -> None:
        check_annotated(self)
        choice("ablation", self.ablation, ABLATION_METHODS)


GRADIENT_METRICS: tuple[str, ...] = ("entropy", "logprob", "logit_diff")
"""The metrics with a gradient (attribution and find-heads estimate with it)."""


@dataclass(frozen=True)
class MetricSettings:
    """What a head study measures.

    ``--metric`` and ``--tokens``, declared once for every command that takes them.

    Example:
        >>> MetricSettings("logit_diff", tokens="7,8").token_pair()
        (7, 8)
    """

    metric: str = "entropy"
    """entropy (next token, last position) | logprob (needs --answer) | logit_diff (needs --tokens) |
    attention:<segment>, e.g. attention:system (sweep and patch-heads only: attention carries no gradient)"""
    tokens: str | None = field(default=None, metadata={"custom_args": {"metavar": "A,B"}})
    """the two tokens of --metric logit_diff, ids or text (e.g. 7,8)"""

    def __post_init__(self) -> None:
        check_annotated(self)
        if not isinstance(self.metric, str) or not self.metric.strip():
            raise SettingError("metric", f"expected a metric name such as entropy, got {self.metric!r}")
        _check_tokens(self.metric, self.tokens)

    def token_pair(self) -> tuple[int | str, ...] | None:
        """The two tokens as the experiments take them (:func:`token_pair`)."""
        return token_pair(self.tokens)

    def check_gradient(self) -> None:
        """Refuse a metric without a gradient (what ``attribute`` and ``find-heads`` estimate with).

        Raises:
            SettingError: an attention metric, or an unknown one.
        """
        if self.metric not in GRADIENT_METRICS:
            raise SettingError("metric", f"expected one of {', '.join(GRADIENT_METRICS)}, got {self.metric!r} "
                                         "(attention metrics carry no gradient: measure them exactly with lensprobe "
                                         "sweep)")


@dataclass(frozen=True)
class AblateConfig:
    """Where ``lensprobe ablate`` ablates on one question, and what it lists.

    The heads and the ablation are :class:`HeadSelection` and :class:`AblationSettings`.

    Example:
        >>> AblateConfig().show_tokens
        10
    """

    positions: str | None = field(default=None, metadata={"custom_args": {"metavar": "POSITIONS"}})
    """restrict the ablation to a prompt segment (e.g. question) or positions (e.g. 3,4,5); default: every one"""
    show_tokens: int = 10
    """next tokens to list (at most 10,000 and the vocabulary)"""

    def __post_init__(self) -> None:
        check_annotated(self)
        count("show_tokens", self.show_tokens, 1, TOP_K_MAX)

    def position_spec(self) -> str | list[int] | None:
        """``positions`` as :func:`~lensprobe.interventions.ablation.ablate_heads` takes it ("3,4" -> [3, 4])."""
        parts = (self.positions or "").split(",")
        if self.positions is not None and all(p.strip().isdigit() for p in parts):
            return [int(p) for p in parts]
        return self.positions


@dataclass(frozen=True)
class AblationBatch:
    """How many heads one forward ablates.

    ``--heads-per-forward``, declared once for ``sweep``, ``attribute``, ``find-heads`` and ``patch-heads``.

    Example:
        >>> AblationBatch().heads_per_forward  # the functions' batch_size
        32
    """

    heads_per_forward: int = 32
    """heads (or KV groups) handled per batched forward: single-head ablations, and AtP*'s QK fix"""

    def __post_init__(self) -> None:
        check_annotated(self)
        count("heads_per_forward", self.heads_per_forward, 1)


@dataclass(frozen=True)
class RecallCheck:
    """The heads drawn at random to check what was missed.

    ``--random-heads``, declared once for ``attribute`` and ``find-heads``.

    Example:
        >>> RecallCheck().count(10)  # not given: the command's default
        10
    """

    random_heads: int | None = None
    """heads drawn at random from the rest and ablated exactly, the recall check (default: attribute 0,
    find-heads 10)"""

    def __post_init__(self) -> None:
        check_annotated(self)
        if self.random_heads is not None:
            count("random_heads", self.random_heads, 0)

    def count(self, default: int) -> int:
        """The heads to draw: those given, else ``default``."""
        return self.random_heads if self.random_heads is not None else default


@dataclass(frozen=True)
class AttributionConfig:
    """How ``lensprobe attribute`` estimates every head's ablation effect, and how many it verifies.

    Example:
        >>> AttributionConfig().attribution  # lp.attribute_heads' default
        'atp'
    """

    attribution: AttributionMethod = "atp"
    """attribution method: atp, or atp* (with the QK fix and GradDrop)"""
    unit: Literal["head", "kv"] = "head"
    """one row per query head, or per KV group"""
    verify: int = 20
    """ablate the K top heads exactly to check the estimates (0: none)"""

    def __post_init__(self) -> None:
        check_annotated(self)
        choice("attribution", self.attribution, ATTRIBUTION_METHODS)
        choice("unit", self.unit, ("head", "kv"))
        count("verify", self.verify, 0)

    def attribution_kwargs(self) -> dict:
        """The keywords of :func:`~lensprobe.experiments.attribution.attribute_heads` these settings give (the
        heads per forward: an :class:`AblationBatch`)."""
        return {"method": self.attribution, "unit": self.unit}


@dataclass(frozen=True)
class FindHeadsConfig:
    """How ``lensprobe find-heads`` finds the exact top heads (:func:`~lensprobe.experiments.findheads.find_heads`).

    Example:
        >>> FindHeadsConfig().refine  # lp.find_heads' default
        3
    """

    top: int = 20
    """how many heads to find"""
    flag: float = field(default=0.07, metadata={"infinite": True})
    """ablate exactly every head whose ablation moves the residual stream by more than this share of its norm"""
    step: int = 5
    """heads verified per step on every prompt, in AtP's order"""
    refine: int = 3
    """heads verified per step on each prompt alone, in its own AtP order (0: none)"""

    def __post_init__(self) -> None:
        check_annotated(self)
        count("top", self.top, 1)
        finite_number("flag", self.flag, 0, allow_inf=True)  # a share of the residual stream's norm; inf: none
        for name in ("step", "refine"):
            count(name, getattr(self, name), 0 if name == "refine" else 1)

    def find_kwargs(self) -> dict:
        """The keywords of :func:`~lensprobe.experiments.findheads.find_heads` these settings give (the random
        heads and the heads per forward: a :class:`RecallCheck` and an :class:`AblationBatch`)."""
        return {"top": self.top, "flag": self.flag, "step": self.step, "refine": self.refine}
