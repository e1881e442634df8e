r"""Step 1 of the meaningless-tokens mechanism (arXiv 2510.01032): filler tokens rescale layer-0
attention affinely, ``out_with = lambda * out_without + bias`` (see :mod:`lensprobe.studies.mechanism`
for the whole mechanism and when the fit is exact).

Example:
    >>> from lensprobe.studies.affine import affine_fit_summary, filler_affine_fit
    >>> fit = filler_affine_fit(model, with_filler, without, layer=0)
    >>> affine_fit_summary(fit).head()
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import ActivationRecorder
from lensprobe.core.hooks.forward import forward
from lensprobe.core.hooks.heads import head_label
from lensprobe.core.lazy import pandas
from lensprobe.core.models.loading import check_heads, check_layers
from lensprobe.core.prompts.prompt import Prompt

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["affine_fit_summary", "filler_affine_fit"]

FILLER = "filler"
"""The filler segment's name."""


# --------------------------------------------------------------------------- running one layer


def record_layer(model, prompt: Prompt, layer: int, names: list[str], interventions: Sequence[Any] = ()
                  ) -> dict[str, Tensor]:
    """The named activations of one forward pass, stopped after block ``layer``; the recorder is
    attached after the interventions, so it sees what they wrote."""
    rec = ActivationRecorder(names)
    forward(model, prompt, *interventions, rec, stop_at_layer=layer + 1)
    missing = [n for n in names if n not in rec.acts]
    if missing:
        raise LensprobeError(
            f"{missing} did not fire in the forward pass: the model needs TransformerLens hook points "
            "(and eager attention for hook_pattern; lp.load_model() uses it)."
        )
    return rec.acts


def check_prompt(p: Any, name: str) -> Prompt:
    if not isinstance(p, Prompt):
        raise LensprobeError(
            f"{name} must be a Prompt with named segments (lp.build_prompt), got {type(p).__name__}."
        )
    return p


def one_layer(model, layer: Any) -> int:
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise LensprobeError(f"layer must be one integer (0-based), got {layer!r}.")
    return check_layers(model, [layer])[0]


# --------------------------------------------------------------------------- affine fit


def _aligned_queries(with_filler: Prompt, without: Prompt, segment: str) -> tuple[list[int], list[int], list[int]]:
    """Query positions of ``segment`` in both prompts, and the with-filler keys the other prompt lacks."""
    if FILLER not in with_filler.segments:
        raise LensprobeError(
            "with_filler has no 'filler' segment: build it with lp.build_prompt(..., "
            "filler=lp.Filler.meaningless())."
        )
    if FILLER in without.segments:
        raise LensprobeError(
            "without has a 'filler' segment: build it with the same arguments but filler=None."
        )
    keep = with_filler.positions_except(FILLER)
    if len(keep) != len(without) or not bool((with_filler.tokens[0, keep].cpu() == without.tokens[0].cpu()).all()):
        raise LensprobeError(
            "the prompts differ outside the filler: build both with lp.build_prompt from the same question, "
            "system prompt, placement and chat setting, one with filler and one without."
        )
    q_with, q_without = with_filler.positions(segment), without.positions(segment)
    if len(q_with) != len(q_without) or not q_with:
        raise LensprobeError(
            f"segment {segment!r} has {len(q_with)} tokens with filler and {len(q_without)} without: "
            "pass a segment both prompts share (e.g. 'question')."
        )
    kept = set(keep)
    inserted = [j for j in range(len(with_filler)) if j not in kept]
    return q_with, q_without, inserted


def filler_affine_fit(model, with_filler: Prompt, without: Prompt, layer: int = 0, *,
                      heads: Sequence[int] | None = None, segment: str = "question") -> "pd.DataFrame":
    r"""How well ``out_with = lambda * out_without + bias`` describes a layer's attention output.

    Runs both prompts up to block ``layer`` and records ``blocks.{layer}.attn.hook_pattern``,
    ``hook_v`` and ``hook_z``. For each query head ``h`` and each query position ``i`` of
    ``segment`` (matched to position ``i'`` of the same token in ``without``):

    - ``filler_mass = sum_{j in F} A_with[h, i, j]`` and ``lambda = 1 - filler_mass``, where
      ``F`` is every key the with-filler prompt has and ``without`` lacks (the filler and its
      separator);
    - ``bias = sum_{j in F} A_with[h, i, j] v_j``, with ``v`` from the with-filler run and the
      head's KV group under grouped-query attention (query head ``h`` reads KV head
      ``h // (n_heads // n_kv_heads)``);
    - ``rel_error = ||z_with[i, h] - (lambda * z_without[i', h] + bias)|| / ||z_with[i, h]||``;
    - ``rel_change = ||z_with[i, h] - z_without[i', h]|| / ||z_with[i, h]||``, the error of
      assuming the filler changes nothing, for comparison.

    The fit is exact when the original keys' scores do not change with the filler, for
    example when scores carry no positional information; with RoPE the original tokens move by the
    filler length, so the fit is approximate (see the module docstring).

    Args:
        model: a TransformerLens model.
        with_filler: the prompt with a ``filler`` segment (:func:`lensprobe.build_prompt`).
        without: the same prompt built without filler.
        layer: the 0-based layer (the paper: 0).
        heads: query heads (0-based; default: all).
        segment: the query positions to fit (default: the question).

    Returns:
        One row per (head, position): ``layer``, ``head``, ``head_label``, ``position`` (index
        within ``segment``), ``prompt_pos`` (position in the with-filler prompt), ``token``,
        ``lambda``, ``filler_mass``, ``bias_norm``, ``rel_error``, ``rel_change``.

    Raises:
        LensprobeError: prompts that do not differ by exactly the filler, a bad layer or head,
            or a model whose hooks do not fire.

    Example:
        >>> fit = filler_affine_fit(model, with_f, without, layer=0)
        >>> fit.groupby("head")["lambda"].mean()
    """
    pd = pandas()
    check_prompt(with_filler, "with_filler")
    check_prompt(without, "without")
    layer = one_layer(model, layer)
    heads = check_heads(model, heads)
    q_with, q_without, inserted = _aligned_queries(with_filler, without, segment)
    names = [f"blocks.{layer}.attn.{n}" for n in ("hook_pattern", "hook_v", "hook_z")]
    w = record_layer(model, with_filler, layer, names)
    o = record_layer(model, without, layer, names)
    pattern = w[names[0]][0].to(torch.float64)          # [head, q, k]
    v = w[names[1]][0].to(torch.float64)                # [k, kv_head, d_head]
    z_with = w[names[2]][0].to(torch.float64)           # [pos, head, d_head]
    z_without = o[names[2]][0].to(torch.float64)
    n_heads, n_kv = pattern.shape[0], v.shape[1]
    group = max(1, n_heads // n_kv)
    qi, qo = torch.tensor(q_with, device="cpu"), torch.tensor(q_without, device="cpu")
    fill = torch.tensor(inserted, dtype=torch.long, device="cpu")
    rows = []
    for h in heads:
        kv = h if n_kv == n_heads else h // group
        weights = pattern[h][qi][:, fill]                # [q, F]
        mass = weights.sum(-1)                           # [q]
        lam = 1.0 - mass
        bias = weights @ v[fill, kv]                     # [q, d_head]
        out_w, out_o = z_with[qi, h], z_without[qo, h]
        norm = out_w.norm(dim=-1)
        err = (out_w - (lam[:, None] * out_o + bias)).norm(dim=-1) / norm
        change = (out_w - out_o).norm(dim=-1) / norm
        rows.append(pd.DataFrame({
            "layer": layer, "head": h, "head_label": head_label(layer, h),
            "position": range(len(q_with)), "prompt_pos": q_with,
            "token": [with_filler.str_tokens[i] for i in q_with],
            "lambda": lam.tolist(), "filler_mass": mass.tolist(), "bias_norm": bias.norm(dim=-1).tolist(),
            "rel_error": err.tolist(), "rel_change": change.tolist(),
        }))
    return pd.concat(rows, ignore_index=True)


def affine_fit_summary(fit: "pd.DataFrame") -> "pd.DataFrame":
    """Per (layer, head) summary of a :func:`filler_affine_fit` table.

    Returns:
        ``layer``, ``head``, ``head_label``, ``mean_lambda``, ``min_lambda``,
        ``mean_filler_mass``, ``mean_bias_norm``, ``mean_rel_error``, ``max_rel_error``,
        ``mean_rel_change``, ``n_positions``.

    Example:
        >>> affine_fit_summary(filler_affine_fit(model, with_f, without)).sort_values("mean_lambda")
    """
    needed = {"layer", "head", "lambda", "filler_mass", "bias_norm", "rel_error", "rel_change"}
    missing = needed - set(getattr(fit, "columns", ()))
    if missing:
        raise LensprobeError(f"not a filler_affine_fit table: columns {sorted(missing)} are missing.")
    g = fit.groupby(["layer", "head"], sort=True)
    out = g.agg(mean_lambda=("lambda", "mean"), min_lambda=("lambda", "min"),
                mean_filler_mass=("filler_mass", "mean"), mean_bias_norm=("bias_norm", "mean"),
                mean_rel_error=("rel_error", "mean"), max_rel_error=("rel_error", "max"),
                mean_rel_change=("rel_change", "mean"), n_positions=("lambda", "size")).reset_index()
    out.insert(2, "head_label", [head_label(int(a), int(b)) for a, b in zip(out["layer"], out["head"], strict=True)])
    return out
