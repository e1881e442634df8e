"""What runs a generation step: the TransformerBridge with its hook points, or a plain view of
its Hugging Face model (same tensors, no hook points) with an attention kernel that also
returns the newest query's weights, TransformerLens hook names served on it, and a thread
rule for small decode steps; for a TransformerLens 3.x ``HookedTransformer``, the model itself
with its own KV cache.

May import: :mod:`lensprobe.core`.
"""

from lensprobe.generation.engines.bridge import BridgeEngine
from lensprobe.generation.engines.choose import choose_engine, engine_name, engine_to_run
from lensprobe.generation.engines.hooked import HookedEngine
from lensprobe.generation.engines.plain import PlainEngine
from lensprobe.generation.engines.protocol import ENGINE_NAMES, Engine, EngineName

__all__ = ["ENGINE_NAMES", "BridgeEngine", "Engine", "EngineName", "HookedEngine", "PlainEngine", "choose_engine", "engine_name",
           "engine_to_run"]
