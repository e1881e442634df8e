"""The progress bars of attribution and its verification: one step per forward pass actually run (counted
by a hook on the embedding, independently of the bar), a total that is reached, and the same numbers as
without a bar."""

import math

import pytest
import torch
import tqdm

import lensprobe as lp
import lensprobe.experiments.attribution as attribution_module
import lensprobe.experiments.verify as verify_module


class Counter:
    """Counts the model's forward passes (each runs the embedding once)."""

    def __init__(self):
        self.n = 0

    def __call__(self, x, hook):
        self.n += 1
        return x


def recording_bar(bars: list, forwards: Counter):
    """A tqdm bar that records, at each update, the forwards run so far, and keeps its totals."""

    class Bar(tqdm.tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = False
            kwargs["file"] = open("/dev/null", "w")  # noqa: SIM115 (closed with the bar)
            super().__init__(*args, **kwargs)
            self.seen: list[tuple[int, int]] = []
            bars.append(self)

        def update(self, n=1):
            self.seen.append((int(n), forwards.n))
            return super().update(n)

        def close(self):
            file = self.fp
            super().close()
            file.close()

    return Bar


@pytest.fixture(scope="module")
def prompts(tiny):
    return [lp.build_prompt(tiny, "What is 12+7?", filler=lp.Filler.meaningless(count=5)),
            lp.build_prompt(tiny, "the cat sat on the mat")]


def test_attribution_bar_steps_once_per_forward_pass(tiny, prompts, monkeypatch):
    plain = lp.attribute_heads(tiny, prompts, "entropy", method="atp*", batch_size=3)
    bars: list = []
    forwards = Counter()
    monkeypatch.setattr(attribution_module, "tqdm", recording_bar(bars, forwards))
    with tiny.hooks(fwd_hooks=[("hook_embed", forwards)]):
        att = lp.attribute_heads(tiny, prompts, "entropy", method="atp*", batch_size=3, progress=True)
    assert torch.equal(att.estimates, plain.estimates) and torch.equal(att.scores, plain.scores)
    (bar,) = bars
    n_layers, n_heads = tiny.cfg.n_layers, tiny.cfg.n_heads
    below = (n_layers - 1) * n_heads  # heads under the top layer: the QK fix's rows
    per_prompt = 1 + 1 + math.ceil(below / 3)  # gradients, the pull-back pass, the chunks
    assert bar.total == len(prompts) * per_prompt == bar.n
    steps = [forwards_then for step, forwards_then in bar.seen if step == 1]
    assert steps == list(range(1, forwards.n + 1))  # every forward is one step, none counted twice
    assert forwards.n == bar.total


def test_attribution_without_the_qk_fix_steps_once_per_prompt(tiny, prompts, monkeypatch):
    bars: list = []
    forwards = Counter()
    monkeypatch.setattr(attribution_module, "tqdm", recording_bar(bars, forwards))
    with tiny.hooks(fwd_hooks=[("hook_embed", forwards)]):
        lp.attribute_heads(tiny, prompts, "entropy", method="atp", progress=True)
    (bar,) = bars
    assert bar.total == bar.n == forwards.n == len(prompts)


def test_verification_bar_steps_once_per_batched_forward(tiny, prompts, monkeypatch):
    att = lp.attribute_heads(tiny, prompts, "entropy")
    plain = lp.verify_attribution(tiny, prompts, "entropy", att, top=5, sample=4, batch_size=4)
    bars: list = []
    forwards = Counter()
    monkeypatch.setattr(verify_module, "tqdm", recording_bar(bars, forwards))
    with tiny.hooks(fwd_hooks=[("hook_embed", forwards)]):
        ver = lp.verify_attribution(tiny, prompts, "entropy", att, top=5, sample=4, batch_size=4, progress=True)
    assert ver.table["exact"].tolist() == plain.table["exact"].tolist()
    (bar,) = bars
    rows = 1 + 5 + 4  # the unablated row and one per verified head
    assert bar.total == bar.n == len(prompts) * math.ceil(rows / 4) == forwards.n
