"""Cost of ``lens="logit"``: every layer's logit lens per step, against an untraced ``lp.generate`` and against
plain ``transformers``.

On the embedded SmolLM2-135M-Instruct (30 layers, d_model 576, vocabulary 49,152), one MATH-style prompt,
``--steps`` greedy steps (128 by default, end of sequence ignored so every method makes the same tokens),
interleaved for ``--repeats`` rounds:

- ``lp generate``: ``lp.generate`` with nothing recorded (the plain engine): (a);
- ``lp lens (30 layers)``: the same with ``lens="logit"``: per step one ``[30, 576] x [576, 49152]`` product,
  reduced to entropy, top-5, the chosen token's rank and probability and the KL divergence;
- ``lp lens (every 4th layer)``: ``lens_layers=range(1, 30, 4)`` plus the last (9 layers);
- ``lp lens (last layer)``: ``lens_layers=[29]``: the machinery without the per-layer products;
- ``hf generate``: ``transformers`` ``generate`` on the same weights (sdpa), for reference;
- ``hf generate + lens after``: ``generate(output_hidden_states=True)`` and every layer's lens computed after it
  from the kept hidden states (the same reductions): what plain ``transformers`` offers.

Target: ``lp lens (30 layers)`` <= 1.5x (a). The script checks that every method made the same tokens, that
the last layer's lens is the model's own entropy, and that lensprobe's lens equals the one computed after
``transformers``' generate.

Usage:
    python benchmarks/logit_lens.py --steps 128 --repeats 3
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from trace_overhead import QUESTION  # noqa: E402

import lensprobe as lp  # noqa: E402


def lens_after(hf, hidden, tokens: list[int]) -> torch.Tensor:
    """``[step, layer]`` entropies of every layer's lens, from ``generate``'s hidden states (per step, per layer
    ``[1, pos, d]``; the last entry is already through the final norm), with the other reductions computed
    alongside so the work equals lensprobe's."""
    out = []
    for t, per_layer in enumerate(hidden):
        h = torch.stack([x[0, -1] for x in per_layer[1:]])  # [layer, d]
        normed = torch.cat([hf.model.norm(h[:-1]), h[-1:]])
        logits = hf.lm_head(normed).float()
        logp = torch.log_softmax(logits, -1)
        p = logp.exp()
        ent = -(p * logp).sum(-1)
        logp.topk(5, dim=-1)
        (logits > logits[:, tokens[t], None]).sum(-1)
        (p[-1] * (logp[-1] - logp)).sum(-1)
        out.append(ent)
    return torch.stack(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    from lensprobe.core.models.loading import converted_gguf_folder, embedded_gguf_path, quiet

    model = lp.load_model()
    with quiet():
        hf = AutoModelForCausalLM.from_pretrained(converted_gguf_folder(embedded_gguf_path()),
                                                  attn_implementation="sdpa", dtype=torch.float32).eval()
    prompt = lp.build_prompt(model, QUESTION, system=lp.MATH_SYSTEM_PROMPT)
    ids = prompt.tokens.to(hf.device)
    n, last = args.steps, model.cfg.n_layers - 1
    gen = dict(max_new_tokens=n, stop_at_eos=False)

    def hf_generate(hidden: bool):
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, output_hidden_states=hidden, return_dict_in_generate=True,
                              pad_token_id=0)
            return (out, lens_after(hf, out.hidden_states, out.sequences[0, ids.shape[1]:].tolist())) if hidden else out

    methods = {
        "lp generate": lambda: lp.generate(model, prompt, **gen),
        "lp lens (30 layers)": lambda: lp.generate(model, prompt, lens="logit", **gen),
        "lp lens (every 4th layer)": lambda: lp.generate(model, prompt, lens="logit",
                                                         lens_layers=[*range(1, last, 4), last], **gen),
        "lp lens (last layer)": lambda: lp.generate(model, prompt, lens="logit", lens_layers=[last], **gen),
        "hf generate": lambda: hf_generate(False),
        "hf generate + lens after": lambda: hf_generate(True),
    }
    outs = {name: fn() for name, fn in methods.items()}  # warm-up, and the outputs checked below
    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(args.repeats):
        for name, fn in methods.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)

    tokens = outs["lp generate"].generated_ids[0]
    for name in ("lp lens (30 layers)", "lp lens (every 4th layer)", "lp lens (last layer)"):
        assert outs[name].generated_ids[0] == tokens, name
    assert outs["hf generate"].sequences[0, ids.shape[1]:].tolist() == tokens
    lens = outs["lp lens (30 layers)"]
    after = outs["hf generate + lens after"][1]
    last_vs_model = float((lens.lens.entropy[:, -1] - lens.entropy).abs().max())
    vs_after = float((lens.lens.entropy - after).abs().max())

    base = statistics.median(times["lp generate"])
    print(f"SmolLM2-135M, {n} greedy steps, {args.repeats} rounds, {torch.get_num_threads()} threads "
          "(median seconds; ratio to lp generate)")
    for name, ts in times.items():
        print(f"  {name:26s} {statistics.median(ts):7.3f} s  {statistics.median(ts) / base:5.2f}x")
    held = sum(getattr(lens.lens, f).nbytes for f in ("entropy_rows", "top_ids_rows", "top_probs_rows",
                                                      "chosen_rank_rows", "chosen_prob_rows", "kl_rows"))
    print(f"lens held by the trace: {held / 2**10:.1f} KiB (a [step, layer, vocab] float32 tensor would be "
          f"{n * (last + 1) * model.cfg.d_vocab * 4 / 2**20:.0f} MiB)")
    print(f"last layer's lens entropy vs the model's: max |difference| {last_vs_model:.2e} nats; every layer vs "
          f"the lens computed after transformers' generate: {vs_after:.2e} nats")


if __name__ == "__main__":
    main()
