"""Datasets from the Hugging Face hub, failing fast and quietly when the hub cannot be reached.

``datasets.load_dataset`` retries an unreachable hub five times with growing pauses (about
30 s) and logs a line per retry before its error. :func:`load_hub_dataset` first asks the hub
endpoint once (a ``HEAD`` request, proxies respected); when it does not answer, the load runs
in offline mode (``HF_HUB_OFFLINE``-style: a cached copy still loads, nothing is retried), with
the libraries' logging silenced, and a failure is one :class:`LensprobeError` naming the
dataset and the fix.

Example:
    >>> ds = load_hub_dataset("HuggingFaceH4/MATH-500", "test", fix="pass a local JSONL file")
"""

import contextlib
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from lensprobe.core.errors import LensprobeError
from lensprobe.core.lazy import heavy

__all__ = ["PROBE_TIMEOUT", "hub_endpoint", "hub_reachable", "load_hub_dataset"]

PROBE_TIMEOUT = 5.0
"""Seconds the one request that checks the hub may take."""

_FLAG = "HF_HUB_OFFLINE"  # the offline switch of huggingface_hub.constants and datasets.config
_QUIET = ("huggingface_hub", "datasets", "fsspec", "filelock", "urllib3")


def hub_endpoint() -> str:
    """The hub's address: ``HF_ENDPOINT`` as ``huggingface_hub`` read it (default ``https://huggingface.co``)."""
    try:
        return str(heavy("huggingface_hub.constants").ENDPOINT).rstrip("/")
    except (ImportError, AttributeError):
        return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_reachable(endpoint: str, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether ``endpoint`` answers one ``HEAD`` request (any HTTP status counts as an answer)."""
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return True  # it answered, with an error status
    except (OSError, ValueError):  # refused, unroutable, no DNS, timed out, not a URL
        return False
    return True


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The hub libraries' logging silenced (their retry and fallback lines), restored afterwards."""
    loggers = [logging.getLogger(name) for name in _QUIET]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """``HF_HUB_OFFLINE`` for this load only: the libraries read their flag at call time."""
    flags = [heavy("huggingface_hub.constants"), heavy("datasets.config")]
    saved = [(mod, getattr(mod, _FLAG)) for mod in flags if hasattr(mod, _FLAG)]
    for mod, _ in saved:
        setattr(mod, _FLAG, True)
    try:
        yield
    finally:
        for mod, value in saved:
            setattr(mod, _FLAG, value)


def load_hub_dataset(name: str, split: str, *, fix: str, **kwargs: Any):
    """``datasets.load_dataset(name, split=split, **kwargs)``, offline at once when the hub is unreachable.

    Args:
        name: the dataset's hub name.
        split: the split to load.
        fix: what the user can do instead (ends the error message).
        kwargs: passed on to ``datasets.load_dataset`` (e.g. ``cache_dir``).

    Raises:
        ImportError: ``datasets`` is not installed.
        LensprobeError: the dataset could not be loaded (one line: the dataset, why, the fix).
    """
    datasets = heavy("datasets")
    endpoint = hub_endpoint()
    online = hub_reachable(endpoint)
    try:
        with _quiet(), (contextlib.nullcontext() if online else _offline()):
            return datasets.load_dataset(name, split=split, **kwargs)
    except Exception as err:  # offline without a cached copy, hub errors, a damaged cache
        why = (f"the hub ({endpoint}) answered but the load failed ({type(err).__name__})" if online else
               f"the hub ({endpoint}) is unreachable and no copy is cached")
        raise LensprobeError(f"could not load {name!r} from the Hugging Face hub: {why}. {fix}") from None
