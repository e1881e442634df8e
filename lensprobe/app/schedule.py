"""A progress bar over steps of unequal cost, whose time estimate weights each step by its declared cost.

The demo report runs its studies one after the other, and they differ a hundredfold in cost: on a 2-core
machine the mechanism takes seconds and the evaluations most of the run. A bar counting studies (each worth
one) estimated the time left from the mean time per study so far, and said 16 s were left when 21 minutes
were. Here each step advances the bar by its cost, declared in seconds as measured on a reference machine,
and the time left is the time so far scaled by the cost left over the cost done::

    left = elapsed * (cost of the steps to run) / (cost of the steps done)

So a machine twice as slow as the reference shows twice the declared time, and the estimate is right as long
as the steps keep their proportions. Before the first step ends there is nothing to scale: the bar shows the
declared total instead (:func:`declared_text`).

Example:
    >>> with CostBar([("load", 10.0), ("sweep", 300.0)], desc="report") as bar:
    ...     for name, _ in bar.steps:
    ...         bar.start(name)
    ...         run(name)
    ...         bar.done()
"""

from collections.abc import Sequence
from typing import Any

from lensprobe.core.errors import LensprobeError
from lensprobe.core.progress import tqdm

__all__ = ["CostBar", "declared_text", "remaining_seconds"]


def remaining_seconds(costs: Sequence[float], done: int, elapsed: float) -> float | None:
    """The seconds left after the first ``done`` steps of declared ``costs`` took ``elapsed`` seconds: ``elapsed``
    scaled by the cost left over the cost done; ``None`` before a step with a cost has ended.

    Example:
        >>> remaining_seconds([10, 10, 600], done=2, elapsed=20.0)   # a count of steps would say 10 s
        600.0
    """
    if not 0 <= done <= len(costs):
        raise LensprobeError(f"done must be from 0 to {len(costs)} (the number of steps), got {done}.")
    spent = float(sum(costs[:done]))
    if spent <= 0:
        return None
    return elapsed * float(sum(costs[done:])) / spent


def declared_text(seconds: float) -> str:
    """A declared duration as a person says it: ``"about 25 min"``, ``"about 40 s"``."""
    return f"about {seconds / 60:.0f} min" if seconds >= 90 else f"about {seconds:.0f} s"


class CostBar:
    """A tqdm bar over named steps, advanced by each step's declared cost (seconds on a reference machine), so
    its time estimate is :func:`remaining_seconds`'s (tqdm's rate averaged over the whole run: ``smoothing=0``).

    Args:
        steps: ``(name, cost)`` in run order; costs are seconds measured on a reference machine (only their
            proportions matter to the estimate).
        desc: the bar's label.
        disable: no bar (the steps are still counted).
        reference: what the costs were measured on, shown before the first step ends.
        **kwargs: passed to tqdm (``file=``, ...).
    """

    def __init__(self, steps: Sequence[tuple[str, float]], *, desc: str, disable: bool = False,
                 reference: str = "on a 2-core machine", **kwargs: Any) -> None:
        if not steps or any(not cost > 0 for _, cost in steps):
            raise LensprobeError(f"every step needs a positive cost in seconds, got {list(steps)}.")
        self.steps = list(steps)
        self.index = 0
        total = float(sum(cost for _, cost in self.steps))
        self.reference = f"{declared_text(total)} {reference}"
        self.bar = tqdm(total=total, desc=desc, disable=disable, smoothing=0, unit="s",
                        bar_format="{l_bar}{bar}| {postfix} [{elapsed}<{remaining}]", **kwargs)

    def start(self, name: str) -> None:
        """Say which step runs (the bar's postfix: its number, name and, before any has ended, the declared
        total)."""
        note = f"; the whole run: {self.reference}" if self.index == 0 else ""
        self.bar.set_postfix_str(f"{self.index + 1}/{len(self.steps)} {name}{note}")

    def done(self) -> None:
        """The current step has ended: advance by its cost."""
        if self.index >= len(self.steps):
            raise LensprobeError(f"all {len(self.steps)} steps are done already.")
        self.bar.update(self.steps[self.index][1])
        self.index += 1

    def remaining(self) -> float | None:
        """The bar's estimate of the seconds left (:func:`remaining_seconds` at the bar's elapsed time)."""
        elapsed = self.bar.format_dict["elapsed"]
        return remaining_seconds([c for _, c in self.steps], self.index, elapsed)

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> "CostBar":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
