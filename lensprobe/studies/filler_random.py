"""The meaningless filler against a random sentence of the same token count, one model after another, at one
(layer, head): the figure of arXiv 2510.01032 that asks whether any run of tokens would do.

Example:
    >>> fr = filler_vs_random([model], "What is 12+7?", layer=0, head=3)
    >>> fr.table.groupby(["model", "condition"])["attention"].mean()
"""

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from lensprobe.core.errors import LensprobeError
from lensprobe.core.lazy import pandas
from lensprobe.core.models.loading import model_label
from lensprobe.core.prompts.prompt import Prompt
from lensprobe.studies.filler import FillerSetup, attention_received_by_condition

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["FillerVsRandom", "filler_vs_random", "named_models"]


@dataclass(frozen=True)
class FillerVsRandom:
    """Filler vs a random sentence of the same token count, per model, at one (layer, head).

    Attributes:
        table: rows ``model``, ``condition`` (``w/ Mless``/``random sentence``), ``layer``,
            ``head``, ``head_label``, ``position``, ``token``, ``segment``, ``attention``
            (average attention received, over the full prompt: both prompts have the same
            length, and the filler span sits at the same positions).
        spans: model -> filler span ``(start, end)``.
        prompts: model -> {condition -> Prompt}.
        layer, head: the head that was read.
    """

    table: "pd.DataFrame"
    spans: dict[str, tuple[int, int]]
    prompts: dict[str, dict[str, Prompt]]
    layer: int
    head: int


def filler_vs_random(models, question: str, *, layer: int = 0, head: int = 0,
                     setup: FillerSetup | None = None) -> FillerVsRandom:
    """The meaningless filler vs a random sentence of the same token count, one model after another.

    Args:
        models: a model, a list of models, or a ``{label: model}`` mapping.
        question: the question text.
        layer, head: the (0-based) head to read, in every model.
        setup: prompt settings (its ``conditions`` are ignored).

    Example:
        >>> fr = filler_vs_random([model], "What is 12+7?", layer=0, head=3)
        >>> fr.table.groupby(["model", "condition"])["attention"].mean()
    """
    setup = replace(setup or FillerSetup(), conditions=("w/ Mless", "random sentence"))
    named = named_models(models)
    frames, spans, prompts = [], {}, {}
    for label, model in named.items():
        res = attention_received_by_condition(model, question, layers=[layer], heads=[head], setup=setup)
        t = res.table.drop(columns=["aligned_pos"])
        t.insert(0, "model", label)
        frames.append(t)
        spans[label] = res.filled_span("w/ Mless")
        prompts[label] = res.prompts
    return FillerVsRandom(table=pandas().concat(frames, ignore_index=True), spans=spans, prompts=prompts,
                          layer=layer, head=head)


def named_models(models) -> dict[str, Any]:
    """``{label: model}`` from a model, a list of models (labels made unique) or a mapping."""
    if isinstance(models, Mapping):
        return dict(models)
    if not isinstance(models, (list, tuple)):
        models = [models]
    named: dict[str, Any] = {}
    for m in models:
        label = model_label(m)
        while label in named:
            label += "'"
        named[label] = m
    if not named:
        raise LensprobeError("no model given: pass a model or a list of models.")
    return named
