"""lensprobe: attention, entropy and intervention studies on TransformerLens models.

Example:
    >>> import lensprobe as lp
    >>> model = lp.load_model()
    >>> p = lp.build_prompt(model, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT,
    ...                     filler=lp.Filler.meaningless())
    >>> pats = lp.attention_patterns(model, p, layers=[0])
    >>> recv = lp.average_attention_received(pats[0])  # [head, key_pos]
"""

from lensprobe.errors import LensprobeError, ModelLoadError
from lensprobe.interventions import AttentionRecorder, Intervention, intervene
from lensprobe.metrics import (
    DEFAULT_TOKEN_CLASSES,
    attention_by_token_class,
    attention_proportion,
    average_attention_received,
    entropy,
)
from lensprobe.models import cache_dir, load_model
from lensprobe.prompts import MATH_SYSTEM_PROMPT, Filler, Prompt, build_prompt
from lensprobe.run import attention_patterns, forward

__all__ = [
    "DEFAULT_TOKEN_CLASSES",
    "MATH_SYSTEM_PROMPT",
    "AttentionRecorder",
    "Filler",
    "Intervention",
    "LensprobeError",
    "ModelLoadError",
    "Prompt",
    "attention_by_token_class",
    "attention_patterns",
    "attention_proportion",
    "average_attention_received",
    "build_prompt",
    "cache_dir",
    "entropy",
    "forward",
    "intervene",
    "load_model",
]
__version__ = "0.1.0"
