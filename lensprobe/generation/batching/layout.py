"""Prompts laid out as one left-padded batch: one row per (prompt, sample).

Each row computes what it would alone: its tokens end at the last prompt column, an
attention mask hides the padding, and position ids count from the row's first token.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from lensprobe.core.prompts.prompt import Prompt

__all__ = ["PaddedBatch", "pad_batch"]


@dataclass
class PaddedBatch:
    """A left-padded batch for a generation of ``T - P`` steps.

    Attributes:
        rows: ``(prompt index, sample index)`` per row.
        ids: ``[row, P]`` prompt token ids, left-padded with ``pad_id``.
        mask: ``[row, T]`` attention mask; the loop sets column ``P + t`` as step ``t`` goes in.
        lengths: ``[row]`` prompt lengths.
        pad_id: the padding token id (also put in for rows that have ended).
    """

    rows: list[tuple[int, int]]
    ids: Tensor
    mask: Tensor
    lengths: Tensor
    pad_id: int

    @property
    def n_rows(self) -> int:
        return len(self.rows)

    @property
    def width(self) -> int:
        """``P``: the longest prompt; step ``t``'s token goes in at padded column ``P + t``."""
        return int(self.ids.shape[1])

    @property
    def device(self) -> torch.device:
        return self.ids.device

    @property
    def prompt_rows(self) -> list[int]:
        return [pi for pi, _ in self.rows]

    def prompt_positions(self) -> Tensor:
        """``[row, P]`` position of each padded column from the row's first token (negative on padding)."""
        pad_offset = self.width - self.lengths
        return torch.arange(self.width, device=self.device)[None, :] - pad_offset[:, None]


def pad_batch(items: list[tuple[list[int], Prompt | None]], rows: list[tuple[int, int]], max_new_tokens: int,
              pad_id: int, device) -> PaddedBatch:
    """``rows`` (``(prompt index, sample index)`` each) left-padded to their longest prompt, on ``device``."""
    lengths = torch.tensor([len(items[pi][0]) for pi, _ in rows], device="cpu")
    width = int(lengths.max())
    ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long, device="cpu")
    mask = torch.zeros((len(rows), width + max_new_tokens), dtype=torch.long, device="cpu")
    for r, (pi, _) in enumerate(rows):
        seq = items[pi][0]
        ids[r, width - len(seq):] = torch.tensor(seq, device="cpu")
        mask[r, width - len(seq):width] = 1
    return PaddedBatch(rows, ids.to(device), mask.to(device), lengths.to(device), int(pad_id))
