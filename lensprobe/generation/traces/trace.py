"""Generation traces: per-step tokens, entropy and attention onto tracked sets, as a result object.

A :class:`GenerationTrace` is what :func:`lensprobe.generate` and
:func:`lensprobe.trace_generation` return. It holds, for every batch row (a prompt, or one
sample of a prompt) and every generation step:

- the chosen token (id and text), and whether the step was a thinking step;
- the entropy of the next-token distribution (nats) and the probability of the chosen
  token under the model (temperature 1, before any sampling filter);
- for each tracked set, the attention proportion from the newest query onto the set,
  per layer and head.

**Step 0 is the last prompt position**: its query predicts the first generated token, so
``entropy[0]`` is the entropy of the first token's distribution and ``attention[s][0]`` is
where the last prompt position looks. Step ``t`` is the query at prompt length ``+ t - 1``.

Arrays are batched ``[row, step, ...]``; like :func:`lensprobe.attention_patterns`, the
properties drop the row dimension when the trace has one row (``trace.entropy`` is
``[step]`` for one prompt). The ``*_rows`` fields are always batched. Steps after a row
stopped (end of sequence) are ``NaN`` (token id ``-1``).

Traces save to Parquet or JSON (never pickle) and load back unchanged.

Example:
    >>> trace = lp.trace_generation(model, prompt, max_new_tokens=64, track={"system": "system"})
    >>> trace.entropy.shape, trace.attention["system"].shape   # [step], [step, layer, head]
    >>> trace.to_dataframe().head()
    >>> trace.save("trace.parquet"); lp.generation.load_trace("trace.parquet")
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.lazy import pandas
from lensprobe.generation.traces.activations import ran_steps
from lensprobe.generation.traces.files import read_trace, write_trace
from lensprobe.generation.traces.lens import LensTrace

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["GenerationTrace", "load_trace"]

DIMS = ("row", "step", "layer", "head")


@dataclass
class GenerationTrace:
    """Per-step record of a (batched) generation. See the module docstring for the conventions.

    Attributes:
        token_ids_rows: ``[row, step]`` chosen token ids; ``-1`` after the row stopped.
        entropy_rows: ``[row, step]`` next-token entropy in nats; ``NaN`` after the row stopped.
        chosen_prob_rows: ``[row, step]`` model probability of the chosen token.
        thinking_rows: ``[row, step]`` True where the step was a thinking step.
        attention_rows: tracked set name -> ``[row, step, layer, head]`` attention proportion.
        str_tokens_rows: per row, the text of each generated token.
        texts: per row, the decoded generated text (the final end-of-sequence token left out).
        prompt_index: per row, which input prompt it came from.
        sample_index: per row, which sample of its prompt it is (0 .. n_samples-1).
        prompt_lengths: per row, the prompt's length in tokens (without padding).
        finish_reasons: per row, ``"eos"``, ``"length"``, ``"nonfinite"`` (the step's logits
            held a NaN or +inf, or only -inf: the row stopped there, with a warning), or
            ``"error"`` (the row could not run, ``generate(..., on_error="row")``; see :attr:`errors`).
        layers: the layers of the attention arrays (0-based).
        n_heads: query heads per layer.
        meta: the generation settings (JSON-able).
        activations_rows: hook name -> ``[row, step, ...]`` float32 values recorded at each row's newest
            position (``record=``, :mod:`lensprobe.generation.traces.activations`); ``NaN`` where
            :attr:`recorded_rows` is False.
        prompt_activations: hook name -> per row, ``[position, ...]`` values at the prompt positions kept
            (``Record(prompt=...)``).
        prompt_positions: hook name -> per row, the absolute prompt positions of ``prompt_activations``.
        lens: the logit lens per row, step and layer (``lens=``, :mod:`lensprobe.generation.traces.lens`), or
            ``None`` when none was asked for.
    """

    token_ids_rows: Int[Tensor, "row step"]
    entropy_rows: Float[Tensor, "row step"]
    chosen_prob_rows: Float[Tensor, "row step"]
    thinking_rows: Bool[Tensor, "row step"]
    attention_rows: dict[str, Float[Tensor, "row step layer head"]]
    str_tokens_rows: list[list[str]]
    texts: list[str]
    prompt_index: list[int]
    sample_index: list[int]
    prompt_lengths: list[int]
    finish_reasons: list[str]
    layers: list[int] = field(default_factory=list)
    n_heads: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    activations_rows: dict[str, Tensor] = field(default_factory=dict)
    prompt_activations: dict[str, list[Tensor]] = field(default_factory=dict)
    prompt_positions: dict[str, list[list[int]]] = field(default_factory=dict)
    lens: LensTrace | None = None

    # ----- shape helpers -------------------------------------------------------------
    @property
    def n_rows(self) -> int:
        return int(self.token_ids_rows.shape[0])

    @property
    def n_steps(self) -> int:
        return int(self.token_ids_rows.shape[1])

    @property
    def lengths(self) -> list[int]:
        """Generated tokens per row (thinking steps included)."""
        return [int(n) for n in (self.token_ids_rows >= 0).sum(-1)]

    @property
    def tracked(self) -> list[str]:
        return list(self.attention_rows)

    def _squeeze(self, x):
        return x[0] if self.n_rows == 1 else x

    @property
    def token_ids(self) -> Int[Tensor, "... step"]:
        """``[step]`` (one row) or ``[row, step]`` token ids, ``-1`` after a row stopped."""
        return self._squeeze(self.token_ids_rows)

    @property
    def entropy(self) -> Float[Tensor, "... step"]:
        """``[step]`` (one row) or ``[row, step]`` next-token entropy in nats."""
        return self._squeeze(self.entropy_rows)

    @property
    def chosen_prob(self) -> Float[Tensor, "... step"]:
        """``[step]`` (one row) or ``[row, step]`` probability of the chosen token."""
        return self._squeeze(self.chosen_prob_rows)

    @property
    def thinking(self) -> Bool[Tensor, "... step"]:
        """``[step]`` (one row) or ``[row, step]``: which steps were thinking steps."""
        return self._squeeze(self.thinking_rows)

    @property
    def attention(self) -> dict[str, Float[Tensor, "... step layer head"]]:
        """Set name -> ``[step, layer, head]`` (one row) or ``[row, step, layer, head]``."""
        return {k: self._squeeze(v) for k, v in self.attention_rows.items()}

    @property
    def recorded_rows(self) -> Bool[Tensor, "row step"]:
        """``[row, step]``: whether the row ran the step's forward (its recorded values are real, even
        when non-finite); False after the row stopped and for error rows."""
        return ran_steps(self.token_ids_rows, self.finish_reasons)

    @property
    def activations(self) -> dict[str, Tensor]:
        """Hook name -> ``[step, ...]`` (one row) or ``[row, step, ...]`` recorded values (``record=``)."""
        return {k: self._squeeze(v) for k, v in self.activations_rows.items()}

    @property
    def text(self) -> str | list[str]:
        """The generated text (one row) or a list of texts."""
        return self.texts[0] if self.n_rows == 1 else list(self.texts)

    @property
    def errors(self) -> dict[int, str]:
        """Row -> why it could not run (rows with ``finish_reason="error"``); empty when none."""
        return {int(r): m for r, m in self.meta.get("errors", {}).items()}

    @property
    def generated_ids(self) -> list[list[int]]:
        """Per row, the generated token ids (always a list of lists)."""
        return [[int(i) for i in row if i >= 0] for row in self.token_ids_rows]

    def row(self, i: int) -> "GenerationTrace":
        """A one-row trace of row ``i``."""
        if not 0 <= i < self.n_rows:
            raise LensprobeError(f"row {i} out of range: this trace has {self.n_rows} rows (0-{self.n_rows - 1}).")
        n = max(self.lengths[i], 1)
        sl = slice(i, i + 1)
        return GenerationTrace(
            token_ids_rows=self.token_ids_rows[sl, :n], entropy_rows=self.entropy_rows[sl, :n],
            chosen_prob_rows=self.chosen_prob_rows[sl, :n], thinking_rows=self.thinking_rows[sl, :n],
            attention_rows={k: v[sl, :n] for k, v in self.attention_rows.items()},
            str_tokens_rows=[self.str_tokens_rows[i]], texts=[self.texts[i]],
            prompt_index=[self.prompt_index[i]], sample_index=[self.sample_index[i]],
            prompt_lengths=[self.prompt_lengths[i]], finish_reasons=[self.finish_reasons[i]],
            layers=list(self.layers), n_heads=self.n_heads, meta=dict(self.meta),
            activations_rows={k: v[sl, :n] for k, v in self.activations_rows.items()},
            prompt_activations={k: [v[i]] for k, v in self.prompt_activations.items()},
            prompt_positions={k: [v[i]] for k, v in self.prompt_positions.items()},
            lens=self.lens.row(i, n) if self.lens is not None else None,
        )

    # ----- reductions ----------------------------------------------------------------
    def mean(self, over: Sequence[str] | str = ("layer", "head"), *, sets: Sequence[str] | None = None
             ) -> dict[str, Tensor]:
        """Mean attention proportion over some dimensions, per tracked set (NaNs ignored).

        Args:
            over: dimensions to average, any of ``"row"``, ``"step"``, ``"layer"``, ``"head"``.
            sets: tracked set names (default: all).

        Returns:
            Set name -> tensor with the remaining dimensions in the order row, step, layer,
            head (the row dimension dropped for a one-row trace, like :attr:`attention`).

        Example:
            >>> trace.mean()["thinking"]          # [step]: mean over layers and heads
            >>> trace.mean(over=("row", "head"))  # [step, layer]
        """
        over = (over,) if isinstance(over, str) else tuple(over)
        bad = [d for d in over if d not in DIMS]
        if bad:
            raise LensprobeError(f"cannot average over {bad}: choose from {DIMS}.")
        sets = self.tracked if sets is None else list(sets)
        for s in sets:
            if s not in self.attention_rows:
                raise LensprobeError(f"no tracked set {s!r} in this trace; it has {self.tracked}.")
        dims = tuple(DIMS.index(d) for d in over)
        out = {}
        for s in sets:
            x = self.attention_rows[s]
            x = torch.nanmean(x, dim=dims) if dims else x
            if "row" not in over and self.n_rows == 1:
                x = x[0]
            out[s] = x
        return out

    # ----- tables --------------------------------------------------------------------
    def to_dataframe(self) -> "pd.DataFrame":
        """One row per (batch row, generated step).

        Columns: ``row``, ``prompt``, ``sample``, ``step``, ``token_id``, ``token``,
        ``thinking``, ``entropy``, ``chosen_prob``, and ``attention:<set>`` for each tracked
        set (mean over layers and heads; per layer and head in :meth:`attention_dataframe`).
        """
        pd = pandas()
        means = {s: torch.nanmean(v, dim=(2, 3)) if v.numel() else v.sum((2, 3))
                 for s, v in self.attention_rows.items()}
        records = []
        for r in range(self.n_rows):
            for t in range(self.lengths[r]):
                rec = {"row": r, "prompt": self.prompt_index[r], "sample": self.sample_index[r], "step": t,
                       "token_id": int(self.token_ids_rows[r, t]), "token": self.str_tokens_rows[r][t],
                       "thinking": bool(self.thinking_rows[r, t]), "entropy": float(self.entropy_rows[r, t]),
                       "chosen_prob": float(self.chosen_prob_rows[r, t])}
                for s, m in means.items():
                    rec[f"attention:{s}"] = float(m[r, t])
                records.append(rec)
        cols = ["row", "prompt", "sample", "step", "token_id", "token", "thinking", "entropy", "chosen_prob"]
        return pd.DataFrame.from_records(records, columns=cols + [f"attention:{s}" for s in means])

    def attention_dataframe(self) -> "pd.DataFrame":
        """Long table: one row per (batch row, step, set, layer, head) with ``attention``."""
        pd = pandas()
        frames = []
        for s, v in self.attention_rows.items():
            R, T, L, H = v.shape
            r, t, li, h = np.meshgrid(np.arange(R), np.arange(T), np.arange(L), np.arange(H), indexing="ij")
            df = pd.DataFrame({"row": r.ravel(), "step": t.ravel(), "set": s,
                               "layer": np.asarray(self.layers)[li.ravel()], "head": h.ravel(),
                               "attention": v.numpy().ravel()})
            frames.append(df.dropna(subset=["attention"]))
        if not frames:
            return pd.DataFrame(columns=["row", "prompt", "sample", "step", "set", "layer", "head", "attention"])
        out = pd.concat(frames, ignore_index=True)
        out.insert(1, "prompt", np.asarray(self.prompt_index)[out["row"].to_numpy()])
        out.insert(2, "sample", np.asarray(self.sample_index)[out["row"].to_numpy()])
        return out

    # ----- files ---------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the trace to ``.parquet`` (needs pyarrow) or ``.json``, atomically
        (:func:`~lensprobe.core.storage.store.atomic_file`: a failed write leaves an earlier file as it was);
        returns the path (the format: :mod:`lensprobe.generation.traces.files`).

        Example:
            >>> trace.save("out/trace.parquet")
        """
        return write_trace(self, path)

    @classmethod
    def load(cls, path: str | Path) -> "GenerationTrace":
        """Read a trace written by :meth:`save` (``.parquet`` or ``.json``)."""
        return cls(**read_trace(path))


def load_trace(path: str | Path) -> GenerationTrace:
    """Read a :class:`GenerationTrace` from a ``.parquet`` or ``.json`` file written by ``save``.

    Example:
        >>> trace = lp.generation.load_trace("out/trace.parquet")
    """
    return GenerationTrace.load(path)
