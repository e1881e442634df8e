"""KV-cached generation: the public loop, each row's state, the scheduler, the step, the KV cache's
rows, tracked sets, thinking schedules, latent thinking inputs, traces, and the engines that run each
forward (the TransformerBridge, or a plain Hugging Face view of the same weights for speed).

May import: :mod:`lensprobe.core` (interventions are passed in as objects, never imported).
"""

from lensprobe.core.boundary import guard_public
from lensprobe.generation.config import GenerationConfig
from lensprobe.generation.lens import AffineLens
from lensprobe.generation.loop import generate, trace_generation
from lensprobe.generation.rows import FinishedRow
from lensprobe.generation.thinking import schedule
from lensprobe.generation.thinking.latent import LatentFusion, Pause, add_thinking_token
from lensprobe.generation.traces.activations import Record
from lensprobe.generation.traces.lens import LensTrace
from lensprobe.generation.traces.sets import trace_jobs, trace_prompts
from lensprobe.generation.traces.summary import trace_summary
from lensprobe.generation.traces.trace import GenerationTrace, load_trace
from lensprobe.generation.traces.tracking import SPECIAL_SETS

__all__ = ["SPECIAL_SETS", "AffineLens", "FinishedRow", "GenerationConfig", "GenerationTrace", "LatentFusion",
           "LensTrace", "Pause", "Record", "add_thinking_token", "generate", "load_trace", "schedule", "trace_generation",
           "trace_jobs", "trace_prompts", "trace_summary"]

guard_public(globals())  # public functions raise one LensprobeError (lensprobe.core.boundary)
