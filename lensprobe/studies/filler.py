"""The meaningless-tokens study: where attention goes with and without filler tokens.

Reproduces the attention analyses of "Meaningless Tokens, Meaningful Gains" (arXiv
2510.01032) on any TransformerLens model, from real forward passes:

- :func:`attention_received_by_condition`: average attention received per token position, per
  (layer, head), under the conditions w/o / w/ Mless / w/ Mful / random sentence (or
  conditions of your own, :class:`~lensprobe.core.prompts.conditions.Condition`), both aligned
  across conditions (the filler span dropped) and over the full with-filler prompt;
- :func:`~lensprobe.studies.filler_random.filler_vs_random`: the filler against a random sentence of the
  same token count, one model after another, at one (layer, head);
- :func:`~lensprobe.studies.token_classes.compare_token_class_attention`: attention mass per token class (``#``, ``*``,
  whitespace) at chosen layers, for two conditions or two models (arXiv 2512.24532).

Every function returns tidy pandas DataFrames (one row per number), so the figures in
:mod:`lensprobe.viz` and the CSV files of the report show the same numbers. Layers and
heads are 0-based, as in TransformerLens: ``L0H13`` is the papers' "layer 1, head 14".

Example:
    >>> import lensprobe as lp
    >>> model = lp.load_model()
    >>> res = lp.studies.attention_received_by_condition(model, "What is 12+7?", layers=[0])
    >>> res.aligned().query("head == 0 and condition == 'w/ Mless'").head()
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from lensprobe.core.checks import check_annotated, choice
from lensprobe.core.checks import count as checked_count
from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.capabilities import bind_interventions
from lensprobe.core.hooks.forward import attention_patterns
from lensprobe.core.hooks.heads import head_label
from lensprobe.core.lazy import pandas
from lensprobe.core.measures.metrics import (
    average_attention_received,
)
from lensprobe.core.models.loading import check_heads, check_layers, model_label
from lensprobe.core.progress import tqdm
from lensprobe.core.prompts.assembly import PLACEMENTS, Placement
from lensprobe.core.prompts.conditions import (
    BUILTIN_CONDITIONS,
    Condition,
    canonical_condition_name,
    paper_conditions,
    resolve_conditions,
)
from lensprobe.core.prompts.fillers import MAX_FILLER_COUNT
from lensprobe.core.prompts.prompt import MATH_SYSTEM_PROMPT, Prompt, prompt_json

if TYPE_CHECKING:
    import pandas as pd

CONDITIONS: tuple[str, ...] = tuple(BUILTIN_CONDITIONS)
"""The paper's conditions: ``"w/o"`` (no filler), ``"w/ Mless"`` ("/" x 55), ``"w/ Mful"``
("he" x 55), ``"random sentence"`` (as many tokens as Mless)."""

BASELINE = "w/o"
"""The condition without filler that the others are aligned to and compared with."""


def normalize_conditions(conditions: Sequence[str | Condition] | str | Condition) -> tuple[str | Condition, ...]:
    """Condition names in their canonical spelling (``"meaningless"`` -> ``"w/ Mless"``), in order,
    each once; :class:`~lensprobe.core.prompts.conditions.Condition` objects are kept as they are.

    Raises:
        LensprobeError: an unknown name (or no condition at all).

    Example:
        >>> normalize_conditions(["none", "Mless"])
        ('w/o', 'w/ Mless')
    """
    if isinstance(conditions, (str, Condition)):
        conditions = [conditions]
    out: list[str | Condition] = []
    for c in conditions:
        name = c if isinstance(c, Condition) else canonical_condition_name(c)
        if isinstance(name, str) and name not in BUILTIN_CONDITIONS:
            raise LensprobeError(
                f"unknown condition {c!r}: use some of {list(CONDITIONS)} (aliases: none, meaningless, "
                "meaningful, random) or a lensprobe Condition."
            )
        if name not in out:
            out.append(name)
    if not out:
        raise LensprobeError(f"no condition given: pass some of {list(CONDITIONS)}.")
    return tuple(out)


MAX_COUNT = MAX_FILLER_COUNT
"""No model's context holds more filler tokens: a larger count is a typo (the fillers' own bound)."""


@dataclass(frozen=True)
class FillerSetup:
    """Which conditions the study runs, and the filler settings of the built-in ones (defaults:
    the paper's MATH-500 set-up).

    Attributes:
        conditions: built-in condition names (``"w/o"``, ``"w/ Mless"``, ``"w/ Mful"``,
            ``"random sentence"``, or aliases such as ``"none"``, ``"meaningless"``) or
            :class:`~lensprobe.core.prompts.conditions.Condition` objects of your own.
        system: system prompt of the built-in conditions (``None`` for none); default
            :data:`MATH_SYSTEM_PROMPT`.
        count: filler length in repetitions (55 in the paper).
        symbol: the meaningless symbol (``"/"``).
        word: the meaningful word (``"he"``).
        seed: seed of the random sentence, which has as many tokens as the Mless filler.
        placement: where the filler goes (``"between"`` system prompt and question).
        chat: apply the model's chat template.

    Example:
        >>> FillerSetup(conditions=("none", "Mless")).conditions
        ('w/o', 'w/ Mless')
    """

    conditions: tuple[str | Condition, ...] = field(default=CONDITIONS, metadata={"cmd": False})  # --filler
    system: str | None = field(default=MATH_SYSTEM_PROMPT, metadata={"cmd": False})  # --system, --no-system
    count: int = field(default=55, metadata={"cmd": False})  # --filler-count: app's FillerCountOptions
    symbol: str = "/"
    word: str = "he"
    seed: int = 0
    placement: Placement = "between"
    chat: bool = field(default=True, metadata={"cmd": False})

    def __post_init__(self):
        object.__setattr__(self, "conditions", normalize_conditions(self.conditions))
        check_annotated(self)
        checked_count("count", self.count, 1, MAX_COUNT)  # filler repetitions
        choice("placement", self.placement, PLACEMENTS)

    def resolve(self) -> list[Condition]:
        """The :class:`~lensprobe.core.prompts.conditions.Condition` of each entry of ``conditions``, in order."""
        builtins = paper_conditions(system=self.system, count=self.count, symbol=self.symbol, word=self.word,
                                    seed=self.seed, placement=self.placement, chat=self.chat)
        return resolve_conditions(list(self.conditions), builtins=builtins)

    def condition(self, name: str) -> Condition:
        """One built-in condition (any spelling) with this set-up's filler settings.

        Example:
            >>> FillerSetup(count=5).condition("meaningless").prompt_builder(model)("What is 12+7?")
        """
        return replace(self, conditions=(name,)).resolve()[0]


def condition_prompts(model, question: str, setup: FillerSetup | None = None) -> dict[str, Prompt]:
    """One prompt per condition, built by the condition (:meth:`Condition.prompt_builder`).

    Example:
        >>> ps = condition_prompts(model, "What is 12+7?")
        >>> len(ps["w/ Mless"].positions("filler")) == len(ps["random sentence"].positions("filler"))
        True
    """
    setup = setup or FillerSetup()
    return {c.name: c.prompt_builder(model)(question) for c in setup.resolve()}


def aligned_positions(prompt: Prompt) -> list[int]:
    """Positions of ``prompt`` that also exist in the same prompt without filler, in order.

    Drops the ``filler`` span and its separator (``filler_sep``); a prompt without filler
    keeps every position. Position ``k`` of the result lines up with position ``k`` of the
    no-filler prompt.
    """
    if "filler" not in prompt.segments:
        return list(range(len(prompt)))
    return prompt.positions_except("filler")  # also drops the filler's separator


@dataclass(frozen=True)
class AttentionReceived:
    """Average attention received per position, per condition, layer and head.

    Attributes:
        table: one row per (condition, layer, head, position) with columns ``condition``
            (``"w/o"``, ``"w/ Mless"``, ...), ``layer``, ``head``, ``head_label`` ("L0H13"),
            ``position`` (in that condition's prompt), ``aligned_pos`` (position in the
            no-filler prompt; ``<NA>`` inside the filler span), ``token``, ``segment`` and
            ``attention``. The last position has no later query, so its ``attention`` is NaN.
        prompts: the prompt of each condition, by condition name.
        model_name: which model produced the numbers.
        question: the question text.
        setup: the conditions and filler settings that were run.
    """

    table: "pd.DataFrame"
    prompts: dict[str, Prompt]
    model_name: str
    question: str
    setup: FillerSetup = field(default_factory=FillerSetup)

    @property
    def conditions(self) -> tuple[str, ...]:
        """The condition names, in the order they were run."""
        return tuple(self.prompts)

    def condition_name(self, condition: str) -> str:
        """The name ``condition`` (any spelling, e.g. ``"meaningless"``) has in this result.

        Raises:
            LensprobeError: the condition was not run.
        """
        name = canonical_condition_name(condition)
        if name not in self.prompts:
            raise LensprobeError(f"condition {condition!r} was not run: this result has {list(self.prompts)}.")
        return name

    def aligned(self) -> "pd.DataFrame":
        """Rows outside the filler span, with ``aligned_pos`` as the shared x axis."""
        return self.table[self.table["aligned_pos"].notna()].reset_index(drop=True)

    def filler_span(self, condition: str) -> tuple[int, int] | None:
        """Half-open ``(start, end)`` token span of the filler in ``condition``'s prompt."""
        return self.prompts[self.condition_name(condition)].segments.get("filler")

    def filled_span(self, condition: str) -> tuple[int, int]:
        """:meth:`filler_span` of a condition that has a filler (``"w/ Mless"``, ``"random sentence"``).

        Raises:
            LensprobeError: ``condition``'s prompt has no filler segment.
        """
        span = self.filler_span(condition)
        if span is None:
            raise LensprobeError(f"condition {condition!r} has no filler span: pick a condition with a filler.")
        return span

    def prompts_json(self) -> dict[str, Any]:
        """The prompts as JSON-able dicts (text, tokens, segments), for the report."""
        return {c: prompt_json(p) for c, p in self.prompts.items()}


def check_alignable(prompts: Mapping[str, Prompt]) -> None:
    """Refuse prompts that differ from the no-filler prompt outside their filler span.

    Raises:
        LensprobeError: a prompt has another number of positions outside its filler than the
            ``"w/o"`` prompt (so positions cannot be lined up).
    """
    if BASELINE not in prompts:
        return
    base = len(prompts[BASELINE])
    for c, p in prompts.items():
        if len(aligned_positions(p)) != base:  # would mean a filler changed other tokens
            raise LensprobeError(
                f"condition {c!r}: {len(aligned_positions(p))} positions outside the filler, "
                f"but the no-filler prompt has {base}; the prompts cannot be aligned."
            )


def received_table(condition: str, prompt: Prompt, patterns: Mapping[int, Any], heads: Sequence[int]
                   ) -> "pd.DataFrame":
    """Rows of :attr:`AttentionReceived.table` for one condition, from its ``{layer: [head, q, k]}`` patterns."""
    pd = pandas()
    n = len(prompt)
    aligned = [pd.NA] * n
    for k, p in enumerate(aligned_positions(prompt)):
        aligned[p] = k
    segment = [prompt.segment_of(p) for p in range(n)]
    frames = []
    for layer, pattern in patterns.items():
        recv = average_attention_received(pattern.float())[list(heads)].cpu().numpy()
        for row, head in enumerate(heads):
            frames.append(pd.DataFrame({
                "condition": condition, "layer": layer, "head": head, "head_label": head_label(layer, head),
                "position": range(n), "aligned_pos": pd.array(aligned, dtype="Int64"),
                "token": prompt.str_tokens, "segment": segment, "attention": recv[row],
            }))
    return pd.concat(frames, ignore_index=True)


def attention_received_by_condition(model, question: str, *, layers: int | Sequence[int] | None = None,
                       heads: int | Sequence[int] | None = None, setup: FillerSetup | None = None,
                       progress: bool = False) -> AttentionReceived:
    """Average attention received per token position under each filler condition.

    One forward pass per condition (stopping after the last requested layer, with the
    condition's interventions attached, if it has any), keeping only the requested layers'
    patterns; ``lp.metrics.average_attention_received`` gives, per key position ``j``, the mean of
    ``A[i, j]`` over the queries ``i > j`` (queries inside the filler included). For the
    aligned view the filler span (and its separator) is dropped from the key positions
    afterwards, so position ``k`` means the same token in every condition.

    Args:
        model: a TransformerLens model (e.g. ``lp.load_model()``).
        question: the question text.
        layers: 0-based layer indices (``None``: all).
        heads: 0-based query-head indices (``None``: all).
        setup: conditions and prompt settings; default all four paper conditions.
        progress: show a progress bar over conditions.

    Returns:
        An :class:`AttentionReceived`.

    Example:
        >>> res = attention_received_by_condition(model, "What is 12+7?", layers=[0], heads=[0, 1])
        >>> res.aligned().groupby("condition")["attention"].mean()
    """
    setup = setup or FillerSetup()
    layers = check_layers(model, layers)
    heads = check_heads(model, heads)
    conditions = setup.resolve()
    prompts = {c.name: c.prompt_builder(model)(question) for c in conditions}
    check_alignable(prompts)
    frames = []
    for cond in tqdm(conditions, desc="conditions", disable=not progress, leave=False):
        prompt = prompts[cond.name]
        interventions, _ = bind_interventions(cond.interventions, prompt)
        pats = attention_patterns(model, prompt, layers, *interventions)
        frames.append(received_table(cond.name, prompt, {layer: pats[layer] for layer in layers}, heads))
    return AttentionReceived(table=pandas().concat(frames, ignore_index=True), prompts=prompts,
                             model_name=model_label(model), question=question, setup=setup)


def condition_changes(result: AttentionReceived, *, baseline: str = BASELINE) -> "pd.DataFrame":
    """How much each filler condition changes each head's aligned series, against ``baseline``.

    ``change`` is the mean over aligned positions of ``|received(condition) -
    received(baseline)|``; the last position, which has no later query, is skipped.

    Returns:
        Columns ``condition``, ``layer``, ``head``, ``head_label``, ``change``, one row per
        (condition other than the baseline, layer, head), in table order.
    """
    baseline = result.condition_name(baseline)
    a = result.aligned()
    keys = ["layer", "head", "head_label", "aligned_pos"]
    y = a[a["condition"] == baseline].set_index(keys)["attention"]
    frames = []
    for c in result.conditions:
        if c == baseline:
            continue
        x = a[a["condition"] == c].set_index(keys)["attention"]
        diff = (x - y).abs().dropna().astype(float)
        out = diff.groupby(level=["layer", "head", "head_label"], sort=False).mean().rename("change").reset_index()
        out.insert(0, "condition", c)
        frames.append(out)
    if not frames:
        raise LensprobeError(f"only the baseline {baseline!r} was run: add a filler condition to compare.")
    return pandas().concat(frames, ignore_index=True)


def heads_by_change(result: AttentionReceived, *, condition: str = "w/ Mless", baseline: str = BASELINE,
                    k: int | None = None) -> "pd.DataFrame":
    """Rank (layer, head) by how much ``condition`` changes the aligned series (see :func:`condition_changes`).

    Returns:
        Columns ``layer``, ``head``, ``head_label``, ``change``; largest change first; the
        top ``k`` per layer when ``k`` is given.
    """
    condition = result.condition_name(condition)
    ch = condition_changes(result, baseline=baseline)
    out = ch[ch["condition"] == condition].drop(columns=["condition"])
    out = out.sort_values("change", ascending=False, kind="stable")
    if k is not None:
        out = out.groupby("layer", sort=False).head(k)
    return out.reset_index(drop=True)


def attention_view_pattern(model, prompt: Prompt, layer: int, decimals: int = 4):
    """The ``[head, query_pos, key_pos]`` pattern of one layer for the circuitsvis view.

    Rounded to ``decimals`` (as float64, so it serialises short) to keep the HTML small.
    """
    return attention_patterns(model, prompt, [layer])[layer].cpu().double().round(decimals=decimals)

