"""lm-eval's requests for each family: the adapter's token ids and loglikelihoods equal lm-eval's own ``hf``
model on the same tiny folder (its tokenizer loaded by lm-eval from the folder, its BOS rule: Llama-3.1 and
Gemma-3 prepend their BOS, Qwen2.5 nothing), with ``add_bos_token`` unset, as in lm-eval, and set."""

import pytest
from lm_eval.models.huggingface import HFLM

from lensprobe.evals.lmeval import LensprobeLM

REQUESTS = [("What is 12+7?", " The answer is 19."), ("The cat", " sat on the mat"), ("", "hello there"),
            ("Question: what is 2+3?\nAnswer:", " 5")]
TEXTS = ["What is 12+7?", "The cat sat on the mat", " hello"]


class Request:
    """An lm-eval request as a model reads it (``.args``)."""

    def __init__(self, *args):
        self.args = args


@pytest.mark.parametrize("add_bos_token", [None, True, False])
def test_requests_equal_lm_evals_hf_model_on_the_family_folder(fam, add_bos_token):
    given = {} if add_bos_token is None else {"add_bos_token": add_bos_token}
    hf_lm = HFLM(pretrained=fam.plain, batch_size=2, device="cpu", **given)  # tokenizer: from the folder
    lm = LensprobeLM(fam.model, batch_size=3, **given)
    for text in TEXTS + [hf_lm.tokenizer.decode(hf_lm.prefix_token_id) + TEXTS[0]]:
        assert lm.tok_encode(text) == hf_lm.tok_encode(text), text
        assert lm.tok_encode(text, add_special_tokens=False) == hf_lm.tok_encode(text, add_special_tokens=False)
    assert lm.prefix_token_id == hf_lm.prefix_token_id
    starts = {lm.tok_encode(t)[0] == hf_lm.tokenizer.bos_token_id for t in TEXTS}
    bos_first = add_bos_token if add_bos_token is not None else fam.family.bos is not None
    assert starts == {bos_first and hf_lm.tokenizer.bos_token_id is not None}
    requests = [Request(*r) for r in REQUESTS]
    got, want = lm.loglikelihood(requests, disable_tqdm=True), hf_lm.loglikelihood(requests, disable_tqdm=True)
    for (g, g_greedy), (w, w_greedy) in zip(got, want, strict=True):
        assert g == pytest.approx(w, abs=2e-4)
        assert g_greedy == w_greedy
    rolling = [Request("The quick brown fox jumps over the lazy dog. What is 3*4?")]
    assert lm.loglikelihood_rolling(rolling) == pytest.approx(hf_lm.loglikelihood_rolling(rolling), abs=2e-4)

