"""The paper's model families as tiny random-weight Hugging Face folders
(:mod:`lensprobe.core.models.families`): each loaded by ``lp.load_model(folder)`` and, as the
independent oracle, by plain ``transformers`` from the same folder (eager attention, no bridge)."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import lensprobe as lp
from lensprobe.core.models.families import FAMILIES, Family, family, tiny_family_folder


@dataclass(frozen=True)
class Loaded:
    """One family's folder, loaded twice: by lensprobe (``model``) and by plain transformers
    (``plain``, with its own ``tokenizer``)."""

    family: Family
    folder: Path
    model: Any
    plain: Any
    tokenizer: Any

    def layers(self):
        """The plain model's decoder layers (behind the vision tower's wrapper for Gemma3ForConditionalGeneration)."""
        inner = self.plain.model
        return getattr(inner, "language_model", inner).layers


@pytest.fixture(scope="session")
def family_folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: tiny_family_folder(name, root / name) for name in FAMILIES}


@pytest.fixture(scope="module", params=FAMILIES)
def fam(request, family_folders) -> Loaded:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lensprobe.core.models.loading import quiet

    folder = family_folders[request.param]
    model = lp.load_model(folder, device="cpu")
    with quiet():
        plain = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    assert type(plain).__name__ == family(request.param).architecture
    # lensprobe decodes greedily unless asked to sample; the oracle is told the same (the family's
    # generation config samples, and Qwen's has a repetition penalty)
    gen = plain.generation_config
    gen.do_sample, gen.repetition_penalty, gen.top_k, gen.top_p, gen.temperature = False, 1.0, None, None, None
    if gen.pad_token_id is None:  # Llama-3.1 has no padding token: any id under the attention mask will do
        gen.pad_token_id = gen.eos_token_id[0]
    return Loaded(family(request.param), folder, model, plain, AutoTokenizer.from_pretrained(folder))
