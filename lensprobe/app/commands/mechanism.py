"""``lensprobe mechanism``: how filler tokens rescale one layer's attention, and where its MLP activations go."""

from dataclasses import replace
from pathlib import Path

from lensprobe.app.common import (
    add_inputs,
    check_out_dir,
    load_cli_model,
    out_of,
    print_files,
    system_of,
    write_figure,
    writing_out_dir,
)
from lensprobe.app.examples import describe
from lensprobe.app.option_groups import (
    FillerCountOptions,
    ModelOptions,
    OutputOptions,
    QuestionOptions,
    SystemOptions,
)
from lensprobe.app.parsing import add_config
from lensprobe.app.sections.mechanism import MECHANISM_ARM
from lensprobe.core.models.loading import check_layers, model_label
from lensprobe.core.prompts.prompt import prompt_json
from lensprobe.core.storage.jsonable import stable_repr, to_jsonable
from lensprobe.core.storage.store import atomic_file, atomic_write_json
from lensprobe.experiments.head_settings import HeadSelection
from lensprobe.interventions.arm import ARM
from lensprobe.interventions.arm_settings import ArmSettings
from lensprobe.studies.mechanism import (
    activation_stats,
    affine_fit_summary,
    filler_affine_fit,
    mechanism_prompts,
)
from lensprobe.studies.settings import MechanismConfig, heads_in_layers
from lensprobe.viz import activation_histogram_figure, affine_fit_figure

ARM_CONDITION = "w/o + ARM"


def add_mechanism(subparsers) -> None:
    """Register ``lensprobe mechanism``."""
    p = subparsers.add_parser("mechanism", **describe(
        "mechanism", help="filler tokens rescale attention (lambda, bias) and move MLP activations from zero",
        description="Run a question with and without the Mless filler ('/' x 55) and write, for one layer: per "
                    "head and question position, lambda = 1 - attention on the filler and the error of "
                    "out_with = lambda * out_without + bias; and the MLP activation histograms over the question "
                    "(w/o, w/ Mless, and w/o + ARM) with the share near zero. Tables as CSV, figures as HTML. "
                    "Layers and heads are 0-based (TransformerLens); papers count from 1."))
    add_inputs(p, ModelOptions, QuestionOptions, SystemOptions, FillerCountOptions, HeadSelection, OutputOptions)
    add_config(p, MechanismConfig, "config")
    add_config(p, ArmSettings, "arm")  # --arm-c, as eval and reproduce take it
    p.set_defaults(func=run_mechanism)


def run_mechanism(args) -> int:
    args.QuestionOptions.one("mechanism")  # one question, before the model loads
    args.out = check_out_dir(out_of(args, "mechanism"), "mechanism")  # before the model loads
    with writing_out_dir(args.out, "mechanism") as files:
        return _mechanism(args, files)


def _mechanism(args, files: list[Path]) -> int:
    model = load_cli_model(args)
    config: MechanismConfig = replace(args.config, filler_count=args.FillerCountOptions.filler_count,
                                      arm_c=args.arm.arm_c)
    layer = check_layers(model, [config.layer])[0]
    heads = heads_in_layers(model, args.HeadSelection.spec(), [layer])
    question = args.QuestionOptions.one("mechanism")
    prompts = mechanism_prompts(model, question, system=system_of(args), count=config.filler_count)
    fit = filler_affine_fit(model, prompts["w/ Mless"], prompts["w/o"], layer=layer, heads=heads)
    summary = affine_fit_summary(fit)
    arm = None if config.no_arm else ARM.preset(model, fallback=MECHANISM_ARM, layer=layer, seed=config.arm_seed,
                                                source=args.arm.source, **args.arm.settings())
    c = config.band_c(arm)
    runs = dict(prompts)
    ivs = {}
    if arm is not None:
        runs[ARM_CONDITION] = prompts["w/o"]
        ivs[ARM_CONDITION] = [arm]
    stats = activation_stats(model, runs, layer=layer, where=config.where, interventions=ivs, eps=config.eps, c=c,
                             bins=config.bins)
    out: Path = args.out
    name = model_label(model)
    tables = {"affine_fit.csv": fit, "affine_fit_summary.csv": summary,
              "activation_histogram.csv": stats.histogram, "activation_summary.csv": stats.summary}
    for file, table in tables.items():
        with atomic_file(out / file) as tmp:
            table.to_csv(tmp, index=False)
        files.append(out / file)
    files.append(write_figure(affine_fit_figure(fit, title=f"{name}: filler tokens rescale layer-{layer} attention"),
                              out / f"affine_fit_L{layer}.html"))
    files.append(write_figure(
        activation_histogram_figure(stats, title=f"{name}: layer-{layer} MLP activations {config.where}, per condition"),
        out / f"activation_histogram_L{layer}.html"))
    meta = {"model": name, "question": question, "layer": layer, "heads": heads, "where": config.where,
            "eps": stats.eps, "eps_reference": stats.reference, "c": c,
            "arm": stable_repr(arm) if arm is not None else None,
            "indexing": "0-based layers and heads (L0H13 = papers' layer 1, head 14)",
            "prompts": {k: prompt_json(p) for k, p in prompts.items()}}
    js = out / "mechanism.json"
    atomic_write_json(js, to_jsonable(meta))
    files.append(js)
    print_files(out, files)
    return 0
