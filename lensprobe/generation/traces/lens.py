"""The logit lens of a generation, per row, step and layer: ``trace.lens`` of :func:`lensprobe.generate`.

``lp.generate(..., lens="logit")`` (or a translator, :mod:`lensprobe.generation.lens`) reads every chosen
layer's residual stream at each row's newest position, applies the model's own final norm and unembedding,
and keeps, per row, step and layer, only what the distribution comes to: its entropy, its top-k tokens and
their probabilities, the rank and probability of the token the trace records at that step, and the KL
divergence from the model's own next-token distribution to the layer's. No ``[step, layer, vocab]`` tensor
is kept.

**Step 0 is the last prompt position** (its query predicts the first generated token), as in every
``*_rows`` array of a trace. Steps a row did not run are ``NaN`` (values) and ``-1`` (ids and ranks), and
``False`` in :attr:`LensTrace.recorded_rows`, so a real non-finite value is told from a step never run.

Example:
    >>> out = lp.generate(model, prompt, max_new_tokens=16, lens="logit")
    >>> out.lens.entropy.shape              # [step, layer]
    >>> out.lens.chosen_rank[:, -1]         # the last layer ranks the chosen token first (greedy): 0
    >>> out.lens.to_dataframe().head()
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from lensprobe.core.lazy import pandas

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["LensTrace", "arrow_columns", "header", "json_fields", "read_arrow", "read_json"]

_FLOATS = ("entropy_rows", "chosen_prob_rows", "kl_rows")
_INTS = ("chosen_rank_rows",)


@dataclass
class LensTrace:
    """The logit lens of every row, step and layer of a generation (see the module docstring).

    Attributes:
        layers: the layers read (0-based), in order: the ``layer`` axis of every array.
        entropy_rows: ``[row, step, layer]`` entropy of the layer's next-token distribution (nats).
        top_ids_rows: ``[row, step, layer, k]`` the layer's ``k`` most probable tokens, most probable first.
        top_probs_rows: ``[row, step, layer, k]`` their probabilities under the layer's distribution.
        chosen_rank_rows: ``[row, step, layer]`` the rank of the token the trace records at the step under the
            layer's distribution (0: its top token; the tokens of strictly higher logit are counted).
        chosen_prob_rows: ``[row, step, layer]`` that token's probability under the layer's distribution.
        kl_rows: ``[row, step, layer]`` KL(model's next-token distribution || the layer's), in nats.
        lens: what was applied: ``"logit"``, or the translator's description.
        token_text: token id -> its text, for every id in :attr:`top_ids_rows`.
    """

    layers: list[int]
    entropy_rows: Float[Tensor, "row step layer"]
    top_ids_rows: Int[Tensor, "row step layer k"]
    top_probs_rows: Float[Tensor, "row step layer k"]
    chosen_rank_rows: Int[Tensor, "row step layer"]
    chosen_prob_rows: Float[Tensor, "row step layer"]
    kl_rows: Float[Tensor, "row step layer"]
    lens: Any = "logit"
    token_text: dict[int, str] = field(default_factory=dict)

    @property
    def k(self) -> int:
        """Tokens kept per row, step and layer."""
        return int(self.top_ids_rows.shape[-1])

    @property
    def recorded_rows(self) -> Tensor:
        """``[row, step]``: whether the row ran the step (its values are real, even when non-finite)."""
        return self.top_ids_rows[:, :, 0, 0] >= 0  # a step run has top tokens at every layer read

    def _squeeze(self, x: Tensor) -> Tensor:
        return x[0] if x.shape[0] == 1 else x

    @property
    def entropy(self) -> Tensor:
        """``[step, layer]`` (one row) or ``[row, step, layer]`` entropy in nats."""
        return self._squeeze(self.entropy_rows)

    @property
    def top_ids(self) -> Tensor:
        """``[step, layer, k]`` (one row) or ``[row, step, layer, k]`` top token ids."""
        return self._squeeze(self.top_ids_rows)

    @property
    def top_probs(self) -> Tensor:
        """``[step, layer, k]`` (one row) or ``[row, step, layer, k]`` top token probabilities."""
        return self._squeeze(self.top_probs_rows)

    @property
    def chosen_rank(self) -> Tensor:
        """``[step, layer]`` (one row) or ``[row, step, layer]`` rank of the chosen token (-1: not run)."""
        return self._squeeze(self.chosen_rank_rows)

    @property
    def chosen_prob(self) -> Tensor:
        """``[step, layer]`` (one row) or ``[row, step, layer]`` probability of the chosen token."""
        return self._squeeze(self.chosen_prob_rows)

    @property
    def kl(self) -> Tensor:
        """``[step, layer]`` (one row) or ``[row, step, layer]`` KL(model || layer) in nats."""
        return self._squeeze(self.kl_rows)

    def row(self, i: int, n_steps: int) -> "LensTrace":
        """Row ``i``'s first ``n_steps`` steps, as a one-row lens."""
        sl = slice(i, i + 1)
        return LensTrace(list(self.layers), **{f: getattr(self, f)[sl, :n_steps] for f in _FIELDS},
                         lens=self.lens, token_text=dict(self.token_text))

    def to_dataframe(self) -> "pd.DataFrame":
        """Tidy table: one row per (trace row, step run, layer).

        Columns: ``row``, ``step``, ``layer``, ``entropy``, ``kl``, ``top_token_id``, ``top_token`` (its
        text), ``top_prob``, ``chosen_rank``, ``chosen_prob``.

        Example:
            >>> out.lens.to_dataframe().query("layer == 29").head()
        """
        pd = pandas()
        cols = ["row", "step", "layer", "entropy", "kl", "top_token_id", "top_token", "top_prob", "chosen_rank",
                "chosen_prob"]
        R, T, L = self.entropy_rows.shape
        r, t, li = np.meshgrid(np.arange(R), np.arange(T), np.arange(L), indexing="ij")
        keep = self.recorded_rows[:, :, None].expand(R, T, L).numpy().ravel()
        top = self.top_ids_rows[..., 0].numpy().ravel() if self.k else np.full(R * T * L, -1)
        df = pd.DataFrame({
            "row": r.ravel(), "step": t.ravel(), "layer": np.asarray(self.layers, dtype=np.int64)[li.ravel()],
            "entropy": self.entropy_rows.numpy().ravel(), "kl": self.kl_rows.numpy().ravel(),
            "top_token_id": top, "top_token": [self.token_text.get(int(i), "") for i in top],
            "top_prob": self.top_probs_rows[..., 0].numpy().ravel() if self.k else np.full(R * T * L, np.nan),
            "chosen_rank": self.chosen_rank_rows.numpy().ravel(), "chosen_prob": self.chosen_prob_rows.numpy().ravel(),
        }, columns=cols)
        return df[keep].reset_index(drop=True)


_FIELDS = ("entropy_rows", "top_ids_rows", "top_probs_rows", "chosen_rank_rows", "chosen_prob_rows", "kl_rows")


# ----- files (lensprobe.generation.traces.files) ------------------------------------------------------
def header(trace) -> dict[str, Any]:
    """The lens's part of a trace file's header: its layers, k, what was applied, the top tokens' text."""
    lens = trace.lens
    if lens is None:
        return {}
    return {"lens": {"layers": list(map(int, lens.layers)), "k": lens.k, "lens": lens.lens,
                     "token_text": {str(i): s for i, s in sorted(lens.token_text.items())}}}


def json_fields(trace) -> dict[str, Any]:
    """The lens's values as JSON lists (``NaN`` as ``None``)."""
    lens = trace.lens
    if lens is None:
        return {}
    return {"lens_values": {f: _nan_to_none(getattr(lens, f).tolist()) for f in _FIELDS}}


def arrow_columns(trace, pa) -> dict[str, Any]:
    """Parquet columns ``lens:<field>``: one fixed-size list per (row, step), ``layer`` (x ``k``) long."""
    lens = trace.lens
    if lens is None:
        return {}
    R, T = trace.n_rows, trace.n_steps
    cols = {}
    for f in _FIELDS:
        v = getattr(lens, f)
        width = int(np.prod(v.shape[2:]))
        kind = pa.int64() if f in _INTS or f == "top_ids_rows" else pa.float32()
        flat = pa.array(v.reshape(-1).numpy(), kind)
        cols[f"lens:{f}"] = pa.FixedSizeListArray.from_arrays(flat, width) if width else pa.nulls(R * T)
    return cols


def read_json(body: dict) -> dict[str, Any]:
    """The lens of a JSON trace file (see :func:`json_fields`): ``{"lens": LensTrace}``, or ``{}``."""
    head = body.get("lens")
    if head is None:
        return {}
    values = body["lens_values"]
    return {"lens": _lens(head, body["n_rows"], body["n_steps"],
                          {f: _tensor(values[f], f) for f in _FIELDS})}


def read_arrow(table, head: dict) -> dict[str, Any]:
    """The lens of a Parquet trace file (see :func:`arrow_columns`): ``{"lens": LensTrace}``, or ``{}``."""
    lens = head.get("lens")
    if lens is None:
        return {}
    R, T, L, k = head["n_rows"], head["n_steps"], len(lens["layers"]), lens["k"]
    values = {}
    for f in _FIELDS:
        col = table[f"lens:{f}"].combine_chunks()
        width = L * (k if "top" in f else 1)
        flat = col.flatten().to_numpy(zero_copy_only=False) if width else np.zeros(0)
        values[f] = torch.tensor(flat, dtype=_dtype(f)).reshape(R * T * width)
    return {"lens": _lens(lens, R, T, values)}


def _lens(head: dict, R: int, T: int, values: dict[str, Tensor]) -> LensTrace:
    L, k = len(head["layers"]), head["k"]
    shaped = {f: v.reshape(R, T, L, k) if "top" in f else v.reshape(R, T, L) for f, v in values.items()}
    return LensTrace(list(head["layers"]), **shaped, lens=head["lens"],
                     token_text={int(i): s for i, s in head["token_text"].items()})


def _dtype(name: str) -> torch.dtype:
    return torch.long if name in _INTS or name == "top_ids_rows" else torch.float32


def _nan_to_none(x):
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return None if isinstance(x, float) and x != x else x


def _tensor(nested, name: str) -> Tensor:
    def fix(x):
        if isinstance(x, list):
            return [fix(v) for v in x]
        return float("nan") if x is None else x
    return torch.tensor(fix(nested), dtype=_dtype(name)).reshape(-1)
