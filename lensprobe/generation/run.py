"""One generation run: the forwards of its rows, in static batches or with continuous batching.

:func:`lensprobe.generate` checks its inputs and hands them to :class:`Run`. A run has one
*row* per (prompt, sample), in prompt order (the rows of the returned trace). Its parts, one module
each: the :class:`~lensprobe.generation.batching.scheduler.Scheduler` decides the rows' order, how many are
live at once and the mode; the :class:`~lensprobe.generation.step.Step` chooses each live row's token
from a forward's logits and ends rows; each row's status and the running batch are in
:mod:`lensprobe.generation.batching.rowstate`, its outputs in :mod:`lensprobe.generation.rows`. The run
itself does the forwards, through the engine, in one of two ways:

**Static batches** (``batch_size`` unset, or ``refill=False``, or attention recorded): the
rows of a batch are left-padded to their longest prompt, prefilled together, and stepped
together until the last of them ends; a row that ended earlier keeps its place (fed padding,
its outputs no longer recorded). Traces with tracked sets always run this way, as one batch
of every row (the recorder keeps one block per row and step).

**Continuous batching** (``batch_size`` smaller than the rows, ``refill=True``): a queue of
rows; at most ``batch_size`` are live at once. A row is prefilled **alone** (so its prompt
forward is exactly the one it would have alone: no padding, any intervention's statistics
over its own positions only) and its KV cache joins the running batch as a new row,
left-padded to the batch's width (:mod:`lensprobe.generation.batching.cacherows`). Every decode step
runs the live rows together, each at its own step and its own positions (``hook.step``'s
``positions``, ``steps`` and ``rows``). When a row ends (end of sequence, its own length cap,
non-finite logits) it leaves the cache at once and its place takes the next row of the queue;
cache columns that are padding in every live row are dropped. Each row's results are those of
running it alone: the same greedy tokens, the same sampled tokens (each row draws from its own
generator), the same thinking steps (a schedule is asked once per group of rows at the same step),
interventions applied by position. A cache whose rows cannot be joined (sliding-window or quantized
layers) runs static batches.

Results land by row index, so the scheduler's order changes nothing but speed. ``on_row`` hears of
each row as soon as it has ended.
"""

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import Steps
from lensprobe.core.models.facts import ModelFacts, model_facts
from lensprobe.core.progress import tqdm
from lensprobe.generation.batching import cacherows
from lensprobe.generation.batching.layout import pad_batch
from lensprobe.generation.batching.rowstate import Live, Running
from lensprobe.generation.batching.scheduler import Scheduler
from lensprobe.generation.config import GenerationConfig
from lensprobe.generation.engines import Engine, choose_engine
from lensprobe.generation.lens import LogitLens
from lensprobe.generation.recording import StepRecorder, final_hidden_hook
from lensprobe.generation.rows import FinishedRow, RowOutputs
from lensprobe.generation.step import Step
from lensprobe.generation.thinking.latent import LatentFusion
from lensprobe.generation.traces.activations import ActivationSteps
from lensprobe.generation.traces.tracking import TrackedSet, add_position, set_masks

__all__ = ["Run", "row_fault"]


class Run:
    """One generation, its inputs checked (see :func:`lensprobe.generate`); :meth:`execute` runs it.

    Args:
        items: ``(token ids, Prompt or None)`` per prompt.
        rows: ``(prompt index, sample index)`` per row, in trace order.
        caps: each prompt's length cap (at most ``cfg.max_new_tokens``; its rows stop there).
        failed: rows that cannot run, with the reason (they get ``finish_reason="error"``).
        batch_size: rows live at once (``None``: every row).
        refill: continuous batching when ``batch_size`` is smaller than the rows.
        on_row: called with a :class:`FinishedRow` as each row ends.
        keep_going: a row whose prefill fails with a row fault (:func:`row_fault`) becomes an error
            row instead of stopping the run (under continuous batching, so do the live rows of a
            decode step that fails so).
        facts: the model's facts (tokenizer, pad and end ids, device, heads), read once by the caller
            (``None``: read here).
        acts: the buffers and hooks of ``record=`` (``None``: nothing recorded).
        lens: the logit lens of ``lens=`` (``None``: none).
    """

    def __init__(self, model, cfg: GenerationConfig, items, rows: list[tuple[int, int]], caps: list[int],
                 failed: dict[int, str], interventions: list, sets: list[TrackedSet], layers: list[int],
                 think_id: int | None, batch_size: int | None, refill: bool, longest_first: bool,
                 on_row: Callable[[FinishedRow], Any] | None, keep_going: bool, facts: ModelFacts | None = None,
                 acts: ActivationSteps | None = None, lens: LogitLens | None = None) -> None:
        self.model, self.cfg, self.items, self.rows = model, cfg, items, rows
        self.facts = facts if facts is not None else model_facts(model)
        self.prompt_caps = list(caps)
        self.caps = [self.prompt_caps[pi] for pi, _ in rows]  # per row
        self.interventions, self.sets, self.layers, self.think_id = interventions, sets, layers, think_id
        self.keep_going, self.acts, self.lens = keep_going, acts, lens
        self.device = self.facts.device
        self.out = RowOutputs.start(len(rows), cfg.max_new_tokens)
        for r, message in failed.items():
            self.out.fail(r, message)
        self.scheduler = Scheduler(items, rows, [r for r in range(len(rows)) if r not in failed], batch_size,
                                  refill, longest_first, bool(sets), interventions)
        runnable = self.scheduler.order
        self.static_rows = runnable if sets else None  # recorded attention: one batch of every row
        hidden = final_hidden_hook(model) if isinstance(cfg.thinking, LatentFusion) else None
        n_rec = len(runnable) if sets else 0
        self.masks = (set_masks(items, sets, [rows[r][0] for r in runnable], self._width(runnable),
                                self._width(runnable) + cfg.max_new_tokens, self.device) if sets else None)
        self.rec = StepRecorder(layers, n_rec, len(sets), self.facts.n_heads, cfg.max_new_tokens, self.masks,
                                hidden, self.device)
        self.step = Step(model, cfg, items, rows, self.out, self.rec, think_id, on_row, self.device, self.facts, lens)

    def _width(self, rows: list[int]) -> int:
        return max((len(self.items[self.rows[r][0]][0]) for r in rows), default=0)

    # ----- running -------------------------------------------------------------------------
    def execute(self, engine_name: str, progress: bool | str) -> Engine:
        """Run every row; returns the engine that ran (its ``describe()`` goes in the trace's meta)."""
        hooks = [*self.rec.hooks(self.model), *(self.acts.hooks() if self.acts is not None else []),
                 *(self.lens.hooks(self.model) if self.lens is not None else [])]
        engine = choose_engine(self.model, engine_name, interventions=self.interventions,
                               hook_names=[name for name, _ in hooks], rows=self.scheduler.batch_size)
        bar = _progress_bar(progress, sum(self.caps[r] for r in self.scheduler.order))
        started = time.perf_counter()
        for r in sorted(self.out.errors):  # rows refused before any forward
            self.step.report(r)
        publish = (steps := Steps()).publish  # each forward's StepContext, published before it runs
        try:
            with engine.attach(hooks, self.interventions, steps):
                if self.scheduler.order:
                    if self.scheduler.mode == "refill":
                        self._refill(engine, publish, bar)
                    else:
                        for batch_rows in self.scheduler.batches_of(self.scheduler.order):
                            self._static(engine, publish, bar, batch_rows)
        finally:
            _close_bar(bar, self.out.token_ids, started)
        return engine

    def _static(self, engine: Engine, publish, bar, batch_rows: list[int]) -> None:
        """Rows ``batch_rows`` as one left-padded batch, stepped together until all have ended."""
        cfg = self.cfg
        batch = pad_batch(self.items, [self.rows[r] for r in batch_rows], cfg.max_new_tokens, self.step.pad_id, self.device)
        n = len(batch_rows)
        live = Live(_cpu(batch_rows), _cpu([0] * n), _cpu([self.caps[r] for r in batch_rows]),
                     torch.ones(n, dtype=torch.bool, device=self.device),
                     torch.zeros(n, dtype=torch.long, device=self.device), batch.lengths, batch.mask)
        self.step.start_rows(batch_rows)
        self.scheduler.batches.append(n)
        positions = batch.prompt_positions()
        publish(live.info(positions, prefill=True))
        logits, past = engine.forward(batch.ids, batch.mask[:, :batch.width], positions.clamp(min=0), None)
        for t in range(cfg.max_new_tokens):
            last = logits[:, -1].float()
            choice, think = self.step(live, last, bar)
            if not bool(live.active.any()):
                break
            col = batch.width + t
            batch.mask[:, col] = 1
            if self.sets and self.masks is not None:  # masks exist exactly when sets do
                add_position(self.masks, self.sets, col, choice, think, batch.lengths, t, live.active)
            inputs = self.step.latent(think, last, self.rec.hidden)
            self.rec.step = t + 1
            live.steps += 1
            pos = (batch.lengths + t)[:, None]
            publish(live.info(pos, inputs=inputs))
            logits, past = engine.forward(choice[:, None], batch.mask[:, : col + 1], pos, past)

    def _refill(self, engine: Engine, publish, bar) -> None:
        """Continuous batching (see the module docstring)."""
        running: Running | None = None
        while True:
            running = self._admit(engine, publish, bar, running)
            if running is None:
                break
            running = self._decode(engine, publish, bar, running)
        if self.scheduler.waiting:  # a cache that cannot take rows in and out: the rest as static batches
            self.scheduler.mode = "static"
            for batch_rows in self.scheduler.batches_of(list(self.scheduler.waiting)):
                self._static(engine, publish, bar, batch_rows)

    def _admit(self, engine: Engine, publish, bar, running: "Running | None") -> "Running | None":
        """Fill free slots from the scheduler's queue: each row prefilled alone, its first token chosen, its
        cache joined, so the next decode forward runs full. A row whose cache cannot join stops
        the admitting (it goes back to the queue; the live rows run to their end first)."""
        joined = 0
        while (r := self.scheduler.next_row(running)) is not None:
            solo = self._prefill(engine, publish, r)
            if solo is None:
                continue
            row_live, logits, cache, hidden = solo
            if not cacherows.can_join(cache):
                self.scheduler.put_back(r, f"a {type(cache).__name__} cannot take rows in and out")
                self.step.gens.pop(r, None)
                self.step.status[r] = "waiting"
                break
            last = logits[:, -1].float()
            choice, think = self.step(row_live, last, bar)
            if not bool(row_live.active.any()):
                continue  # ended at its first token
            new = Running(row_live, cache, choice, think, last, hidden)
            try:
                running = new if running is None else running.joined(new)
            except Exception as err:  # noqa: BLE001 - sorted by row_fault
                self._row_fault(err, [r], "joining the running batch")
                continue
            joined += 1
        if joined:
            self.scheduler.batches.append(joined)
        return running

    def _decode(self, engine: Engine, publish, bar, running: Running) -> "Running | None":
        """One decode forward of every live row and its next token; ended rows leave the batch."""
        live = running.live
        live.mask = torch.nn.functional.pad(live.mask, (0, 1), value=1)
        inputs = self.step.latent(running.think, running.last, running.hidden)
        pos = (live.lengths + live.steps.to(self.device))[:, None]
        live.steps = live.steps + 1
        publish(live.info(pos, inputs=inputs))
        try:
            logits, cache = engine.forward(running.choice[:, None], live.mask, pos, running.cache)
        except Exception as err:  # noqa: BLE001 - sorted by row_fault
            self._row_fault(err, live.rows.tolist(), "the decode step")
            return None
        last = logits[:, -1].float()
        choice, think = self.step(live, last, bar)
        running = Running(live, cache, choice, think, last, self.rec.hidden)
        if bool(live.active.all()):
            return running
        keep = live.active.nonzero().flatten()
        if keep.numel() == 0:
            return None
        try:
            return running.kept(keep)
        except Exception as err:  # noqa: BLE001 - sorted by row_fault
            self._row_fault(err, live.rows[keep.cpu()].tolist(), "taking finished rows out of the batch")
            return None

    def _row_fault(self, err: Exception, rows: list[int], what: str) -> None:
        """``rows`` become error rows when ``err`` is a row fault and failures are rows; else re-raise."""
        if not (self.keep_going and row_fault(err)):
            raise err
        for r in rows:
            self.step.fail(r, f"{what} failed: {type(err).__name__}: {err}")

    def _prefill(self, engine: Engine, publish, r: int):
        """Row ``r``'s prompt forward, alone: ``(its Live, logits, cache, hidden)``, or ``None``
        when it failed and failures become error rows."""
        ids = self.items[self.rows[r][0]][0]
        n = len(ids)
        tokens = torch.tensor([ids], dtype=torch.long, device=self.device)
        mask = torch.ones((1, n), dtype=torch.long, device=self.device)
        positions = torch.arange(n, device=self.device)[None]
        live = Live(_cpu([r]), _cpu([0]), _cpu([self.caps[r]]),
                     torch.ones(1, dtype=torch.bool, device=self.device),
                     torch.zeros(1, dtype=torch.long, device=self.device),
                     torch.tensor([n], device=self.device), mask)
        self.step.start_rows([r])
        publish(live.info(positions, prefill=True))
        try:
            logits, cache = engine.forward(tokens, mask, positions, None)
        except Exception as err:  # noqa: BLE001 - sorted by row_fault
            self._row_fault(err, [r], "the prompt forward")
            return None
        return live, logits, cache, self.rec.hidden

    # ----- results -----------------------------------------------------------------------------
    def attention(self, n_steps: int) -> dict[str, Tensor]:
        """Tracked set -> ``[row, step, layer, head]`` (NaN for rows outside the recorded batch)."""
        n_heads = self.facts.n_heads
        shape = (len(self.rows), n_steps, len(self.layers), n_heads)
        out = {ts.name: torch.full(shape, float("nan"), device="cpu") for ts in self.sets}
        if self.rec.attn is None or not self.static_rows:
            return out
        a = self.rec.attn[:n_steps].permute(2, 4, 0, 1, 3).cpu()  # [row, set, step, layer, head]
        idx = _cpu(self.static_rows)
        for s, ts in enumerate(self.sets):
            out[ts.name][idx] = a[:, s]
        return out

    def describe(self) -> dict[str, Any]:
        """How the rows were batched (for the trace's meta)."""
        return self.scheduler.describe()


def row_fault(err: BaseException) -> bool:
    """Whether ``err`` is a fault of the rows being run rather than a bug: a :class:`LensprobeError`
    (lensprobe refusing an input, also from inside a hook) or running out of memory. Anything
    else (an intervention's bug, a ``KeyboardInterrupt``) stops the generation."""
    if isinstance(err, LensprobeError) or isinstance(err, getattr(torch, "OutOfMemoryError", ())):
        return True
    return isinstance(err, RuntimeError) and "out of memory" in str(err).lower()


def _cpu(values: list[int]) -> Tensor:
    return torch.tensor(values, dtype=torch.long, device="cpu")


def _progress_bar(progress: bool | str, total: int):
    if not progress:
        return None
    return tqdm(total=total, unit="tok", dynamic_ncols=True,
                desc=progress if isinstance(progress, str) else "generating")


def _close_bar(bar, token_ids: Tensor, started: float) -> None:
    if bar is not None:
        elapsed = max(time.perf_counter() - started, 1e-9)
        bar.set_postfix_str(f"{int((token_ids >= 0).sum())} tokens in {elapsed:.1f}s")
        bar.close()

