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
does (the whole string, the context's tokens split off; no special tokens unless
``add_bos_token=True``; an empty context is the BOS token, else EOS); requests run longest first in
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

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from lensprobe.core.boundary import PASSED_THROUGH, translated
from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import intervene
from lensprobe.core.lazy import pandas
from lensprobe.core.models.facts import ModelFacts, model_facts
from lensprobe.core.models.kinds import require_bridge
from lensprobe.core.models.loading import load_model
from lensprobe.core.prompts.conditions import Condition, arm_base, resolve_conditions, with_arm
from lensprobe.core.prompts.fillers import Filler
from lensprobe.core.storage.identity import IdentityError, identity
from lensprobe.generation.loop import generate
from lensprobe.interventions import ARM, ablate_heads

__all__ = ["MODEL_NAME", "LensprobeLM", "continuation_scores", "lm_eval_accuracy", "main"]

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
        add_bos_token: put the tokenizer's special tokens (its BOS) in front of every request (lm-eval's
            ``hf`` model does when the tokenizer adds one by default, e.g. Llama; not SmolLM2 or Qwen2.5).
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
                 dtype: Any = None, add_bos_token: bool = False, facts: ModelFacts | None = None) -> None:
        super().__init__()
        if facts is not None and (device is not None or dtype is not None):
            raise LensprobeError("facts= is for a model already loaded: give device= and dtype= to lp.load_model, "
                                 "or drop facts=.")
        model = pretrained if facts is not None else load_model(pretrained, device=device, dtype=dtype)
        require_bridge(model, "the lm-eval adapter", "load the model with lp.load_model(name)")
        self.model = model
        self.facts = facts if facts is not None else model_facts(model)
        self.tokenizer = self.facts.tokenizer
        self.batch_size = _batch_size(batch_size)
        self.add_bos_token = bool(add_bos_token)
        made = _arm(self.facts, arm, arm_benchmark, arm_source, c=c, percentile=percentile, seed=seed)
        cond = _condition(condition, made)
        if ablate is not None:
            heads = ablate.split() if isinstance(ablate, str) else ablate
            cond = replace(cond, name=f"{cond.name}, {' '.join(map(str, heads))} ablated",
                           interventions=cond.interventions + (ablate_heads(heads),))
        self.condition = cond
        self.filler = _filler_text(cond, self.tokenizer)

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
        add = self.add_bos_token if add_special_tokens is None else add_special_tokens
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
        first = self.tok_encode(self.filler, add_special_tokens=self.add_bos_token) if self.filler else None
        out = []
        for (text,) in (r.args for r in requests):
            room = self.max_length - (len(first) if first else 0)
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(text, add_special_tokens=False), prefix_token=self.prefix_token_id,
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
        max_gen = int(kwargs.pop("max_gen_toks", 256))
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
        return [_cut(text, until) for text in texts]

    def get_model_info(self) -> dict:
        """What lm-eval writes in its results' ``config``: the model and the condition that ran."""
        cfg = self.model.cfg
        return {"model_name": str(getattr(cfg, "model_name", "")), "condition": self.condition.name,
                "filler": self.filler, "interventions": [_described(i) for i in self.condition.interventions],
                "dtype": str(getattr(cfg, "dtype", "")), "add_bos_token": self.add_bos_token}


if __name__ != "__main__":  # run as a script, the module registers itself on import below
    register_model(MODEL_NAME)(LensprobeLM)


def _described(intervention: Any) -> Any:
    """An intervention by content (its settings, tensors by digest) for lm-eval's results; never its ``repr``,
    which summarises tensors and hides closures. One that cannot be described is named by its type."""
    try:
        return identity(intervention)
    except IdentityError:
        return {".type": type(intervention).__qualname__, ".identity": "not describable by content"}


class _Request:
    """A request's arguments, as TemplateLM reads them (``.args``)."""
    __slots__ = ("args",)

    def __init__(self, args: tuple) -> None:
        self.args = args


def continuation_scores(model, rows: list[list[int]], conts: list[list[int]], interventions: Sequence = (),
                        batch_size: int = 8, *, facts: ModelFacts | None = None) -> list[tuple[float, bool]]:
    """Summed log-probability of each continuation and whether greedy decoding gives it, batched.

    Args:
        model: a TransformerLens bridge.
        rows: per request, the input token ids: context and continuation without its last token.
        conts: per request, the continuation's token ids (the last ``len(cont)`` inputs predict them).
        interventions: attached with :func:`lensprobe.intervene`, once per batch.
        batch_size: requests per forward (longest first, left-padded, with an attention mask).
        facts: the model's facts, read once by the caller (``None``: read here).

    Raises:
        LensprobeError: a request longer than the model's context.

    Example:
        >>> continuation_scores(model, [[5, 6, 7]], [[7, 8]])   # log P(7, 8 | 5, 6)
    """
    facts = facts if facts is not None else model_facts(model)
    n_ctx = facts.n_ctx
    longest = max((len(r) for r in rows), default=0)
    if longest > n_ctx:
        raise LensprobeError(f"a request is {longest} tokens but the model's context is {n_ctx}: lensprobe does "
                             "not truncate it (that would drop the filler); use shorter contexts or fewer few-shot "
                             "examples.")
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
    out: list[tuple[float, bool]] = [(0.0, False)] * len(rows)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        keep = max(len(conts[i]) for i in chunk)
        logp = _last_log_probs(model, facts, [rows[i] for i in chunk], keep, interventions)
        for b, i in enumerate(chunk):
            target = torch.tensor(conts[i], device=logp.device)
            read = logp[b, keep - len(target):]
            out[i] = (float(read.gather(-1, target[:, None]).sum()), bool((read.argmax(-1) == target).all()))
    return out


def _last_log_probs(model, facts: ModelFacts, rows: list[list[int]], keep: int, interventions: Sequence
                    ) -> torch.Tensor:
    """``[batch, keep, d_vocab]`` float32 log-softmax at the last ``keep`` positions of left-padded ``rows``."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), facts.pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[b, width - len(r):] = 1
    ids, mask = ids.to(facts.device), mask.to(facts.device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode(), intervene(model, *interventions):
        logits = model(ids, attention_mask=mask, position_ids=positions, return_type="logits")
    return torch.log_softmax(logits[:, -keep:].float(), dim=-1)


def _cut(text: str, until: list[str]) -> str:
    """``text`` up to the first of the ``until`` strings (HF's ``hf`` model cuts each in turn, the same)."""
    for stop in until:
        if stop:
            text = text.split(stop)[0]
    return text


def _batch_size(value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise LensprobeError(f"batch_size must be an integer >= 1, got {value!r} (lensprobe has no 'auto').")
    return value


def _arm(facts: ModelFacts, arm: Any, benchmark: str | None, source: str, **given: Any) -> Any:
    """The ARM the settings ask for (an intervention given as ``arm`` is taken as it is), or ``None``; the preset
    is the model's by its configuration (:func:`~lensprobe.interventions.arm_presets.model_key`)."""
    fields = {k: v for k, v in given.items() if v is not None}
    if arm is None:
        return ARM(**fields) if "c" in fields or "percentile" in fields else None
    if arm == "preset":
        return ARM.preset(facts, benchmark, source=source, **fields)  # type: ignore[arg-type]
    if isinstance(arm, str) or not hasattr(arm, "hooks"):
        raise LensprobeError(f"arm must be 'preset', an lp.ARM or None, got {arm!r}.")
    return arm


def _condition(condition: Any, arm: Any) -> Condition:
    """The condition by name or as given, with ``arm`` attached when it does not name ARM itself."""
    if isinstance(condition, Condition):
        cond = condition
    elif isinstance(condition, str) and condition.strip():
        cond = resolve_conditions(condition.strip(), arm=arm)[0]
        if arm is not None and arm_base(condition) is not None:
            return _checked(cond)
    else:
        raise LensprobeError(f"condition must be a condition name or an lp.Condition, got {condition!r}.")
    return _checked(with_arm(cond, arm) if arm is not None else cond)


def _checked(cond: Condition) -> Condition:
    if cond.build is not None:
        raise LensprobeError(f"condition {cond.name!r} builds its own prompts (build=...); lm-eval's tasks build "
                             "the prompt, so only a condition's filler and interventions apply.")
    if cond.generate_kwargs:
        raise LensprobeError(f"condition {cond.name!r} sets generation keywords {sorted(cond.generate_kwargs)}, "
                             "which lm-eval requests cannot take.")
    if cond.filler is not None and cond.placement == "after_question":
        raise LensprobeError(f"condition {cond.name!r} places its filler after the question, which would put it "
                             "between lm-eval's context and the scored continuation: use placement='between'.")
    return cond


def _filler_text(cond: Condition, tokenizer) -> str | None:
    filler = cond.filler
    if filler is None:
        return None
    if not isinstance(filler, Filler):
        filler = filler(tokenizer)
    return filler.resolve(tokenizer)


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
        standard error of the mean, or NaN).

    Example:
        >>> lm_eval_accuracy(model, ["arc_easy", "arc_challenge"], "w/o,w/ Mless", limit=100)
    """
    import lm_eval
    from lm_eval.tasks import TaskManager

    loaded = load_model(model, device=model_args.pop("device", None), dtype=model_args.pop("dtype", None))
    facts = model_facts(loaded)  # loaded and read once, for every condition
    names = [tasks] if isinstance(tasks, str) else list(tasks)
    items = [s for s in conditions.split(",") if s.strip()] if isinstance(conditions, str) else list(conditions)
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
            for key, value in scores.items():
                if key.startswith(f"{metric},") and not key.startswith(f"{metric}_stderr,"):
                    filt = key.split(",", 1)[1]
                    err = scores.get(f"{metric}_stderr,{filt}")
                    rows.append({"task": task, "condition": lm.condition.name, "filter": filt, "n": int(n),
                                 "accuracy": float(value),
                                 "stderr": float(err) if isinstance(err, (int, float)) else float("nan")})
    return pandas().DataFrame(rows, columns=["task", "condition", "filter", "n", "accuracy", "stderr"])


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
