r"""The meaningless-tokens authors' evaluation protocols as named settings, each from their files.

A protocol fixes everything a script of the authors fixes; ``evaluate(..., protocol=NAME)``
(``lensprobe eval --protocol NAME``) applies it, records its name in ``config.json``
(``run.generation.protocol``) and grades its tables with ``paper-exact``. Settings given
explicitly still win (and are recorded, so such a folder is not the protocol's).

- ``"arm-math500"``: ``Math500/math500.py`` and ``mless.py`` (their MATH-500 and AIME scripts
  are the same; ``AIME2024/aime2024.py`` and ``AIME2025/AIME2025.py`` differ only in the data).
- ``"arm-aime-pass3"``: ``evaluate_pass_at3`` in the same files, run by ``pass_3.py``.

Every setting with the file it comes from is in :data:`PROTOCOLS` (``Protocol.sources``).
"""

from dataclasses import dataclass, field
from typing import Any

from lensprobe.core.errors import LensprobeError
from lensprobe.core.prompts.prompt import PAPER_SYSTEM_PROMPT

__all__ = ["PASS3_SYSTEM_PROMPT", "PROTOCOLS", "Protocol", "get_protocol", "grades_prompt"]

PASS3_SYSTEM_PROMPT = "Please reason step by step and put your final answer within \\boxed{}."
r"""The pass@3 script's instruction: an f-string there, so the model sees ``\boxed{}`` (single braces)."""


@dataclass(frozen=True)
class Protocol:
    """One of the authors' evaluation protocols.

    Attributes:
        name: its key (``"arm-math500"``).
        description: one line.
        settings: :class:`~lensprobe.evals.harness.EvalConfig` fields it fixes (besides the model's
            own generation config, which the ``"paper"`` format reads).
        system: the instruction before the filler and the problem.
        grade_prompt: ``True``: ``paper-exact`` grades prompt + generation (the MATH-500 script
            decodes both); ``False``: the generation alone (the pass@3 script strips the prompt).
        k: pass@k reported (``None``: accuracy).
        runs: runs the paper averages (Table 1: five).
        sources: setting -> the authors' file (and line of reasoning) it comes from.

    Example:
        >>> PROTOCOLS["arm-aime-pass3"].settings["n_samples"]
        20
    """

    name: str
    description: str
    settings: dict[str, Any] = field(default_factory=dict)
    system: str = PAPER_SYSTEM_PROMPT
    grade_prompt: bool = True
    k: int | None = None
    runs: int = 1
    sources: dict[str, str] = field(default_factory=dict)


PROTOCOLS: dict[str, Protocol] = {
    "arm-math500": Protocol(
        name="arm-math500",
        description="the authors' MATH-500 / AIME accuracy script: raw prompt, 2048 new tokens, the model's "
                    "generation config, one problem at a time, their is_equiv on prompt + generation",
        settings={"prompt_format": "paper", "max_new_tokens": 2048},
        runs=5,
        sources={
            "prompt": "Math500/math500.py, mless.py: 'Please reason step by step and put your final answer within "
                      "\\\\boxed{{}}.' + filler + problem, no chat template, one tokenizer call",
            "filler": "mless.py: --Mtokens default, 55 '/' joined by single spaces",
            "max_new_tokens": "Math500/math500.py: model.generate(..., max_new_tokens=2048)",
            "sampling": "Math500/math500.py: no sampling arguments, so the model's generation_config.json "
                        "(do_sample, temperature, top_p, top_k, repetition_penalty)",
            "batch": "args.py: --batch_size 1 (ARM's statistics per row: lp.ARM(per_row=True) is that, batched)",
            "grader": "Math500/math500.py: is_equiv(decoded prompt + generation, answer) (paper-exact)",
            "runs": "paper, Table 1: 'average of five runs'",
            "dtype": "Math500/utils.py: from_pretrained without torch_dtype, so fp32",
        },
    ),
    "arm-aime-pass3": Protocol(
        name="arm-aime-pass3",
        description="the authors' pass@3 script: single-brace \\boxed{} prompt, 512 new tokens, sampling, 20 samples "
                    "per problem, unbiased pass@3, the prompt stripped before grading",
        settings={"prompt_format": "paper", "max_new_tokens": 512, "do_sample": True, "n_samples": 20},
        system=PASS3_SYSTEM_PROMPT,
        grade_prompt=False,
        k=3,
        sources={
            "prompt": "AIME2024/aime2024.py evaluate_pass_at3: f'{system_prefix}{prompt}' with system_prefix "
                      "'...within \\\\boxed{}.' (an f-string: single braces)",
            "max_new_tokens": "evaluate_pass_at3(max_new_tokens=512)",
            "sampling": "evaluate_pass_at3: do_sample=True, temperature/top_p commented out, so the model's "
                        "generation config",
            "n_samples": "evaluate_pass_at3(samples_per_task=20) (pass_3.py passes args.samples_per_task, "
                         "default 5 in args.py: use n_samples=5 to follow that)",
            "k": "evaluate_pass_at3: k = 3, pass_at_k_from_counts = 1 - C(n-c, k) / C(n, k) (unbiased)",
            "grader": "evaluate_pass_at3: the prompt stripped from the decoded text, then is_equiv "
                      "(paper-exact on the generation alone)",
        },
    ),
}
"""The named protocols (see the module docs)."""


def get_protocol(name: str) -> Protocol:
    """The protocol called ``name``.

    Raises:
        LensprobeError: an unknown name (the message lists the known ones).

    Example:
        >>> get_protocol("arm-math500").settings["max_new_tokens"]
        2048
    """
    if name not in PROTOCOLS:
        raise LensprobeError(f"unknown protocol {name!r}: use one of {tuple(PROTOCOLS)}.")
    return PROTOCOLS[name]


def grades_prompt(protocol: str | None) -> bool:
    """Whether ``paper-exact`` grades prompt + generation under ``protocol`` (``None``: yes, as the
    MATH-500 script does)."""
    return True if protocol is None else get_protocol(protocol).grade_prompt
