"""Models placed across devices with ``device_map``: accelerate's CPU and disk offload of a tiny folder against
the same folder loaded whole and against plain ``transformers`` (its ``generate``, ``output_hidden_states`` and
``output_attentions``): equal logits, equal greedy tokens, hooks firing on offloaded layers, ``record=``,
ARM, ablation and continuous batching equal; bad placements refused before a weight is read. The ``cuda``
case puts layer 1 on the last visible GPU (a second one where there are two)."""

import pytest
import torch
import transformers
from oracles import layer_io

import lensprobe as lp
from lensprobe.core.models.facts import model_facts
from lensprobe.core.models.placement import check_placement, input_device, is_dispatched
from lensprobe.core.models.testing import tiny_hf_model
from lensprobe.interventions.ablation import ablate_heads

pytestmark = pytest.mark.offload

SEED = 4
OFFLOADED = {"model.embed_tokens": "disk", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
             "model.layers.1": "disk", "model.norm": "cpu", "lm_head": "disk"}
"""The embedding, layer 1 and the unembedding on the disk; the rest on the CPU."""
QUESTIONS = ["What is 12+7?", "What is 3*4? the cat sat on the mat", "x y z"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    hf, tok = tiny_hf_model(SEED)
    path = tmp_path_factory.mktemp("tiny-folder")
    hf.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def twin(folder):
    """Plain ``transformers``, the folder loaded whole (eager attention)."""
    return transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def whole(folder):
    return lp.load_model(folder, device="cpu")


@pytest.fixture(scope="module")
def offloaded(folder, tmp_path_factory):
    return lp.load_model(folder, device_map=OFFLOADED, offload_folder=tmp_path_factory.mktemp("offload"))


@pytest.fixture(scope="module")
def prompts(whole):
    return [lp.build_prompt(whole, q) for q in QUESTIONS]


def test_the_offloaded_model_is_placed_as_asked(offloaded):
    hf = offloaded.original_model
    assert hf.hf_device_map == OFFLOADED
    on = {n.replace("._original_component", ""): p.device.type for n, p in hf.named_parameters()}
    assert on["model.layers.1.mlp.up_proj.weight"] == on["model.embed_tokens.weight"] == "meta"  # on the disk
    assert on["model.layers.0.mlp.up_proj.weight"] == "cpu"
    assert is_dispatched(offloaded) and input_device(offloaded) == torch.device("cpu")
    facts = model_facts(offloaded)
    assert facts.device == torch.device("cpu")  # where token ids go, not the disk-offloaded embedding's meta
    assert torch.device(offloaded.cfg.device) == torch.device("cpu")


def test_logits_equal_the_whole_model_and_plain_transformers(whole, offloaded, twin, prompts):
    for p in prompts:
        got = lp.forward(offloaded, p)
        assert torch.equal(got, lp.forward(whole, p))
        with torch.inference_mode():
            want = twin(p.tokens).logits
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_greedy_tokens_equal_the_whole_model_and_transformers_generate(whole, offloaded, twin, prompts):
    kw = dict(max_new_tokens=8, stop_at_eos=False)
    got = lp.generate(offloaded, prompts, **kw)
    assert got.meta["engine"] == "bridge"  # the plain view would lack accelerate's hooks
    assert got.generated_ids == lp.generate(whole, prompts, engine="bridge", **kw).generated_ids
    for p, ids in zip(prompts, got.generated_ids, strict=True):
        with torch.inference_mode():
            out = twin.generate(p.tokens, max_new_tokens=8, do_sample=False, min_new_tokens=8,
                                pad_token_id=twin.config.pad_token_id)
        assert out[0, p.tokens.shape[1]:].tolist() == ids
    assert len({tuple(ids) for ids in got.generated_ids}) > 1  # the prompts' tokens differ: the check can fail


def test_engine_hf_is_refused_with_the_reason(offloaded, prompts):
    with pytest.raises(lp.LensprobeError, match="placed with a device_map"):
        lp.generate(offloaded, prompts[:1], max_new_tokens=2, engine="hf")


def test_hooks_fire_on_offloaded_layers_with_the_plain_models_values(offloaded, twin, prompts):
    p = prompts[1]
    seen = {}

    def keep(name):
        def fn(x, hook):
            seen[name] = x.detach().clone()
        return fn

    names = ["blocks.1.hook_resid_post", "blocks.1.attn.hook_pattern", "hook_embed"]
    with lp.intervene(offloaded, *[(n, keep(n)) for n in names]):
        lp.forward(offloaded, p)
    assert sorted(seen) == sorted(names)
    with torch.inference_mode():
        out = twin(p.tokens, output_hidden_states=True, output_attentions=True)
    assert torch.allclose(seen["hook_embed"], out.hidden_states[0], atol=1e-6)
    ins, outs = layer_io(twin, p.tokens[0].tolist())
    assert torch.allclose(seen["blocks.1.hook_resid_post"][0], outs[1], atol=1e-5)
    assert torch.allclose(seen["blocks.1.attn.hook_pattern"], out.attentions[1], atol=1e-6)
    pats = lp.attention_patterns(offloaded, p, layers=[1])
    assert torch.allclose(pats[1], out.attentions[1][0], atol=1e-6)


def test_record_values_equal_the_whole_model(whole, offloaded, prompts):
    kw = dict(max_new_tokens=5, stop_at_eos=False, engine="bridge",
              record=["blocks.*.hook_resid_post", "blocks.1.attn.hook_z"])
    got = lp.generate(offloaded, prompts, **kw)
    want = lp.generate(whole, prompts, **kw)
    assert sorted(got.activations_rows) == sorted(want.activations_rows) and len(got.activations_rows) == 3
    for name, values in want.activations_rows.items():
        assert torch.equal(got.activations_rows[name].isnan(), values.isnan())
        assert torch.allclose(got.activations_rows[name].nan_to_num(), values.nan_to_num(), atol=1e-6), name


def test_arm_and_an_ablation_under_continuous_batching_equal_the_whole_model(whole, offloaded, prompts):
    interventions = [lp.ARM(c=0.1, percentile=95, seed=3), ablate_heads("L1H2")]
    kw = dict(max_new_tokens=6, stop_at_eos=False, batch_size=2, caps=[6, 3, 5], engine="bridge", do_sample=True,
              seed=1)
    got = lp.generate(offloaded, prompts, interventions=interventions, **kw)
    want = lp.generate(whole, prompts, interventions=interventions, **kw)
    assert got.meta["batching"] == "continuous batching"
    assert got.generated_ids == want.generated_ids
    assert torch.allclose(got.entropy_rows.nan_to_num(), want.entropy_rows.nan_to_num(), atol=1e-5)
    plain = lp.generate(offloaded, prompts, **kw)
    assert plain.entropy_rows.nan_to_num().tolist() != got.entropy_rows.nan_to_num().tolist()  # they acted


def test_a_trace_with_arm_equals_the_whole_models(whole, offloaded, prompts):
    kw = dict(max_new_tokens=5, stop_at_eos=False, interventions=[lp.ARM(c=0.1, percentile=95, seed=3)])
    got, want = lp.trace_generation(offloaded, prompts, **kw), lp.trace_generation(whole, prompts, **kw)
    assert got.meta["engine"] == "bridge" and sorted(got.attention_rows) == sorted(want.attention_rows)
    assert got.token_ids_rows.tolist() == want.token_ids_rows.tolist()
    for name, values in want.attention_rows.items():
        assert torch.allclose(got.attention_rows[name].nan_to_num(), values.nan_to_num(), atol=1e-5), name


def test_device_map_auto_with_a_small_cpu_budget_offloads_to_the_disk(folder, whole, prompts, tmp_path):
    model = lp.load_model(folder, device_map="auto", max_memory={"cpu": "120KB"}, offload_folder=tmp_path / "off")
    assert "disk" in set(model.original_model.hf_device_map.values())
    assert any(p.is_meta for p in model.original_model.parameters())
    assert torch.equal(lp.forward(model, prompts[0]), lp.forward(whole, prompts[0]))


# ----- bad placements, refused before a weight is read -----------------------------------------------


@pytest.fixture()
def no_loading(monkeypatch):
    """``from_pretrained`` fails the test if it runs: the refusal must come first."""
    def refuse(*a, **k):
        raise AssertionError("a weight was read before the placement was refused")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(device_map="everywhere"), r"device_map 'everywhere' is not a placement: use one of \['auto'"),
    pytest.param(dict(device_map=["cpu"]), r"device_map must be one of .* got a list", marks=pytest.mark.unchecked),
    (dict(device_map={}), "empty dict"),
    (dict(device_map={"": "gpu7"}), r"device 'gpu7' is not a torch device"),
    (dict(device_map={"": "meta"}), "'meta' holds no weights"),
    (dict(device_map={"": -1}), "GPU index -1 is negative"),
    (dict(device_map={0: "cpu"}), "device_map key 0 is not a module name"),
    (dict(device_map={"model.layers.1": "disk", "": "cpu"}), "no offload_folder is given"),
    pytest.param(dict(device_map="auto", max_memory=["75GiB"]), "max_memory must be a dict from devices to sizes",
                 marks=pytest.mark.unchecked),
    (dict(device_map="auto", max_memory={"cpu": "lots"}), r"max_memory\['cpu'\]: 'lots' is not a memory size"),
    (dict(device_map="auto", max_memory={"cpu": 2.5}), "is not a memory size"),
    (dict(device_map="auto", max_memory={"nowhere": "1GB"}), "'nowhere' is not a torch device"),
    (dict(max_memory={"cpu": "1GB"}), "max_memory is given without device_map"),
    (dict(offload_folder="/tmp"), "offload_folder is given without device_map"),
    (dict(device="cpu", device_map="auto"), "device and device_map are both given"),
    (dict(device_map={"model.layer.0": "cpu", "": "cpu"}), r"names \['model.layer.0'\], which are not modules"),
    (dict(device_map={"model": "cpu"}), r"places no module holding \['lm_head.weight'\]"),
])
def test_bad_placements_are_refused_before_loading(folder, no_loading, kwargs, message):
    with pytest.raises(lp.LensprobeError, match=message):
        lp.load_model(folder, **kwargs)


def test_an_offload_folder_that_is_a_file_and_a_gpu_where_there_is_none_are_refused(folder, no_loading, tmp_path):
    file = tmp_path / "a-file"
    file.write_text("x")
    with pytest.raises(lp.LensprobeError, match="offload_folder .* is a file"):
        lp.load_model(folder, device_map="auto", offload_folder=file)
    if not torch.cuda.is_available():
        with pytest.raises(lp.LensprobeError, match="torch sees no CUDA GPU"):
            lp.load_model(folder, device_map={"": 0})
    else:
        with pytest.raises(lp.LensprobeError, match="mixes 'cpu'/'disk' offload with a GPU"):
            lp.load_model(folder, device_map={"model": 0, "lm_head": "cpu"})


def test_a_loaded_bridge_cannot_be_placed_again(whole):
    with pytest.raises(lp.LensprobeError, match="loaded already: pass its name or folder"):
        lp.load_model(whole, device_map="auto")


def test_check_placement_keeps_a_valid_map():
    placed = check_placement({"model": "cpu", "lm_head": "disk"}, {"cpu": 10**6, "disk": "1GB"}, "/tmp/x")
    assert placed.kwargs() == {"device_map": {"model": "cpu", "lm_head": "disk"},
                               "max_memory": {"cpu": 10**6, "disk": "1GB"}, "offload_folder": "/tmp/x"}
    assert check_placement(None) is None


@pytest.mark.cuda
def test_layers_on_the_last_gpu_equal_the_whole_model(folder, whole, prompts):
    last = torch.cuda.device_count() - 1  # a second GPU where there are two
    placed = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0, "model.layers.1": last,
              "model.norm": last, "lm_head": last}
    model = lp.load_model(folder, device_map=placed)
    assert model_facts(model).device == torch.device("cuda:0")
    on_cuda = lp.load_model(folder, device="cuda")
    for p in prompts:
        assert torch.allclose(lp.forward(model, p).cpu(), lp.forward(whole, p), atol=1e-4)
    kw = dict(max_new_tokens=6, stop_at_eos=False, batch_size=2, record="blocks.1.hook_resid_post")
    got, want = lp.generate(model, prompts, **kw), lp.generate(on_cuda, prompts, engine="bridge", **kw)
    assert got.generated_ids == want.generated_ids
    assert torch.allclose(got.activations_rows["blocks.1.hook_resid_post"].nan_to_num(),
                          want.activations_rows["blocks.1.hook_resid_post"].nan_to_num(), atol=1e-4)
