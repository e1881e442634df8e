"""The latent-thinking study: entropy and attention onto thinking tokens per generation step.

Reproduces the analysis of LT-Tuning (arXiv 2602.10229) on any TransformerLens model: the
same prompts are generated under several thinking settings (latent fusion, Coconut,
Soft-Thinking, pause tokens, no thinking) with one schedule, and every step's next-token
entropy and attention proportion onto the thinking positions are traced
(:func:`lensprobe.trace_generation`). The figure shows the mean over prompts (or samples)
with a shaded band.

On a model that was never trained with a thinking token (such as the embedded
SmolLM2-135M-Instruct) the token is added with the mean input embedding
(:func:`lensprobe.generation.add_thinking_token`) and a fixed schedule decides when to think: this shows
the instrument at work, not the paper's trained behaviour.

Example:
    >>> import lensprobe as lp
    >>> from lensprobe.studies.thinking import compare_thinking, THINKING_SETTINGS
    >>> traces = compare_thinking(model, [prompt], ["fusion", "pause", "none"], max_new_tokens=128,
    ...                           think_when=lp.generation.schedule.every(8))
    >>> fig = lp.viz.generation_trace_figure(lp.generation.trace_summary(traces))
"""

import copy
from collections.abc import Mapping, Sequence

from lensprobe.core.errors import LensprobeError
from lensprobe.core.lazy import pandas
from lensprobe.generation.config import GenerationConfig, generation_config
from lensprobe.generation.loop import trace_generation
from lensprobe.generation.thinking.latent import THINKING_TOKEN, LatentFusion, Pause, add_thinking_token
from lensprobe.generation.thinking.schedule import every
from lensprobe.generation.traces.trace import GenerationTrace

THINKING_SETTINGS = ("fusion", "coconut", "soft", "pause", "none")
"""Names of the thinking settings: LT-Tuning fusion, Coconut, Soft-Thinking, pause tokens, none."""

SETTING_LABELS = {
    "fusion": "LatentFusion (alpha=0.6)",
    "coconut": "Coconut (alpha=1)",
    "soft": "Soft-Thinking (alpha=0)",
    "pause": "Pause",
    "none": "no thinking",
}


def thinking_setting(name: str, *, alpha: float = 0.6, top_p: float = 0.9, temperature: float = 1.0,
                     token: str = THINKING_TOKEN) -> LatentFusion | Pause | None:
    """The thinking input of a setting name (see :data:`THINKING_SETTINGS`).

    Example:
        >>> thinking_setting("soft")
        LatentFusion(alpha=0.0, top_p=0.9, temperature=1.0, token='<thinking>')
    """
    if name == "fusion":
        return LatentFusion(alpha=alpha, top_p=top_p, temperature=temperature, token=token)
    if name == "coconut":
        return LatentFusion(alpha=1.0, top_p=top_p, temperature=temperature, token=token)
    if name == "soft":
        return LatentFusion(alpha=0.0, top_p=top_p, temperature=temperature, token=token)
    if name == "pause":
        return Pause(token=token)
    if name == "none":
        return None
    raise LensprobeError(f"unknown thinking setting {name!r}: choose from {', '.join(THINKING_SETTINGS)}.")


def with_thinking_token(model, token: str = THINKING_TOKEN):
    """The model itself if its vocabulary holds ``token``, else a copy with the token added."""
    ids = model.tokenizer.encode(token, add_special_tokens=False)
    if len(ids) == 1 and model.tokenizer.decode(ids) == token:
        return model
    model = copy.deepcopy(model)
    add_thinking_token(model, token)
    return model


def compare_thinking(model, prompts, settings: Sequence[str] | Mapping[str, object],
                     config: GenerationConfig | None = None, *, track: Mapping | None = None, layers=None,
                     progress: bool = False, record=None, **generation) -> dict[str, GenerationTrace]:
    """Trace the same prompts under several thinking settings with one schedule.

    Args:
        model: a model whose vocabulary holds the thinking token (see :func:`with_thinking_token`).
        prompts: one prompt or a list (batched with left padding).
        settings: names from :data:`THINKING_SETTINGS`, or ``{label: LatentFusion | Pause | None}``.
        config: a :class:`~lensprobe.GenerationConfig`; its ``thinking`` is replaced by each
            setting's. Default schedule (``think_when``): ``every(8)``.
        track, layers, record: as in :func:`lensprobe.trace_generation`; ``"thinking"`` is tracked for
            the thinking settings.
        progress: a progress bar (tokens per second) per setting.
        **generation: :class:`~lensprobe.GenerationConfig` fields as keywords
            (``max_new_tokens=128, think_when=lp.generation.schedule.every(4), n_samples=4, ...``).

    Returns:
        Setting label -> trace, in the order given.
    """
    if not isinstance(settings, Mapping):
        settings = {SETTING_LABELS.get(s, s): thinking_setting(s) for s in settings}
    think_when = generation.pop("think_when", None)
    think_when = think_when if think_when is not None else (config.think_when if config is not None else None)
    think_when = every(8) if think_when is None else think_when
    base = generation_config(config, {**generation, "thinking": None, "think_when": None})
    out = {}
    for label, thinking in settings.items():
        cfg = base.replace(thinking=thinking, think_when=think_when if thinking is not None else None)
        out[label] = trace_generation(model, prompts, cfg, track=dict(track or {}), layers=layers,
                                      progress=label if progress else False, record=record)
    return out


def texts_table(traces: Mapping[str, GenerationTrace], max_chars: int = 400):
    """Generated texts per setting and row (the thinking token shown as ``<thinking>``)."""
    pd = pandas()
    rows = []
    for label, tr in traces.items():
        for r in range(tr.n_rows):
            rows.append({"setting": label, "prompt": tr.prompt_index[r], "sample": tr.sample_index[r],
                         "tokens": tr.lengths[r], "thinking_steps": int(tr.thinking_rows[r].sum()),
                         "finish": tr.finish_reasons[r], "text": tr.texts[r][:max_chars]})
    return pd.DataFrame(rows)


# ----- the demo section -------------------------------------------------------------------


# ----- the CLI subcommand -----------------------------------------------------------------


