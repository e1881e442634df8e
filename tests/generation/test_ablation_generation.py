"""Head ablation inside trace_generation equals greedy generation with the head zeroed by hand
in a separately built plain transformers model (KV-cached, one new position per step)."""

import pytest
import torch

import lensprobe as lp
from lensprobe.interventions.ablation import ablate_heads

# The tiny random model's next-token distributions are close to uniform over 400 tokens, so an
# ablation moves its entropies by 1e-5 to 1e-4: the comparisons are tight enough to tell.
TOL = 1e-5


def entropy_by_hand(logits: torch.Tensor) -> float:
    p = torch.softmax(logits.double(), -1)
    return float(-torch.where(p > 0, p * p.log(), 0.0).sum())


def hf_greedy(hf, tokens, n_steps, edit=None, layer=0):
    """Greedy decoding with a plain Hugging Face model and its own KV cache, by hand.

    ``edit(x, prompt_forward: bool) -> x`` edits the input of ``layers[layer].self_attn.o_proj``
    ([batch, pos, n_heads * d_head]) at every forward.
    """
    state = {"prompt": True}
    handle = None
    if edit is not None:
        def pre(mod, args):
            return (edit(args[0].clone(), state["prompt"]),)

        handle = hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(pre)
    ids, ents = [], []
    try:
        with torch.inference_mode():
            out = hf(tokens, use_cache=True)
            state["prompt"] = False
            for _ in range(n_steps):
                logits = out.logits[:, -1]
                ents.append(entropy_by_hand(logits[0]))
                nxt = logits.argmax(-1)
                ids.append(int(nxt[0]))
                out = hf(nxt[:, None], past_key_values=out.past_key_values, use_cache=True)
    finally:
        if handle is not None:
            handle.remove()
    return ids, torch.tensor(ents, dtype=torch.float64)


def zero_head(head, d_head, positions=None, when="always"):
    def edit(x, prompt_forward):
        if when == "prompt" and not prompt_forward or when == "generated" and prompt_forward:
            return x
        sl = slice(head * d_head, (head + 1) * d_head)
        if positions is None:
            x[..., sl] = 0
        else:
            x[:, positions, sl] = 0
        return x

    return edit


@pytest.fixture(scope="module")
def prompt(tiny):
    return lp.build_prompt(tiny, "What is 12+7?", system="Please reason step by step.",
                           filler=lp.Filler.meaningless(count=4))


def test_trace_generation_with_ablation_equals_hand_zeroing(tiny, tiny_hf, prompt):
    n = 10
    trace = lp.trace_generation(tiny, prompt, max_new_tokens=n, interventions=[ablate_heads("L1H2")],
                                stop_at_eos=False)
    ids, ents = hf_greedy(tiny_hf, prompt.tokens, n, zero_head(2, tiny.cfg.d_head), layer=1)
    assert trace.generated_ids[0] == ids
    assert (trace.entropy - ents).abs().max() <= TOL
    clean_ids, clean_ents = hf_greedy(tiny_hf, prompt.tokens, n)
    assert (clean_ents - ents).abs().max() > 5 * TOL  # the ablation changed the generation


def test_trace_generation_ablating_a_prompt_segment(tiny, tiny_hf, prompt):
    """positions='question': ablated at the prompt forward only; the cached keys/values carry it."""
    n = 8
    abl = ablate_heads("L0H1", positions="question", prompt=prompt)
    trace = lp.trace_generation(tiny, prompt, max_new_tokens=n, interventions=[abl], stop_at_eos=False)
    edit = zero_head(1, tiny.cfg.d_head, positions=prompt.positions("question"), when="prompt")
    ids, ents = hf_greedy(tiny_hf, prompt.tokens, n, edit, layer=0)
    assert trace.generated_ids[0] == ids
    assert (trace.entropy - ents).abs().max() <= TOL
    _, clean_ents = hf_greedy(tiny_hf, prompt.tokens, n)
    assert (clean_ents - ents).abs().max() > 5 * TOL  # ablating the question's positions mattered


def test_generated_positions_in_a_left_padded_batch(tiny, tiny_hf, prompt):
    """positions='generated' needs no prompt inside generation: each row ablates from its own
    prompt end, also when rows are left-padded to a common length."""
    short = lp.build_prompt(tiny, "What is 3*4?")
    assert len(short) != len(prompt)
    n = 6
    abl = ablate_heads("L1H0,L1H3", positions="generated")
    trace = lp.trace_generation(tiny, [prompt, short], max_new_tokens=n, interventions=[abl], stop_at_eos=False)
    d = tiny.cfg.d_head

    def edit(x, prompt_forward):
        if not prompt_forward:
            x[..., 0:d] = 0
            x[..., 3 * d:4 * d] = 0
        return x

    for row, p in enumerate([prompt, short]):
        ids, ents = hf_greedy(tiny_hf, p.tokens, n, edit, layer=1)
        assert trace.generated_ids[row] == ids
        assert (trace.entropy[row] - ents).abs().max() <= TOL
        _, clean_ents = hf_greedy(tiny_hf, p.tokens, n)
        assert abs(float(clean_ents[0] - ents[0])) < 1e-9  # step 0 (the prompt's own prediction) is untouched
        assert (clean_ents - ents).abs().max() > 5 * TOL  # later steps changed


def test_trace_generation_ablation_on_smollm2(smol, smol_hf):
    p = lp.build_prompt(smol, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT)
    n = 6
    trace = lp.trace_generation(smol, p, max_new_tokens=n, interventions=[ablate_heads("L0H4")],
                                stop_at_eos=False)
    ids, ents = hf_greedy(smol_hf, p.tokens, n, zero_head(4, smol.cfg.d_head), layer=0)
    assert trace.generated_ids[0] == ids
    assert (trace.entropy - ents).abs().max() <= 1e-4  # float32 sums over 49,152 tokens
    _, clean_ents = hf_greedy(smol_hf, p.tokens, n)
    assert (clean_ents - ents).abs().max() > 1e-3


def o_proj_inputs(hf, tokens, layer, head, d_head):
    """[pos, d_head]: the head's slice of ``layers[layer].self_attn.o_proj``'s input in the plain model."""
    got = {}
    handle = hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(
        lambda mod, args: got.__setitem__("x", args[0].detach().clone()))
    try:
        with torch.inference_mode():
            hf(tokens)
    finally:
        handle.remove()
    return got["x"][0, :, head * d_head:(head + 1) * d_head]


def test_mean_ablation_inside_trace_generation(tiny, tiny_hf, prompt):
    """Mean ablation during generation: every position, prompt and generated, gets the reference mean
    (the head's output averaged over every position of the reference prompts, computed here)."""
    ref = [lp.build_prompt(tiny, "What is 3*4?"), prompt]
    layer, head, d = 1, 1, tiny.cfg.d_head
    means = torch.cat([o_proj_inputs(tiny_hf, p.tokens, layer, head, d) for p in ref]).mean(0)
    n = 6
    abl = ablate_heads([(layer, head)], method="mean", reference=ref)
    trace = lp.trace_generation(tiny, prompt, max_new_tokens=n, interventions=[abl], stop_at_eos=False)

    def fill(x, prompt_forward):
        x[..., head * d:(head + 1) * d] = means
        return x

    ids, ents = hf_greedy(tiny_hf, prompt.tokens, n, fill, layer=layer)
    assert trace.generated_ids[0] == ids
    assert (trace.entropy - ents).abs().max() <= TOL
    _, clean_ents = hf_greedy(tiny_hf, prompt.tokens, n)
    assert (clean_ents - ents).abs().max() > 5 * TOL  # the mean differs from the head's own output
    described = str(trace.meta["interventions"][0])  # the run's description names the ablation
    assert "L1H1" in described and "'mean'" in described and "2 prompts, sha256" in described
