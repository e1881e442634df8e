"""How many runs a reproduced cell gets: ``--runs N`` is N seeded runs only where the run's generation samples.

The generation that runs is the run's protocol or format as :func:`lensprobe.evaluate` applies it
(:func:`~lensprobe.evals.running.config.with_format_defaults`), not the model's generation config on its own:
a model whose ``generation_config.json`` samples (``do_sample=true``) decodes greedily under the chat format
or a greedy protocol, and then every seed would give the same rows. Such a cell runs once and the table's
notes say why; a sampling generation config that the run does not follow is named too.

Example:
    >>> run_samples(model, {"protocol": "arm-math500"})   # the model's own sampling settings
    False
"""

from typing import Any

from lensprobe.evals.running.config import EvalConfig, model_samples, with_format_defaults

__all__ = ["run_samples", "runs_notes"]


def run_samples(model: Any, settings: dict) -> bool:
    """Whether the generation of a run with ``settings`` (what :func:`lensprobe.evaluate` is given) samples.

    Example:
        >>> run_samples(model, {"batch_size": 8})   # the chat format decodes greedily unless asked
        False
    """
    return bool(EvalConfig(**with_format_defaults(model, dict(settings))).do_sample)


def runs_notes(model: Any, settings: dict, bench: str, fixed: list[str], runs: int) -> list[str]:
    """The table's notes on the runs of ``bench``: the conditions that ran once of ``runs`` (``fixed``: their rows
    do not depend on the seed) and why, and a model whose generation config samples under a run that does not.

    Example:
        >>> runs_notes(model, {}, "math500", ["w/o"], 3)[0]
        'math500: w/o: greedy: one run; --runs 3 would repeat it (...)'
    """
    how = f"protocol {settings['protocol']!r}" if settings.get("protocol") else "the chat format"
    notes = []
    if runs > 1 and fixed:
        notes.append(f"{bench}: {', '.join(fixed)}: greedy: one run; --runs {runs} would repeat it ({how} decodes "
                     "greedily and no intervention of theirs draws random numbers, so every run would give the same "
                     "rows).")
    if model_samples(model) and not run_samples(model, settings):
        notes.append(f"{bench}: the model's generation config samples (do_sample=true), but {how} decodes greedily: "
                     "every cell is greedy decoding, not the model's own sampling.")
    return notes
