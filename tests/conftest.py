"""Shared fixtures: a tiny random GQA Llama (fast) and the embedded SmolLM2 model (real)."""

import os
from pathlib import Path

import pytest

MATH500 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "math500" / "test.jsonl"


@pytest.fixture(scope="session")
def tiny():
    from lensprobe.testing import tiny_model

    return tiny_model(seed=0)


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
