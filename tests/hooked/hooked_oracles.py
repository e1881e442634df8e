"""Expected values for the HookedTransformer tests, computed on the plain ``LlamaForCausalLM`` twin
(no TransformerLens, no lensprobe in its forward) or written out by hand."""

import copy

import torch
from oracles import latent_by_hand


def entropy_by_hand(logits: torch.Tensor) -> float:
    """-sum p ln p of the softmax of one row of logits, in float64."""
    p = torch.softmax(logits.double(), -1)
    p = p[p > 0]
    return float(-(p * p.log()).sum())


def hf_run(hf, tokens, *, o_proj=None, v_proj=None, down_proj=None, **kwargs):
    """A plain forward with edits: ``o_proj={layer: fn(x) -> x}`` on the input of the attention's
    output projection ``[batch, pos, n_heads * d_head]`` (heads in order), ``v_proj`` on the value
    projection's output ``[batch, pos, n_kv_heads * d_head]``, ``down_proj`` on the MLP's down
    projection input (``act_fn(gate) * up``)."""
    handles = []
    layers = hf.model.layers
    for edits, module_of, pre in ((o_proj, lambda lay: lay.self_attn.o_proj, True),
                                  (v_proj, lambda lay: lay.self_attn.v_proj, False),
                                  (down_proj, lambda lay: lay.mlp.down_proj, True)):
        for layer, fn in (edits or {}).items():
            module = module_of(layers[layer])
            if pre:
                handles.append(module.register_forward_pre_hook(
                    lambda _m, args, fn=fn: (fn(args[0].clone()), *args[1:])))
            else:
                handles.append(module.register_forward_hook(lambda _m, _a, out, fn=fn: fn(out.clone())))
    try:
        with torch.inference_mode():
            return hf(tokens, **kwargs)
    finally:
        for handle in handles:
            handle.remove()


def o_proj_inputs(hf, tokens, layer: int) -> torch.Tensor:
    """``[batch, pos, n_heads, d_head]``: the per-head attention output the plain model sums in ``o_proj``."""
    got = {}

    def keep(x):
        got["x"] = x.clone()
        return x

    hf_run(hf, tokens, o_proj={layer: keep})
    cfg = hf.config
    x = got["x"]
    return x.view(*x.shape[:2], cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads)


def set_heads(heads, d_head: int, value=0.0, positions=None):
    """An ``o_proj`` edit that sets the given heads' slices (at ``positions``, default all) to ``value``
    (a number or a ``[head, d_head]`` tensor of per-head values)."""
    def fn(x):
        where = slice(None) if positions is None else list(positions)
        for i, h in enumerate(heads):
            fill = value if not isinstance(value, torch.Tensor) else value[i]
            x[:, where, h * d_head:(h + 1) * d_head] = fill
        return x

    return fn


def greedy_without_cache(hf, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """Greedy decoding by a full forward over the whole sequence at every step (no KV cache):
    the chosen tokens and each step's entropy."""
    ids, tokens, ents = list(ids), [], []
    for _ in range(n):
        with torch.inference_mode():
            logits = hf(torch.tensor([ids])).logits[0, -1]
        ents.append(entropy_by_hand(logits))
        tokens.append(int(logits.argmax()))
        ids.append(tokens[-1])
    return tokens, ents


def hf_with_thinking_token(hf):
    """A copy of the (untied) plain model grown by one token the way ``add_thinking_token`` documents it:
    the mean input embedding row and the mean output row. Returns the copy and the new id."""
    hf = copy.deepcopy(hf)
    V = hf.get_input_embeddings().weight.shape[0]
    E_old = hf.get_input_embeddings().weight.detach().clone()
    U_old = hf.get_output_embeddings().weight.detach().clone()
    hf.resize_token_embeddings(V + 1, mean_resizing=False)
    with torch.no_grad():
        hf.get_input_embeddings().weight[V] = E_old.mean(0)
        hf.get_output_embeddings().weight[V] = U_old.mean(0)
    return hf.eval(), V



def thinking_loop_by_hand(hf, prompt_ids, n, think_steps, tid, *, fusion: bool, alpha=0.6, top_p=0.9):
    """Greedy decoding with the plain model's own KV cache, the thinking inputs fed by hand as
    ``inputs_embeds``: tokens, entropies and the attention onto thinking positions [step, layer, head]."""
    E = hf.get_input_embeddings().weight
    P = len(prompt_ids)
    tokens, ents, attn = [], [], []
    with torch.inference_mode():
        out = hf(torch.tensor([prompt_ids]), use_cache=True, output_hidden_states=True, output_attentions=True)
        for t in range(n):
            logits, h = out.logits[0, -1], out.hidden_states[-1][0, -1]
            ents.append(entropy_by_hand(logits))
            thinking_pos = [P + i for i in range(t) if i in think_steps]
            attn.append(torch.stack([a[0, :, -1, thinking_pos].sum(-1) for a in out.attentions]))
            tok = tid if t in think_steps else int(logits.argmax())
            if t in think_steps:
                emb = latent_by_hand(h, logits, E, alpha=alpha, top_p=top_p, exclude=tid)[0] if fusion else E[tid]
            else:
                emb = E[tok]
            tokens.append(tok)
            out = hf(inputs_embeds=emb[None, None], past_key_values=out.past_key_values, use_cache=True,
                     output_hidden_states=True, output_attentions=True)
    return tokens, torch.tensor(ents, dtype=torch.float64), torch.stack(attn)
