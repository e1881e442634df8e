"""What the generation loop asks of an engine: attach hooks, run a forward, describe itself.

An engine runs the forwards of one generation. The loop (:mod:`lensprobe.generation.loop`)
never looks inside it: it attaches its recorder hooks and the caller's interventions with
:meth:`Engine.attach`, runs the prompt and every decode step with :meth:`Engine.forward`,
and records :meth:`Engine.describe` in the trace's ``meta``. Three engines implement it:
:class:`~lensprobe.generation.engines.bridge.BridgeEngine` (the TransformerBridge and its
hook points), :class:`~lensprobe.generation.engines.plain.PlainEngine` (an unwrapped view
of the same weights) and :class:`~lensprobe.generation.engines.hooked.HookedEngine` (a
TransformerLens 3.x ``HookedTransformer`` with its own KV cache);
:func:`~lensprobe.generation.engines.choose.choose_engine` picks one.
"""

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol, runtime_checkable

from jaxtyping import Float, Int
from torch import Tensor

from lensprobe.core.hooks.attach import Hook, Steps

__all__ = ["ENGINE_NAMES", "Engine", "EngineName"]

EngineName = Literal["auto", "bridge", "hf"]
ENGINE_NAMES: tuple[str, ...] = ("auto", "bridge", "hf")


@runtime_checkable
class Engine(Protocol):
    """Runs the forwards of one generation (one instance per generation).

    Attributes:
        name: ``"bridge"``, ``"hf"`` or ``"hooked"`` (what ``trace.meta["engine"]`` records).
    """

    name: str

    def attach(self, hooks: Sequence[Hook], interventions: Sequence, steps: Steps) -> AbstractContextManager[None]:
        """Attach recorder ``hooks`` (TransformerLens names) and ``interventions`` while open.

        Every hook is called with a :class:`~lensprobe.core.hooks.hookpoint.HookSite` whose ``step``
        is what the runner last gave ``steps.publish``.

        Everything attached is removed on exit, also after an exception or a KeyboardInterrupt.
        """
        ...

    def forward(self, tokens: Int[Tensor, "batch pos"], attention_mask: Int[Tensor, "batch key_pos"],
                position_ids: Int[Tensor, "batch pos"], past: Any) -> tuple[Float[Tensor, "batch 1 d_vocab"], Any]:
        """Run ``tokens`` after the cache ``past`` (``None`` for the prompt).

        Returns the logits of the last position and the grown cache.
        """
        ...

    def describe(self) -> dict[str, Any]:
        """``{"engine", "attention", "decode_threads"}`` for the trace's ``meta``."""
        ...
