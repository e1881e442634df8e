"""Batch-invariant decode steps: an intervention that names a ``rounding_sensitive_layer`` (ARM) sees,
under continuous batching on the embedded model, exactly the activations its row sees alone (bit
for bit: the layers up to it run one row at a time), and the view is restored afterwards."""

import pytest
import torch

import lensprobe as lp
from lensprobe.core.hooks.attach import rounding_sensitive_layer
from lensprobe.generation.engines.view import attention_modules, mlp_modules, plain_model

TEXTS = ("What is 12+7?", "Compute the sum of the first ten odd numbers, then halve it.", "Is 91 prime?")
CAPS = [6, 9, 7]


class GateLog:
    """Records, per (trace row, step), the layer-0 MLP input ARM reads (``hook_pre``: the gate
    projection), the newest position only."""

    def __init__(self, sensitive: bool) -> None:
        self.capabilities = lp.interventions.Capabilities(rounding_sensitive_layer=0 if sensitive else None)
        self.seen: dict[tuple[int, int], torch.Tensor] = {}

    def hooks(self, model):
        def hook(act, hook):
            info = hook.step
            for i, (row, step) in enumerate(zip(info.rows.tolist(), info.steps.tolist(), strict=True)):
                self.seen[(row, step)] = act[i, -1].clone()
        return [("blocks.0.mlp.hook_pre", hook)]


def logged(model, prompts, sensitive: bool, **kw) -> dict:
    log = GateLog(sensitive)
    out = lp.generate(model, prompts, max_new_tokens=max(CAPS), caps=CAPS[:len(prompts)], stop_at_eos=False,
                      interventions=[log], engine="hf", **kw)
    return {"seen": log.seen, "ids": out.generated_ids, "entropy": out.entropy_rows, "meta": out.meta}


def alone(model, prompts, sensitive: bool) -> dict:
    """Each prompt in its own generation, keyed by its row in the batched run."""
    seen = {}
    for r, p in enumerate(prompts):
        log = GateLog(sensitive)
        lp.generate(model, [p], max_new_tokens=CAPS[r], stop_at_eos=False, interventions=[log], engine="hf")
        seen.update({(r, step): act for (_, step), act in log.seen.items()})
    return seen


@pytest.fixture(scope="module")
def smol_prompts(smol):
    return [lp.build_prompt(smol, t, system=lp.MATH_SYSTEM_PROMPT) for t in TEXTS]


def test_the_capability_is_read_from_the_interventions():
    assert rounding_sensitive_layer([lp.ARM(c=0.1, percentile=95, layer=3), ("x", print), GateLog(True)]) == 3
    assert rounding_sensitive_layer([("x", print), GateLog(False)]) is None


def test_a_sensitive_intervention_sees_each_rows_activations_bit_for_bit_as_alone(smol, smol_prompts):
    batched = logged(smol, smol_prompts, True, batch_size=2)
    solo = alone(smol, smol_prompts, True)
    assert batched["meta"]["rows_alone_through_layer"] == 0 and batched["meta"]["batching"] != "static"
    assert set(batched["seen"]) == set(solo) and len(solo) == sum(CAPS)
    unequal = [key for key, act in solo.items() if not torch.equal(batched["seen"][key], act)]
    assert unequal == []


def test_without_the_capability_batched_rows_differ_by_float_rounding(smol, smol_prompts):
    """The premise: on this CPU a multi-row decode step rounds differently from a row alone (else the
    test above would prove nothing)."""
    batched = logged(smol, smol_prompts, False, batch_size=2)
    solo = alone(smol, smol_prompts, False)
    assert batched["meta"]["rows_alone_through_layer"] is None
    diffs = [float((batched["seen"][key] - act).abs().max()) for key, act in solo.items()]
    assert max(diffs) > 0 and max(diffs) < 1e-3


def test_seeded_arm_rows_equal_their_prompts_alone_on_the_embedded_model(smol, smol_prompts):
    arm = lp.ARM(layer=0, c=0.1, percentile=95, seed=0)
    batched = lp.generate(smol, smol_prompts, max_new_tokens=max(CAPS), caps=CAPS, stop_at_eos=False,
                          interventions=[arm], batch_size=2)
    assert batched.meta["engine"] == "hf" and batched.meta["rows_alone_through_layer"] == 0
    for r, p in enumerate(smol_prompts):
        one = lp.generate(smol, [p], max_new_tokens=CAPS[r], stop_at_eos=False, interventions=[arm])
        assert batched.generated_ids[r] == one.generated_ids[0]
        # the layers after ARM's run batched: their floats round differently, the tokens do not part
        torch.testing.assert_close(batched.entropy_rows[r, :CAPS[r]], one.entropy_rows[0, :CAPS[r]],
                                   rtol=1e-4, atol=1e-5)


def test_the_view_is_restored_also_after_an_error(smol, smol_prompts):
    view = plain_model(smol, "sdpa")
    linears = [m for part in (attention_modules(smol, view)[0], mlp_modules(smol, view)[0])
               for m in part.modules() if isinstance(m, torch.nn.Linear)]
    calls = []
    q = linears[0]
    own = q.forward  # an instance forward of the owner's (as accelerate's device hooks install)

    def counted(x):
        calls.append(x.shape[0])
        return own(x)

    q.forward = counted
    before = view.config._attn_implementation

    class Boom(GateLog):
        def hooks(self, model):
            def hook(act, hook):
                if not hook.step.prefill:
                    raise RuntimeError("boom")
            return [("blocks.0.mlp.hook_pre", hook)]

    try:
        with pytest.raises(RuntimeError, match="boom"):
            lp.generate(smol, smol_prompts, max_new_tokens=4, stop_at_eos=False, interventions=[Boom(True)],
                        batch_size=2, engine="hf")
        assert calls and set(calls) == {1}  # the owner's forward ran, one row at a time at decode
        assert vars(q)["forward"] is counted and view.config._attn_implementation == before
        assert all("forward" not in vars(m) for m in linears[1:])
    finally:
        del q.forward


def test_recorded_attention_is_unchanged_when_rows_run_alone(tiny):
    """Attention recording (the view's ``sdpa_last`` rows, put back at each row's own key positions)
    gives the same traces with the layers computed one row at a time as batched."""
    prompts = [lp.build_prompt(tiny, t) for t in ("the cat sat on the mat", "x", "0 1 2 3")]
    runs = [lp.trace_generation(tiny, prompts, max_new_tokens=5, stop_at_eos=False, interventions=[GateLog(flag)],
                                track={"prompt": "prompt", "generated": "generated"}, layers=[0, 1], engine="hf")
            for flag in (True, False)]
    assert runs[0].meta["rows_alone_through_layer"] == 0 and runs[1].meta["rows_alone_through_layer"] is None
    assert runs[0].generated_ids == runs[1].generated_ids
    for name in ("prompt", "generated"):
        torch.testing.assert_close(runs[0].attention[name], runs[1].attention[name], rtol=1e-5, atol=1e-6)
        assert runs[0].attention[name].abs().sum() > 0
