"""Shared fixtures: a tiny random GQA Llama (fast) and the embedded SmolLM2 model (real)."""

import os
from pathlib import Path

import pytest

MATH500 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "math500" / "test.jsonl"


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    """One intra-op thread: the suite's matrices are small, and on a shared 2-core machine
    spinning thread pools make small ops up to 10x slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny():
    from lensprobe.core.testing import tiny_model

    return tiny_model(seed=0)


def pytest_collection_modifyitems(config, items):
    """A test that takes the embedded model (the ``smol`` fixture) is a slow test."""
    for item in items:
        if "smol" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _fast_tests_never_load_the_embedded_model(request, monkeypatch):
    """Outside ``slow`` tests, loading the embedded SmolLM2 fails: the fast tier stays fast."""
    if request.node.get_closest_marker("slow") is not None:
        return
    import lensprobe.core.models as models

    embedded = models.embedded_gguf_path().resolve()
    convert = models.converted_gguf_folder

    def refuse_embedded(gguf):
        if Path(gguf).resolve() == embedded:
            raise AssertionError(f"{request.node.nodeid} loads the embedded model: mark it @pytest.mark.slow")
        return convert(gguf)

    monkeypatch.setattr(models, "converted_gguf_folder", refuse_embedded)


@pytest.fixture(scope="session")
def smol():
    import lensprobe as lp

    return lp.load_model()


@pytest.fixture(scope="session")
def math500_path() -> Path:
    assert MATH500.is_file(), f"MATH-500 not found at {MATH500}; the repo expects ../shared beside it"
    return MATH500


@pytest.fixture(autouse=True)
def _offline_hub(monkeypatch):
    # Nothing in the suite may reach the hub.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
