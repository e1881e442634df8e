"""Per-row outputs of a generation, the random numbers each row draws from, and finished rows.

A generation has one row per (prompt, sample), in prompt order: the rows of the returned
:class:`~lensprobe.generation.GenerationTrace`. The scheduler may run them in another order and in
several batches (:mod:`lensprobe.generation.batching.scheduler`); what each step records lands here by row
index, so the trace never depends on the schedule. Where a row is in its life (waiting, decoding,
...) is its state, not an output: :mod:`lensprobe.generation.batching.rowstate`.
"""

import hashlib
from dataclasses import dataclass

import torch
from torch import Tensor

from lensprobe.generation.config import GenerationConfig
from lensprobe.generation.sampling import penalised_scores, sampling_probs

__all__ = ["FinishedRow", "RowOutputs", "choose", "row_generator", "row_seed", "row_text"]


@dataclass(frozen=True)
class FinishedRow:
    """One row of a generation, handed to ``on_row`` as soon as the row has finished.

    Attributes:
        row: the row's index in the trace (prompt by prompt, samples within a prompt).
        prompt_index, sample_index: which prompt, and which of its samples.
        token_ids: the generated token ids (the end-of-sequence token included).
        text: the generated text (the final end-of-sequence token left out).
        finish_reason: ``"eos"``, ``"length"``, ``"nonfinite"`` or ``"error"``.
        error: what went wrong, for ``finish_reason="error"``; else ``None``.
    """

    row: int
    prompt_index: int
    sample_index: int
    token_ids: list[int]
    text: str
    finish_reason: str
    error: str | None = None


@dataclass
class RowOutputs:
    """Per-row, per-step outputs on the CPU (token -1, NaN where a row made no step)."""

    token_ids: Tensor
    entropy: Tensor
    chosen_prob: Tensor
    thinking: Tensor
    finish: list[str]
    errors: dict[int, str]
    steps_done: int = 0

    @classmethod
    def start(cls, n_rows: int, max_steps: int) -> "RowOutputs":
        return cls(token_ids=torch.full((n_rows, max_steps), -1, dtype=torch.long, device="cpu"),
                   entropy=torch.full((n_rows, max_steps), float("nan"), device="cpu"),
                   chosen_prob=torch.full((n_rows, max_steps), float("nan"), device="cpu"),
                   thinking=torch.zeros((n_rows, max_steps), dtype=torch.bool, device="cpu"),
                   finish=["length"] * n_rows, errors={})

    def write(self, rows: Tensor, steps: Tensor, choice: Tensor, ent: Tensor, prob: Tensor, think: Tensor) -> None:
        """Store one step of each of ``rows`` (CPU indices) at its own step ``steps``."""
        self.token_ids[rows, steps] = choice.cpu()
        self.entropy[rows, steps] = ent.cpu().float()
        self.chosen_prob[rows, steps] = prob.cpu().float()
        self.thinking[rows, steps] = think.cpu()
        if steps.numel():
            self.steps_done = max(self.steps_done, int(steps.max()) + 1)

    def fail(self, row: int, message: str) -> None:
        """Row ``row`` could not run: ``finish_reason="error"``, no tokens."""
        self.finish[row] = "error"
        self.errors[row] = message
        self.token_ids[row] = -1
        self.entropy[row] = float("nan")
        self.chosen_prob[row] = float("nan")
        self.thinking[row] = False

    def ids(self, row: int) -> list[int]:
        return [int(i) for i in self.token_ids[row] if i >= 0]

    def trimmed(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        n = max(self.steps_done, 1)
        return self.token_ids[:, :n], self.entropy[:, :n], self.chosen_prob[:, :n], self.thinking[:, :n]


def row_text(tokenizer, ids: list[int], finish: str) -> str:
    """The generated text of one row: ``ids`` decoded, a final end-of-sequence token left out
    (``""`` for a model without a tokenizer: its rows are token ids only)."""
    body = ids[:-1] if finish == "eos" else ids
    return tokenizer.decode(body) if body and tokenizer is not None else ""


def row_seed(seed: int, sample: int) -> int:
    """Seed of sample ``sample``: from the seed and the sample index only (not the batch or prompt)."""
    digest = hashlib.sha256(f"{seed}|{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def row_generator(cfg: GenerationConfig, sample: int, device) -> torch.Generator | None:
    """The generator a row draws its samples from (``None``: greedy, or no seed)."""
    if not cfg.do_sample or cfg.seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(row_seed(cfg.seed, sample))
    return g


def choose(logits: Tensor, cfg: GenerationConfig, gens: list[torch.Generator | None] | None,
           seen: Tensor | None = None) -> Tensor:
    """The next token of each row: greedy ``argmax``, or a draw from each row's generator, of the
    scores ``transformers`` would build (:mod:`lensprobe.generation.sampling`; ``seen``: ``[row,
    d_vocab]`` the tokens already in each row, for the repetition penalty)."""
    scores = penalised_scores(logits, seen, cfg.repetition_penalty)
    if not cfg.do_sample:
        return scores.argmax(-1)
    probs = sampling_probs(scores, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, min_p=cfg.min_p)
    if gens is None or any(g is None for g in gens):
        return torch.multinomial(probs, 1)[:, 0]
    return torch.stack([torch.multinomial(probs[r], 1, generator=g)[0] for r, g in enumerate(gens)])
