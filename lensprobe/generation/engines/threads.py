"""Thread counts for small forwards: one thread for tiny recording ops and small decode steps.

torch's thread count is process-wide. :func:`one_thread` runs a block on one thread;
:func:`layer_threads` runs a plain view's decoder layers on :func:`decode_threads` threads
during decode steps (see :data:`ONE_THREAD_LAYER_BYTES` for the measurements behind it).
"""

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

__all__ = ["ONE_THREAD_LAYER_BYTES", "ONE_THREAD_MAX_ROWS", "decode_threads", "layer_threads", "one_thread"]


ONE_THREAD_LAYER_BYTES = 4 * 2**20
"""Decode steps run a view's decoder layers on one thread when no layer weight is larger.

A decode step (one new position per row) multiplies each weight matrix by a few vectors:
it streams the weights from memory, and for small matrices waking torch's other threads
costs more than they save. The unembedding (one large matrix) keeps torch's thread count.
Measured on 2 CPU cores with ``benchmarks/decode_threads.py`` (time per step, torch's two
threads / one thread for the layers; batch 1, 4, 8): largest layer weight 3.4 MiB
(SmolLM2-135M's shapes) 1.17x, 1.11x, 1.10x; 9.4 MiB 1.04x, 0.82x, 0.76x; 24 MiB 0.81x,
0.71x, 0.67x; 64 MiB 0.71x, 0.68x, 0.67x. Set to 0 to always use torch's thread count.
"""


ONE_THREAD_MAX_ROWS = 4
"""... and when a step has at most this many rows (the gain shrinks as rows make each matmul
do more work per weight read; at 8 rows on the embedded model it was within noise)."""


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the enclosed torch ops on one thread (the previous thread count is restored on exit).

    For the tiny per-step recording ops (a ``[head, key]`` row per layer): torch splits some
    of them (softmax, exp) across threads, and waking the other threads costs more than the
    op itself (about 15 us per op on 2 cores with ``OMP_WAIT_POLICY=PASSIVE``, vs 2 us).
    """
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def decode_threads(view: nn.Module, rows: int) -> int:
    """Threads for ``view``'s decoder layers in a decode step of ``rows`` rows.

    One when ``rows <= ONE_THREAD_MAX_ROWS`` and no layer weight matrix is larger than
    :data:`ONE_THREAD_LAYER_BYTES`, else torch's thread count. The thread count does not
    change the results at one row (each output is one dot product either way); at several
    rows the matmul may split its sums differently (float rounding, ~1e-6 relative).
    """
    if rows > ONE_THREAD_MAX_ROWS:
        return torch.get_num_threads()
    embeddings = view.get_input_embeddings()  # type: ignore[operator]  # HF method; torch: Tensor | Module
    base: nn.Module = view.base_model  # type: ignore[assignment]  # a transformers model's decoder stack
    weights = [getattr(m, "weight", None) for m in base.modules() if m is not embeddings]
    sizes = [w.numel() * w.element_size() for w in weights if isinstance(w, torch.Tensor) and w.ndim == 2]
    if sizes and max(sizes) <= ONE_THREAD_LAYER_BYTES:
        return 1
    return torch.get_num_threads()


@contextlib.contextmanager
def layer_threads(view: nn.Module, threads: int) -> Iterator[None]:
    """While open, forwards of ``view`` that add one position per row run its decoder layers on ``threads``.

    The unembedding and every other forward keep torch's thread count. The count is set by
    hooks on the decoder stack (``view.base_model``), which are removed on exit, and the
    count at entry is restored, also after an exception or a KeyboardInterrupt. torch's
    thread count is process-wide: generations running concurrently in several Python
    threads see each other's setting (only their speed changes, not their numbers).
    """
    before = torch.get_num_threads()
    if threads == before:
        yield
        return

    def enter(_m, args, kwargs):
        x = kwargs.get("input_ids")
        x = kwargs.get("inputs_embeds") if x is None else x
        x = args[0] if x is None and args else x
        if isinstance(x, torch.Tensor) and x.ndim >= 2 and x.shape[1] == 1:
            torch.set_num_threads(threads)

    def leave(_m, _args, _out):
        torch.set_num_threads(before)

    stack: nn.Module = view.base_model  # type: ignore[assignment]  # a transformers model's decoder stack
    handles = [stack.register_forward_pre_hook(enter, with_kwargs=True), stack.register_forward_hook(leave)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        torch.set_num_threads(before)
