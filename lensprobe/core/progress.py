"""The progress bar every lensprobe loop shows: tqdm's notebook widget where ipywidgets is installed
(``tqdm.auto``), else tqdm's text bar, so that a notebook without ipywidgets shows a text bar instead of
tqdm's "IProgress not found" warning.

Example:
    >>> from lensprobe.core.progress import tqdm
    >>> for _ in tqdm(range(3), desc="steps"): ...
"""

import importlib.util

if importlib.util.find_spec("ipywidgets") is not None:
    from tqdm.auto import tqdm
else:
    from tqdm import tqdm

__all__ = ["tqdm"]
