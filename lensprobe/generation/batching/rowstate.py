"""The state of a generation's rows: each row's status, and the running batch's rows, KV cache and
pending inputs.

A row (one prompt x sample, :mod:`lensprobe.generation.rows`) goes through one life, as a request does
in ``transformers``' continuous batching (its ``RequestStatus``): :data:`RowStatus` ``"waiting"`` (in the
scheduler's queue, :mod:`lensprobe.generation.batching.scheduler`), ``"prefilling"`` (its prompt forward
running), ``"decoding"`` (a token chosen for it at every step, :mod:`lensprobe.generation.step`) and
``"finished"`` (its ``finish_reason`` says why). While it runs, its place in the batch is one entry of
:class:`Live` (its step, cap, prompt length, attention mask), and under continuous batching one row of
:class:`Running`'s KV cache (:mod:`lensprobe.generation.batching.cacherows`).
"""

from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
from torch import Tensor

from lensprobe.core.hooks.attach import StepContext
from lensprobe.generation.batching import cacherows

__all__ = ["Live", "RowStatus", "Running"]

RowStatus = Literal["waiting", "prefilling", "decoding", "finished"]
"""Where a row is: queued, its prompt forward running, generating step by step, or ended."""


@dataclass
class Live:
    """The rows of the running batch (one entry per batch row, on the model's device unless noted)."""

    rows: Tensor  # [S] row index in the trace (CPU)
    steps: Tensor  # [S] each row's current step (CPU)
    caps: Tensor  # [S] each row's length cap (CPU)
    active: Tensor  # [S] bool: still generating
    n_thinking: Tensor  # [S] thinking steps so far
    lengths: Tensor  # [S] prompt lengths
    mask: Tensor  # [S, W] attention mask over the cache's columns

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def take(self, keep: Tensor) -> "Live":
        k = keep.to(self.active.device)
        kc = keep.cpu()
        return Live(self.rows[kc], self.steps[kc], self.caps[kc], self.active[k], self.n_thinking[k],
                     self.lengths[k], self.mask[k])

    def joined(self, other: "Live") -> "Live":
        w = max(self.mask.shape[1], other.mask.shape[1])

        def pad(m: Tensor) -> Tensor:
            return torch.nn.functional.pad(m, (w - m.shape[1], 0))

        return Live(torch.cat([self.rows, other.rows]), torch.cat([self.steps, other.steps]),
                     torch.cat([self.caps, other.caps]), torch.cat([self.active, other.active]),
                     torch.cat([self.n_thinking, other.n_thinking]), torch.cat([self.lengths, other.lengths]),
                     torch.cat([pad(self.mask), pad(other.mask)]))

    def info(self, positions: Tensor, prefill: bool = False, inputs: tuple[Tensor, Tensor] | None = None
             ) -> StepContext:
        return StepContext(int(self.steps.max()), positions, self.lengths, steps=self.steps.to(positions.device),
                           rows=self.rows.to(positions.device), prefill=prefill, inputs=inputs)


@dataclass
class Running:
    """The running batch of continuous batching: its rows, KV cache, and each row's pending
    input (the token chosen at its last step, whether it thinks, the logits and final hidden
    state it was chosen from), one entry per batch row."""

    live: Live
    cache: Any
    choice: Tensor
    think: Tensor
    last: Tensor
    hidden: Tensor | None

    def joined(self, new: "Running") -> "Running":
        """These rows followed by ``new``'s; the cache is joined last, so a failure changes nothing."""
        # rows of one run: both hold hidden states or neither does
        hidden = None if self.hidden is None else torch.cat([self.hidden, cast(Tensor, new.hidden)])
        live = self.live.joined(new.live)
        choice, think, last = (torch.cat([self.choice, new.choice]), torch.cat([self.think, new.think]),
                               torch.cat([self.last, new.last]))
        return Running(live, cacherows.join(self.cache, new.cache), choice, think, last, hidden)

    def kept(self, keep: Tensor) -> "Running":
        """Only the rows ``keep`` (batch indices); cache columns that are padding in every kept row dropped."""
        cacherows.keep_rows(self.cache, keep)
        live = self.live.take(keep)
        lead = int((live.mask.sum(0) > 0).long().argmax())  # columns that are padding in every row
        if lead:
            cacherows.drop_columns(self.cache, lead)
            live.mask = live.mask[:, lead:]
        hidden = self.hidden[keep] if self.hidden is not None else None
        return Running(live, self.cache, self.choice[keep], self.think[keep], self.last[keep], hidden)
