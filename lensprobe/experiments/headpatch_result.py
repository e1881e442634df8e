"""The result of :func:`~lensprobe.experiments.headpatch.patch_heads`: :class:`HeadPatch`.

One row per pair of prompts (clean, corrupted), one column per patched head. Kept per pair: the
clean metric (``clean``), the corrupted metric (``corrupted``, measured once on the corrupted
prompt) and the metric with each head patched (``patched``); from them the change
``patched - clean`` per pair and its mean over pairs, and each head's **share** of the total effect.

**Share convention** (the one of :func:`~lensprobe.experiments.patching.patch`'s ``share``):
``share = (patched - clean) / (corrupted - clean)``, the part of the way from the clean metric to
the corrupted one that patching this head alone goes (``1``: the head carries the whole difference
at the positions both prompts share; ``0``: nothing; it equals ``1 - (patched - corrupted) /
(clean - corrupted)``). Over pairs: the mean change over the mean total effect,
``mean(patched - clean) / mean(corrupted - clean)``. Where ``|corrupted - clean|`` is at most
:data:`GAP_TOLERANCE` of the metric's scale (``max(1, |clean|, |corrupted|)``), or the corrupted
metric is not defined, the share is NaN and flagged (:attr:`HeadPatch.share_undefined`,
:attr:`HeadPatch.mean_share_undefined`), never an infinity.

Example:
    >>> res = lp.patch_heads(model, [p1, p2], [q1, q2], "entropy")
    >>> res.changes.shape, res.mean_changes.shape      # [pair, head], [head]
    >>> res.top(5)[["label", "change", "share"]]
"""

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.heads import head_label
from lensprobe.core.lazy import pandas
from lensprobe.experiments.sweep import SweepResult

__all__ = ["GAP_TOLERANCE", "HeadPatch"]

GAP_TOLERANCE = 1e-5
"""A total effect ``|corrupted - clean|`` at most this share of ``max(1, |clean|, |corrupted|)`` leaves the
share undefined (NaN, flagged): dividing by it would only magnify float noise."""


def _too_small(gap: float, clean: float, corrupted: float) -> bool:
    """``gap`` is not a usable divisor: not finite, or within :data:`GAP_TOLERANCE` of zero at this scale."""
    if not math.isfinite(gap):
        return True
    return abs(gap) <= GAP_TOLERANCE * max(1.0, abs(clean), abs(corrupted))


@dataclass
class HeadPatch(SweepResult):
    """Heads patched one at a time, over one or more pairs of prompts.

    A :class:`~lensprobe.experiments.sweep.SweepResult` with ``method="patch"``: ``baseline`` (also
    ``clean``) holds the clean metric per pair, ``ablated`` (also ``patched``) the metric with
    each head patched, ``[pair, head]``; ``changes`` is ``patched - clean``.

    Attributes:
        corrupted: ``[pair]`` the metric on each corrupted prompt (NaN where the metric is not defined there).
        pair_positions: per pair, ``(clean positions, corrupted positions)`` paired by segment.
        pair_unmatched: per pair, the segments without counterpart: ``(segment, which prompt alone has it)``.
    """

    corrupted: Float[Tensor, " pair"]
    pair_positions: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
    pair_unmatched: tuple[tuple[tuple[str, str], ...], ...]

    @property
    def n_pairs(self) -> int:
        """How many (clean, corrupted) pairs."""
        return int(self.baseline.shape[0])

    @property
    def clean(self) -> Float[Tensor, " pair"]:
        """The clean metric per pair (``baseline``)."""
        return self.baseline

    @property
    def patched(self) -> Float[Tensor, "pair head"]:
        """The metric with each head patched, per pair (``ablated``)."""
        return self.ablated

    @property
    def mean_changes(self) -> Float[Tensor, " head"]:
        """``patched - clean`` averaged over pairs, per head (in the order of ``heads``)."""
        return self.changes.mean(0)

    @property
    def gap(self) -> Float[Tensor, " pair"]:
        """The total effect per pair: ``corrupted - clean``."""
        return self.corrupted - self.baseline

    @property
    def share_undefined(self) -> Bool[Tensor, " pair"]:
        """Pairs whose share is NaN: total effect within :data:`GAP_TOLERANCE` of zero, or not finite."""
        return torch.tensor([_too_small(float(g), float(c), float(k))
                             for g, c, k in zip(self.gap, self.baseline, self.corrupted, strict=True)], dtype=torch.bool)

    @property
    def shares(self) -> Float[Tensor, "pair head"]:
        """Each head's share of each pair's total effect: ``(patched - clean) / (corrupted - clean)`` (NaN where
        ``share_undefined``)."""
        gap = self.gap.clone()
        gap[self.share_undefined] = float("nan")
        return self.changes / gap[:, None]

    @property
    def mean_gap(self) -> float:
        """The total effect averaged over pairs: ``mean(corrupted - clean)``."""
        return float(self.gap.mean())

    @property
    def mean_share_undefined(self) -> bool:
        """Whether the mean total effect is within :data:`GAP_TOLERANCE` of zero (or not finite)."""
        return _too_small(self.mean_gap, float(self.baseline.abs().mean()), float(self.corrupted.abs().mean()))

    @property
    def mean_shares(self) -> Float[Tensor, " head"]:
        """Each head's share of the total effect over pairs: ``mean(patched - clean) / mean(corrupted - clean)``
        (all NaN when ``mean_share_undefined``)."""
        if self.mean_share_undefined:
            return torch.full_like(self.mean_changes, float("nan"))
        return self.mean_changes / self.mean_gap

    @property
    def clean_positions(self) -> tuple[int, ...]:
        """The clean prompt's paired positions (one pair; with several, read ``pair_positions``)."""
        return self._one_pair("clean_positions")[0]

    @property
    def corrupted_positions(self) -> tuple[int, ...]:
        """The corrupted prompt's paired positions (one pair; with several, read ``pair_positions``)."""
        return self._one_pair("corrupted_positions")[1]

    def _one_pair(self, what: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if self.n_pairs != 1:
            raise LensprobeError(f"{what} is one pair's; this result has {self.n_pairs} pairs: read "
                                 f".pair_positions[i], or .prompt(i) for pair i alone.")
        return self.pair_positions[0]

    @property
    def unmatched(self) -> tuple[tuple[str, str], ...]:
        """The segments without counterpart in any pair (never patched), each once, in order."""
        return tuple(dict.fromkeys(item for pair in self.pair_unmatched for item in pair))

    def grid(self, value: str = "change") -> Float[Tensor, "layer head"]:
        """A ``[layer, head]`` tensor for :func:`~lensprobe.viz.ablation.sweep_heatmap` (NaN where not patched):
        ``value="change"`` the mean ``patched - clean``, ``"share"`` ``mean_shares``."""
        if value not in ("change", "share"):
            raise LensprobeError(f"value must be 'change' or 'share', got {value!r}.")
        if value == "change":
            return super().grid()
        out = torch.full((self.n_layers, self.n_heads), float("nan"), device="cpu")
        for (layer, head), v in zip(self.heads, self.mean_shares.tolist(), strict=True):
            out[layer, head] = v
        return out

    @property
    def table(self):
        """Mean ``patched - clean`` over pairs as a DataFrame (index ``layer``, one column per head); its
        ``attrs`` name the metric and the method, which :func:`~lensprobe.viz.ablation.sweep_heatmap` reads."""
        df = super().table
        df.attrs.update({"metric": self.metric, "method": self.method, "pairs": self.n_pairs})
        return df

    def to_dataframe(self):
        """Long form: one row per (pair, head): ``prompt`` (the pair), ``baseline`` (clean), ``ablated`` (patched),
        ``change``, ``corrupted``, ``gap`` (corrupted - clean), ``share`` and ``share_undefined``."""
        df = super().to_dataframe()
        n = len(self.heads)
        df["corrupted"] = self.corrupted.repeat_interleave(n).tolist()
        df["gap"] = self.gap.repeat_interleave(n).tolist()
        df["share"] = self.shares.reshape(-1).tolist()
        df["share_undefined"] = self.share_undefined.repeat_interleave(n).tolist()
        return df

    def pairs_table(self):
        """One row per pair: ``pair``, ``clean``, ``corrupted``, ``gap`` (corrupted - clean), ``share_undefined``,
        ``positions`` (paired), ``unmatched`` (segments without counterpart)."""
        return pandas().DataFrame([{
            "pair": i, "clean": float(self.baseline[i]), "corrupted": float(self.corrupted[i]),
            "gap": float(self.gap[i]), "share_undefined": bool(self.share_undefined[i]),
            "positions": len(self.pair_positions[i][0]),
            "unmatched": "; ".join(f"{s} ({who})" for s, who in self.pair_unmatched[i])} for i in range(self.n_pairs)])

    def prompt(self, index: int) -> "HeadPatch":
        """The result for pair ``index`` only."""
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < self.n_pairs:
            raise LensprobeError(f"pair {index!r} out of range: this result has {self.n_pairs} pairs.")
        one = slice(index, index + 1)
        return replace(self, baseline=self.baseline[one], ablated=self.ablated[one], corrupted=self.corrupted[one],
                       pair_positions=self.pair_positions[one], pair_unmatched=self.pair_unmatched[one])

    def top(self, k: int = 10):
        """The ``k`` heads with the largest mean absolute change: ``layer``, ``head``, ``label``, ``change``
        (mean ``patched - clean``), ``share`` (of the mean total effect; NaN when undefined)."""
        df = super().top(k)
        share = {head_label(*h): float(s) for h, s in zip(self.heads, self.mean_shares.tolist(), strict=True)}
        df["share"] = [share[label] for label in df["label"]]
        return df

    def summary(self) -> str:
        """One line: what was patched, the metrics, where the largest changes are and what each carries."""
        top = self.top(3)
        undefined = self.mean_share_undefined
        where = ", ".join(f"{r.label} {r.change:+.4g}" + ("" if undefined else f" ({r.share:.0%} of it)")
                          for r in top.itertuples())
        alone = "; ".join(f"{seg} ({who}) has no counterpart and is not patched" for seg, who in self.unmatched)
        n_pos = sorted({len(c) for c, _ in self.pair_positions})
        at = f"{n_pos[0]}" if len(n_pos) == 1 else f"{n_pos[0]}-{n_pos[-1]}"
        pairs = "" if self.n_pairs == 1 else f" over {self.n_pairs} pairs (mean shown)"
        mean = (f"{self.metric} clean {float(self.baseline.mean()):.4g}, corrupted {float(self.corrupted.mean()):.4g} "
                f"(total effect corrupted - clean {self.mean_gap:+.4g})")
        flagged = [i for i, bad in enumerate(self.share_undefined.tolist()) if bad]
        notes = []
        if undefined:
            notes.append("share not defined: the total effect is about 0")
        elif flagged:
            notes.append(f"share not defined on pair(s) {', '.join(map(str, flagged))}: total effect about 0")
        return (f"{len(self.heads)} heads patched one at a time at {at} aligned positions{pairs}; {mean}; largest "
                f"changes (patched - clean): {where}" + "".join(f"; {x}" for x in [alone, *notes] if x))

    def describe(self) -> dict[str, Any]:
        """JSON-able summary: the metrics per pair, their means, the share convention and the top heads."""
        return {"metric": self.metric, "pairs": self.n_pairs, "heads_patched": len(self.heads),
                "clean": self.baseline.tolist(), "corrupted": self.corrupted.tolist(), "gap": self.gap.tolist(),
                "mean_gap": self.mean_gap, "share_undefined": self.share_undefined.tolist(),
                "mean_share_undefined": self.mean_share_undefined,
                "share": "(patched - clean) / (corrupted - clean); over pairs mean change / mean total effect",
                "unmatched": [list(u) for u in self.unmatched],
                "positions": [len(c) for c, _ in self.pair_positions],
                "top": self.top(10).to_dict(orient="records")}
