"""One generation step: each live row's next token chosen from its logits, recorded, and the rows
that end there ended.

A forward of the live rows (:mod:`lensprobe.generation.run`) gives each its next-token logits;
:class:`Step` then, for every row at once: ends the rows whose logits are not finite (one warning),
takes the entropy, chooses the token (greedy or a draw from the row's own generator,
:func:`~lensprobe.generation.rows.choose`), asks the thinking schedule which rows think (once per group
of rows at the same step), writes the step into :class:`~lensprobe.generation.rows.RowOutputs` at each
row's own step, and ends the rows that chose an end-of-sequence token or reached their cap. It keeps each
row's :data:`~lensprobe.generation.batching.rowstate.RowStatus` and hands each ended row to ``on_row``. It runs no
forward and decides no order: the same step serves static batches and continuous batching.
"""

import warnings
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor

from lensprobe.core.errors import NonFiniteWarning
from lensprobe.core.measures.metrics import nonfinite_rows
from lensprobe.core.models.facts import ModelFacts
from lensprobe.generation.batching.rowstate import Live, RowStatus
from lensprobe.generation.config import GenerationConfig
from lensprobe.generation.lens import LogitLens
from lensprobe.generation.recording import StepRecorder
from lensprobe.generation.rows import FinishedRow, RowOutputs, choose, row_generator, row_text
from lensprobe.generation.thinking.schedule import StepState

__all__ = ["Step"]


class Step:
    """The step of one generation's rows: token choice, recording, ending rows, row status.

    Args:
        model: the model (its tokenizer for padding, end-of-sequence ids and ``on_row``'s text).
        cfg: the generation's settings.
        items: ``(token ids, Prompt or None)`` per prompt.
        rows: ``(prompt index, sample index)`` per row, in trace order.
        out: where each row's steps are written (rows that already failed are ``"finished"``).
        rec: the recorder whose hooks hold the attention blocks and final hidden states.
        think_id: the thinking token's id (``None`` without thinking).
        on_row: called with a :class:`~lensprobe.generation.rows.FinishedRow` as each row ends.
        device: the model's device.
        facts: the model's facts (tokenizer, pad and end ids), read once per run.
        lens: the logit lens of ``lens=`` (:mod:`lensprobe.generation.lens`), or ``None``.
    """

    def __init__(self, model, cfg: GenerationConfig, items, rows: list[tuple[int, int]], out: RowOutputs,
                 rec: StepRecorder, think_id: int | None, on_row: Callable[[FinishedRow], Any] | None,
                 device, facts: ModelFacts, lens: LogitLens | None = None) -> None:
        self.model, self.cfg, self.items, self.rows, self.out, self.rec = model, cfg, items, rows, out, rec
        self.lens = lens
        self.think_id, self.on_row, self.device = think_id, on_row, device
        self.facts = facts
        self.pad_id = facts.pad_id
        self.gens: dict[int, torch.Generator | None] = {}
        eos = set(facts.end_ids) | set(cast(tuple, cfg.eos_token_id) or ()) if cfg.stop_at_eos else set()
        self.eos = torch.tensor(sorted(eos), dtype=torch.long, device=device)
        self.status: list[RowStatus] = ["finished" if r in out.errors else "waiting" for r in range(len(rows))]

    def start_rows(self, rows: list[int]) -> None:
        """Rows ``rows`` begin their prompt forward: each gets its generator."""
        for r in rows:
            self.gens[r] = row_generator(self.cfg, self.rows[r][1], self.device)
            self.status[r] = "prefilling"

    def __call__(self, live: Live, last: Tensor, bar) -> tuple[Tensor, Tensor]:
        """Choose each live row's token from its logits, record it, end rows (EOS, cap, non-finite)."""
        cfg = self.cfg
        ran = live.active  # the rows this forward ran (the lens's rows, non-finite ones included)
        broken = nonfinite_rows(last)  # NaN/+inf or all -inf: no distribution (as lp.metrics.entropy)
        if bool(broken.any()):
            if bool((broken & live.active).any()):
                self._end_nonfinite(live, broken & live.active)
            # ended rows (their KV cache may hold NaN now): any finite logits do, nothing is kept
            last = torch.where(broken[:, None], 0.0, last)
        logp = torch.log_softmax(last, dim=-1)
        probs = logp.exp()
        ent = -torch.where(probs > 0, probs * logp, 0.0).sum(-1)  # as lp.metrics.entropy, one softmax
        seen = self._seen(live, last.shape[-1]) if cfg.repetition_penalty != 1.0 else None
        choice = choose(last, cfg, [self.gens[r] for r in live.rows.tolist()], seen)
        think = torch.zeros_like(live.active)
        if cfg.thinking is not None:
            think = self._think(live, last, ent, choice)
            choice = torch.where(think, torch.full_like(choice, cast(int, self.think_id)), choice)
        choice = torch.where(live.active, choice, torch.full_like(choice, self.pad_id))
        on = live.active.cpu()
        idx = on.nonzero().flatten()
        self.out.write(live.rows[idx], live.steps[idx], choice.cpu()[idx], ent.cpu()[idx],
                       probs.gather(-1, choice[:, None])[:, 0].cpu()[idx], think.cpu()[idx])
        if self.lens is not None:
            self.lens.record(live.rows, live.steps, ran, logp, choice, ran & ~live.active)
        if self.rec.attn is not None:
            self.rec.end_rows(int(live.steps[0]), ~live.active)
        if bar is not None:
            bar.update(int(idx.numel()))
        for r in live.rows[idx].tolist():
            self.status[r] = "decoding"
        ended = torch.zeros_like(live.active)
        if self.eos.numel():
            ended = torch.isin(choice, self.eos) & live.active & ~think
            self._end(live, ended, "eos")
        at_cap = (live.steps >= live.caps - 1).to(self.device) & live.active
        self._end(live, at_cap, "length")
        return choice, think

    def _seen(self, live: Live, vocab: int) -> Tensor:
        """``[row, d_vocab]``: the tokens each live row holds so far (prompt and generated), for the
        repetition penalty."""
        seen = torch.zeros((len(live), vocab), dtype=torch.bool, device="cpu")
        for b, (r, t) in enumerate(zip(live.rows.tolist(), live.steps.tolist(), strict=True)):
            ids = torch.tensor(self.items[self.rows[r][0]][0], dtype=torch.long)
            made = self.out.token_ids[r, :t]
            seen[b, torch.cat([ids, made[made >= 0]]).clamp(max=vocab - 1)] = True
        return seen.to(self.device)

    def _think(self, live: Live, last: Tensor, ent: Tensor, choice: Tensor) -> Tensor:
        """Which live rows take a thinking step: the schedule asked once per group of rows at one step."""
        think = torch.zeros_like(live.active)
        steps = live.steps.to(self.device)
        for t in sorted(set(live.steps.tolist())):
            idx = (steps == t).nonzero().flatten()
            parts = [last, ent, choice, live.n_thinking]
            if idx.numel() < len(live):
                parts = [x[idx] for x in parts]
            state = StepState(step=t, logits=parts[0], entropy=parts[1], tokens=parts[2],
                              thinking_token_id=cast(int, self.think_id), n_thinking=parts[3])
            think[idx] = torch.as_tensor(self.cfg.think_when(state), dtype=torch.bool,
                                         device=self.device).expand(idx.numel())
        think &= live.active
        live.n_thinking = live.n_thinking + think.long()
        return think

    def latent(self, think: Tensor, last: Tensor, hidden: Tensor | None) -> tuple[Tensor, Tensor] | None:
        """The thinking inputs of the next forward, ``(batch rows, vectors)`` for the rows that
        think (published in its step context), or ``None``."""
        if self.cfg.thinking is None or not bool(think.any()):
            return None
        idx = think.nonzero().flatten()
        hidden = cast(Tensor, hidden[idx] if hidden is not None else None)  # None only for Pause (unread)
        vec = self.cfg.thinking.input_vectors(self.model, hidden, last[idx], cast(int, self.think_id))
        return None if vec is None else (idx, vec)

    def _end(self, live: Live, ended: Tensor, reason: str) -> None:
        if not bool(ended.any()):
            return
        for i in ended.nonzero().flatten().tolist():
            r = int(live.rows[i])
            self.out.finish[r] = reason
            self.status[r] = "finished"
            self.report(r)
        live.active = live.active & ~ended

    def _end_nonfinite(self, live: Live, broken: Tensor) -> None:
        """End the live rows whose logits are not finite (``finish_reason="nonfinite"``), with one
        warning; their token is -1 and their entropy NaN from this step on."""
        which = [int(live.rows[i]) for i in broken.nonzero().flatten().tolist()]
        t = int(live.steps[broken.nonzero().flatten()[0].cpu()])
        self._end(live, broken, "nonfinite")
        warnings.warn(
            f"non-finite logits (NaN, +inf, or all -inf) at step {t} in row{'s' if len(which) > 1 else ''} "
            f"{', '.join(map(str, which))}: {'they stop' if len(which) > 1 else 'it stops'} there "
            "(finish_reason 'nonfinite', entropy NaN); check the model's weights and any intervention "
            "that writes activations.",
            NonFiniteWarning, stacklevel=5,
        )

    def fail(self, r: int, message: str) -> None:
        """Row ``r`` ends as an error row, with ``message``."""
        self.out.fail(r, message)
        self.status[r] = "finished"
        self.report(r)

    def report(self, r: int) -> None:
        """Hand row ``r``, ended, to ``on_row``."""
        if self.on_row is None:
            return
        ids, finish = self.out.ids(r), self.out.finish[r]
        pi, j = self.rows[r]
        self.on_row(FinishedRow(r, pi, j, ids, row_text(self.facts.tokenizer, ids, finish), finish,
                                self.out.errors.get(r)))

