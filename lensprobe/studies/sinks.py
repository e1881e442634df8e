"""Attention sinks and massive activations, per filler condition (w/o, w/ Mless, w/ Mful, random sentence).

A model's later layers send much of each query's attention to the first token, whatever it is (the
*attention sink*, Xiao et al. 2023), and a few residual-stream entries grow thousands of times larger than
the median (*massive activations*, Sun et al. 2024), often at that same first token. The filler
of the meaningless-tokens paper (arXiv 2510.01032) takes a share of attention too (``1 - lambda`` at
layer 0, :mod:`lensprobe.studies.mechanism`); :func:`attention_sinks` measures both effects under each
condition, over the prompt and at every generation step:

- **sink mass**: per layer and head, the attention a query puts on the first token (position 0) and on
  each named segment the condition's prompt has (the filler); over the prompt, the mean over the queries
  after the target (the positions that see all of it), and each query's own value; at each generation
  step, the newest query's (:func:`lensprobe.trace_generation` with a tracked set per target);
- **massive activations**: per layer, the largest ``|entries|`` of the residual stream
  (``blocks.{l}.hook_resid_post``) against the median ``|entry|`` (``ratio``), with their dimension and
  token; over all prompt positions, and at each step's newest position (``record=`` with
  :class:`~lensprobe.studies.sink_hooks.MassiveEntries` as its ``reduce``).

Everything is reduced inside the hooks (:mod:`lensprobe.studies.sink_hooks`): no ``[query, key]``
matrix and no residual stream is kept. Layers and heads are 0-based, as in TransformerLens. Step 0 is the
last prompt position (its query predicts the first generated token); step ``t`` is position
``prompt length - 1 + t``.

Example:
    >>> res = lp.studies.attention_sinks(model, "What is 12+7?", layers=[0, 5, 10], max_new_tokens=16)
    >>> res.head_means().query("target == 'first token'")        # mean over heads, per condition and layer
    >>> res.largest("prompt")[["condition", "layer", "token", "dim", "ratio"]]
"""

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from lensprobe.core.checks import count
from lensprobe.core.errors import LensprobeError, SettingError
from lensprobe.core.hooks.attach import ActivationRecorder, AttentionRecorder
from lensprobe.core.hooks.capabilities import bind_interventions
from lensprobe.core.hooks.forward import forward
from lensprobe.core.lazy import pandas
from lensprobe.core.models.loading import check_heads, check_layers, model_label
from lensprobe.core.progress import tqdm
from lensprobe.core.prompts.conditions import Condition
from lensprobe.core.prompts.prompt import MATH_SYSTEM_PROMPT, Prompt
from lensprobe.generation.config import generation_config
from lensprobe.generation.engines import ENGINE_NAMES, EngineName
from lensprobe.generation.loop import trace_generation
from lensprobe.generation.traces.activations import Record
from lensprobe.generation.traces.trace import GenerationTrace
from lensprobe.studies.filler import CONDITIONS, FillerSetup, normalize_conditions
from lensprobe.studies.settings import AttentionConfig
from lensprobe.studies.sink_hooks import (
    FIRST,
    MassiveEntries,
    PromptMassive,
    TargetMass,
    massive_rows,
    prompt_sink_rows,
    step_massive_rows,
    step_positions,
    step_sink_rows,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["FIRST", "MAX_ENTRIES", "AttentionSinks", "SinkConfig", "attention_sinks", "is_first"]

MAX_ENTRIES = 64
"""At most this many largest entries per layer (and step): more is a typo."""


def segment_names(spec: str) -> tuple[str, ...]:
    """``"filler,question"`` -> ``("filler", "question")``; ``"none"`` -> ``()``.

    Raises:
        SettingError: an empty name, a name given twice, or the first token's own name.
    """
    if spec.strip().lower() == "none":
        return ()
    names = tuple(s.strip() for s in spec.split(","))
    if not all(names):
        raise SettingError("segments", f"expected segment names such as filler or filler,question (or none), got "
                                       f"{spec!r}")
    _check_segments(names)
    return names


def _check_segments(names: tuple[str, ...]) -> None:
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SettingError("segments", f"{twice[0]!r} is given twice: name each segment once")
    if FIRST in names:
        raise SettingError("segments", f"{FIRST!r} is always measured: name only prompt segments")


@dataclass(frozen=True)
class SinkConfig(AttentionConfig):
    """What ``lensprobe sinks`` measures: the layers (every one by default), the segments, the entries kept.

    The layers are read as :class:`~lensprobe.studies.settings.AttentionConfig` reads them.

    Example:
        >>> SinkConfig(segments="filler,question").segment_names()
        ('filler', 'question')
    """

    layers: str = "all"
    segments: str = "filler"
    """prompt segments whose attention mass is measured beside the first token's, comma-separated (e.g.
    filler,question), or none; a condition whose prompt lacks one has no rows for it"""
    entries: int = 4
    """largest |residual stream| entries kept per layer (and generation step), against the median |entry|"""
    all_conditions: bool = False
    """run all four conditions (w/o, w/ Mless, w/ Mful, random sentence) instead of w/o and --compare"""

    def __post_init__(self) -> None:
        super().__post_init__()
        segment_names(self.segments)
        count("entries", self.entries, 1, MAX_ENTRIES)

    def segment_names(self) -> tuple[str, ...]:
        """The segments, as :func:`attention_sinks` takes them."""
        return segment_names(self.segments)


@dataclass(frozen=True)
class AttentionSinks:
    """Attention-sink masses and massive activations per condition, from :func:`attention_sinks`.

    Attributes:
        prompt: one row per (condition, layer, head, target): ``condition``, ``layer``, ``head``,
            ``head_label``, ``target`` (``"first token"`` or a segment name), ``mass`` (the mean over the
            prompt's queries after the target of the attention each puts on it; NaN when no query follows
            it) and ``queries`` (how many).
        queries: the per-query values behind ``prompt``: ``condition``, ``layer``, ``head``, ``target``,
            ``query`` (position), ``mass``.
        steps: one row per (condition, step, layer, head, target): ``condition``, ``step``, ``position``
            (``prompt length - 1 + step``), ``token`` (the token at that position, whose query it is),
            ``layer``, ``head``, ``head_label``, ``target``, ``mass`` (the newest query's attention on it).
        massive: the largest ``|entries|`` of ``blocks.{l}.hook_resid_post``, ``entries`` per layer:
            ``condition``, ``phase`` (``"prompt"``: over every prompt position; ``"step"``: at the step's
            newest position), ``step`` (``<NA>`` for the prompt), ``position``, ``token``, ``layer``,
            ``rank`` (0 = largest), ``dim``, ``value`` (signed), ``magnitude``, ``median`` (the median
            ``|entry|`` over the same positions) and ``ratio`` (``magnitude / median``).
        prompts: each condition's prompt.
        traces: each condition's generation trace (its tokens, entropies and recorded values).
        model_name: which model produced the numbers.
        question: the question text.
        layers: the layers measured (0-based).
        setup: the conditions and filler settings that were run.
    """

    prompt: "pd.DataFrame"
    queries: "pd.DataFrame"
    steps: "pd.DataFrame"
    massive: "pd.DataFrame"
    prompts: dict[str, Prompt]
    traces: dict[str, GenerationTrace]
    model_name: str
    question: str
    layers: list[int]
    setup: FillerSetup = field(default_factory=FillerSetup)

    @property
    def conditions(self) -> tuple[str, ...]:
        """The condition names, in the order they were run."""
        return tuple(self.prompts)

    @property
    def targets(self) -> tuple[str, ...]:
        """``"first token"`` and the segments measured, in order."""
        return tuple(dict.fromkeys(self.prompt["target"]))

    def head_means(self) -> "pd.DataFrame":
        """``prompt`` averaged over heads: one row per (condition, layer, target) with ``mass`` and ``sd``."""
        return _over_heads(self.prompt, ["condition", "layer", "target"])

    def step_means(self) -> "pd.DataFrame":
        """``steps`` averaged over heads: one row per (condition, step, layer, target) with ``position``,
        ``token``, ``mass`` and ``sd``."""
        return _over_heads(self.steps, ["condition", "step", "position", "token", "layer", "target"])

    def largest(self, phase: str = "prompt") -> "pd.DataFrame":
        """The largest entry (rank 0) of each layer (and step): the rows of ``massive`` of one ``phase``.

        Raises:
            LensprobeError: ``phase`` is neither ``"prompt"`` nor ``"step"``.
        """
        if phase not in ("prompt", "step"):
            raise LensprobeError(f"phase must be 'prompt' or 'step', got {phase!r}.")
        m = self.massive
        return m[(m["phase"] == phase) & (m["rank"] == 0)].reset_index(drop=True)


def _over_heads(table: "pd.DataFrame", keys: list[str]) -> "pd.DataFrame":
    return (table.groupby(keys, sort=False, dropna=False)["mass"].agg(mass="mean", sd="std").reset_index())


def is_first(position: int, token_id: int) -> bool:
    """The tracked set of the first token: position 0 of the row."""
    return position == 0


def attention_sinks(model, question: str, *, system: str | None = MATH_SYSTEM_PROMPT,
                    conditions: Sequence[str | Condition] | str | Condition = CONDITIONS,
                    layers: int | Sequence[int] | None = None, segments: Sequence[str] | str | None = None,
                    max_new_tokens: int = 32, entries: int = 4, setup: FillerSetup | None = None,
                    engine: EngineName = "auto", progress: bool = False, **generation: Any) -> AttentionSinks:
    """Attention sinks and massive activations under each filler condition, over the prompt and per step.

    Per condition: one forward over the prompt (stopped after the last layer asked for, with the
    condition's interventions) whose hooks reduce each layer's attention pattern to the mass on each
    target and its residual stream to its largest entries; then a generation of ``max_new_tokens`` (greedy
    unless ``do_sample=True``) through :func:`lensprobe.trace_generation` on ``engine``, tracking the first
    token and the segments, and recording each layer's
    :class:`~lensprobe.studies.sink_hooks.MassiveEntries` at the newest position.

    Args:
        model: a TransformerLens model (``lp.load_model()``; eager attention, so that
            ``blocks.{l}.attn.hook_pattern`` fires).
        question: the question text.
        system: the system prompt of the built-in conditions (``None``: none).
        conditions: built-in condition names (``"w/o"``, ``"w/ Mless"``, ``"w/ Mful"``, ``"random sentence"``
            or aliases) or :class:`~lensprobe.core.prompts.conditions.Condition` objects; default all four.
        layers: 0-based layers (``None``: all).
        segments: prompt segments measured beside the first token (``"filler"``, ``"question"``, ...); a
            condition whose prompt lacks one has no rows for it, never zeros. ``None`` (default): the filler,
            in the conditions that have one.
        max_new_tokens: generation steps per condition.
        entries: largest ``|entries|`` kept per layer (and step).
        setup: the filler's other settings (count, symbol, word, seed, placement, chat); its conditions and
            system prompt are ``conditions`` and ``system``.
        engine: the generation's engine (:func:`lensprobe.generate`).
        progress: a progress bar over conditions.
        **generation: other :class:`~lensprobe.GenerationConfig` fields (``stop_at_eos=False``,
            ``do_sample=True, seed=0``); one sample, no latent thinking.

    Returns:
        An :class:`AttentionSinks`.

    Raises:
        LensprobeError: a bad setting, a segment no condition's prompt has, or a prompt plus
            ``max_new_tokens`` beyond the context, all before any forward.

    Example:
        >>> res = attention_sinks(model, "What is 12+7?", conditions=["w/o", "w/ Mless"], layers=[0, 3])
        >>> res.prompt.query("target == 'first token' and layer == 3")
    """
    count("entries", entries, 1, min(MAX_ENTRIES, int(model.cfg.d_model)))
    cfg = generation_config(None, {"max_new_tokens": max_new_tokens, **generation})
    if cfg.n_samples != 1 or cfg.thinking is not None:
        raise LensprobeError("attention_sinks runs one sample per condition without latent thinking: leave "
                             "n_samples and thinking unset (trace those with lp.trace_generation).")
    if engine not in ENGINE_NAMES:
        raise LensprobeError(f"engine must be one of {list(ENGINE_NAMES)}, got {engine!r}.")
    seg = _segments(segments)
    explicit = segments is not None
    layers = check_layers(model, layers)
    setup = _setup(setup, system, conditions)
    conds = setup.resolve()
    odd = [c.name for c in conds if c.generate_kwargs]
    if odd:
        raise LensprobeError(f"condition {odd[0]!r} has generate_kwargs, which attention_sinks does not apply: "
                             "pass generation settings as keywords of attention_sinks, for every condition.")
    prompts = {c.name: c.prompt_builder(model)(question) for c in conds}
    targets = {name: _targets(p, seg) for name, p in prompts.items()}
    if explicit:
        _check_found(seg, prompts)
    bound = {c.name: bind_interventions(c.interventions, prompts[c.name])[0] for c in conds}
    for name, p in prompts.items():
        if len(p) + cfg.max_new_tokens > model.cfg.n_ctx:
            raise LensprobeError(f"condition {name!r}: the prompt ({len(p)} tokens) + max_new_tokens "
                                 f"({cfg.max_new_tokens}) exceeds the model's context of {model.cfg.n_ctx} tokens: "
                                 f"lower max_new_tokens to at most {max(model.cfg.n_ctx - len(p), 0)}.")
    heads = check_heads(model, None)
    names = {layer: f"blocks.{layer}.hook_resid_post" for layer in layers}
    frames: dict[str, list] = {"prompt": [], "queries": [], "steps": [], "massive": []}
    traces = {}
    for name in tqdm(list(prompts), desc="conditions", disable=not progress, leave=False):
        p, tg = prompts[name], targets[name]
        masses, massive = _prompt_pass(model, p, layers, tg, entries, bound[name])
        per_head, per_query = prompt_sink_rows(name, masses, tg, heads)
        frames["prompt"].append(per_head)
        frames["queries"].append(per_query)
        frames["massive"].append(massive_rows(name, massive, int(model.cfg.d_model), p.str_tokens))
        track = {t: (is_first if t == FIRST else t) for t in tg}
        trace = trace_generation(model, p, cfg, track=track, layers=layers, interventions=list(bound[name]),
                                 record=Record(tuple(names.values()), reduce=MassiveEntries(entries)), engine=engine)
        traces[name] = trace
        positions, tokens = step_positions(trace, len(p), p.str_tokens)
        if trace.n_steps:
            frames["steps"].append(step_sink_rows(name, trace, list(tg), positions, tokens))
            frames["massive"].append(step_massive_rows(name, trace, names, entries, positions, tokens))
    pd = pandas()
    tables = {k: pd.concat(v, ignore_index=True) if v else pd.DataFrame() for k, v in frames.items()}
    return AttentionSinks(**tables, prompts=prompts, traces=traces, model_name=model_label(model),
                          question=question, layers=list(layers), setup=setup)


def _segments(segments: Sequence[str] | str | None) -> tuple[str, ...]:
    if segments is None:
        return ("filler",)
    if isinstance(segments, str):
        segments = (segments,)
    if not isinstance(segments, (list, tuple)) or not all(isinstance(s, str) and s for s in segments):
        raise LensprobeError(f"segments must be segment names (non-empty strings), e.g. ('filler',), got "
                             f"{segments!r}.")
    names = tuple(segments)
    _check_segments(names)
    return names


def _setup(setup: FillerSetup | None, system: str | None, conditions) -> FillerSetup:
    """``setup`` with ``conditions`` and ``system``; refuses a setup whose own differ from both its default
    and the ones given (they would be replaced without a word)."""
    given: dict[str, Any] = {"conditions": normalize_conditions(conditions), "system": system}
    if setup is None:
        return FillerSetup(**given)
    if not isinstance(setup, FillerSetup):
        raise LensprobeError(f"setup must be a lensprobe FillerSetup, got {type(setup).__name__}.")
    default = FillerSetup()
    for key, value in given.items():
        own = getattr(setup, key)
        if own != getattr(default, key) and own != value:
            raise LensprobeError(f"setup.{key} is {own!r}, but attention_sinks takes its {key} from {key}=... "
                                 f"({value!r}): pass {key}={own!r} instead.")
    return replace(setup, **given)


def _targets(prompt: Prompt, segments: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """The first token's span and those of the ``segments`` the prompt has, in order."""
    return {FIRST: (0, 1), **{s: prompt.segments[s] for s in segments if s in prompt.segments}}


def _check_found(segments: tuple[str, ...], prompts: dict[str, Prompt]) -> None:
    have = sorted({s for p in prompts.values() for s in p.segments})
    missing = [s for s in segments if s not in have]
    if missing:
        raise LensprobeError(f"no condition's prompt has a segment {missing[0]!r}: use some of {have}.")


def _prompt_pass(model, prompt: Prompt, layers: list[int], targets: dict[str, tuple[int, int]], k: int,
                 interventions: Sequence[Any]) -> tuple[dict[int, Any], dict[int, Any]]:
    """One forward over the prompt: ``({layer: [target, head, query]}, {layer: [4, k]})``."""
    att = AttentionRecorder(layers=layers, reduce=TargetMass(tuple(targets.values())))
    acts = ActivationRecorder([f"blocks.{layer}.hook_resid_post" for layer in layers], reduce=PromptMassive(k))
    last = max(layers) + 1
    forward(model, prompt, *interventions, att, acts, stop_at_layer=last if last < model.cfg.n_layers else None)
    missing = [layer for layer in layers if layer not in att.patterns]
    if missing:
        raise LensprobeError(f"no attention pattern was recorded for layers {missing}: the model does not fire "
                             "blocks.{l}.attn.hook_pattern (sdpa or flash attention?). Load it with "
                             "lp.load_model(), which uses eager attention.")
    return ({layer: att.patterns[layer][0] for layer in layers},
            {layer: acts.acts[f"blocks.{layer}.hook_resid_post"][0] for layer in layers})
