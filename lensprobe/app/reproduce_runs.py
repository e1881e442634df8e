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

import tempfile
from pathlib import Path
from typing import Any

from lensprobe.core.hooks.capabilities import capabilities
from lensprobe.evals.results.folder import read_config
from lensprobe.evals.running.config import EvalConfig, model_samples, with_format_defaults
from lensprobe.evals.running.harness import evaluate

__all__ = ["run_samples", "runs_notes", "seeded_runs", "varies"]


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


def seeded_runs(run: Any, bench: str, problems, conds, samples: bool, out: Path | None) -> list[tuple]:
    """``(seed, rows, config)`` per run of ``run`` (the reproduction: its model, name, runs, settings, progress): every condition with seed 0, then seeds 1 .. runs-1 of the conditions
    whose rows depend on the seed; ``config`` is what the run's folder records (its ``config.json``; without
    ``out``, the run goes to a temporary folder, removed after it is read)."""
    done = []
    with tempfile.TemporaryDirectory(prefix="lensprobe-reproduce-") as tmp:
        runs = Path(tmp) if out is None else out / "runs"
        for seed in range(run.runs):
            todo = conds if seed == 0 else [c for c in conds if varies(c, samples)]
            if not todo:
                break
            folder = runs / (bench if seed == 0 else f"{bench}.seed{seed}")
            rows = evaluate(run.model, problems, todo, out=folder, model_name=run.name, benchmark=bench,
                            progress=run.progress, seed=seed, **run.settings)
            done.append((seed, rows, read_config(folder)))
    return done


def varies(cond, samples: bool) -> bool:
    """Whether a condition's rows depend on the seed: the model samples, or an intervention draws random numbers."""
    return samples or any(capabilities(i).seeded for i in cond.interventions)
