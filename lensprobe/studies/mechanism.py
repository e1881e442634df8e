r"""The layer-0 mechanism of the meaningless-tokens paper (arXiv 2510.01032), measured on real runs.

The paper explains the gain from filler tokens in two steps, and this module measures both:

1. **Attention is rescaled affinely.** Inserting filler tokens adds keys that take a share of
   each later query's attention. When the scores of the original keys do not change, the
   attention output of a query ``i`` with filler is an affine map of its output without filler:
   ``out_with = lambda * out_without + bias`` with ``lambda = 1 - (attention mass on the
   filler)`` and ``bias = sum over filler keys j of A[i, j] v_j``. :func:`filler_affine_fit`
   computes ``lambda`` and ``bias`` per head and query position from the with-filler run and
   reports how well the map predicts the recorded output (``rel_error``).
2. **MLP activations move away from zero.** :func:`activation_stats` collects the layer's MLP
   activation ``a = act_fn(gate_proj(x))`` (or the gated product ``hook_post``) under several
   conditions (e.g. w/o, w/ Mless, w/o + ARM) and returns shared-bin histograms and the share of
   near-zero entries, with the near-zero band ``eps = 1.4826 * MAD(|a|) * c`` defined as in
   :mod:`lensprobe.interventions.arm`.

When is the affine fit exact? The softmax over all keys equals ``lambda`` times the softmax over
the original keys exactly when the original keys' scores are the same in both runs, and the
original values ``v_j`` are the same too. At layer 0 the values depend only on the token (its
embedding and the norm: RoPE rotates queries and keys, never values), so the values always
match. The scores match when they carry no positional information (for example a model with
constant scores). With RoPE the original tokens after the filler sit ``len(filler)`` positions
later, so the query-key angles, and hence the scores, change: the fit is then approximate and
``rel_error`` says by how much. In later layers the residual stream itself changes, so the fit is
a description, not an identity.

"Filler" here is every key the with-filler prompt has and the prompt without filler lacks: the
filler segment and its separator (``filler_sep``, a newline), which is what
:meth:`~lensprobe.core.prompts.prompt.Prompt.positions_except` drops to align the two prompts.

Layers and heads are 0-based, as in TransformerLens (``L0H13`` is the papers' layer 1, head 14).

Example:
    >>> import lensprobe as lp
    >>> from lensprobe.studies.mechanism import activation_stats, affine_fit_summary, filler_affine_fit
    >>> model = lp.load_model()
    >>> q = "What is 12+7?"
    >>> with_f = lp.build_prompt(model, q, system=lp.MATH_SYSTEM_PROMPT, filler=lp.Filler.meaningless())
    >>> without = lp.build_prompt(model, q, system=lp.MATH_SYSTEM_PROMPT)
    >>> fit = filler_affine_fit(model, with_f, without, layer=0)
    >>> affine_fit_summary(fit).head()
    >>> stats = activation_stats(model, {"w/o": without, "w/ Mless": with_f, "w/o + ARM": without},
    ...                          interventions={"w/o + ARM": [lp.ARM(c=0.1, percentile=95, seed=0)]})
    >>> stats.summary[["condition", "near_zero", "mean_abs"]]
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
from jaxtyping import Float
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.lazy import pandas
from lensprobe.core.prompts.conditions import paper_conditions
from lensprobe.core.prompts.prompt import MATH_SYSTEM_PROMPT, Prompt
from lensprobe.interventions.arm import activation_function, near_zero_band
from lensprobe.studies.affine import (
    affine_fit_summary,
    check_prompt,
    filler_affine_fit,
    one_layer,
    record_layer,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "WHERE",
    "ActivationStats",
    "activation_stats",
    "affine_fit_summary",
    "filler_affine_fit",
    "fraction_beyond",
    "mad_eps",
    "mechanism_prompts",
    "near_zero_fraction",
]

Where = Literal["act_fn(gate)", "hook_post"]
WHERE: tuple[str, ...] = ("act_fn(gate)", "hook_post")
"""What :func:`activation_stats` measures: ``act_fn(gate_proj(x))`` (what ARM edits) or the gated
product ``act_fn(gate_proj(x)) * up_proj(x)`` at ``blocks.{l}.mlp.hook_post``."""


def mechanism_prompts(model, question: str, *, system: str | None = MATH_SYSTEM_PROMPT, count: int = 55,
                      symbol: str = "/", chat: bool = True) -> dict[str, Prompt]:
    """The paper's ``"w/o"`` and ``"w/ Mless"`` prompts of one question (filler between system
    prompt and question), built by :func:`~lensprobe.core.prompts.conditions.paper_conditions`.

    Example:
        >>> ps = mechanism_prompts(model, "What is 12+7?")
        >>> fit = filler_affine_fit(model, ps["w/ Mless"], ps["w/o"])
    """
    conds = paper_conditions(system=system, count=count, symbol=symbol, chat=chat)
    return {name: conds[name].prompt_builder(model)(question) for name in ("w/o", "w/ Mless")}


# --------------------------------------------------------------------------- pure tensor helpers


def _check_tensor(a: Any, name: str = "activations") -> Tensor:
    if not isinstance(a, Tensor) or not a.is_floating_point():
        raise LensprobeError(f"{name} must be a floating-point tensor, got {type(a).__name__}.")
    if a.numel() == 0:
        raise LensprobeError(f"{name} is empty: pass at least one entry.")
    return a.detach().reshape(-1).to(torch.float32)


def _check_number(x: Any, name: str, *, positive: bool = False) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0 or (
            positive and x == 0):
        need = "a positive" if positive else "a non-negative"
        raise LensprobeError(f"{name} must be {need} finite number, got {x!r}.")
    return float(x)


def mad_eps(activations: Float[Tensor, "..."], c: float) -> float:
    """ARM's near-zero band: ``eps = 1.4826 * MAD(|a|) * c`` over the whole tensor.

    ``MAD = median(| |a| - median(|a|) |)`` (clamped at ``1e-12``), with ``torch.median``'s
    lower middle value for an even count, in float32: the same ``eps`` that
    :func:`lensprobe.interventions.arm_redistribute` computes for the same tensor and ``c``.

    Raises:
        LensprobeError: not a non-empty float tensor, or a negative ``c``.

    Example:
        >>> mad_eps(torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0]), c=1.0)  # MAD of |a| = 1
        1.4826...
    """
    flat = _check_tensor(activations)
    c = _check_number(c, "c")
    return float(near_zero_band(flat, c))


def near_zero_fraction(activations: Float[Tensor, "..."], eps: float) -> float:
    """Share of entries with ``|a| < eps`` (strictly, as in ARM).

    Example:
        >>> near_zero_fraction(torch.tensor([0.0, 0.05, -0.2, 1.0]), eps=0.1)
        0.5
    """
    flat = _check_tensor(activations)
    eps = _check_number(eps, "eps")
    return float((flat.abs() < eps).to(torch.float64).mean())


def fraction_beyond(activations: Float[Tensor, "..."], magnitude: float) -> float:
    """Share of entries with ``|a| > magnitude``.

    Example:
        >>> fraction_beyond(torch.tensor([0.0, 0.5, -2.0, 1.0]), 0.9)
        0.5
    """
    flat = _check_tensor(activations)
    magnitude = _check_number(magnitude, "magnitude")
    return float((flat.abs() > magnitude).to(torch.float64).mean())


# --------------------------------------------------------------------------- activation statistics


@dataclass(frozen=True, eq=False)
class ActivationStats:
    """MLP activation statistics per condition, from :func:`activation_stats`.

    Attributes:
        histogram: one row per (condition, bin): ``condition``, ``bin``, ``left``, ``right``,
            ``center``, ``count``, ``fraction`` (count / entries of the condition); bins are
            shared by every condition.
        summary: one row per condition: ``condition``, ``layer``, ``where``, ``n`` (entries),
            ``eps``, ``near_zero`` (share with ``|a| < eps``), ``mean_abs``, ``std``, ``min``,
            ``max``, ``negative`` (share below 0), and ``beyond_{m}`` (share with ``|a| > m``)
            for each magnitude ``m``.
        layer: the 0-based layer.
        where: ``"act_fn(gate)"`` or ``"hook_post"``.
        segment: the prompt segment whose positions were collected.
        eps: half-width of the near-zero band.
        reference: the condition ``eps`` was computed on (``None`` when ``eps`` was given).
        magnitudes: the magnitudes of the ``beyond_*`` columns.
    """

    histogram: "pd.DataFrame"
    summary: "pd.DataFrame"
    layer: int
    where: str
    segment: str
    eps: float
    reference: str | None
    magnitudes: tuple[float, ...]

    @property
    def conditions(self) -> list[str]:
        """Condition names, in the order given."""
        return [str(c) for c in self.summary["condition"]]


def _mlp_activation(model, acts: dict[str, Tensor], layer: int, where: str, act_fn) -> Tensor:
    """``[batch, pos, d_mlp]`` activation the down projection is fed through.

    ``hook_post`` as recorded (after any intervention). For ``act_fn(gate)``:
    ``act_fn(hook_pre)``, except at entries where ``hook_post`` no longer equals
    ``act_fn(hook_pre) * hook_pre_linear`` because an intervention (such as ARM) edited the
    product; there the edited activation is ``hook_post / hook_pre_linear``.
    """
    prefix = f"blocks.{layer}.mlp"
    post = acts[f"{prefix}.hook_post"].to(torch.float32)
    if where == "hook_post":
        return post
    gate = acts[f"{prefix}.hook_pre"]
    up = acts[f"{prefix}.hook_pre_linear"].to(torch.float32)
    a = act_fn(gate).to(torch.float32)
    product = a * up
    edited = ~torch.isclose(post, product, rtol=1e-5, atol=1e-7)
    if bool(edited.any()):
        a = torch.where(edited, post / torch.where(edited, up, torch.ones_like(up)), a)
    return a


def _edges(values: list[Tensor], bins: Any) -> Tensor:
    if isinstance(bins, bool):
        bins = None
    if isinstance(bins, int):
        if bins < 1:
            raise LensprobeError(f"bins must be at least 1, got {bins}.")
        lo = min(float(v.min()) for v in values)
        hi = max(float(v.max()) for v in values)
        if hi <= lo:
            lo, hi = lo - 0.5, hi + 0.5
        return torch.linspace(lo, hi, bins + 1, dtype=torch.float64, device="cpu")
    try:
        edges = torch.tensor([float(e) for e in bins], dtype=torch.float64, device="cpu")
    except (TypeError, ValueError):
        raise LensprobeError(f"bins must be a number of bins or a list of bin edges, got {bins!r}.") from None
    if edges.numel() < 2 or not bool((edges[1:] > edges[:-1]).all()):
        raise LensprobeError(f"bin edges must be at least two increasing numbers, got {list(edges.tolist())}.")
    return edges


def _check_where(model, layer: int, where: str) -> list[str]:
    if where not in WHERE:
        raise LensprobeError(f"where must be one of {WHERE}, got {where!r}.")
    prefix = f"blocks.{layer}.mlp"
    names = [f"{prefix}.hook_post"]
    if where == "act_fn(gate)":
        names = [f"{prefix}.hook_pre", f"{prefix}.hook_pre_linear"] + names
        hook_dict = getattr(model, "hook_dict", {})
        if not getattr(model.cfg, "gated_mlp", False) or any(n not in hook_dict for n in names):
            raise LensprobeError(
                "where='act_fn(gate)' needs a gated MLP (down_proj(act_fn(gate_proj(x)) * up_proj(x))) with "
                f"hooks {names}; use where='hook_post' on this model."
            )
    return names


def _check_same_segment(prompts: Mapping[str, Prompt], segment: str) -> None:
    """Every prompt's ``segment`` holds the first prompt's tokens (the same question)."""
    names = [str(n) for n in prompts]
    first = next(iter(prompts.values()))
    want = first.tokens[0, first.positions(segment)].cpu()
    for name, p in prompts.items():
        got = p.tokens[0, p.positions(segment)].cpu()
        if got.shape != want.shape or not bool((got == want).all()):
            raise LensprobeError(
                f"prompts[{name!r}] has other {segment!r} tokens than prompts[{names[0]!r}]: compare conditions "
                "of the same question."
            )


def activation_stats(model, prompts: Mapping[str, Prompt], layer: int = 0, where: Where = "act_fn(gate)", *,
                     interventions: Mapping[str, Sequence[Any]] | None = None, segment: str = "question",
                     eps: float | None = None, c: float = 0.1, reference: str | None = None,
                     bins: int | Sequence[float] = 60, magnitudes: Sequence[float] = (0.1, 0.5, 1.0)
                     ) -> ActivationStats:
    r"""Distribution of a layer's MLP activations per condition: do they move away from zero?

    Each named prompt runs up to block ``layer`` (with its ``interventions``, if any), and the
    activation at the positions of ``segment`` is collected, every hidden unit of every such
    position. Collecting the question only means every condition is measured on the same
    tokens (the filler's own positions, present in one condition only, are left out), so a
    difference is how the *same* tokens' activations change.

    ``where="act_fn(gate)"`` is ``a = act_fn(gate_proj(x))``, what ARM edits; it is rebuilt from
    ``blocks.{layer}.mlp.hook_pre`` with the model's own activation function
    (:func:`lensprobe.interventions.arm.activation_function`). When an intervention edited the
    MLP's product at ``hook_post`` (ARM does), the edited entries are read back as
    ``hook_post / hook_pre_linear``, so a ``"w/o + ARM"`` condition shows ARM's output.
    ``where="hook_post"`` is the gated product ``act_fn(gate) * up`` as the down projection
    receives it.

    Args:
        model: a TransformerLens model (a gated MLP for ``"act_fn(gate)"``).
        prompts: condition name -> :class:`~lensprobe.core.prompts.prompt.Prompt`, e.g.
            ``{"w/o": p0, "w/ Mless": p1, "w/o + ARM": p0}``. Every prompt's ``segment`` must
            hold the same tokens.
        layer: the 0-based layer (the paper: 0).
        where: ``"act_fn(gate)"`` or ``"hook_post"``.
        interventions: condition name -> interventions attached for that condition only, e.g.
            ``{"w/o + ARM": [lp.ARM(c=0.1, percentile=95, seed=0)]}``.
        segment: the positions collected (default: the question).
        eps: half-width of the near-zero band; ``None`` computes it as ARM does,
            ``1.4826 * MAD(|a|) * c``, on the ``reference`` condition.
        c: ARM's scale of the band (0.1: the authors' Qwen2.5-Math-7B MATH-500 setting).
        reference: the condition ``eps`` is computed on (default: the first one, e.g. ``"w/o"``).
        bins: number of equal-width bins over the range of every condition together, or the
            bin edges (values outside them are not counted).
        magnitudes: report the share of entries with ``|a|`` above each.

    Returns:
        An :class:`ActivationStats` with a histogram table and a summary table.

    Raises:
        LensprobeError: an empty or unnamed set of prompts, interventions for an unknown
            condition, prompts whose ``segment`` differs, a bad layer, ``where``, ``eps``, ``c``,
            ``bins`` or magnitude.

    Example:
        >>> stats = activation_stats(model, {"w/o": without, "w/ Mless": with_f})
        >>> stats.summary[["condition", "near_zero", "beyond_0.5"]]
    """
    pd = pandas()
    if not isinstance(prompts, Mapping) or not prompts:
        raise LensprobeError("prompts must be a non-empty dict {condition name: Prompt}, e.g. {'w/o': p0}.")
    names = [str(n) for n in prompts]
    for name, p in prompts.items():
        check_prompt(p, f"prompts[{name!r}]")
    interventions = dict(interventions or {})
    unknown = [k for k in interventions if k not in prompts]
    if unknown:
        raise LensprobeError(f"interventions for unknown conditions {unknown}: the prompts are named {names}.")
    layer = one_layer(model, layer)
    hooks = _check_where(model, layer, where)
    reference = names[0] if reference is None else reference
    if eps is None and reference not in prompts:
        raise LensprobeError(f"reference {reference!r} is not one of the conditions {names}.")
    if eps is not None:
        eps = _check_number(eps, "eps")
        reference = None
    c = _check_number(c, "c")
    mags = tuple(_check_number(m, "magnitude") for m in magnitudes)
    _check_same_segment(prompts, segment)
    act_fn = activation_function(model, layer) if where == "act_fn(gate)" else None
    values: dict[str, Tensor] = {}
    for name, p in prompts.items():
        acts = record_layer(model, p, layer, hooks, list(interventions.get(name, ())))
        a = _mlp_activation(model, acts, layer, where, act_fn)
        values[str(name)] = a[0, p.positions(segment)].reshape(-1).cpu()
    if eps is None:  # no eps given: reference names one of the prompts (checked above)
        eps = mad_eps(values[cast(str, reference)], c)
    edges = _edges(list(values.values()), bins)
    hist_rows, summary_rows = [], []
    for name, a in values.items():
        counts, _ = torch.histogram(a.to(torch.float64), bins=edges)
        n = a.numel()
        hist_rows.append(pd.DataFrame({
            "condition": name, "bin": range(len(counts)), "left": edges[:-1].tolist(), "right": edges[1:].tolist(),
            "center": ((edges[:-1] + edges[1:]) / 2).tolist(), "count": counts.to(torch.int64).tolist(),
            "fraction": (counts / n).tolist(),
        }))
        row = {"condition": name, "layer": layer, "where": where, "segment": segment, "n": n, "eps": eps,
               "near_zero": near_zero_fraction(a, eps), "mean_abs": float(a.abs().mean()),
               "std": float(a.std()) if n > 1 else 0.0, "min": float(a.min()), "max": float(a.max()),
               "negative": float((a < 0).to(torch.float64).mean())}
        row.update({f"beyond_{m:g}": fraction_beyond(a, m) for m in mags})
        summary_rows.append(row)
    return ActivationStats(histogram=pd.concat(hist_rows, ignore_index=True), summary=pd.DataFrame(summary_rows),
                           layer=layer, where=where, segment=segment, eps=float(eps), reference=reference,
                           magnitudes=mags)
