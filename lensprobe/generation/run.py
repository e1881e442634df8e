"""One generation run: rows scheduled into batches, stepped, recorded, refilled.

:func:`lensprobe.generate` checks its inputs and hands them to :class:`Run`. A run has one
*row* per (prompt, sample), in prompt order (the rows of the returned trace), and runs them
in one of two ways:

**Static batches** (``batch_size`` unset, or ``refill=False``, or attention recorded): the
rows of a batch are left-padded to their longest prompt, prefilled together, and stepped
together until the last of them ends; a row that ended earlier keeps its place (fed padding,
its outputs no longer recorded). Traces with tracked sets always run this way, as one batch
of every row (the recorder keeps one block per row and step).

**Continuous batching** (``batch_size`` smaller than the rows, ``refill=True``): a queue of
rows; at most ``batch_size`` are live at once. A row is prefilled **alone** (so its prompt
forward is exactly the one it would have alone: no padding, any intervention's statistics
over its own positions only) and its KV cache joins the running batch as a new row,
left-padded to the batch's width (:mod:`lensprobe.generation.cacherows`). Every decode step
runs the live rows together, each at its own step and its own positions (``hook.step``'s
``positions``, ``steps`` and ``rows``). When a row ends (end of sequence, its own length cap,
non-finite logits) it leaves the cache at once and its place takes the next row of the queue;
cache columns that are padding in every live row are dropped. Each row's results are those of running it alone: the same greedy tokens, the same
sampled tokens (each row draws from its own generator), the same thinking steps (a schedule
is asked once per group of rows at the same step), interventions applied by position.
A cache whose rows cannot be joined (sliding-window or quantized layers) runs static batches.

When ``batch_size`` is smaller than the rows, they are scheduled longest prompt first
(``longest_first``); results land by row index, so the order changes nothing but speed. One
batch of every row keeps the trace's row order (batch row ``i`` is row ``i``). ``on_row`` hears of each row as soon as it has ended.
"""

import time
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor

from lensprobe.core.errors import LensprobeError, NonFiniteWarning
from lensprobe.core.hooks.attach import Steps, batch_dependent
from lensprobe.core.measures.metrics import nonfinite_rows
from lensprobe.core.models.facts import ModelFacts, model_facts
from lensprobe.core.progress import tqdm
from lensprobe.generation import cacherows
from lensprobe.generation.batch import pad_batch
from lensprobe.generation.config import GenerationConfig
from lensprobe.generation.engines import Engine, choose_engine
from lensprobe.generation.live import Live, Running
from lensprobe.generation.recording import StepRecorder, final_hidden_hook
from lensprobe.generation.rows import FinishedRow, RowOutputs, choose, row_generator, row_text
from lensprobe.generation.schedule import StepState
from lensprobe.generation.thinking import LatentFusion
from lensprobe.generation.tracking import TrackedSet, add_position, set_masks

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
    """

    def __init__(self, model, cfg: GenerationConfig, items, rows: list[tuple[int, int]], caps: list[int],
                 failed: dict[int, str], interventions: list, sets: list[TrackedSet], layers: list[int],
                 think_id: int | None, batch_size: int | None, refill: bool, longest_first: bool,
                 on_row: Callable[[FinishedRow], Any] | None, keep_going: bool, facts: ModelFacts | None = None) -> None:
        self.model, self.cfg, self.items, self.rows = model, cfg, items, rows
        self.facts = facts if facts is not None else model_facts(model)
        self.prompt_caps = list(caps)
        self.caps = [self.prompt_caps[pi] for pi, _ in rows]  # per row
        self.interventions, self.sets, self.layers, self.think_id = interventions, sets, layers, think_id
        self.on_row, self.keep_going = on_row, keep_going
        self.pad_id = self.facts.pad_id
        self.device = self.facts.device
        self.out = RowOutputs.start(len(rows), cfg.max_new_tokens)
        for r, message in failed.items():
            self.out.fail(r, message)
        runnable = [r for r in range(len(rows)) if r not in failed]
        self.batch_size = max(1, min(batch_size or len(runnable) or 1, len(runnable) or 1))
        self.longest_first = longest_first and self.batch_size < len(runnable)
        if self.longest_first:  # one batch of every row keeps the trace's order (hooks may index rows)
            runnable.sort(key=lambda r: -len(items[rows[r][0]][0]))  # stable: ties keep row order
        self.order = runnable
        dependent = batch_dependent(interventions)
        self.mode = "refill" if refill and self.batch_size < len(runnable) and not sets and not dependent else "static"
        self.static_rows = runnable if sets else None  # recorded attention: one batch of every row
        hidden = final_hidden_hook(model) if isinstance(cfg.thinking, LatentFusion) else None
        n_rec = len(runnable) if sets else 0
        self.masks = (set_masks(items, sets, [rows[r][0] for r in runnable], self._width(runnable),
                                self._width(runnable) + cfg.max_new_tokens, self.device) if sets else None)
        self.rec = StepRecorder(layers, n_rec, len(sets), self.facts.n_heads, cfg.max_new_tokens, self.masks,
                                hidden, self.device)
        self.gens: dict[int, torch.Generator | None] = {}
        eos = set(self.facts.end_ids) | set(cast(tuple, cfg.eos_token_id) or ()) if cfg.stop_at_eos else set()
        self.eos = torch.tensor(sorted(eos), dtype=torch.long, device=self.device)
        self.batches: list[int] = []  # rows per static batch, or per refill (for meta)
        self.fallback: str | None = None
        if dependent and refill and self.batch_size < len(runnable):
            names = ", ".join(sorted({type(i).__name__ for i in dependent}))
            self.fallback = f"static batches ({names} depends on the batch: no continuous batching)"

    def _width(self, rows: list[int]) -> int:
        return max((len(self.items[self.rows[r][0]][0]) for r in rows), default=0)

    # ----- running -------------------------------------------------------------------------
    def execute(self, engine_name: str, progress: bool | str) -> Engine:
        """Run every row; returns the engine that ran (its ``describe()`` goes in the trace's meta)."""
        hooks = self.rec.hooks(self.model)
        engine = choose_engine(self.model, engine_name, interventions=self.interventions,
                               hook_names=[name for name, _ in hooks], rows=self.batch_size)
        bar = _progress_bar(progress, sum(self.caps[r] for r in self.order))
        started = time.perf_counter()
        for r in sorted(self.out.errors):  # rows refused before any forward
            self._report(r)
        publish = (steps := Steps()).publish  # each forward's StepContext, published before it runs
        try:
            with engine.attach(hooks, self.interventions, steps):
                if self.order:
                    if self.mode == "refill":
                        self._refill(engine, publish, bar)
                    else:
                        for i in range(0, len(self.order), self.batch_size):
                            self._static(engine, publish, bar, self.order[i:i + self.batch_size])
        finally:
            _close_bar(bar, self.out.token_ids, started)
        return engine

    def _static(self, engine: Engine, publish, bar, batch_rows: list[int]) -> None:
        """Rows ``batch_rows`` as one left-padded batch, stepped together until all have ended."""
        cfg = self.cfg
        batch = pad_batch(self.items, [self.rows[r] for r in batch_rows], cfg.max_new_tokens, self.pad_id, self.device)
        n = len(batch_rows)
        live = Live(_cpu(batch_rows), _cpu([0] * n), _cpu([self.caps[r] for r in batch_rows]),
                     torch.ones(n, dtype=torch.bool, device=self.device),
                     torch.zeros(n, dtype=torch.long, device=self.device), batch.lengths, batch.mask)
        self._start_rows(batch_rows)
        self.batches.append(n)
        positions = batch.prompt_positions()
        publish(live.info(positions, prefill=True))
        logits, past = engine.forward(batch.ids, batch.mask[:, :batch.width], positions.clamp(min=0), None)
        for t in range(cfg.max_new_tokens):
            last = logits[:, -1].float()
            choice, think = self._step(live, last, bar)
            if not bool(live.active.any()):
                break
            col = batch.width + t
            batch.mask[:, col] = 1
            if self.sets and self.masks is not None:  # masks exist exactly when sets do
                add_position(self.masks, self.sets, col, choice, think, batch.lengths, t, live.active)
            inputs = self._latent(think, last, self.rec.hidden)
            self.rec.step = t + 1
            live.steps += 1
            pos = (batch.lengths + t)[:, None]
            publish(live.info(pos, inputs=inputs))
            logits, past = engine.forward(choice[:, None], batch.mask[:, : col + 1], pos, past)

    def _refill(self, engine: Engine, publish, bar) -> None:
        """Continuous batching (see the module docstring)."""
        queue = deque(self.order)
        running: Running | None = None
        while True:
            running = self._admit(engine, publish, bar, queue, running)
            if running is None:
                break
            running = self._decode(engine, publish, bar, running)
        if queue:  # a cache that cannot take rows in and out: the rest as static batches, once no row is live
            self.mode = "static"
            rest = list(queue)
            for i in range(0, len(rest), self.batch_size):
                self._static(engine, publish, bar, rest[i:i + self.batch_size])

    def _admit(self, engine: Engine, publish, bar, queue: deque, running: "Running | None") -> "Running | None":
        """Fill free slots from ``queue``: each row prefilled alone, its first token chosen, its
        cache joined, so the next decode forward runs full. A row whose cache cannot join stops
        the admitting (it goes back to the queue; the live rows run to their end first)."""
        joined = 0
        while queue and self.fallback is None and (running is None or len(running.live) < self.batch_size):
            r = queue.popleft()
            solo = self._prefill(engine, publish, r)
            if solo is None:
                continue
            row_live, logits, cache, hidden = solo
            if not cacherows.can_join(cache):
                self.fallback = f"static batches (a {type(cache).__name__} cannot take rows in and out)"
                queue.appendleft(r)
                self.gens.pop(r, None)
                break
            last = logits[:, -1].float()
            choice, think = self._step(row_live, last, bar)
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
            self.batches.append(joined)
        return running

    def _decode(self, engine: Engine, publish, bar, running: Running) -> "Running | None":
        """One decode forward of every live row and its next token; ended rows leave the batch."""
        live = running.live
        live.mask = torch.nn.functional.pad(live.mask, (0, 1), value=1)
        inputs = self._latent(running.think, running.last, running.hidden)
        pos = (live.lengths + live.steps.to(self.device))[:, None]
        live.steps = live.steps + 1
        publish(live.info(pos, inputs=inputs))
        try:
            logits, cache = engine.forward(running.choice[:, None], live.mask, pos, running.cache)
        except Exception as err:  # noqa: BLE001 - sorted by row_fault
            self._row_fault(err, live.rows.tolist(), "the decode step")
            return None
        last = logits[:, -1].float()
        choice, think = self._step(live, last, bar)
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
            self._fail(r, f"{what} failed: {type(err).__name__}: {err}")

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
        self._start_rows([r])
        publish(live.info(positions, prefill=True))
        try:
            logits, cache = engine.forward(tokens, mask, positions, None)
        except Exception as err:  # noqa: BLE001 - sorted by row_fault
            self._row_fault(err, [r], "the prompt forward")
            return None
        return live, logits, cache, self.rec.hidden

    # ----- one step ---------------------------------------------------------------------------
    def _start_rows(self, rows: list[int]) -> None:
        for r in rows:
            self.gens[r] = row_generator(self.cfg, self.rows[r][1], self.device)

    def _step(self, live: Live, last: Tensor, bar) -> tuple[Tensor, Tensor]:
        """Choose each live row's token from its logits, record it, end rows (EOS, cap, non-finite)."""
        cfg = self.cfg
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
        if self.rec.attn is not None:
            self.rec.end_rows(int(live.steps[0]), ~live.active)
        if bar is not None:
            bar.update(int(idx.numel()))
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

    def _latent(self, think: Tensor, last: Tensor, hidden: Tensor | None) -> tuple[Tensor, Tensor] | None:
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
            self._report(r)
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

    def _fail(self, r: int, message: str) -> None:
        self.out.fail(r, message)
        self._report(r)

    def _report(self, r: int) -> None:
        if self.on_row is None:
            return
        ids, finish = self.out.ids(r), self.out.finish[r]
        pi, j = self.rows[r]
        self.on_row(FinishedRow(r, pi, j, ids, row_text(self.facts.tokenizer, ids, finish), finish,
                                self.out.errors.get(r)))

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
        mode = self.fallback or ("continuous batching" if self.mode == "refill" else "static batches")
        return {"batching": mode, "batch_size": self.batch_size, "longest_first": self.longest_first}


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

