"""math-verify, bounded and honest: each step has a timeout, and a timeout is a verdict of its own.

`math-verify <https://github.com/huggingface/Math-Verify>`_ parses both answers into sympy objects
and compares them; each step runs under a ``SIGALRM`` timeout (main thread only). math-verify
itself turns a timeout into ``False`` and logs the whole input; here a timeout gives ``None``
(:data:`TIMED_OUT`: neither right nor wrong, left out of the statistics and counted in the
summaries) and one log line with a short excerpt of the answers.
"""

import contextlib
import logging
import sys
import threading

from lensprobe.core.errors import LensprobeError, SettingError
from lensprobe.core.lazy import heavy

__all__ = ["GRADE_TIMEOUT", "TIMED_OUT", "check_timeout", "excerpt", "math_verify_equiv"]

GRADE_TIMEOUT = 5
"""Seconds math-verify may spend on each of its steps (parsing each answer, comparing them) by default."""

TIMED_OUT = None
"""The verdict of a grading that timed out: ``None``, neither right nor wrong ("timed out")."""

RECURSION_LIMIT = 20_000
"""Python's recursion limit while math-verify runs (its parser recurses once per term)."""

_log = logging.getLogger("lensprobe.grading")


class _TimeoutsCaught(logging.Filter):
    """Catches math-verify's "Timeout during ..." log records (they hold the whole input) and counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Timeout during"):
            self.count += 1
            return False
        return True


@contextlib.contextmanager
def _bounded_and_caught():
    """math-verify's timeouts caught (and not logged whole), with room for Python to recurse: its
    parser recurses once per term, so a sum of 1,000 terms would otherwise be read as no expression."""
    caught = _TimeoutsCaught()
    loggers = [logging.getLogger(f"math_verify.{name}") for name in ("parser", "grader")]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, RECURSION_LIMIT))
    for logger in loggers:
        logger.addFilter(caught)
    try:
        yield caught
    finally:
        for logger in loggers:
            logger.removeFilter(caught)
        sys.setrecursionlimit(limit)


def excerpt(text: str, limit: int = 60) -> str:
    """``text`` cut to about ``limit`` characters for a log line (its length said when cut).

    Example:
        >>> excerpt("1+" * 500 + "1", 10)
        "'1+1+1+1+1+' ... (1001 characters)"
    """
    return repr(text) if len(text) <= limit else f"{text[:limit]!r} ... ({len(text)} characters)"


def check_timeout(timeout, name: str = "timeout") -> int | None:
    """``timeout`` when it is a whole number of seconds in ``[1, MAX_GRADE_TIMEOUT]`` or ``None`` (no limit).

    Raises:
        SettingError: anything else (math-verify's alarm counts whole seconds), naming the setting ``name``.
    """
    if timeout is None or (isinstance(timeout, int) and not isinstance(timeout, bool)
                           and 1 <= timeout <= MAX_GRADE_TIMEOUT):
        return timeout
    raise SettingError(name, f"{{setting}} must be a whole number of seconds >= 1 and at most {MAX_GRADE_TIMEOUT:,} "
                             f"(math-verify's alarm counts whole seconds) or None for no limit, got {timeout!r}.")


MAX_GRADE_TIMEOUT = 86_400
"""A day: a longer limit per grading step is a typo."""


def math_verify_equiv(prediction: str, answer: str, timeout: int | None = GRADE_TIMEOUT) -> bool | None:
    """math-verify's verdict on ``prediction`` vs ``answer``, or ``None`` when a step timed out
    (and the answers are not found equal anyway).

    Raises:
        LensprobeError: math-verify is not installed.
    """
    try:
        math_verify = heavy("math_verify")
    except ImportError as err:
        raise LensprobeError(
            "method='math-verify' needs the math-verify package: "
            "pip install 'math-verify[antlr4_13_2]' (or use method='paper')."
        ) from err
    # math-verify's timeouts use SIGALRM, which only works in the main thread.
    if threading.current_thread() is not threading.main_thread():
        timeout = None
    parse, verify = math_verify.parse, math_verify.verify
    with _bounded_and_caught() as caught:
        gold = parse("\\boxed{" + answer + "}", parsing_timeout=timeout)
        pred = parse("\\boxed{" + prediction + "}", parsing_timeout=timeout)
        verdict = bool(gold and pred and verify(gold, pred, timeout_seconds=timeout))
    if caught.count and not verdict:
        _log.warning("math-verify timed out (%s s per step) on %s vs %s: no verdict (None, 'timed out')", timeout,
                     excerpt(prediction), excerpt(answer))
        return TIMED_OUT
    return verdict
