"""Heavy libraries, imported on first use so that ``import lensprobe`` loads little beyond torch.

Every module of lensprobe imports what it needs at the top, except the libraries listed in
:data:`HEAVY`, which take from half a second (pandas) to several seconds (transformer_lens)
to import and are needed by only some calls: those go through :func:`heavy` (or
:func:`pandas`) at the point of use. :mod:`lensprobe.viz` imports plotly at the top of its
modules instead, because the whole package is imported on first use of ``lp.viz``.

Example:
    >>> pd = pandas()
    >>> TransformerBridge = heavy("transformer_lens.model_bridge").TransformerBridge
"""

import importlib
from types import ModuleType

HEAVY = ("pandas", "pyarrow", "circuitsvis", "transformers", "transformer_lens", "tokenizers", "huggingface_hub",
         "datasets", "math_verify")
"""Libraries imported on first use rather than with lensprobe."""


def heavy(name: str) -> ModuleType:
    """Import ``name`` (a module of one of the :data:`HEAVY` libraries) now, once, and return it.

    Raises:
        ValueError: ``name`` is not part of a library in :data:`HEAVY` (import it at the top of
            the module instead).
        ImportError: the library is not installed.
    """
    if name.split(".")[0] not in HEAVY:
        raise ValueError(f"{name!r} is not a heavy library of lensprobe ({', '.join(HEAVY)}): import it at the top.")
    return importlib.import_module(name)


def pandas() -> ModuleType:
    """The pandas module (imported on first use)."""
    return heavy("pandas")
