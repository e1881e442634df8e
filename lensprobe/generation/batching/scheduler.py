"""Which rows of a generation run when: their order, how many are live at once, and how they are batched.

A generation's rows (one per prompt x sample) wait in the :class:`Scheduler`'s order: longest prompt
first when they do not all fit in one batch (``longest_first``; results land by row index, so the
order changes nothing but speed), else the trace's row order (one batch of every row: batch row ``i``
is row ``i``, and hooks may index rows). ``batch_size`` is the row budget: at most that many rows are
live at once. The scheduler decides the mode:

- **continuous batching** (``"refill"``): ``batch_size`` smaller than the rows, ``refill=True``, no
  attention recorded and no intervention whose rows depend on each other: a finished row's place is
  taken by the next waiting row (:meth:`Scheduler.next_row`, while :meth:`Scheduler.admits` says there
  is room);
- **static batches** (``"static"``): the rows cut into batches of ``batch_size``
  (:meth:`Scheduler.batches_of`), each stepped until its last row ends. A run falls back to them,
  with the reason recorded (:meth:`Scheduler.refuse`), when an intervention depends on the batch or a
  KV cache cannot take rows in and out.

It runs no forward (:mod:`lensprobe.generation.run` does) and chooses no token
(:mod:`lensprobe.generation.step`); this is not the thinking schedule (:mod:`lensprobe.generation.thinking.schedule`,
which decides when a row thinks).

Example:
    >>> s = Scheduler(items, rows, [0, 1, 2], batch_size=2, refill=True, longest_first=True,
    ...               records=False, interventions=[])
    >>> s.mode, s.batches_of(s.order)
"""

from collections import deque
from typing import Any

from lensprobe.core.hooks.attach import batch_dependent
from lensprobe.generation.batching.rowstate import Running

__all__ = ["Scheduler"]


class Scheduler:
    """The order, row budget and batching mode of one generation's runnable rows.

    Args:
        items: ``(token ids, Prompt or None)`` per prompt.
        rows: ``(prompt index, sample index)`` per row.
        runnable: the rows that can run (not refused before any forward), in row order.
        batch_size: rows live at once (``None``: every row).
        refill: continuous batching when ``batch_size`` is smaller than the rows.
        longest_first: longest prompt first when the rows do not fit in one batch.
        records: attention is recorded (every row runs in one static batch).
        interventions: the generation's interventions (one that depends on the batch means static batches).
    """

    def __init__(self, items, rows: list[tuple[int, int]], runnable: list[int], batch_size: int | None,
                 refill: bool, longest_first: bool, records: bool, interventions: list) -> None:
        self.batch_size = max(1, min(batch_size or len(runnable) or 1, len(runnable) or 1))
        self.longest_first = longest_first and self.batch_size < len(runnable)
        if self.longest_first:  # one batch of every row keeps the trace's order (hooks may index rows)
            runnable.sort(key=lambda r: -len(items[rows[r][0]][0]))  # stable: ties keep row order
        self.order = runnable
        dependent = batch_dependent(interventions)
        self.mode = "refill" if refill and self.batch_size < len(runnable) and not records and not dependent else "static"
        self.waiting: deque[int] = deque(runnable)  # continuous batching takes rows from the left
        self.batches: list[int] = []  # rows per static batch, or per refill (for meta)
        self.fallback: str | None = None
        if dependent and refill and self.batch_size < len(runnable):
            names = ", ".join(sorted({type(i).__name__ for i in dependent}))
            self.fallback = f"static batches ({names} depends on the batch: no continuous batching)"

    def batches_of(self, rows: list[int]) -> list[list[int]]:
        """``rows`` cut into static batches of ``batch_size`` rows, in order."""
        return [rows[i:i + self.batch_size] for i in range(0, len(rows), self.batch_size)]

    def admits(self, running: Running | None) -> bool:
        """Whether a waiting row may join the running batch: continuous batching still on, and a free place."""
        return self.fallback is None and (running is None or len(running.live) < self.batch_size)

    def next_row(self, running: Running | None) -> int | None:
        """The next waiting row, taken from the queue, when one may join ``running`` now; else ``None``."""
        return self.waiting.popleft() if self.waiting and self.admits(running) else None

    def put_back(self, row: int, reason: str) -> None:
        """``row`` waits again, first in the queue, and no more rows join a running batch (:meth:`refuse`)."""
        self.waiting.appendleft(row)
        self.refuse(reason)

    def refuse(self, reason: str) -> None:
        """No more rows join a running batch: the rest run as static batches, ``reason`` in the meta."""
        self.fallback = f"static batches ({reason})"

    def describe(self) -> dict[str, Any]:
        """How the rows were batched (for the trace's meta)."""
        mode = self.fallback or ("continuous batching" if self.mode == "refill" else "static batches")
        return {"batching": mode, "batch_size": self.batch_size, "longest_first": self.longest_first}
