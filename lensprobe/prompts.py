"""Prompts with named segments, fillers, system prompts and the prompt conditions of the papers.

Example:
    >>> p = lp.prompts.build_prompt(model, "What is 2+3?", filler=lp.prompts.Filler.meaningless())
    >>> p.positions("filler")[:3]
"""

from lensprobe.core.boundary import guard_public
from lensprobe.core.prompts.conditions import PROMPT_FORMATS, Condition, paper_conditions, with_arm
from lensprobe.core.prompts.prompt import (
    MATH_SYSTEM_PROMPT,
    PAPER_SYSTEM_PROMPT,
    Filler,
    Prompt,
    build_prompt,
    prompt_json,
)

__all__ = ["MATH_SYSTEM_PROMPT", "PAPER_SYSTEM_PROMPT", "PROMPT_FORMATS", "Condition", "Filler", "Prompt",
           "build_prompt", "paper_conditions", "prompt_json", "with_arm"]

guard_public(globals())  # public functions raise one LensprobeError (lensprobe.core.boundary)
