"""Shared fixtures: a tiny random GQA Llama (fast) and the embedded SmolLM2 model (real), each with
a plain ``transformers`` twin that oracle tests compute expected values on."""

import copy
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


@pytest.fixture(scope="session", autouse=True)
def _tqdm_lock_of_this_session():
    """tqdm guards its bars with a lock every process forked after its first bar shares (a
    multiprocessing semaphore, beside a thread lock). Mutation runs (``tests/mutate.py``) fork a process per
    mutant, two at a time, after running the tests once; there ``tqdm(...)`` was seen waiting for ever on
    that lock, so that every later mutant of ``run_sharded`` timed out. Each session's bars take a thread
    lock of its own."""
    import threading

    from tqdm import tqdm

    before = tqdm.__dict__.get("_lock")
    tqdm.set_lock(threading.RLock())
    yield
    if before is None:
        del tqdm._lock
    else:
        tqdm.set_lock(before)


@pytest.fixture(autouse=True)
def _lensprobe_warnings_are_errors():
    """Every warning lensprobe issues (a ``LensprobeWarning``, whichever frame its ``stacklevel`` names)
    fails the test; a test that expects one says so with ``pytest.warns``. pyproject.toml's
    ``error:::lensprobe`` alone would miss them: a warning is credited to the caller its stacklevel
    names (the user's code, or jaxtyping's checking wrapper), not to lensprobe."""
    import warnings

    from lensprobe.core.errors import LensprobeWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error", LensprobeWarning)
        yield


@pytest.fixture(autouse=True)
def _runtime_type_checks(request):
    """The suite checks lensprobe's annotations at run time (jaxtyping shapes with beartype: the
    ``--jaxtyping-packages`` option in pyproject.toml's addopts). A test marked ``unchecked`` passes
    values outside the annotations on purpose, to test lensprobe's own error messages (what a user
    without a type checker sees): it runs with the checks off."""
    if request.node.get_closest_marker("unchecked") is None:
        yield
        return
    import jaxtyping

    before = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping.config.update("jaxtyping_disable", before)


@pytest.fixture(scope="session")
def tiny():
    from lensprobe.core.models.testing import tiny_model

    return tiny_model(seed=0)


def plain_twin(model):
    """A plain ``transformers`` model with ``model``'s weights, for computing expected values.

    Built from the bridge's Hugging Face config with ``from_config`` (eager attention, so
    ``output_attentions=True`` works) and loaded with the bridge's state dict, the wrapper
    prefixes stripped. No bridge component and no lensprobe code runs in its forward.
    """
    from transformers import AutoModelForCausalLM

    wrapped = model.original_model
    weights = {}
    for key, value in wrapped.state_dict().items():
        weights.setdefault(key.replace("._original_component", ""), value.detach().clone())
    config = copy.deepcopy(wrapped.config)
    config.vocab_size = int(weights["model.embed_tokens.weight"].shape[0])
    twin = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    wanted = twin.state_dict().keys()
    missing = sorted(set(wanted) - set(weights))
    assert not missing, f"the bridge's state dict lacks {missing}"
    twin.load_state_dict({k: weights[k] for k in wanted}, strict=True)
    extra_bias = weights.get("lm_head.bias")  # the bridge adds a zero unembedding bias
    assert extra_bias is None or not extra_bias.any(), "the bridge's unembedding bias is not zero"
    return twin.eval()


@pytest.fixture(scope="session")
def tiny_hf(tiny):
    """The ``tiny`` fixture's weights in a plain ``LlamaForCausalLM`` (see :func:`plain_twin`)."""
    return plain_twin(tiny)


@pytest.fixture(scope="session")
def twin_of():
    """:func:`plain_twin` for models a test builds itself (another seed, a thinking token)."""
    return plain_twin


DESELECTED = pytest.StashKey[dict]()


def _unavailable() -> dict[str, str]:
    """Markers whose tests cannot run here, with the reason (they are deselected, never skipped)."""
    from importlib.metadata import version

    import torch

    from lensprobe.core.models.kinds import hooked_transformer_class

    out = {}
    if hooked_transformer_class() is None:
        out["hooked"] = (f"transformer-lens {version('transformer-lens')} has no HookedTransformer (removed in "
                         "4.0); `make test-tl3` runs them with TransformerLens 3.x")
    if int(version("transformer-lens").split(".")[0]) < 4:
        out["offload"] = (f"transformer-lens {version('transformer-lens')}'s bridge refuses disk offload; the main suite "
                          "runs them with TransformerLens 4")
    if not torch.cuda.is_available():
        out["cuda"] = "no CUDA device here; they run the same checks on a GPU where one is present"
    return out


def pytest_collection_modifyitems(config, items):
    """A test that takes the embedded model (the ``smol`` fixture) is a slow test.

    ``hooked`` tests need TransformerLens 3.x (``HookedTransformer``) and ``cuda`` tests a GPU:
    where that is missing they are deselected, not skipped, and the summary says how many and why."""
    for item in items:
        if "smol" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    counts = {}
    for marker, reason in _unavailable().items():
        out = [item for item in items if item.get_closest_marker(marker) is not None]
        if out:
            items[:] = [item for item in items if item.get_closest_marker(marker) is None]
            config.hook.pytest_deselected(items=out)
            counts[marker] = (len(out), reason)
    config.stash[DESELECTED] = counts


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for marker, (count, reason) in config.stash.get(DESELECTED, {}).items():
        terminalreporter.write_line(f"{count} {marker} tests deselected: {reason}.")


@pytest.fixture(autouse=True)
def _fast_tests_never_load_the_embedded_model(request, monkeypatch):
    """Outside ``slow`` tests, loading the embedded SmolLM2 fails: the fast tier stays fast."""
    if request.node.get_closest_marker("slow") is not None:
        return
    import lensprobe.core.models.loading as models

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
def smol_hf(smol):
    """SmolLM2 loaded on its own by ``transformers`` from the converted safetensors folder
    (eager attention, float32), with no bridge around it."""
    import torch
    from transformers import AutoModelForCausalLM

    from lensprobe.core.models.loading import converted_gguf_folder, embedded_gguf_path, quiet

    with quiet():
        hf = AutoModelForCausalLM.from_pretrained(
            str(converted_gguf_folder(embedded_gguf_path())), attn_implementation="eager", dtype=torch.float32
        )
    return hf.eval()


@pytest.fixture(scope="session")
def math500_path() -> Path:
    assert MATH500.is_file(), f"MATH-500 not found at {MATH500}; the repo expects ../shared beside it"
    return MATH500


# Seconds rank 0 of a sharded run waits without news from the other ranks (LENSPROBE_STALL_TIMEOUT; an
# hour outside the suite). A fast test runs its ranks one after another in one process, so rank 0's
# wait finds every unit at once and a merge bug fails in seconds; a slow test's ranks are processes that
# load a real model side by side, and a busy machine may keep one of them silent for a minute.
STALL_LIMITS = {"fast": 10, "slow": 240}


@pytest.fixture(autouse=True)
def _short_stall_limit(request, monkeypatch):
    """Every wait for other ranks gives up within the test's timeout (pyproject.toml's pytest
    ``timeout``) with lensprobe's own error, instead of waiting an hour; subprocesses inherit it."""
    from lensprobe.core.storage.store import STALL_TIMEOUT_VAR

    tier = "slow" if request.node.get_closest_marker("slow") is not None else "fast"
    monkeypatch.setenv(STALL_TIMEOUT_VAR, str(STALL_LIMITS[tier]))


@pytest.fixture(autouse=True)
def _offline_hub(monkeypatch):
    # Nothing in the suite may reach the hub.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
