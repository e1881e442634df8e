"""Attention to token classes across layers (arXiv 2512.24532): the attention mass that queries put
on classes of key tokens (``#``, ``*``, whitespace) at chosen layers, compared between conditions or
models, on a random ASCII grid.

Example:
    >>> p = lp.build_prompt(model, ascii_grid())
    >>> compare_token_class_attention({"SmolLM2": (model, p)}, layers=class_layers(model))
"""

import random
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.forward import attention_patterns
from lensprobe.core.lazy import pandas
from lensprobe.core.measures.metrics import DEFAULT_TOKEN_CLASSES, attention_by_token_class, token_class_mask
from lensprobe.core.models.loading import check_layers
from lensprobe.core.prompts.prompt import Prompt

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ascii_grid", "class_layers", "compare_token_class_attention"]


def ascii_grid(rows: int = 8, cols: int = 16, *, seed: int = 0, chars: str = "#* ") -> str:
    """A random grid of ``#``, ``*`` and spaces (the token-class study's input), rows joined by newlines.

    Example:
        >>> ascii_grid(2, 4, seed=1)
        '# #*\\n*** '
    """
    if rows <= 0 or cols <= 0:
        raise LensprobeError(f"grid needs rows > 0 and cols > 0, got {rows}x{cols}.")
    rng = random.Random(seed)
    return "\n".join("".join(rng.choice(chars) for _ in range(cols)) for _ in range(rows))


def compare_token_class_attention(runs: Mapping[str, tuple[Any, Prompt]], layers: Sequence[int],
                          classes: Mapping[str, str | Callable[[str], bool]] | None = None,
                          *, other: bool = True) -> "pd.DataFrame":
    """Attention mass per token class at chosen layers, for several (model, prompt) runs.

    Uses ``lp.metrics.attention_by_token_class``: for each query and head, the sum of attention on
    the class's key tokens, then the mean over queries and heads.

    Args:
        runs: ``{group: (model, prompt)}``, e.g. two conditions on one model
            (``{"w/o filler": (m, p0), "Mless": (m, p1)}``) or two models on the same text.
        layers: 0-based layers (each must exist in every model).
        classes: name -> rule (default ``#``, ``*``, whitespace).
        other: add an ``other`` row holding the rest of the mass (1 - the classes' sum),
            only when no token falls in two classes.

    Returns:
        Columns ``group``, ``layer``, ``layer_label`` ("L0"), ``token_class``, ``attention``,
        ``n_tokens`` (key tokens in the class).

    Example:
        >>> p = lp.build_prompt(model, ascii_grid())
        >>> compare_token_class_attention({"SmolLM2": (model, p)}, layers=[0, 16])
    """
    classes = dict(DEFAULT_TOKEN_CLASSES if classes is None else classes)
    rows = []
    for group, (model, prompt) in runs.items():
        lay = check_layers(model, list(layers))
        pats = attention_patterns(model, prompt, lay)
        per = attention_by_token_class({layer: pats[layer].float() for layer in lay}, prompt.str_tokens, classes)
        mask = token_class_mask(prompt.str_tokens, classes)
        counts = mask.sum(-1).tolist()
        disjoint = bool((mask.sum(0) <= 1).all())
        for i, layer in enumerate(sorted(lay)):
            for j, name in enumerate(classes):
                rows.append((group, layer, f"L{layer}", name, float(per[i, j]), int(counts[j])))
            if other and disjoint:
                rows.append((group, layer, f"L{layer}", "other", max(0.0, 1.0 - float(per[i].sum())),
                             len(prompt.str_tokens) - int(sum(counts))))
    return pandas().DataFrame(rows, columns=["group", "layer", "layer_label", "token_class", "attention", "n_tokens"])


def class_layers(model) -> list[int]:
    """Layers of the token-class study: the paper's 0/16/20/27 when the model has them, else 4 spread out."""
    n = int(model.cfg.n_layers)
    if n >= 28:
        return [0, 16, 20, 27]
    return sorted({0, n // 2, (3 * n) // 4, n - 1})
