"""The settings of the attention studies, one frozen dataclass each: :class:`AttentionConfig`
(which layers and heads :func:`~lensprobe.studies.filler.attention_received_by_condition` records) and
:class:`MechanismConfig` (:func:`~lensprobe.studies.mechanism.filler_affine_fit` and
:func:`~lensprobe.studies.mechanism.activation_stats`). ``lensprobe attention`` and ``lensprobe
mechanism`` read their options from these fields (the filler's from
:class:`~lensprobe.studies.filler.FillerSetup`).

Example:
    >>> layers = AttentionConfig(layers="0,5").layer_list(model)
    >>> layers, heads_in_layers(model, "H1,H7", layers)
    ([0, 5], [1, 7])
"""

from dataclasses import dataclass, field
from typing import Literal

from lensprobe.core.checks import check_annotated, choice, count, finite_number
from lensprobe.core.errors import LensprobeError, SettingError
from lensprobe.core.fielddocs import field_docs
from lensprobe.core.hooks.heads import parse_heads
from lensprobe.core.models.loading import check_heads, check_layers, n_heads
from lensprobe.generation.config import GenerationConfig
from lensprobe.generation.thinking.schedule import parse_schedule
from lensprobe.interventions.arm_settings import ARM_C_HELP
from lensprobe.studies.filler import FillerSetup
from lensprobe.studies.thinking import SETTING_LABELS, THINKING_SETTINGS, thinking_setting

__all__ = ["AttentionConfig", "MechanismConfig", "TraceConfig", "heads_in_layers", "parse_layers"]


def parse_layers(spec: str) -> list[int] | None:
    """``"0,5,29"`` -> ``[0, 5, 29]``; ``"all"`` -> ``None`` (every layer).

    Raises:
        SettingError: not whole numbers >= 0, none, or one given twice.
    """
    if spec.strip().lower() == "all":
        return None
    parts = [v for v in spec.replace(" ", "").split(",") if v != ""]
    if not parts or not all(v.isascii() and v.isdigit() for v in parts):
        raise SettingError("layers", f"expected 0-based layers such as 0 or 0,5,29, or all, got {spec!r}")
    values = [int(v) for v in parts]
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise SettingError("layers", f"{twice[0]} is given twice in {spec!r}: name each once")
    return values


def heads_in_layers(model, spec: str, layers: list[int]) -> list[int]:
    """The head indices ``spec`` names within ``layers`` (``"H1,H7"``, ``"1,7"``, ``"L0H1"``, ``"all"``),
    checked against ``model``.

    Raises:
        LensprobeError: a head out of range, or a head of a layer not among ``layers``.
    """
    heads: set[int] = set()
    for layer, head in parse_heads(spec):
        if layer is not None and layer not in layers:
            raise SettingError("heads", f"L{layer}H{head} is in layer {layer}, which is not among the layers "
                                        f"recorded ({layers}): add it to the layers, or name the head as H{head}")
        heads.update(range(n_heads(model)) if head is None else [head])
    return check_heads(model, sorted(heads))


@dataclass(frozen=True)
class AttentionConfig:
    """Which layers ``lensprobe attention`` records (0-based, as in TransformerLens).

    Its heads are a :class:`~lensprobe.experiments.head_settings.HeadSelection`.

    Example:
        >>> AttentionConfig().layers
        '0'
    """

    layers: str = "0"
    """0-based layers, e.g. 0 or 0,5,29, or all"""

    def __post_init__(self) -> None:
        check_annotated(self)
        parse_layers(self.layers)

    def layer_list(self, model) -> list[int]:
        """The layers, checked against ``model``."""
        return check_layers(model, parse_layers(self.layers))



@dataclass(frozen=True)
class MechanismConfig:
    """What ``lensprobe mechanism`` measures on one layer.

    Its heads are a :class:`~lensprobe.experiments.head_settings.HeadSelection`.

    Attributes:
        arm_c: the c of the ARM condition (``w/o + ARM``) and the scale of the near-zero band
            ``eps = 1.4826 * MAD(|a|) * c`` from the w/o run. ``None``: the model's ARM preset's c (its
            default variant), else 0.1 (:meth:`band_c`).

    Example:
        >>> MechanismConfig(layer=0, arm_c=0.2).band_c(None)
        0.2
    """

    layer: int = 0
    """0-based layer (0, as in the paper)"""
    filler_count: int = field(default=55, metadata={"cmd": False, "help": field_docs(FillerSetup)["count"]})
    where: Literal["act_fn(gate)", "hook_post"] = "act_fn(gate)"
    """activation measured: act_fn(gate_proj(x)) (what ARM edits) or hook_post (act_fn(gate) * up)"""
    arm_c: float | None = field(default=None, metadata={"cmd": False, "help": ARM_C_HELP})
    eps: float | None = None
    """half-width of the near-zero band (default: 1.4826 * MAD(|a|) * c, c the ARM's c, else 0.1)"""
    bins: int = 60
    """histogram bins (as activation_stats)"""
    no_arm: bool = False
    """leave out the w/o + ARM condition"""
    arm_seed: int = 0
    """seed of ARM's draws"""

    def __post_init__(self) -> None:
        check_annotated(self)
        count("layer", self.layer, 0)
        count("filler_count", self.filler_count, 1, 10_000_000)
        choice("where", self.where, ("act_fn(gate)", "hook_post"))
        for name in ("arm_c", "eps"):
            if getattr(self, name) is not None:
                finite_number(name, getattr(self, name), 0, lo_open=True)
        count("bins", self.bins, 1)

    def band_c(self, arm) -> float:
        """The c of the near-zero band: ``arm_c`` when given, else ``arm``'s c (the default variant), else 0.1."""
        if self.arm_c is not None:
            return self.arm_c
        if arm is not None and arm.variant == "default" and arm.c is not None:
            return float(arm.c)
        return 0.1


@dataclass(frozen=True)
class TraceConfig(GenerationConfig):
    """How ``lensprobe trace`` generates (a :class:`~lensprobe.GenerationConfig`) and what it traces.

    The thinking inputs of the settings ``fusion``, ``coconut`` and ``soft`` take their ``top_p``,
    ``temperature`` and token from a :class:`~lensprobe.generation.LatentFusion` (:meth:`settings`).

    Example:
        >>> TraceConfig(think="fusion,pause", schedule="first:2+every:4").names()
        ['fusion', 'pause']
    """

    max_new_tokens: int = 400
    seed: int | None = 0
    think: str = "fusion"
    """thinking setting(s), comma-separated, from fusion, coconut, soft, pause, none"""
    schedule: str = "every:8"
    """when to think: every:N, first:K, at:S1,S2, entropy:NATS, emitted (the model emits the token), joined
    with '+'"""
    track: str = "system,question"
    """extra tracked sets, comma-separated: segment names, 'prompt', 'generated', or one-token strings"""
    smooth: int = 1
    """moving-average window of the figure, in steps"""
    format: Literal["parquet", "json"] = "parquet"
    """trace file format"""
    record: str = ""
    """hook points to record at every step (the newest position), comma-separated names or patterns, e.g.
    'blocks.*.hook_resid_post'; kept in the trace files"""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.names():
            raise SettingError("think", f"needs at least one of {', '.join(THINKING_SETTINGS)}")
        for name in self.names():
            thinking_setting(name)
        try:
            parse_schedule(self.schedule)
        except LensprobeError as err:
            raise SettingError("schedule", str(err)) from None
        count("smooth", self.smooth, 1)
        choice("format", self.format, ("parquet", "json"))

    def names(self) -> list[str]:
        """The thinking settings' names."""
        return [s.strip() for s in self.think.split(",") if s.strip()]

    def settings(self, fusion) -> dict:
        """Label -> thinking input of each setting, the latent ones with ``fusion``'s settings."""
        return {SETTING_LABELS.get(n, n): thinking_setting(n, alpha=fusion.alpha, top_p=fusion.top_p,
                                                          temperature=fusion.temperature, token=fusion.token)
                for n in self.names()}

    def recorded(self) -> list[str]:
        """The hook names or patterns ``record`` lists."""
        return [s.strip() for s in self.record.split(",") if s.strip()]

    def tracked(self) -> dict[str, str]:
        """The extra tracked sets, name -> spec."""
        return {s.strip(): s.strip() for s in self.track.split(",") if s.strip()}

    def generation(self) -> dict:
        """The generation settings :func:`~lensprobe.studies.thinking.compare_thinking` takes as keywords (the
        seed only when sampling), with the schedule."""
        names = ("max_new_tokens", "do_sample", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                 "n_samples", "stop_at_eos")
        return {**{n: getattr(self, n) for n in names}, "seed": self.seed if self.do_sample else None,
                "think_when": parse_schedule(self.schedule), "track": self.tracked()}
