"""A translator's identity is its values: two :class:`AffineLens` of other weights give another run identity,
another description in the trace's meta, and a trace-set folder of one refuses the other; two of the same values
(other objects) are the same run."""

import pytest
import torch

import lensprobe as lp
from lensprobe.core.storage.runidentity import run_identity


def lenses(d: int, scale: float = 1.0):
    weights = torch.eye(d).repeat(2, 1, 1) * scale
    return lp.generation.AffineLens(weights.clone(), torch.zeros(2, d))


def test_an_affine_lens_is_identified_by_its_values(tiny):
    d = tiny.cfg.d_model
    a, same, other = lenses(d), lenses(d), lenses(d, 1.5)
    assert a is not same and repr(a) == repr(other)  # the repr alone would not tell them apart
    assert run_identity(tiny, lens=a) == run_identity(tiny, lens=same)
    assert run_identity(tiny, lens=a) != run_identity(tiny, lens=other)
    bias = lp.generation.AffineLens(a.weights.clone(), torch.full((2, d), 1e-3))
    assert run_identity(tiny, lens=a) != run_identity(tiny, lens=bias)
    metas = [lp.generate(tiny, [5, 17, 3], max_new_tokens=2, lens=lens).meta["lens"]["lens"] for lens in (a, same, other)]
    assert metas[0] == metas[1] != metas[2]
    assert metas[0].startswith("AffineLens(")


def test_a_trace_set_of_one_lens_refuses_another(tiny, tmp_path):
    d = tiny.cfg.d_model
    out = tmp_path / "set"
    first = lp.generation.trace_prompts(tiny, [[5, 17, 3]], max_new_tokens=2, lens=lenses(d), out=out)
    again = lp.generation.trace_prompts(tiny, [[5, 17, 3]], max_new_tokens=2, lens=lenses(d), out=out)
    assert torch.equal(first[0].lens.entropy, again[0].lens.entropy)
    with pytest.raises(lp.LensprobeError):
        lp.generation.trace_prompts(tiny, [[5, 17, 3]], max_new_tokens=2, lens=lenses(d, 1.5), out=out)
