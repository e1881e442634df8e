"""No hook is left behind: an error or a KeyboardInterrupt raised inside a hook mid-run
propagates, and afterwards the model holds exactly the hooks it held before (the user's own,
which still fire), whichever entry point was running."""

import pytest
import torch
from oracles import Counter, hook_snapshot

import lensprobe as lp
from lensprobe.evals.problems.load import Problem


class Bomb:
    """A user hook that raises ``error`` on its ``at``-th call while armed."""

    def __init__(self, at: int, error: BaseException) -> None:
        self.at, self.error, self.calls, self.armed = at, error, 0, True

    def __call__(self, x, hook):
        self.calls += 1
        if self.armed and self.calls == self.at:
            raise self.error
        return None



PROMPT = "What is 2+3?"


def run_patch(model, p):
    lp.patch(model, p, lp.build_prompt(model, "What is 4+1?"), ["blocks.1.hook_resid_pre", "blocks.0.attn.hook_z"])


def run_sweep(model, p):
    lp.ablation_sweep(model, [p], heads=[(0, 0), (0, 1), (1, 0)], batch_size=1, progress=False)


def run_attention(model, p):
    lp.attention_patterns(model, p, [1], lp.ablate_heads("L0H1"))


def run_evaluate(model, p):
    probs = [Problem(id="a", problem=PROMPT, answer="5"), Problem(id="b", problem="What is 1+1?", answer="2")]
    lp.evaluate(model, probs, [lp.Condition("abl", interventions=(lp.ablate_heads("L0H1"),))],
                max_new_tokens=4, batch_size=1, progress=False)


def run_head_means(model, p):
    lp.interventions.head_means(model, [p, lp.build_prompt(model, "What is 1+1?")], layers=[0, 1])


def run_trace(model, p):
    lp.trace_generation(model, p, max_new_tokens=4, interventions=[lp.ablate_heads("L1H2")])


def run_generate(model, p):
    lp.generate(model, [p, p], max_new_tokens=4, interventions=[lp.ablate_heads("L1H2")])


# entry point, and at which call of blocks.0.hook_resid_post the error comes (mid-run:
# after lensprobe attached its hooks and some forwards or layers ran)
ENTRY_POINTS = {
    "patch": (run_patch, 2), "ablation_sweep": (run_sweep, 2), "attention_patterns": (run_attention, 1),
    "evaluate": (run_evaluate, 3), "head_means": (run_head_means, 1), "trace_generation": (run_trace, 3),
    "generate": (run_generate, 3),
}


@pytest.mark.parametrize("error", [RuntimeError("boom inside a hook"), KeyboardInterrupt("boom inside a hook")],
                         ids=["exception", "KeyboardInterrupt"])
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_no_hook_is_left_behind(tiny, entry, error):
    run, at = ENTRY_POINTS[entry]
    p = lp.build_prompt(tiny, PROMPT)
    counter, bomb = Counter(), Bomb(at, error)
    with torch.inference_mode():
        tiny(p.tokens)  # TransformerLens' own block hooks are wired now, not during the run
    bare = hook_snapshot(tiny)
    tiny.add_hook("blocks.1.hook_resid_post", counter)
    tiny.add_hook("blocks.0.hook_resid_post", bomb)
    try:
        before = hook_snapshot(tiny)
        with pytest.raises(type(error), match="boom inside a hook"):
            run(tiny, p)
        assert bomb.calls == at, "the error must come from the hook, mid-run"
        assert hook_snapshot(tiny) == before
        bomb.armed = False
        seen = counter.calls
        with torch.inference_mode():
            tiny(p.tokens)
        assert counter.calls == seen + 1  # the user's hook is still there and fires
        run(tiny, p)  # and the entry point still works afterwards
        assert hook_snapshot(tiny) == before
    finally:
        tiny.reset_hooks(including_permanent=True)
    assert hook_snapshot(tiny) == bare


@pytest.mark.parametrize("error", [RuntimeError("boom inside a hook"), KeyboardInterrupt("boom inside a hook")],
                         ids=["exception", "KeyboardInterrupt"])
@pytest.mark.parametrize("entry", ["generate", "trace_generation"])
def test_the_plain_engine_leaves_no_hook_behind(tiny, entry, error):
    """With no hooks on the model, generation runs the unwrapped modules (engine "hf"); an error
    in an intervention there leaves no hook on them either."""
    from lensprobe.generation.engines.view import plain_model

    p = lp.build_prompt(tiny, PROMPT)
    bomb = Bomb(2, error)  # the first decode step
    run = lp.generate if entry == "generate" else lp.trace_generation
    views = [v for v in (plain_model(tiny, a) for a in ("sdpa", "sdpa_last", "eager")) if v is not None]
    assert views

    def view_hooks():
        return [hook_snapshot(v) for v in views]

    before_view, before_model = view_hooks(), hook_snapshot(tiny)
    with pytest.raises(type(error), match="boom inside a hook"):
        run(tiny, p, max_new_tokens=4, interventions=[("hook_embed", bomb)])
    assert bomb.calls == 2
    assert view_hooks() == before_view and hook_snapshot(tiny) == before_model
    bomb.armed = False
    out = run(tiny, p, max_new_tokens=4, interventions=[("hook_embed", bomb)])
    assert out.meta["engine"] == "hf"  # the engine this test is about
    assert view_hooks() == before_view and hook_snapshot(tiny) == before_model
