"""Attribution of a metric to every attention head in a few passes: AtP and AtP*.

Attribution patching (AtP; Nanda 2022) estimates the change of a metric when a head is
ablated, ``M(ablated) - M(clean)``, to first order: ``sum((z_ablated - z) * dM/dz)`` at the
head's ``hook_z`` slice, for every head from one forward and one backward pass. AtP*
(Kramar, Lieberum, Shah, Nanda 2024, arXiv 2403.00745) fixes its two failure modes: the QK
fix recomputes the attention softmax exactly where the head's write changes later queries
and keys (a saturated softmax has a vanishing gradient), and GradDrop guards against
cancellation between direct and indirect paths. The paper recommends verifying the top
candidates by exact ablation: :func:`~lensprobe.experiments.verify.verify_attribution`.

The ablation is :func:`~lensprobe.interventions.ablation.ablate_heads`' (same hook, same
positions, same zero/mean/resample values), so every estimate has an exact counterpart in
:func:`~lensprobe.experiments.sweep.ablation_sweep`.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.forward import as_prompts
from lensprobe.core.hooks.heads import Positions, head_label, kv_group_heads, resolve_heads, resolve_positions
from lensprobe.core.lazy import pandas
from lensprobe.core.measures.forced import resolve_measures
from lensprobe.core.progress import tqdm
from lensprobe.core.storage.identity import IdentityError, identity_digest
from lensprobe.core.storage.store import atomic_file
from lensprobe.experiments.atp import attribute_prompt, combine
from lensprobe.experiments.atp_gradients import Unit
from lensprobe.experiments.atp_qkfix import qk_passes
from lensprobe.experiments.headpatch import aligned_positions, aligned_source
from lensprobe.interventions.ablation import check_ablation_positions
from lensprobe.interventions.replacement import METHODS, Method, ablation_source, check_method

__all__ = ["Attribution", "AttributionMethod", "attribute_heads", "attribution_sources", "computed_on", "unit_label"]

AttributionMethod = Literal["atp", "atp*"]
UNITS = ("head", "kv")


def unit_label(unit: Unit, kind: str, n_kv_per_group: int = 1) -> str:
    """``"L0H3"`` for a head, ``"L0KV1"`` for a KV group."""
    layer, heads = unit
    return head_label(layer, heads[0]) if kind == "head" else f"L{layer}KV{heads[0] // n_kv_per_group}"


@dataclass
class Attribution:
    """Estimated metric change from ablating each head (or KV group), per prompt.

    Attributes:
        units: ``(layer, heads)`` per column: one query head, or the heads of a KV group.
        estimates: ``[prompt, unit]`` signed estimate of ``M(ablated) - M(clean)``.
        scores: ``[prompt, unit]`` the magnitude that ranks units: ``|estimate|`` for AtP,
            GradDrop's for AtP*.
        values: ``[prompt]`` the metric on the clean prompts.
        method, metric, unit: how it was computed (``unit``: ``"head"`` or ``"kv"``).
        n_layers, n_heads, group_size: the model's shape (``group_size`` query heads per KV head).
        settings: the ablation and metric settings, for :func:`~lensprobe.experiments.verify.verify_attribution`.
    """

    units: list[Unit]
    estimates: Float[Tensor, "prompt unit"]
    scores: Float[Tensor, "prompt unit"]
    values: Float[Tensor, " prompt"]
    method: str
    metric: str
    unit: str
    n_layers: int
    n_heads: int
    group_size: int = 1
    settings: dict = field(default_factory=dict, repr=False)

    @property
    def labels(self) -> list[str]:
        """``"L0H3"`` (or ``"L0KV1"``) per unit."""
        return [unit_label(u, self.unit, self.group_size) for u in self.units]

    @property
    def table(self):
        """One row per unit: ``layer``, ``head`` (``kv_head`` for groups), ``head_label``, ``estimate``
        (mean over prompts), ``spread`` (standard deviation over prompts), ``score``, ``n_prompts``."""
        column = "head" if self.unit == "head" else "kv_head"
        est, score = self.estimates, self.scores
        spread = est.std(0, unbiased=False)
        rows = [{"layer": layer, column: heads[0] if self.unit == "head" else heads[0] // self.group_size,
                 "head_label": label, "estimate": float(est[:, i].mean()), "spread": float(spread[i]),
                 "score": float(score[:, i].mean()), "n_prompts": int(est.shape[0])}
                for i, ((layer, heads), label) in enumerate(zip(self.units, self.labels, strict=True))]
        return pandas().DataFrame(rows, columns=["layer", column, "head_label", "estimate", "spread", "score",
                                                 "n_prompts"])

    def grid(self) -> Float[Tensor, "layer head"]:
        """Mean estimate as a ``[layer, head]`` tensor (``[layer, kv_head]`` for groups; NaN where not estimated:
        :meth:`measured` tells a unit not estimated from one whose estimate is NaN)."""
        out = torch.full(self._grid_shape(), float("nan"), device="cpu")
        for (layer, heads), value in zip(self.units, self.estimates.mean(0).tolist(), strict=True):
            out[layer, heads[0] if self.unit == "head" else heads[0] // self.group_size] = value
        return out

    def measured(self) -> Bool[Tensor, "layer head"]:
        """Which cells of :meth:`grid` were estimated: a NaN where this is ``True`` is the estimate's own value."""
        out = torch.zeros(self._grid_shape(), dtype=torch.bool)
        for layer, heads in self.units:
            out[layer, heads[0] if self.unit == "head" else heads[0] // self.group_size] = True
        return out

    def _grid_shape(self) -> tuple[int, int]:
        return self.n_layers, (self.n_heads if self.unit == "head" else self.n_heads // self.group_size)

    def top(self, k: int = 10):
        """The ``k`` units with the largest score (the candidates to verify), as a table."""
        t = self.table
        return t.reindex(t["score"].sort_values(ascending=False, kind="stable").index).head(k).reset_index(drop=True)

    def to_csv(self, path: str | Path) -> Path:
        """Write :attr:`table` as CSV, atomically (:func:`~lensprobe.core.storage.store.atomic_file`); returns the path."""
        path = Path(path)
        with atomic_file(path) as tmp:
            self.table.to_csv(tmp, index=False)
        return path


def computed_on(model, items, metric: Any, answers: Any = None, tokens: Any = None, continuation: Any = None
                ) -> dict[str, str]:
    """What an attribution was computed on, by content: the model (a digest of its weights), the prompts
    and the metric (with its answers, tokens or continuation). A metric that cannot be described by
    content (:mod:`~lensprobe.core.storage.identity`) is identified as this very object.
    :func:`~lensprobe.experiments.verify.verify_attribution` compares them with its own arguments."""
    try:
        measured = identity_digest([metric, answers, tokens, continuation])
    except IdentityError:
        measured = f"object {id(metric)}"  # kept alive by the settings that hold it
    return {"model": identity_digest(model), "prompts": identity_digest(list(items)), "metric": measured}


def prompt_positions(settings: dict, index: int, prompt) -> Any:
    """The ablated positions of prompt ``index`` under an attribution's ``settings``: the positions paired
    by segment (``align``), else ``positions`` resolved against the prompt."""
    aligned = settings.get("aligned")
    if aligned is not None:
        return aligned[index]
    return resolve_positions(settings["positions"], prompt if hasattr(prompt, "positions") else None)


def aligned_sources(model, items, ablation: Any, align: Any, positions: Any, unit: str, layers: Sequence[int]
                     ) -> tuple[list, list]:
    """Per prompt: the corrupted prompt's ``hook_z`` placed at the positions paired by segment, and those positions."""
    if isinstance(ablation, str) or positions is not None or unit != "head":
        raise LensprobeError("align= pairs positions by segment between each prompt and its corrupted prompt: pass "
                             "ablation=[corrupted prompts], leave positions=None (the paired positions are ablated) "
                             "and unit='head'.")
    corrupted = as_prompts(model, ablation, build_strings=True)
    names = None if align is True else align
    sources, aligned = [], []
    for clean, other in zip(items, corrupted, strict=True):
        clean_pos, other_pos, _ = aligned_positions(clean, other, names)
        sources.append(aligned_source(model, other, len(clean), clean_pos, other_pos, sorted(set(layers))))
        aligned.append(Positions(fixed=frozenset(clean_pos)))
    return sources, aligned


def head_units(model, heads, unit: str) -> list[Unit]:
    if unit not in UNITS:
        raise LensprobeError(f"unit must be one of {UNITS}, got {unit!r}.")
    pairs = sorted(resolve_heads(model, heads))
    if not pairs:
        raise LensprobeError("no heads to attribute: pass heads='all' or a list of heads.")
    if unit == "head":
        return [(layer, (head,)) for layer, head in pairs]
    n_heads = int(model.cfg.n_heads)
    size = n_heads // int(getattr(model.cfg, "n_key_value_heads", None) or n_heads)
    groups = sorted({(layer, head // size) for layer, head in pairs})
    return [(layer, tuple(h for _, h in kv_group_heads(model, layer, g))) for layer, g in groups]


def attribution_sources(model, n: int, ablation: Any, reference: Any, per_position: bool,
                        layers: Sequence[int]) -> tuple[str, list]:
    """``(method, one replacement source per prompt)`` from the ``ablation`` argument.

    ``ablation`` is ``"zero"``, ``"mean"``, ``"resample"`` (``reference`` as in
    :func:`~lensprobe.interventions.ablation.ablate_heads`), or a list of corrupted prompts,
    one per prompt: each prompt's heads are then resampled from its own corrupted prompt.
    """
    if isinstance(ablation, str):
        check_method(ablation, reference)  # one of METHODS from here on
        source = ablation_source(model, cast(Method, ablation), reference, layers, per_position)
        return ablation, [source] * n
    if reference is not None:
        raise LensprobeError("corrupted prompts are the reference already: pass them as ablation=[...] alone.")
    corrupted = as_prompts(model, ablation, build_strings=True)
    if len(corrupted) != n:
        raise LensprobeError(
            f"got {len(corrupted)} corrupted prompts for {n} prompts: pass one corrupted prompt per prompt, or "
            f"ablation in {METHODS}."
        )
    return "resample", [ablation_source(model, "resample", c, layers) for c in corrupted]


def attribute_heads(model, prompts, metric: Any = "entropy", *, method: AttributionMethod = "atp",
                    ablation: Any = "zero", reference: Any = None, per_position: bool = False,
                    positions: Any = None, heads: Any = "all", unit: str = "head",
                    answers: str | Sequence[str] | None = None, tokens: Sequence[int | str] | None = None,
                    continuation: Any = None, align: bool | str | Sequence[str] | None = None,
                    batch_size: int = 32, progress: bool = False) -> Attribution:
    """Estimate, for every head at once, how a metric changes when that head is ablated.

    The ablation is :func:`~lensprobe.interventions.ablation.ablate_heads`' (``hook_z``,
    per query head, the same positions and replacement values), so
    :func:`~lensprobe.experiments.sweep.ablation_sweep` measures exactly what this estimates.

    **What is exact and what is approximate.** ``"atp"`` is the first-order Taylor term:
    exact when the metric is linear in the head outputs (e.g. a logit difference of a model
    whose heads feed the unembedding directly), approximate wherever a nonlinearity lies
    between the head and the metric (norms, MLPs, later attention, the softmax of the metric).
    ``"atp*"`` adds, following Kramar et al. 2024: the **QK fix**. The paper defines it for
    query and key nodes (the softmax of their own head computed exactly); a head's output lies
    after its own softmax, so here it is applied to the softmaxes the head's write reaches: for
    every later layer, the attention is recomputed exactly (norm, queries, keys, softmax,
    values) on its input plus the head's direct write ``dz @ W_O``, and only what follows that
    layer's attention output is linearised (so for a layer-0 head of a two-layer
    attention-only model with a linear metric the estimate is exact); paths through MLPs and
    the interaction of several layers' changes stay linear. **GradDrop**: the ranking
    ``score`` averages, over layers ``L'``, the magnitude of the QK-fixed estimate with layer
    ``L'``'s gradient dropped (``sum / (n_layers - 1)``; the QK fix's terms are recomputed
    with the dropped gradient), so a head whose direct and indirect effects cancel on these
    prompts still ranks high; it is a magnitude, not a signed effect. Both are first-order
    beyond the softmaxes they fix: an ablation far outside the linear regime whose effect runs
    through chains of later MLPs and attention layers (on SmolLM2, zero-ablated heads of layers
    0 and 1: see the docs' Heads guide) is underestimated by both. Verify candidates with
    :func:`~lensprobe.experiments.verify.verify_attribution`.

    Cost per prompt (forward-pass equivalents): AtP about 3 (forward, backward); AtP* adds
    about ``n_layers / 2`` backward passes (GradDrop), one pass in which every later layer's
    attention pulls its gradients back to its input (one row per gradient: the full one and
    one per GradDrop layer above it), and for every later layer one attention computation per
    unit below it (QK fix), in chunks of ``batch_size`` units.
    Memory: one prompt at a time; gradients only at ``hook_z`` (parameters are frozen during the
    passes and receive no gradient), activations of one forward kept for its backward.

    Args:
        model: a TransformerLens model (TransformerBridge or HookedTransformer).
        prompts: a :class:`~lensprobe.core.prompts.prompt.Prompt`, a question string, token ids, or a list.
        metric: ``"entropy"`` (next-token entropy at the last position, nats), ``"logprob"``
            (log-probability of ``answers`` fed after the prompt), ``"logit_diff"`` (``tokens=(a, b)``),
            or a callable ``fn(logits [batch, pos, vocab], prompt) -> [batch]`` of torch operations
            (see :func:`~lensprobe.core.measures.forced.resolve_measures`).
        method: ``"atp"`` or ``"atp*"``.
        ablation: ``"zero"``, ``"mean"``, ``"resample"`` (with ``reference``), or corrupted prompts
            (one per prompt, each resampled from its own).
        reference, per_position, positions: as in :func:`~lensprobe.interventions.ablation.ablate_heads`
            (segment names are resolved per prompt).
        heads: heads to attribute (``"all"`` or any head spec).
        unit: ``"head"`` (one row per query head) or ``"kv"`` (one per KV group, its heads ablated together).
        answers, tokens, continuation: the metric's answer text, logit-difference tokens, or a
            teacher-forced continuation (token ids, e.g. a generation's) per prompt.
        align: with corrupted prompts of other lengths (``ablation=[...]``), pair positions by
            segment as :func:`~lensprobe.experiments.headpatch.patch_heads` does (``True``: every
            segment both prompts have; or segment names): each head's output at the paired positions
            is replaced by its output there on the corrupted prompt (the positions are the paired ones,
            so ``positions`` must stay ``None``).
        batch_size: units per batched attention computation of the QK fix.
        progress: show a progress bar of the forward and backward passes (one step per gradient
            pass and per QK-fix pass), with an estimate of the time left.

    Returns:
        An :class:`Attribution`; ``.table`` has ``layer``, ``head``, ``head_label``, ``estimate``,
        ``spread``, ``score``.

    Raises:
        LensprobeError: a bad method, unit, metric, ablation or head spec; positions that ablate
            nothing (outside the prompt, an empty list, ``"generated"`` on a prompt); a non-finite
            metric, or one whose gradient at every head's output is zero (cut by ``.detach()``,
            ``.item()``, ...).

    Example:
        >>> att = lp.attribute_heads(model, prompts, "entropy", method="atp*")
        >>> att.top(5)[["head_label", "estimate", "score"]]
    """
    if method not in ("atp", "atp*"):
        raise LensprobeError(f"method must be 'atp' or 'atp*', got {method!r}.")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise LensprobeError(f"batch_size must be a positive integer, got {batch_size!r}.")
    units = head_units(model, heads, unit)
    items = as_prompts(model, prompts, build_strings=True)
    measures = resolve_measures(model, metric, len(items), answers=answers, tokens=tokens, continuation=continuation,
                                gradient=True)
    kind, sources = attribution_sources(model, len(items), ablation, reference, per_position, [u[0] for u in units])
    aligned = None
    if align is not None and align is not False:
        sources, aligned = aligned_sources(model, items, ablation, align, positions, unit, [u[0] for u in units])
    star = method == "atp*"
    n_layers = int(model.cfg.n_layers)
    estimates, scores, values = [], [], []
    steps = 1 + (qk_passes(units, n_layers, batch_size) if star else 0)  # passes per prompt, at most
    with tqdm(total=len(items) * steps, desc=f"attribution ({method})", unit="pass", disable=not progress,
              leave=False) as bar:
        for p, (prompt, measure, source) in enumerate(zip(items, measures, sources, strict=True)):
            pos = aligned[p] if aligned is not None else resolve_positions(
                positions, prompt if hasattr(prompt, "positions") else None)
            inputs = measure.inputs(model, prompt)
            check_ablation_positions(pos, int(inputs.shape[-1]))  # positions that ablate nothing: as the sweep refuses
            part = attribute_prompt(model, inputs, measure, prompt, units, pos, source, qk_fix=star, grad_drop=star,
                                    batch_size=batch_size, tick=lambda: bar.update(1))
            bar.update((p + 1) * steps - bar.n)  # passes the QK fix did not need (layers without a gradient)
            est, score = combine(part, units, n_layers)
            estimates.append(est)
            scores.append(score)
            values.append(part.value)
    n_heads = int(model.cfg.n_heads)
    settings = {"ablation": ablation, "method": kind, "reference": reference, "per_position": per_position,
                "positions": positions, "answers": answers, "tokens": tokens, "continuation": continuation,
                "metric": metric, "sources": sources, "aligned": aligned, "computed_on": computed_on(model, items, metric, answers, tokens,
                                                                             continuation)}
    return Attribution(units, torch.stack(estimates), torch.stack(scores), torch.tensor(values, device="cpu"),
                       method, getattr(measures[0], "name", str(metric)), unit, n_layers, n_heads,
                       n_heads // int(getattr(model.cfg, "n_key_value_heads", None) or n_heads), settings)
