r"""The meaningless-tokens authors' evaluation protocols as named settings, each from their files.

A protocol fixes everything a script of the authors fixes; ``evaluate(..., protocol=NAME)``
(``lensprobe eval --protocol NAME``) applies it, records its name in ``config.json``
(``run.generation.protocol``) and grades its tables with ``paper-exact``. Settings given
explicitly still win (and are recorded, so such a folder is not the protocol's).

- ``"arm-math500"``: ``Math500/math500.py`` and ``mless.py`` (their MATH-500 and AIME scripts
  are the same; ``AIME2024/aime2024.py`` and ``AIME2025/AIME2025.py`` differ only in the data).
- ``"arm-math500-t0.5"``: ``"arm-math500"`` sampled at temperature 0.5, top_p 0.95 with 5 samples per
  problem (Table 8's caption; the released code has no script for it).
- ``"arm-aime-pass3"``: ``evaluate_pass_at3`` in the same files, run by ``pass_3.py``, as the code
  runs it: ``generate(do_sample=True)`` with the model's generation config, so a configuration without
  ``top_k`` samples the 50 most probable tokens (``transformers``' default; Qwen2.5-Math's configs are
  greedy and set none), and ARM at the decoder layers' defaults (``c=0.13``, percentile 99.5; Gemma
  fraction 0.13, quantile 0.995): the function passes no ARM settings to ``generate``.
- ``"arm-aime-pass3-text"``: the same with ARM at the benchmark's preset, as the paper's text has it
  (Table 9 with ``arm_source="paper"``, ``--arm-source paper``); the only difference from the code's.

Every setting with the file it comes from is in :data:`PROTOCOLS` (``Protocol.sources``).
"""

from dataclasses import dataclass, field
from typing import Any, Literal

from lensprobe.core.errors import LensprobeError
from lensprobe.core.prompts.prompt import PAPER_SYSTEM_PROMPT

__all__ = ["PASS3_SYSTEM_PROMPT", "PROTOCOLS", "Protocol", "arm_layer_defaults", "get_protocol", "grades_prompt",
           "ungradable_is_wrong"]

PASS3_SYSTEM_PROMPT = "Please reason step by step and put your final answer within \\boxed{}."
r"""The pass@3 script's instruction: an f-string there, so the model sees ``\boxed{}`` (single braces)."""


@dataclass(frozen=True)
class Protocol:
    """One of the authors' evaluation protocols.

    Attributes:
        name: its key (``"arm-math500"``).
        description: one line.
        settings: :class:`~lensprobe.evals.running.harness.EvalConfig` fields it fixes (besides the model's
            own generation config, which the ``"paper"`` format reads).
        system: the instruction before the filler and the problem.
        grade_prompt: ``True``: ``paper-exact`` grades prompt + generation (the MATH-500 script
            decodes both); ``False``: the generation alone (the pass@3 script strips the prompt).
        ungradable: what an answer the authors' ``is_equiv`` raises on becomes
            (:class:`~lensprobe.evals.grading.grade.PaperGraderError`): ``"error"``, an error row (their
            MATH-500 loop does not catch it and would stop), or ``"wrong"`` (their pass@3 loop catches
            it and counts the sample wrong: ``paper-exact`` is ``False``, the other graders grade it).
        k: pass@k reported (``None``: accuracy).
        runs: runs the paper averages (Table 1: five).
        arm: the ARM that ``"ARM"`` conditions attach when none is given: ``"preset"``, the model's
            preset for the benchmark (from the run's ARM source), or ``"layer-defaults"``, the authors'
            decoder-layer defaults (:data:`~lensprobe.interventions.arm_presets.LAYER_DEFAULTS`) where the
            benchmark has a preset.
        sources: setting -> the authors' file (and line of reasoning) it comes from.
        notes: how the protocol differs from the paper's text (or a sibling protocol), listed with it.

    Example:
        >>> PROTOCOLS["arm-aime-pass3"].settings["n_samples"]
        20
    """

    name: str
    description: str
    settings: dict[str, Any] = field(default_factory=dict)
    system: str = PAPER_SYSTEM_PROMPT
    grade_prompt: bool = True
    ungradable: Literal["error", "wrong"] = "error"
    k: int | None = None
    runs: int = 1
    arm: Literal["preset", "layer-defaults"] = "preset"
    sources: dict[str, str] = field(default_factory=dict)
    notes: str = ""


def _pass3(name: str, arm: Literal["preset", "layer-defaults"], how: str, notes: str) -> Protocol:
    """The pass@3 script's protocol with ARM as ``arm`` says."""
    return Protocol(
        name=name,
        description="the authors' pass@3 script, " + how + ": single-brace \\boxed{} prompt, 512 new tokens, "
                    "sampling with the model's generation config (top_k 50 where it sets none), 20 samples per "
                    "problem, unbiased pass@3, the prompt stripped before grading",
        settings={"prompt_format": "paper", "max_new_tokens": 512, "do_sample": True, "n_samples": 20},
        system=PASS3_SYSTEM_PROMPT,
        grade_prompt=False,
        ungradable="wrong",
        k=3,
        arm=arm,
        notes=notes,
        sources={
            "prompt": "AIME2024/aime2024.py evaluate_pass_at3: f'{system_prefix}{prompt}' with system_prefix "
                      "'...within \\\\boxed{}.' (an f-string: single braces)",
            "max_new_tokens": "evaluate_pass_at3(max_new_tokens=512)",
            "sampling": "evaluate_pass_at3: generate(do_sample=True), temperature/top_p commented out, so the "
                        "model's generation config, and transformers' top_k=50 where it sets no top_k (4.56 in "
                        "requirements.txt; Qwen2.5-Math's configs are greedy and set none: the top 50 tokens, "
                        "not the whole vocabulary)",
            "arm": "aime2024_pass3: the ARM model loaded where choose_parameters has a setting; evaluate_pass_at3 "
                   "then calls generate without range_c/percentage, so the decoder layers run their defaults "
                   "(range_c=0.13, percentage=99.5; modeling_llama.py's arm pmin=0.2)",
            "n_samples": "evaluate_pass_at3(samples_per_task=20) (pass_3.py passes args.samples_per_task, "
                         "default 5 in args.py: use n_samples=5 to follow that)",
            "k": "evaluate_pass_at3: k = 3, pass_at_k_from_counts = 1 - C(n-c, k) / C(n, k) (unbiased)",
            "grader": "evaluate_pass_at3: the prompt stripped from the decoded text, then is_equiv "
                      "(paper-exact on the generation alone; an answer is_equiv raises on counts as wrong)",
        },
    )


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
    "arm-math500-t0.5": Protocol(
        name="arm-math500-t0.5",
        description="the authors' MATH-500 / AIME accuracy script sampled at temperature 0.5, top_p 0.95 (Table 8), "
                    "5 samples per problem (Best-of-N, N=5)",
        settings={"prompt_format": "paper", "max_new_tokens": 2048, "do_sample": True, "temperature": 0.5,
                  "top_p": 0.95, "n_samples": 5},
        notes="Table 8's settings as its caption states them (temperature 0.5, top_p 0.95); the released code has no "
              "script for them, so everything else is arm-math500's, and top_k, min_p and repetition_penalty stay "
              "the model's generation config's (transformers' top_k=50 where it sets none, as generate(do_sample="
              "True, temperature=0.5, top_p=0.95) applies them). The paper does not say how Best-of-N picks the best "
              "of the N=5 samples; lensprobe takes the majority answer (see the arm-table8 recipe).",
        sources={
            "sampling": "paper, Table 8 (p. 22): 'temperature 0.5, top_p 0.95'",
            "n_samples": "paper, Table 8: Best-of-N (N=5)",
            "prompt": "Math500/math500.py, as arm-math500",
            "max_new_tokens": "Math500/math500.py: max_new_tokens=2048, as arm-math500",
            "grader": "Math500/math500.py: is_equiv(decoded prompt + generation, answer) (paper-exact)",
        },
    ),
    "arm-aime-pass3": _pass3(
        "arm-aime-pass3", "layer-defaults",
        "as the code runs it: ARM at the decoder layers' defaults (c=0.13, percentile 99.5; Gemma fraction 0.13, "
        "quantile 0.995)",
        "ARM: the code's evaluate_pass_at3 passes no range_c/percentage to generate, so the decoder layers' defaults "
        "run (modeling_*.py: range_c=0.13, percentage=99.5), not the benchmark's choose_parameters (Table 9); "
        "arm-aime-pass3-text runs those"),
    "arm-aime-pass3-text": _pass3(
        "arm-aime-pass3-text", "preset",
        "as the paper's text has it: ARM at the benchmark's preset (Table 9 with --arm-source paper)",
        "ARM: the benchmark's preset (Table 9 with arm_source='paper'), where the code's pass@3 runs the decoder "
        "layers' defaults (arm-aime-pass3); everything else is the code's"),
}
"""The named protocols (see the module docs)."""


def arm_layer_defaults(protocol: str | None) -> bool:
    """Whether ``"ARM"`` conditions under ``protocol`` run the authors' decoder-layer defaults rather than the
    benchmark's preset (``Protocol.arm``; ``None``: the preset)."""
    return protocol is not None and get_protocol(protocol).arm == "layer-defaults"


def ungradable_is_wrong(protocol: str | None) -> bool:
    """Whether an answer the authors' grader raises on counts as wrong under ``protocol`` (their pass@3 loop)
    rather than making an error row (``Protocol.ungradable``; ``None``: an error row)."""
    return protocol is not None and get_protocol(protocol).ungradable == "wrong"


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


def grades_prompt(protocol: str | None, prompt_format: str = "paper") -> bool:
    """Whether ``paper-exact`` grades prompt + generation: only for the authors' own prompt string
    (``prompt_format="paper"``), as their MATH-500 script does (``protocol=None`` or a protocol whose
    ``grade_prompt`` says so). A chat prompt is never graded: its system message's own ``\\boxed{}``
    would be read as the answer (an empty box, which the authors' lenient rule accepts for every problem)."""
    if prompt_format != "paper":
        return False
    return True if protocol is None else get_protocol(protocol).grade_prompt
