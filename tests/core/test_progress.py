"""The progress bar: tqdm's notebook widget only where ipywidgets is installed, else the text bar (a
notebook without ipywidgets then shows a text bar, not tqdm's "IProgress not found" warning)."""

import importlib
import importlib.util

import tqdm
import tqdm.auto

import lensprobe.core.progress as progress


def reloaded_with(monkeypatch, ipywidgets: bool):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (real("tqdm") if ipywidgets else None) if name == "ipywidgets" else real(name, *a))
    try:
        return importlib.reload(progress).tqdm
    finally:
        monkeypatch.undo()
        importlib.reload(progress)


def test_the_text_bar_without_ipywidgets_and_tqdm_auto_with_it(monkeypatch):
    assert reloaded_with(monkeypatch, ipywidgets=False) is tqdm.tqdm
    assert reloaded_with(monkeypatch, ipywidgets=True) is tqdm.auto.tqdm
