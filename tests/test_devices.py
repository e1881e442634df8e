"""The oracle checks on every device: on the CPU here, on a GPU where one is present (``cuda`` tests).

The tiny seeded Llama is moved with ``lp.load_model(model, device=...)`` and compared with its plain
``transformers`` twin on the same device (``output_attentions=True``, greedy ``generate`` with scores)
and with arithmetic on its weights. The ``cuda`` cases run the same code; without a CUDA device they
are deselected (the terminal summary says so), and the CPU cases here prove the checks themselves.
"""

import copy

import pytest
import torch

import lensprobe as lp
from lensprobe.core.models.testing import tiny_model

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
TOL = 1e-4  # float32; a GPU's kernels round differently from the CPU's


@pytest.fixture(scope="module", params=DEVICES)
def pair(request, twin_of):
    """(model, twin) with the same weights on the device, float32."""
    model = lp.load_model(tiny_model(seed=5), device=request.param)
    twin = twin_of(model).to(request.param)
    return model, twin


@pytest.fixture(scope="module")
def prompts(pair):
    model, _ = pair
    return [lp.build_prompt(model, "What is 12+7?", filler=lp.Filler.meaningless(count=5)),
            lp.build_prompt(model, "What is 3*4?")]


def test_load_model_moves_every_weight_and_the_config(pair):
    model, twin = pair
    device = next(twin.parameters()).device
    assert {p.device for p in model.parameters()} == {device}
    assert torch.device(model.cfg.device).type == device.type


def test_logits_and_attention_equal_the_twins(pair, prompts):
    model, twin = pair
    p = prompts[0]
    tokens = p.tokens.to(next(twin.parameters()).device)
    with torch.inference_mode():
        out = twin(tokens, output_attentions=True)
    logits = lp.forward(model, p)
    assert logits.device == tokens.device
    assert torch.allclose(logits, out.logits, atol=TOL, rtol=TOL)
    pats = lp.attention_patterns(model, p, layers=[0, 1])
    for layer in (0, 1):
        assert pats[layer].device.type == "cpu"
        assert torch.allclose(pats[layer], out.attentions[layer][0].cpu(), atol=TOL)


def test_a_traced_batch_equals_the_twins_greedy_generate(pair, prompts):
    model, twin = pair
    device = next(twin.parameters()).device
    for engine in ("bridge", "hf"):
        trace = lp.trace_generation(model, prompts, max_new_tokens=5, stop_at_eos=False, engine=engine)
        assert trace.entropy_rows.device.type == "cpu" and trace.token_ids_rows.device.type == "cpu"
        for r, p in enumerate(prompts):
            with torch.inference_mode():
                ref = twin.generate(p.tokens.to(device), max_new_tokens=5, do_sample=False, output_scores=True,
                                    return_dict_in_generate=True, pad_token_id=twin.config.pad_token_id,
                                    eos_token_id=None)
            want = ref.sequences[0, p.tokens.shape[1]:].cpu()
            assert trace.token_ids_rows[r].tolist() == want.tolist(), engine
            for t, scores in enumerate(ref.scores):
                prob = torch.softmax(scores[0].double(), -1)
                by_hand = float(-(prob[prob > 0] * prob[prob > 0].log()).sum())
                assert abs(float(trace.entropy_rows[r, t]) - by_hand) < TOL


def test_head_ablation_equals_the_twin_with_that_heads_output_zeroed(pair, prompts):
    """Zeroing head h's z equals removing its columns' input to the twin's o_proj."""
    model, twin = pair
    layer, head = 1, 2
    d_head = model.cfg.d_head
    p = prompts[0]

    def zero_head(module, args):
        x = args[0].clone()
        x[..., head * d_head:(head + 1) * d_head] = 0
        return (x,)

    handle = twin.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(zero_head)
    try:
        with torch.inference_mode():
            want = twin(p.tokens.to(next(twin.parameters()).device)).logits
    finally:
        handle.remove()
    got = lp.forward(model, p, lp.ablate_heads((layer, head)))
    assert torch.allclose(got, want, atol=TOL, rtol=TOL)


def test_bf16_weights_on_the_device_match_float32_within_tolerance(pair, prompts):
    model, _ = pair
    half = lp.load_model(copy.deepcopy(model), dtype=torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    want = lp.attention_patterns(model, prompts[0], layers=[0, 1])
    got = lp.attention_patterns(half, prompts[0], layers=[0, 1])
    for layer in (0, 1):
        assert got[layer].dtype == torch.float32
        assert (got[layer] - want[layer]).abs().max() < 0.05
    trace = lp.trace_generation(half, prompts[0], max_new_tokens=3)
    assert trace.entropy_rows.dtype == torch.float32 and torch.isfinite(trace.entropy_rows).all()
