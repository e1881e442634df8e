"""Identity by content: what a run depends on is identified by value, never by repr() or a name, and
what cannot be described is refused."""

import dataclasses
import functools
import json
import subprocess
import sys

import pytest
import torch

import lensprobe as lp
from lensprobe.core.models.testing import tiny_model
from lensprobe.core.storage.identity import IDENTITY_VERSION, identity, identity_digest, weights_digest
from lensprobe.core.storage.jsonable import stable_repr
from lensprobe.core.storage.runidentity import check_identity_rule, model_identity


@functools.partial(lp.interventions.declare, name="add-vector", version="1")
@dataclasses.dataclass(frozen=True)
class AddVector:
    """An intervention holding a tensor: adds ``vector`` to the residual stream after layer 0."""

    vector: torch.Tensor

    def hooks(self, model):
        return [("blocks.0.hook_resid_post", lambda act, hook: act + self.vector.to(act.dtype))]


@functools.partial(lp.interventions.declare, name="plain", version="1")
class Plain:
    """A class with no ``__repr__``, declared by a name and a version."""

    def __init__(self, factor):
        self.factor = factor


class Declared:
    def __init__(self, name, cache):
        self.name, self.cache = name, cache

    def __lensprobe_identity__(self):
        return {"name": self.name, "version": "1"}  # the cache does not change results


def scale(factor):
    return lp.interventions.declare(lambda x: x * factor, name="scale", version="1")


def logprob_of(token_id):
    def metric(logits, prompt):
        return logits[:, -1].log_softmax(-1)[:, token_id]

    return lp.interventions.declare(metric, name="logprob_of", version="1")


def test_interventions_differing_in_one_tensor_element_differ():
    a = torch.zeros(2000)
    b = a.clone()
    b[1234] = 1.0
    assert stable_repr(AddVector(a)) == stable_repr(AddVector(b))  # torch summarises: the repr cannot tell
    assert identity(AddVector(a)) != identity(AddVector(b))
    assert identity(AddVector(a)) == identity(AddVector(a.clone()))
    assert identity(a.double()) != identity(a)  # the dtype is content


def test_closures_metrics_and_plain_objects_differ_by_what_they_hold():
    assert stable_repr(scale(1.0)) == stable_repr(scale(40.0))
    assert identity(scale(1.0)) != identity(scale(40.0))
    assert identity(scale(1.0)) == identity(scale(1.0))
    assert identity(logprob_of(3)) != identity(logprob_of(4))
    assert stable_repr(Plain(1)) == stable_repr(Plain(2))
    assert identity(Plain(1)) != identity(Plain(2)) and identity(Plain(1)) == identity(Plain(1))
    assert identity(functools.partial(max, 1)) != identity(functools.partial(max, 2))
    assert identity(Declared("a", [1])) == identity(Declared("a", [2])) != identity(Declared("b", [1]))


def test_user_functions_are_refused_unless_declared_and_then_identified_by_name_and_version():
    def one(x):
        return helper(x)  # reads a global: its bytecode cannot show what helper does

    with pytest.raises(lp.LensprobeError, match=r"cannot identify .*one at hook: it is user code.*globals it reads.*"
                                                r"lp.interventions.declare\(one, name='one', version='1'\)"):
        identity(one, "hook")
    declared = lp.interventions.declare(one, name="one", version="2")
    assert declared is one and identity(one) == {".declared": "one", "version": "2"}
    assert identity(lp.interventions.declare(one, name="one", version="3")) != {".declared": "one", "version": "2"}
    assert identity(torch.softmax) == {".function": "torch._VariableFunctionsClass.softmax"}  # a library's by name
    assert identity(lp.metrics.entropy) == {".function": "lensprobe.core.measures.metrics.entropy",
                                            "lensprobe": lp.__version__}  # lensprobe's: name and version


def helper(x):
    return x + 1


def test_user_classes_are_refused_unless_declared():
    @dataclasses.dataclass
    class Hook:
        scale: float = 1.0

    with pytest.raises(lp.LensprobeError, match=r"cannot identify .*Hook at x: it is user code.*"
                                                r"declare\(Hook, name='Hook'.*__lensprobe_identity__"):
        identity(Hook(), "x")
    lp.interventions.declare(Hook, name="hook", version="1")
    assert identity(Hook(2.0)) == {".type": f"{Hook.__module__}.{Hook.__qualname__}", "scale": 2}
    with pytest.raises(lp.LensprobeError, match="name must be non-empty"):
        lp.interventions.declare(helper, name=" ", version="1")
    with pytest.raises(lp.LensprobeError, match="cannot carry a declared identity"):
        lp.interventions.declare(len, name="len", version="1")


def test_the_same_declared_lambda_has_the_same_identity_in_another_process():
    code = ("import json\nfrom lensprobe.core.storage.identity import identity\n"
            "from lensprobe.interventions import declare\n"
            "def make(f):\n    return declare(lambda x: x * f + len({'a', 'b'}), name='make', version='1')\n"
            "print(json.dumps(identity(make(3.5))))")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    assert runs[0] == runs[1] and json.loads(runs[0])["closure"] == {"f": 3.5}


def test_undescribable_objects_are_refused_with_what_to_do():
    with pytest.raises(lp.LensprobeError, match=r"cannot identify torch._C.Generator at x: .*__lensprobe_identity__"):
        identity({"x": torch.Generator()})
    gen = torch.Generator()
    with pytest.raises(lp.LensprobeError, match="closure variable 'gen'.*make it a dataclass"):
        identity(lp.interventions.declare(lambda: gen.seed(), name="seed", version="1"))
    loop: list = []
    loop.append(loop)
    with pytest.raises(lp.LensprobeError, match="contains itself"):
        identity(loop)


def test_every_dataclass_field_is_in_the_identity_defaults_included():
    assert identity(lp.evals.EvalConfig())["max_new_tokens"] == 512  # a default is recorded, not left out
    assert identity(lp.evals.EvalConfig(batch_size=2)) != identity(lp.evals.EvalConfig())  # batch_size counts
    assert identity(lp.evals.EvalConfig(max_new_tokens=9))["max_new_tokens"] == 9

    @dataclasses.dataclass
    class Settings:
        n: int = 1

    lp.interventions.declare(Settings, name="settings", version="1")
    before = identity(Settings())

    @dataclasses.dataclass
    class Settings:  # type: ignore[no-redef]  # the same class under a new default
        n: int = 2

    lp.interventions.declare(Settings, name="settings", version="1")
    assert identity(Settings()) != before  # a folder written under the old default does not match
    assert identity(Settings(n=1)) == before


def test_identity_digest_is_the_sha256_of_the_sorted_identity():
    assert identity_digest({"b": [1, 2], "a": torch.ones(2)}) == identity_digest({"a": torch.ones(2), "b": (1, 2)})
    assert identity(identity(AddVector(torch.ones(3)))) == identity(AddVector(torch.ones(3)))


def test_models_differing_after_the_first_embedding_rows_differ():
    a, b = tiny_model(seed=0), tiny_model(seed=0)
    assert model_identity(a) == model_identity(b)
    emb = b.original_model.get_input_embeddings().weight
    kept = float(emb[100, 0].detach())
    with torch.no_grad():
        emb[100, 0] = kept + 1.0  # a row past the first 64, which the old fingerprint hashed
    assert torch.equal(emb[:64], a.original_model.get_input_embeddings().weight[:64])
    assert model_identity(a)["weights"] != model_identity(b)["weights"]  # the cache saw the in-place change
    with torch.no_grad():
        emb[100, 0] = kept
    assert model_identity(a) == model_identity(b)
    for name, tensor in (("model.layers.1.", dict(b.named_parameters())), ("inv_freq", dict(b.named_buffers()))):
        key = next(k for k in tensor if name in k)  # the last layer's weights, and a buffer
        kept = tensor[key].detach().clone()
        with torch.no_grad():
            tensor[key].view(-1)[-1] += 1.0
        assert model_identity(a) != model_identity(b), key
        with torch.no_grad():
            tensor[key].copy_(kept)
        assert model_identity(a) == model_identity(b)
    assert model_identity(a)["n_layers"] == 2 and model_identity(a)["dtype"] == "torch.float32"  # labels beside


def test_the_weights_digest_stays_through_generation(tiny):
    before = weights_digest(tiny)
    lp.generate(tiny, lp.build_prompt(tiny, "What is 2+2?"), max_new_tokens=3)
    assert weights_digest(tiny) == before


def test_an_edit_through_data_changes_the_weights_digest():
    model = tiny_model(seed=0)
    before = weights_digest(model)
    param = next(model.parameters())
    version = param._version
    param.data.mul_(0)  # invisible to the version counter: a cache keyed on it would be fooled
    assert param._version == version
    assert weights_digest(model) != before


def test_a_folder_of_another_identity_rule_is_refused():
    check_identity_rule({"identity": IDENTITY_VERSION}, "runs/x")
    with pytest.raises(lp.LensprobeError, match=r"runs/x was written by identity rule 1.*new output folder"):
        check_identity_rule({"identity": 1}, "runs/x")
    with pytest.raises(lp.LensprobeError, match=r"runs/x was written by an older lensprobe.*new output folder"):
        check_identity_rule({"model": {"name": "m"}}, "runs/x")
