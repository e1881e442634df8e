"""Head-ablation sweeps: the effect of ablating each head, one at a time, as a [layer, head] table.

Batched: one forward pass runs a batch of copies of the prompt, and batch row ``b``
ablates its own head (:class:`~lensprobe.interventions.ablation.RowHeadAblation`), so ``batch_size``
single-head ablations cost one forward. The first batch of every prompt also holds the
unablated row, the baseline. Heads run in layer order, and the layers below a batch's
lowest ablated head (identical in every row) run once, at batch size 1, before the
residual stream is copied into the rows.

**Sharding.** The work splits into units, one per (prompt, batch of heads): the batches are
fixed by ``batch_size`` alone, so every unit runs the same forward whatever the number of
processes. With ``out=folder`` the units are spread over the processes of a launcher
(``torchrun``, ``accelerate launch``, ``srun``; see :mod:`lensprobe.core.storage.shards`), each unit's
values are saved as soon as they are computed, and a rerun skips the units on disk.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import batch_dependent
from lensprobe.core.hooks.forward import as_prompts
from lensprobe.core.hooks.heads import head_label, resolve_heads, resolve_positions
from lensprobe.core.lazy import pandas
from lensprobe.core.measures.forced import LogitDiff, resolve_measures
from lensprobe.core.measures.measure import (
    AnswerLogProb,
    AttentionTo,
    CallableMeasure,
    Measure,
    NextTokenEntropy,
    run_measure,
)
from lensprobe.core.storage.jsonable import prompt_ids_digest
from lensprobe.core.storage.runidentity import run_identity
from lensprobe.core.storage.shards import check_shard, run_sharded
from lensprobe.core.storage.store import atomic_file
from lensprobe.interventions.ablation import RowHeadAblation
from lensprobe.interventions.replacement import Method, ablation_source, check_method

__all__ = ["PREFIX_SAFE", "SweepResult", "ablation_sweep", "sweep_prompt"]

PREFIX_SAFE = (NextTokenEntropy, AnswerLogProb, AttentionTo, CallableMeasure, LogitDiff)
"""Measures that cope with batch-1 activations below the shared prefix's end."""


@dataclass(frozen=True)
class _ExpandBatch:
    """Hook: copy a batch-1 residual stream into ``rows`` batch rows."""
    rows: int

    def __call__(self, resid: Tensor, hook) -> Tensor:
        return resid.expand(self.rows, *resid.shape[1:]).clone()


@dataclass
class SweepResult:
    """Metric change from ablating each head, per prompt.

    Attributes:
        heads: the swept ``(layer, head)`` pairs, in column order of ``ablated``.
        baseline: ``[prompt]`` metric without ablation.
        ablated: ``[prompt, n_swept]`` metric with one head ablated.
        metric, method: what was measured and how heads were ablated.
        n_layers, n_heads: the model's shape (for the full [layer, head] grid).
    """

    heads: list[tuple[int, int]]
    baseline: Float[Tensor, " prompt"]
    ablated: Float[Tensor, "prompt swept"]
    metric: str
    method: str
    n_layers: int
    n_heads: int

    @property
    def changes(self) -> Float[Tensor, "prompt swept"]:
        """``ablated - baseline`` per prompt and swept head."""
        return self.ablated - self.baseline[:, None]

    def grid(self) -> Float[Tensor, "layer head"]:
        """Mean change over prompts as a ``[layer, head]`` tensor (NaN where not swept: :meth:`measured` tells a
        head not swept from one whose ablation made the metric NaN)."""
        out = torch.full((self.n_layers, self.n_heads), float("nan"), device="cpu")
        mean = self.changes.mean(0)
        for (layer, head), value in zip(self.heads, mean.tolist(), strict=True):
            out[layer, head] = value
        return out

    def measured(self) -> Bool[Tensor, "layer head"]:
        """Which cells of :meth:`grid` were swept: a NaN where this is ``True`` is the metric's own value, never
        a marker for a head left out."""
        out = torch.zeros((self.n_layers, self.n_heads), dtype=torch.bool)
        for layer, head in self.heads:
            out[layer, head] = True
        return out

    @property
    def table(self):
        """Mean change over prompts as a DataFrame: index ``layer``, one column per head (``attrs``: metric, method)."""
        df = pandas().DataFrame(self.grid().numpy(), columns=list(range(self.n_heads)))
        df.index.name = "layer"
        df.columns.name = "head"
        df.attrs.update({"metric": self.metric, "method": self.method})  # what lp.viz.sweep_heatmap labels
        return df

    def to_dataframe(self):
        """Long form: one row per (prompt, head) with baseline, ablated value and change."""
        rows = []
        for p in range(self.ablated.shape[0]):
            for i, (layer, head) in enumerate(self.heads):
                rows.append({
                    "prompt": p, "layer": layer, "head": head, "label": head_label(layer, head),
                    "baseline": float(self.baseline[p]), "ablated": float(self.ablated[p, i]),
                    "change": float(self.ablated[p, i] - self.baseline[p]),
                })
        return pandas().DataFrame(rows, columns=["prompt", "layer", "head", "label", "baseline", "ablated", "change"])

    def prompt(self, index: int) -> "SweepResult":
        """The result for one prompt only."""
        if not 0 <= index < self.ablated.shape[0]:
            raise LensprobeError(f"prompt {index} out of range: this sweep has {self.ablated.shape[0]} prompts.")
        return SweepResult(self.heads, self.baseline[index: index + 1], self.ablated[index: index + 1],
                           self.metric, self.method, self.n_layers, self.n_heads)

    def top(self, k: int = 10):
        """The ``k`` heads with the largest mean absolute change."""
        df = self.to_dataframe().groupby(["layer", "head", "label"], as_index=False)["change"].mean()
        return df.reindex(df["change"].abs().sort_values(ascending=False).index).head(k).reset_index(drop=True)

    def to_csv(self, path: str | Path) -> Path:
        """Write the [layer, head] table of mean changes as CSV (and the long form beside it,
        ``<stem>_long.csv``), each file atomically (:func:`~lensprobe.core.storage.store.atomic_file`)."""
        path = Path(path)
        with atomic_file(path) as tmp:
            self.table.to_csv(tmp)
        with atomic_file(path.with_name(path.stem + "_long.csv")) as tmp:
            self.to_dataframe().to_csv(tmp, index=False)
        return path


def _row_independent(interventions) -> tuple:
    """The sweep's extra interventions; refuses those whose result depends on the other batch rows."""
    interventions = tuple(interventions or ())
    for item in batch_dependent(interventions):
        raise LensprobeError(
            f"{type(item).__name__} computes over the whole batch (batch_dependent), but in a sweep every batch row "
            "holds another ablation and its statistics would mix them: use a per-row intervention (for ARM, "
            "per_row=True, the default)."
        )
    return interventions


def chunk_cost(chunk: Sequence[tuple[int, int] | None], n_layers: int, share: bool = True) -> float:
    """Forward-equivalents of one batch of single-head ablations (``None``: the unablated row):
    with ``share``, the layers below its lowest ablated layer ``s`` run once at batch size 1,
    the rest once per row: ``s / L + rows (L - s) / L``; without, ``rows``."""
    start = min((p[0] for p in chunk if p is not None), default=0) if share else 0
    return start / n_layers + len(chunk) * (n_layers - start) / n_layers


def layer_chunks(rows: Sequence[tuple[int, int] | None], n_layers: int, batch_size: int
                 ) -> list[list[tuple[int, int] | None]]:
    """``rows`` (heads, ``None`` first for the unablated row) in layer order, cut into batches of at
    most ``batch_size`` so that their total :func:`chunk_cost` is the least: heads of nearby layers
    share a batch, and a batch starts a new one where its prefix would cost more than it saves
    (an exact dynamic programme over the cut points of the sorted rows)."""
    ordered = sorted(rows, key=lambda r: (-1, -1) if r is None else r)
    n = len(ordered)
    best = [0.0] + [float("inf")] * n  # best[i]: least cost of the first i rows
    cut = [0] * (n + 1)
    for end in range(1, n + 1):
        for begin in range(max(0, end - batch_size), end):
            cost = best[begin] + chunk_cost(ordered[begin:end], n_layers)
            if cost < best[end] - 1e-12:
                best[end], cut[end] = cost, begin
    chunks, end = [], n
    while end > 0:
        chunks.append(ordered[cut[end]:end])
        end = cut[end]
    return chunks[::-1]


def sweep_prompt(model, prompt, measure: Measure, chunks: list[list[tuple[int, int] | None]], method: Method,
                 positions, source, share: bool, bar: Any = None, interventions: Sequence = ()
                 ) -> tuple[Tensor, bool]:
    """The measure with each chunk's heads ablated (batch row ``b`` ablating ``chunk[b]``; ``None``
    is the unablated row), concatenated over chunks; and whether sharing the prefix still works.
    ``interventions`` are attached to every row; ``bar`` (a progress bar, or ``None``) moves
    one step per chunk.

    With ``share``, the layers below a chunk's lowest ablated head run once at batch size 1
    and the residual stream is copied into the rows there; a model that cannot change the
    batch size mid-forward turns sharing off for the rest of the sweep.
    """
    tokens = measure.inputs(model, prompt)
    values = []
    for chunk in chunks:
        abl = RowHeadAblation(tuple(chunk), method, positions, source)
        start = min((pair[0] for pair in chunk if pair is not None), default=0) if share else 0
        if start > 0:
            try:
                expand = (f"blocks.{start}.hook_resid_pre", _ExpandBatch(len(chunk)))
                values.append(run_measure(model, measure, prompt, tokens, expand, abl, *interventions)[0])
                if bar is not None:
                    bar.update(1)
                continue
            except LensprobeError:
                raise
            except Exception:  # a model that cannot change batch size mid-forward
                share = False
        values.append(run_measure(model, measure, prompt, tokens.expand(len(chunk), -1), abl, *interventions)[0])
        if bar is not None:
            bar.update(1)
    return torch.cat(values), share


def ablation_sweep(model, prompts, metric: Any = "entropy", *, heads: Any = "all", method: Method = "zero",
                   reference: Any = None, per_position: bool = False, positions: Any = None,
                   answers: str | Sequence[str] | None = None, tokens: Sequence[int | str] | None = None,
                   continuation: Any = None, batch_size: int = 32,
                   progress: bool = True, share_prefix: bool = True, interventions: Sequence = (),
                   out: str | Path | None = None, rank: int | None = None,
                   world_size: int | None = None) -> SweepResult:
    """Ablate each head on its own and measure how a metric changes, for every head asked.

    Args:
        model: a TransformerLens model.
        prompts: a :class:`~lensprobe.core.prompts.prompt.Prompt`, a question string (built with the chat
            template), token ids, or a list of them.
        metric: a name of the one metric vocabulary (:func:`~lensprobe.core.measures.forced.resolve_measures`):
            ``"entropy"`` (next-token entropy at the last prompt position), ``"logprob"``
            (log-probability of ``answers``), ``"logit_diff"`` (``tokens=(a, b)``),
            ``"attention:<segment>"`` (attention proportion onto a segment, mean over layers and
            heads), a :class:`~lensprobe.core.measures.measure.Measure`, or a callable
            ``fn(logits, prompt) -> [batch]``.
        heads: heads to sweep, ``"all"`` or any spec :func:`~lensprobe.interventions.ablation.ablate_heads`
            takes.
        method: ``"zero"``, ``"mean"`` or ``"resample"`` (these two need ``reference``).
        reference, per_position: as in :func:`~lensprobe.interventions.ablation.ablate_heads`.
        positions: restrict the ablation to positions or a segment name (per prompt).
        answers: the answer text for ``"logprob"``, one string or one per prompt.
        tokens, continuation: the two tokens of ``"logit_diff"``; token ids fed after each prompt
            (``"entropy"``/``"logprob"`` over a teacher-forced continuation), as attribution takes them.
        batch_size: batch rows per forward pass, i.e. heads ablated per forward.
        progress: show a progress bar.
        share_prefix: run the layers below a batch's lowest ablated head once (batch 1)
            and copy the residual stream into the batch rows there, since those layers are
            the same in every row (built-in metrics only; the numbers are unchanged).
        interventions: attached to every run, the baseline included (e.g. ``[lp.ARM(...,
            per_row=True)]``: the sweep under ARM). Each batch row holds another ablation, so
            an intervention whose statistics span the batch (``batch_dependent``, e.g. ARM with
            ``per_row=False``) is refused.
        out: a folder where each unit's values (one prompt, one batch of heads) are saved as
            soon as they are computed: a rerun skips them, and a sharded run's processes meet
            there (it must be on a filesystem they all share). A folder of a sweep with other
            settings is refused. ``None`` (default): nothing is saved.
        rank, world_size: this process's shard; default from the environment
            (:func:`~lensprobe.core.storage.shards.shard_info`: ``RANK``/``WORLD_SIZE`` under
            ``torchrun`` or ``accelerate launch``). Rank ``r`` computes every
            ``world_size``-th unit from unit ``r``; with ``world_size > 1``, ``out`` is required.

    Returns:
        A :class:`SweepResult`; ``.table`` is the [layer, head] DataFrame of mean changes
        (``ablated - baseline``), ``.to_csv(path)`` writes it. In a sharded run, rank 0
        waits for the other processes and returns the whole sweep, equal to a
        single-process run; the other ranks return their part, ``NaN`` outside their units.

    Raises:
        LensprobeError: bad heads, metric, method or batch size; a sharded run without
            ``out``; a folder of another sweep; other ranks that stop finishing units.

    Example:
        >>> res = lp.ablation_sweep(model, prompt, "entropy")
        >>> res.table.loc[0, 3]   # entropy change from ablating L0H3
    """
    check_method(method, reference)
    rank, world_size = check_shard(rank, world_size, out)
    interventions = _row_independent(interventions)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise LensprobeError(f"batch_size must be a positive integer, got {batch_size!r}.")
    pairs = resolve_heads(model, heads)
    if not pairs:
        raise LensprobeError("no heads to sweep: pass heads='all' or a list of heads.")
    items = as_prompts(model, prompts, build_strings=True)
    measures = resolve_measures(model, metric, len(items), answers=answers, tokens=tokens, continuation=continuation)
    source = ablation_source(model, method, reference, [layer for layer, _ in pairs], per_position)
    # Heads in layer order, so a batch's rows share the unablated layers below their heads.
    order = sorted(range(len(pairs)), key=lambda i: pairs[i])
    rows: list[tuple[int, int] | None] = [None, *(pairs[i] for i in order)]
    chunks = [rows[i: i + batch_size] for i in range(0, len(rows), batch_size)]
    units = {f"prompt {p} batch {c}": (p, c) for p in range(len(items)) for c in range(len(chunks))}
    state = {"share": share_prefix and type(measures[0]) in PREFIX_SAFE}

    def compute(unit: str) -> list[float]:
        p_idx, c_idx = units[unit]
        prompt = items[p_idx]
        pos = resolve_positions(positions, prompt if hasattr(prompt, "positions") else None)
        flat, state["share"] = sweep_prompt(model, prompt, measures[p_idx], [chunks[c_idx]], method, pos, source,
                                            state["share"], None, interventions)
        return flat.tolist()

    # batch_size stays in the identity: units are numbered by batch (prompt p, batch c of batch_size rows).
    settings = {} if out is None else run_identity(
        model, prompts=items, metric=metric, answers=answers, tokens=tokens, continuation=continuation, heads=pairs, method=method, reference=source,
        positions=positions, batch_size=batch_size, share_prefix=share_prefix, interventions=list(interventions))
    ids = {} if out is None else {unit: prompt_ids_digest(items[p]) for unit, (p, _) in units.items()}
    values = run_sharded(list(units), compute, out=out, kind="ablation sweep", settings=settings, rank=rank,
                         world_size=world_size, progress="ablation sweep" if progress else False, ids=ids)
    baseline = torch.full((len(items),), float("nan"), device="cpu")
    ablated = torch.full((len(items), len(pairs)), float("nan"), device="cpu")
    for unit, flat in values.items():
        p_idx, c_idx = units[unit]
        for k, value in enumerate(flat):
            row = c_idx * batch_size + k  # row 0 of the first batch is the unablated baseline
            if row == 0:
                baseline[p_idx] = value
            else:
                ablated[p_idx, order[row - 1]] = value
    return SweepResult(pairs, baseline, ablated, getattr(measures[0], "name", str(metric)), method,
                       int(model.cfg.n_layers), int(model.cfg.n_heads))
