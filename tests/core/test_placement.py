"""Every tensor lensprobe makes for a model is made on the model's device; results come back on the CPU.

No GPU is needed. On a GPU the model's device (``cuda``) differs from torch's default device (the CPU),
and a tensor made without ``device=`` lands on the wrong one. Here the mirror image is set up: the model
stays on the CPU while torch's default device is ``meta`` (tensors there hold no data). A tensor that
lensprobe makes without naming its device lands on ``meta``, and the first operation that mixes it with a
real tensor, reads a value from it or copies it fails, naming the line. Each public entry point runs
under that setting, and its numbers must equal the same call run normally.
"""

import contextlib

import pytest
import torch

import lensprobe as lp
from lensprobe.core.models.testing import tiny_model


@contextlib.contextmanager
def default_device_elsewhere():
    """Tensors made without an explicit device go to ``meta`` while this is open."""
    before = torch.get_default_device()
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(before)


@pytest.fixture(scope="module")
def model():
    m = tiny_model(seed=3)
    lp.generation.add_thinking_token(m, "<thinking>")
    return m


@pytest.fixture(scope="module")
def prompts(model):
    filler = lp.Filler.meaningless(count=4)
    return [lp.build_prompt(model, "What is 12+7?", filler=filler), lp.build_prompt(model, "What is 3*4?")]


def _cpu_tensors(x):
    """Every tensor inside a result (dataclass, dict, list, DataFrame cells aside)."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _cpu_tensors(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _cpu_tensors(v)
    elif hasattr(x, "__dataclass_fields__"):
        for name in x.__dataclass_fields__:
            yield from _cpu_tensors(getattr(x, name))


def _same(a, b):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b) or torch.allclose(a, b, equal_nan=True, atol=1e-6)
    elif hasattr(a, "equals"):  # DataFrame / Series; an evaluation's timings differ run to run
        assert a.drop(columns=["seconds"], errors="ignore").equals(b.drop(columns=["seconds"], errors="ignore"))
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif hasattr(a, "__dataclass_fields__"):
        for name in a.__dataclass_fields__:
            if name != "meta":
                _same(getattr(a, name), getattr(b, name))
    else:
        assert a == b


ENTRY_POINTS = {
    "build_prompt": lambda m, ps: lp.build_prompt(m, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT,
                                                  filler=lp.Filler.meaningful(count=3)).tokens,
    "forward": lambda m, ps: lp.forward(m, ps[0]),
    "attention_patterns": lambda m, ps: lp.attention_patterns(m, ps[0], layers=[0, 1]),
    "entropy measure": lambda m, ps: lp.metrics.measure_once(m, lp.metrics.NextTokenEntropy(), ps[0]),
    "generate, batch of two": lambda m, ps: lp.generate(m, ps, max_new_tokens=3, engine="bridge"),
    "generate, plain engine": lambda m, ps: lp.generate(m, ps, max_new_tokens=3, engine="hf"),
    "generate, sampled": lambda m, ps: lp.generate(m, ps[0], max_new_tokens=3, do_sample=True, seed=1,
                                                   n_samples=2, engine="bridge"),
    "trace_generation": lambda m, ps: lp.trace_generation(m, ps[0], max_new_tokens=3,
                                                          track={"filler": "filler"}, engine="bridge"),
    "trace_generation, plain engine": lambda m, ps: lp.trace_generation(m, ps, max_new_tokens=3, engine="hf"),
    "ablation during generation": lambda m, ps: lp.generate(
        m, ps, max_new_tokens=3, interventions=[lp.ablate_heads([(0, 1), (1, 2)], positions="generated")]),
    "ablation by position": lambda m, ps: lp.forward(m, ps[0], lp.ablate_heads((0, 1), positions=[1, 2])),
    "kv-group ablation": lambda m, ps: lp.forward(m, ps[0], lp.interventions.ablate_kv_group("L1G0")),
    "mean ablation": lambda m, ps: lp.forward(m, ps[0], lp.ablate_heads(
        (1, 0), method="mean", reference=lp.interventions.head_means(m, ps, layers=[1]))),
    "head_means": lambda m, ps: lp.interventions.head_means(m, ps, layers=[0]),
    "ablation_sweep": lambda m, ps: lp.ablation_sweep(m, ps[0], "entropy", progress=False).table,
    "patch": lambda m, ps: lp.patch(m, ps[0], ps[1], "blocks.0.hook_resid_post",
                                    segments="question").to_dataframe(),
    "latent thinking": lambda m, ps: lp.trace_generation(
        m, ps[0], max_new_tokens=4, thinking=lp.generation.LatentFusion(alpha=0.6, top_p=0.9),
        think_when=lp.generation.schedule.every(2), engine="bridge"),
    "pause thinking": lambda m, ps: lp.generate(m, ps[0], max_new_tokens=4, thinking=lp.generation.Pause(),
                                                think_when=lp.generation.schedule.every(2)),
    "ARM": lambda m, ps: lp.generate(m, ps, max_new_tokens=3, interventions=[lp.ARM(c=0.2, percentile=95, seed=0)]),
    "activation_stats": lambda m, ps: lp.studies.activation_stats(m, {
        "w/o": lp.build_prompt(m, "What is 3*4?"),
        "w/ Mless": lp.build_prompt(m, "What is 3*4?", filler=lp.Filler.meaningless(count=4))}),
    "evaluate": lambda m, ps: lp.evaluate(
        m, [lp.evals.Problem(id="a", problem="What is 3+4?", answer="7"),
            lp.evals.Problem(id="b", problem="What is 2*3?", answer="6")],
        ["w/o", "w/ Mless"], max_new_tokens=3, progress=False),
}


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_tensors_are_made_on_the_models_device_and_results_come_back_on_the_cpu(name, model, prompts):
    run = ENTRY_POINTS[name]
    expected = run(model, prompts)
    with default_device_elsewhere():
        got = run(model, prompts)
    for t in _cpu_tensors(got):
        assert t.device.type == "cpu", f"{name}: a result tensor is on {t.device}"
    _same(got, expected)


def test_the_setting_catches_a_tensor_made_without_a_device(model, prompts):
    """The check can fail: a hook that makes its replacement without ``device=`` is caught."""

    def careless(z, hook):
        return z * torch.ones(z.shape[-1])  # made on the default device, not z's

    with default_device_elsewhere(), pytest.raises((RuntimeError, NotImplementedError), match="meta"):
        lp.forward(model, prompts[0], ("blocks.0.attn.hook_z", careless))
