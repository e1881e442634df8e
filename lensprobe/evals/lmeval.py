"""Any benchmark through EleutherAI's lm-evaluation-harness (``lm-eval``), with lensprobe conditions attached.

:class:`LensprobeLM` is an ``lm_eval`` model (registered as ``"lensprobe"``) that runs lm-eval's requests
on a lensprobe-loaded model with a condition attached: a filler (the meaningless-tokens paper's
``"w/ Mless"``, ``"w/ Mful"``, ``"random sentence"`` or your own), ARM (the authors' presets or your
settings) and head ablation, all attached through :func:`lensprobe.intervene`. :func:`lm_eval_accuracy`
runs tasks under several conditions and returns one table.

**Where the filler goes.** lm-eval builds each request's prompt itself (task description, few-shot
examples, the question), so the request's context plays the part of the paper's question: the filler
opens the context, joined to it as the authors join their pieces (the condition's ``joiner``: nothing
for the built-in conditions), and the continuation is scored after it. The authors' system prompt
(their MATH instruction) is not added, nor the condition's ``system`` or chat template: a task's own
instruction (its description, or lm-eval's ``--system_instruction``) is part of the context, so it
comes after the filler.

**Requests.** ``loglikelihood``: context and continuation are tokenized as lm-eval's own ``hf`` model
does (the whole string, the context's tokens split off; an empty context is the BOS token, else EOS),
with its special-token rule: ``add_bos_token=None`` (the default, as ``hf``'s) adds what the model's
tokenizer adds by itself when loaded on its own (:func:`~lensprobe.core.prompts.owntokenizer.own_special_tokens`:
Llama-3.1's and Gemma-3's BOS, nothing for SmolLM2 or Qwen2.5; not the BOS TransformerLens's tokenizer adds),
``True`` / ``False`` add them or not, and a text that already starts with the BOS token gets none; requests run longest first in
left-padded batches of ``batch_size`` with an attention mask and position ids counted from each row's
first token, one :func:`lensprobe.intervene` attachment per batch (so a seeded ARM draws for each
request what it draws alone). ``generate_until``: :func:`lensprobe.generate` (KV cache, continuous
batching) up to ``max_gen_toks`` tokens (fewer where the context would overflow the model's context),
stopping at EOS; the text is cut at the first ``until`` string (the generation does not stop there
early). ``loglikelihood_rolling``: lm-eval's rolling windows, the filler as the first window's context.

**Registration.** The lm-eval release on PyPI (0.4.13) finds a third-party model only when its module is
imported in the same process: ``import lensprobe.evals.lmeval`` registers ``"lensprobe"`` for
``lm_eval.simple_evaluate(model="lensprobe", ...)``, and ``python -m lensprobe.evals.lmeval ...`` runs
lm-eval's own command line with it registered. lensprobe also declares an ``lm_eval.models`` entry
point for lm-eval releases that discover installed model plugins; none was released when this was
written (0.4.13 is the newest), so a plain ``lm_eval --model lensprobe`` is untested.

**Beside it.** :mod:`lensprobe.evals.lmeval_scores` scores the ``loglikelihood`` requests
(:func:`~lensprobe.evals.lmeval_scores.continuation_scores`); :mod:`lensprobe.evals.lmeval_condition` turns the
adapter's arguments into its condition, filler and batch size.

Example:
    >>> lm = LensprobeLM(model, condition="w/ Mless", ablate="L0H1", batch_size=8)
    >>> lm_eval.simple_evaluate(model=lm, tasks=["arc_easy"], limit=20)
    >>> lm_eval_accuracy(model, ["arc_easy"], "w/o,w/ Mless", limit=20)   # one row per task x condition
"""


import importlib
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from lensprobe.core.boundary import PASSED_THROUGH, translated
from lensprobe.core.checks import count
from lensprobe.core.errors import LensprobeError, SettingError
from lensprobe.core.lazy import pandas
from lensprobe.core.models.facts import ModelFacts, model_facts
from lensprobe.core.models.kinds import require_bridge
from lensprobe.core.models.loading import load_model
from lensprobe.core.prompts.conditions import Condition
from lensprobe.core.prompts.owntokenizer import own_special_tokens
from lensprobe.evals.lmeval_condition import (
    arm_of,
    batch_size_of,
    condition_of,
    cut_at,
    described,
    filler_text,
)
from lensprobe.evals.lmeval_scores import continuation_scores
from lensprobe.generation.config import MAX_NEW_TOKENS
from lensprobe.generation.loop import generate
from lensprobe.interventions import ablate_heads

__all__ = ["MODEL_NAME", "LensprobeLM", "lm_eval_accuracy", "main"]

MODEL_NAME = "lensprobe"
"""The name lm-eval knows the adapter by (``--model lensprobe``)."""

_SAMPLING = ("do_sample", "temperature", "top_p", "top_k", "seed")


class LensprobeLM(TemplateLM):
    """An lm-eval model running a lensprobe model under one condition.

    Args:
        pretrained: a loaded TransformerLens model, or what :func:`lensprobe.load_model` takes (``None``:
            the embedded SmolLM2; a hub name, a folder or a ``.gguf`` file).
        condition: a condition name (``"w/o"``, ``"w/ Mless"``, ``"w/ Mful"``, ``"random sentence"``,
            their aliases, ``"ARM"`` or ``"<name>+ARM"``) or a :class:`~lensprobe.Condition`; its filler
            and interventions apply (see the module docs for where the filler goes).
        arm: ``"preset"``: the authors' ARM for this model (:meth:`lensprobe.ARM.preset`, on
            ``arm_benchmark`` from ``arm_source``; ``c``, ``percentile``, ``seed`` override it); an
            :class:`~lensprobe.ARM`; or ``None``: ARM from ``c`` and ``percentile`` when given, else none.
            ARM settings attach ARM to the condition (a ``+ARM`` name needs them).
        arm_benchmark, arm_source: the preset's benchmark (``"math500"``, ``"aime2024"``, ...) and source
            (``"code"`` or ``"paper"``).
        c, percentile, seed: ARM settings (see :class:`~lensprobe.ARM`).
        ablate: heads to zero-ablate (:func:`lensprobe.ablate_heads`): ``"L0H3"``, several separated by
            spaces (``"L0H3 L1H2"``), or a list.
        batch_size: requests per forward (an int, or its digits as lm-eval's command line passes them).
        max_batch_size: accepted because lm-eval passes it; batches are ``batch_size``.
        device, dtype: where and in what dtype the model's weights are (:func:`lensprobe.load_model`).
        add_bos_token: lm-eval's ``hf`` argument, with its default: ``None`` adds the special tokens the
            model's tokenizer adds by itself (its BOS for Llama-3.1 and Gemma-3; none for SmolLM2 or
            Qwen2.5); ``True`` puts the BOS in front of every request, ``False`` nothing.
        facts: ``pretrained``'s facts (:func:`~lensprobe.core.models.facts.model_facts`) when the caller has loaded
            the model and read them: the model is used as it is, not loaded again (:func:`lm_eval_accuracy` loads
            once for all its conditions). ``None``: ``pretrained`` goes through :func:`lensprobe.load_model`.

    Raises:
        LensprobeError: an unknown condition, a condition with its own prompt builder or generation
            settings, a filler placed after the question, bad ARM settings, or a bad batch size.

    Example:
        >>> lm = LensprobeLM(model, condition="w/ Mless+ARM", c=0.1, percentile=95, seed=0)
        >>> lm.loglikelihood(requests)   # lm-eval Instances: [(logprob, is_greedy), ...]
    """

    def __init__(self, pretrained: Any = None, condition: Any = "w/o", *, arm: Any = None,
                 arm_benchmark: str | None = "math500", arm_source: str = "code", c: float | None = None,
                 percentile: float | None = None, seed: int | None = None, ablate: Any = None,
                 batch_size: int | str = 8, max_batch_size: int | None = None, device: Any = None,
                 dtype: Any = None, add_bos_token: bool | None = None, facts: ModelFacts | None = None) -> None:
        super().__init__()
        if facts is not None and (device is not None or dtype is not None):
            raise LensprobeError("facts= is for a model already loaded: give device= and dtype= to lp.load_model, "
                                 "or drop facts=.")
        model = pretrained if facts is not None else load_model(pretrained, device=device, dtype=dtype)
        require_bridge(model, "the lm-eval adapter", "load the model with lp.load_model(name)")
        self.model = model
        self.facts = facts if facts is not None else model_facts(model)
        self.tokenizer = self.facts.tokenizer
        self.batch_size = batch_size_of(batch_size)
        if add_bos_token not in (None, True, False):
            raise LensprobeError(f"add_bos_token must be true, false or unset (the tokenizer's own rule), got "
                                 f"{add_bos_token!r}.")
        self.add_bos_token = add_bos_token
        self.adds_special_tokens = own_special_tokens(self.tokenizer) if add_bos_token is None else add_bos_token
        made = arm_of(self.facts, arm, arm_benchmark, arm_source, c=c, percentile=percentile, seed=seed)
        cond = condition_of(condition, made)
        if ablate is not None:
            heads = ablate.split() if isinstance(ablate, str) else ablate
            cond = replace(cond, name=f"{cond.name}, {' '.join(map(str, heads))} ablated",
                           interventions=cond.interventions + (ablate_heads(heads),))
        self.condition = cond
        self.filler = filler_text(cond, self.tokenizer)

    # ----- what TemplateLM asks of a model
    @property
    def eot_token_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return int(bos) if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self.facts.n_ctx

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "")).replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """``string``'s ids as lm-eval's ``hf`` model encodes them: ``add_special_tokens`` when given, else the
        adapter's rule (``add_bos_token``), and none for a text that starts with the BOS token already."""
        add = self.adds_special_tokens if add_special_tokens is None else add_special_tokens
        if add_special_tokens is None and string.startswith(self.tokenizer.decode(self.prefix_token_id)):
            add = False
        return list(self.tokenizer.encode(string, add_special_tokens=add))

    def prompt_text(self, context: str) -> str:
        """The request's context with the condition's filler in front (the context itself without one)."""
        return context if self.filler is None else self.filler + self.condition.joiner + context

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """``(log P(continuation | filler + context), continuation is the greedy one)`` per request."""
        placed = [_Request((self.prompt_text(ctx), cont)) for ctx, cont in (r.args for r in requests)]
        return super().loglikelihood(placed, disable_tqdm=disable_tqdm)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        rows = [(list(ctx) + list(cont))[:-1] for _, ctx, cont in requests]
        conts = [list(cont) for _, _, cont in requests]
        # no partial cache entries: these requests hold the filler, lm-eval's cache keys the requests as asked
        return continuation_scores(self.model, rows, conts, self.condition.interventions, self.batch_size,
                                   facts=self.facts)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Log-probability of each whole text, in lm-eval's rolling windows of the model's context."""
        first = self.tok_encode(self.filler) if self.filler else None  # the filler opens the text, as hf's text would
        out = []
        for (text,) in (r.args for r in requests):
            room = self.max_length - (len(first) if first else 0)
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(text, add_special_tokens=None if first is None else False),
                prefix_token=self.prefix_token_id,
                max_seq_len=room, context_len=1)]
            if first is not None:
                windows[0] = (first, windows[0][1])
            scores = self._loglikelihood_tokens([(None, ctx, cont) for ctx, cont in windows])
            total = sum(score for score, _ in scores)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy (or sampled, as the task asks) text for each request, cut at its first ``until`` string."""
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault(json.dumps(r.args[1], sort_keys=True, default=str), []).append(i)
        out = [""] * len(requests)
        for indices in groups.values():
            kwargs = dict(requests[indices[0]].args[1])
            texts = self._generate([requests[i].args[0] for i in indices], kwargs)
            for i, text in zip(indices, texts, strict=True):
                out[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return out

    def _generate(self, contexts: list[str], kwargs: dict) -> list[str]:
        until = kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        max_gen = count("max_gen_toks", kwargs.pop("max_gen_toks", 256), 1, MAX_NEW_TOKENS)  # 128.0 is no count
        unknown = sorted(set(kwargs) - set(_SAMPLING))
        if unknown:
            raise LensprobeError(f"generation setting(s) {unknown} are not supported by the lensprobe model: "
                                 f"use {', '.join(('until', 'max_gen_toks') + _SAMPLING)}.")
        if not kwargs.get("do_sample") or not kwargs.get("temperature", 1.0):
            kwargs = {"do_sample": False} | ({"seed": kwargs["seed"]} if "seed" in kwargs else {})
        prompts = [self.tok_encode(self.prompt_text(ctx)) for ctx in contexts]
        caps = [min(max_gen, self.max_length - len(p)) for p in prompts]
        if min(caps) < 1:
            raise LensprobeError(f"a prompt of {max(map(len, prompts))} tokens leaves no room to generate in the "
                                 f"model's context of {self.max_length}: use a shorter task prompt or filler.")
        trace = generate(self.model, prompts, max_new_tokens=max(caps), caps=caps, batch_size=self.batch_size,
                         interventions=self.condition.interventions, facts=self.facts, **kwargs)
        texts = [self.tokenizer.decode(ids, skip_special_tokens=True) for ids in trace.generated_ids]
        return [cut_at(text, until) for text in texts]

    def get_model_info(self) -> dict:
        """What lm-eval writes in its results' ``config``: the model and the condition that ran."""
        cfg = self.model.cfg
        return {"model_name": str(getattr(cfg, "model_name", "")), "condition": self.condition.name,
                "filler": self.filler, "interventions": [described(i) for i in self.condition.interventions],
                "dtype": str(getattr(cfg, "dtype", "")), "add_bos_token": self.add_bos_token,
                "adds_special_tokens": self.adds_special_tokens}


if __name__ != "__main__":  # run as a script, the module registers itself on import below
    register_model(MODEL_NAME)(LensprobeLM)


class _Request:
    """A request's arguments, as TemplateLM reads them (``.args``)."""
    __slots__ = ("args",)

    def __init__(self, args: tuple) -> None:
        self.args = args



def lm_eval_accuracy(model: Any, tasks: Sequence[str] | str, conditions: Any = "w/o", *, limit: int | float | None = None,
                     include_path: str | None = None, include_defaults: bool = True, batch_size: int = 8,
                     metric: str = "acc", **model_args: Any):
    """Accuracy of ``model`` on lm-eval ``tasks`` under each condition: one row per task, condition and filter.

    Args:
        model: a loaded model, or what :func:`lensprobe.load_model` takes (loaded once).
        tasks: lm-eval task names (``"arc_easy"``, ``"gsm8k"``, or tasks of your own under ``include_path``).
        conditions: names separated by commas (``"w/o,w/ Mless,w/ Mful"``; ``"ARM"`` and ``"+ARM"`` names
            need ARM settings in ``model_args``), or a list of names and :class:`~lensprobe.Condition`.
        limit: problems per task (lm-eval's ``limit``: a count, or a fraction below 1).
        include_path: a folder of task YAML files of your own.
        include_defaults: also index lm-eval's built-in tasks (``False``: only those under
            ``include_path``; indexing the built-in ones takes tens of seconds).
        batch_size: requests per forward.
        metric: the metric read as accuracy (``"acc"``; ``"exact_match"`` for generation tasks).
        **model_args: the other :class:`LensprobeLM` arguments (``arm="preset"``, ``arm_benchmark``,
            ``c``, ``percentile``, ``seed``, ``ablate``, ``device``, ``dtype``, ``add_bos_token``).

    Returns:
        A pandas DataFrame with columns ``task``, ``condition``, ``filter`` (lm-eval's filter: ``"none"``, or
        e.g. GSM8K's ``"strict-match"``), ``n`` (problems scored), ``accuracy`` and ``stderr`` (lm-eval's
        standard error of the mean, ``<NA>`` where lm-eval gives none).

    Raises:
        SettingError: no task or condition, one twice, no metric name (before loading); a metric not reported.

    Example:
        >>> lm_eval_accuracy(model, ["arc_easy", "arc_challenge"], "w/o,w/ Mless", limit=100)
    """
    import lm_eval
    from lm_eval.tasks import TaskManager

    names = [tasks] if isinstance(tasks, str) else list(tasks)
    items = [s for s in conditions.split(",") if s.strip()] if isinstance(conditions, str) else list(conditions)
    _check_run(names, items, metric)  # before the model loads
    loaded = load_model(model, device=model_args.pop("device", None), dtype=model_args.pop("dtype", None))
    facts = model_facts(loaded)  # loaded and read once, for every condition
    manager = TaskManager(include_path=include_path, include_defaults=include_defaults)
    rows = []
    for item in items:
        lm = LensprobeLM(loaded, item, batch_size=batch_size, facts=facts, **model_args)
        try:
            result = lm_eval.simple_evaluate(model=lm, tasks=names, limit=limit, task_manager=manager,
                                             log_samples=False)
        except PASSED_THROUGH:
            raise
        except Exception as failure:  # lm-eval's own errors (an unknown task, a task file it cannot read): one line
            raise translated(failure, f"lm-eval on {', '.join(names)} under {lm.condition.name!r}",
                             "check the task names (`lm_eval --tasks list`) and the task files given "
                             "(include_path)") from failure
        if result is None:
            raise LensprobeError("lm-eval returned no results (not the main process of a distributed run).")
        for task in names:
            scores, n = result["results"][task], result["n-samples"][task]["effective"]
            if not any(key.startswith(f"{metric},") for key in scores):
                known = sorted({key.split(",")[0] for key in scores if "_stderr" not in key and "," in key})
                raise SettingError("metric", f"task {task} reports no metric {metric!r}: use one of {known}")
            for key, value in scores.items():
                if key.startswith(f"{metric},") and not key.startswith(f"{metric}_stderr,"):
                    filt = key.split(",", 1)[1]
                    err = scores.get(f"{metric}_stderr,{filt}")
                    rows.append({"task": task, "condition": lm.condition.name, "filter": filt, "n": int(n),
                                 "accuracy": float(value),
                                 "stderr": float(err) if isinstance(err, (int, float)) else None})
    table = pandas().DataFrame(rows, columns=["task", "condition", "filter", "n", "accuracy", "stderr"])
    return table.astype({"stderr": "Float64"})  # <NA> where lm-eval gives none ("N/A"), never NaN


def _check_run(tasks: list, conditions: list, metric: Any) -> None:
    """Tasks, conditions (none twice: its rows would mix with its twin's) and a metric name."""
    if not tasks or not all(isinstance(t, str) and t.strip() for t in tasks):
        raise SettingError("tasks", f"expected lm-eval task names such as arc_easy, got {tasks!r}")
    if not conditions:
        raise SettingError("conditions", "expected at least one condition, e.g. 'w/o' or 'w/o,w/ Mless', got none")
    labels = [c.name if isinstance(c, Condition) else str(c).strip() for c in conditions]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise SettingError("conditions", f"{twice[0]!r} is given twice: name each condition once")
    if not isinstance(metric, str) or not metric.strip() or "," in metric:
        raise SettingError("metric", f"expected an lm-eval metric name such as acc or exact_match, got {metric!r}")


def main(argv: Sequence[str] | None = None) -> None:
    """lm-eval's own command line with the ``"lensprobe"`` model registered (``python -m lensprobe.evals.lmeval``).

    Example:
        >>> main(["--model", "lensprobe", "--model_args", "condition=w/ Mless", "--tasks", "arc_easy"])
    """
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()


if __name__ == "__main__":  # python -m lensprobe.evals.lmeval: this copy runs as __main__ and registers nothing;
    # the module under its own name registers the model when imported, and its main runs lm-eval's command line
    importlib.import_module(__spec__.name).main()
