"""Every kind of lensprobe figure, built from hand-made results the size of a real study (SmolLM2's 30 layers
and 9 heads, long model names, long notes), and a check that draws them with kaleido and measures their text
in headless Chromium.

:func:`every_figure` builds them; :func:`render_svgs` draws them all in one kaleido call (SVG);
:func:`measure_svgs` loads the SVGs into one page in Chromium and returns, per figure, the box of every text
element the browser drew (its role: title, panel title, axis title, tick label, legend, colour bar); :func:`problems`
says what sticks out of the figure or overlaps.
"""

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import plotly.io as pio
import torch

import lensprobe as lp
from lensprobe.experiments.attribution import Attribution
from lensprobe.experiments.verify import Verification
from lensprobe.studies.mechanism import ActivationStats

LAYERS, HEADS = 30, 9
MODELS = ("HuggingFaceTB/SmolLM2-135M-Instruct", "Qwen/Qwen2.5-Math-1.5B-Instruct", "meta-llama/Llama-3.2-1B")


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise AssertionError("no chromium binary on PATH: `make test` installs Debian's `chromium` package "
                             "(apt-get install chromium); these tests draw figures in a real browser")
    return path


def received_table():
    rows = []
    for layer, head in ((0, 1), (12, 7)):
        for cond, n, span in (("w/o", 24, None), ("w/ Mless", 40, (4, 20)), ("w/ Mful", 40, (4, 20))):
            aligned = 0
            for pos in range(n):
                inside = span is not None and span[0] <= pos < span[1]
                rows.append((cond, layer, head, f"L{layer}H{head}", pos, None if inside else aligned, f"t{pos}",
                             "filler" if inside else "question", 0.3 / (1 + pos) + 0.001 * layer))
                aligned += 0 if inside else 1
    df = pd.DataFrame(rows, columns=["condition", "layer", "head", "head_label", "position", "aligned_pos",
                                     "token", "segment", "attention"])
    df["aligned_pos"] = df["aligned_pos"].astype("Int64")
    return df


def random_table():
    rows = []
    for model in MODELS:
        for cond in ("w/ Mless", "random sentence"):
            for pos in range(30):
                seg = "filler" if 5 <= pos < 20 else "question"
                rows.append((model, cond, 0, 4, "L0H4", pos, f"t{pos}", seg, 1 / (1 + pos) + (cond != "w/ Mless")))
    return pd.DataFrame(rows, columns=["model", "condition", "layer", "head", "head_label", "position", "token",
                                       "segment", "attention"])


def sweep():
    grid = torch.linspace(-1.2, 0.8, LAYERS * HEADS).reshape(LAYERS, HEADS)
    return pd.DataFrame(grid.numpy(), index=range(LAYERS), columns=range(HEADS))


def attribution():
    units = [(lay, (h,)) for lay in range(LAYERS) for h in range(HEADS)]
    est = torch.linspace(-2, 2, 3 * len(units)).reshape(3, len(units))
    return Attribution(units, est, est.abs(), torch.zeros(3), "atp*", "answer log-prob", "head", LAYERS, HEADS, 3)


def verification():
    labels = [f"L{i}H{i % HEADS}" for i in range(24)]
    table = pd.DataFrame({"head_label": labels, "estimate": [0.1 * i - 1 for i in range(24)],
                          "exact": [0.09 * i - 1.1 for i in range(24)], "chosen": ["top"] * 20 + ["sample"] * 4})
    return Verification(table, 20, 0.91, 0.85, 0.8, table.iloc[20:], "atp*", "answer log-prob", recall_kind="sampled",
                        outside=250)


def trace_summary():
    rows = []
    for cond in ("LatentFusion (mean of the last 4 layers)", "Pause tokens", "w/o thinking"):
        for step in range(60):
            for metric, mean, sd in (("entropy", 0.4 + 0.3 * (step % 7) / 7, 0.9), ("attention", 0.2, 0.25)):
                rows.append((cond, metric, "thinking" if metric == "attention" else "", step, mean, mean - sd,
                             mean + sd, 4))
    return pd.DataFrame(rows, columns=["condition", "metric", "set", "step", "mean", "lower", "upper", "n"])


def sink_prompt():
    rows = [(cond, lay, h, f"L{lay}H{h}", "first token", 0.5 + 0.01 * h, 9)
            for cond in ("w/o", "w/ Mless", "w/ Mful") for lay in range(LAYERS) for h in range(HEADS)]
    return pd.DataFrame(rows, columns=["condition", "layer", "head", "head_label", "target", "mass", "queries"])


def sink_steps():
    rows = [(cond, step, 40 + step, f"t{step}", lay, "first token", 0.5 + 0.01 * step, 0.01)
            for cond in ("w/o", "w/ Mless") for lay in range(LAYERS) for step in range(20)]
    return pd.DataFrame(rows, columns=["condition", "step", "position", "token", "layer", "target", "mass", "sd"])


def massive():
    rows = []
    for cond, scale in (("w/o", 1.0), ("w/ Mless", 2.0)):
        for layer in range(LAYERS):
            mag = scale * (1.3 ** layer)
            rows.append((cond, "prompt", pd.NA, 0, "<s>", layer, 0, 7, -mag, mag, 0.5, mag / 0.5))
    t = pd.DataFrame(rows, columns=["condition", "phase", "step", "position", "token", "layer", "rank", "dim", "value",
                                    "magnitude", "median", "ratio"])
    t["step"] = t["step"].astype("Int64")
    return t


def accuracy():
    rows = [(m, c, 0.3 + 0.1 * i, 0.2, 0.5, 500, 150, "math-verify", lvl)
            for m in MODELS for i, c in enumerate(("w/o", "w/ Mless", "w/ Mful", "random sentence"))
            for lvl in range(1, 6)]
    return pd.DataFrame(rows, columns=["model", "condition", "accuracy", "low", "high", "n", "correct", "grader",
                                       "level"])


def every_figure(tiny) -> dict:
    """``{kind: figure}`` for every plotly figure function of :mod:`lensprobe.viz`, at its default size."""
    v = lp.viz
    prompts = [lp.build_prompt(tiny, q) for q in ("What is 2+3?", "What is 7*6?")]
    found = lp.find_heads(tiny, prompts, "entropy", top=2, flag=float("inf"), step=2, budget=2, sample=2)
    gen = lp.generate(tiny, [[5, 17, 3, 99, 42]], max_new_tokens=12, stop_at_eos=False, lens="logit",
                      record="blocks.*.hook_resid_post")
    classes = pd.DataFrame([(g, lay, f"L{lay}", cls, 0.25, 3) for g in ("w/o filler", "Mless")
                            for lay in range(0, LAYERS, 3) for cls in ("# (hash)", "* (star)", "whitespace", "other")],
                           columns=["group", "layer", "layer_label", "token_class", "attention", "n_tokens"])
    changes = pd.DataFrame([(c, 0, h, f"L0H{h}", 0.1 * h) for c in ("w/ Mless", "w/ Mful", "random sentence")
                            for h in range(HEADS)], columns=["condition", "layer", "head", "head_label", "change"])
    segments = pd.DataFrame([(c, lay, "question", 12, 0.3, 0.05) for c in ("w/o", "w/ Mless") for lay in range(LAYERS)],
                            columns=["condition", "layer", "segment", "positions", "attention", "sd"])
    patch = pd.DataFrame([{"site": f"{h} @ {s}", "hook": h, "segment": s, "n_positions": 3, "clean": 1.0,
                           "patched": 1.2, "change": 0.2, "source": 1.5, "share": 0.4, "kl": 0.01}
                          for h in ("blocks.0.hook_resid_post", "blocks.12.attn.hook_z") for s in ("system", "question")])
    fit = pd.DataFrame([(0, h, p, f"t{p}", 1 - 0.1 * h, 1e-3 * (h + 1)) for h in range(HEADS) for p in range(4)],
                       columns=["layer", "head", "position", "token", "lambda", "rel_error"])
    hist = pd.DataFrame({"condition": ["w/o"] * 4 + ["w/ Mless"] * 4, "center": [-0.3, -0.1, 0.1, 0.3] * 2,
                         "fraction": [0.1, 0.4, 0.4, 0.1, 0.2, 0.3, 0.3, 0.2]})
    stats = ActivationStats(histogram=hist, summary=pd.DataFrame({"condition": ["w/o", "w/ Mless"],
                                                                 "near_zero": [0.25, 0.125]}),
                            layer=0, where="act_fn(gate)", segment="question", eps=0.05, reference="w/o",
                            magnitudes=(0.1,))
    received = received_table()
    heads = received[(received["layer"] == 12)].assign(segment="question")
    effect_tokens = pd.DataFrame({"token": [" 5", " five", "\n", " The answer is"], "p_clean": [0.5, 0.2, 0.1, 0.05],
                                  "p_ablated": [0.3, 0.25, 0.15, 0.1]})
    effect = type("Effect", (), {"tokens": effect_tokens,
                                 "summary": {"entropy_clean": 1.2, "entropy_ablated": 1.5, "kl": 0.04}})()
    return {
        "head_attention_figure": v.head_attention_figure(heads, 12, 7),
        "sweep_heatmap": v.sweep_heatmap(sweep()),
        "next_token_figure": v.next_token_figure(effect),
        "patch_figure": v.patch_figure(patch),
        "attention_received_figure": v.attention_received_figure(received),
        "filler_vs_random_figure": v.filler_vs_random_figure(random_table()),
        "condition_change_figure": v.condition_change_figure(changes),
        "segment_attention_figure": v.segment_attention_figure(segments),
        "token_class_figure": v.token_class_figure(classes),
        "attribution_heatmap": v.attribution_heatmap(attribution()),
        "attribution_scatter": v.attribution_scatter(verification()),
        "find_heads_scatter": v.find_heads_scatter(found),
        "find_heads_heatmap": v.find_heads_heatmap(found),
        "accuracy_bars": v.accuracy_bars(accuracy()[lambda t: t["level"] == 1]),
        "accuracy_by_level": v.accuracy_by_level(accuracy()),
        "affine_fit_figure": v.affine_fit_figure(fit),
        "activation_histogram_figure": v.activation_histogram_figure(stats),
        "sink_heatmap": v.sink_heatmap(sink_prompt()),
        "sink_steps_figure": v.sink_steps_figure(sink_steps()),
        "massive_activation_figure": v.massive_activation_figure(massive()),
        "activation_norm_figure": v.activation_norm_figure({"w/o filler": gen, "Mless": gen}),
        "activation_norm_lines": v.activation_norm_figure(gen, kind="lines"),
        "logit_lens": v.logit_lens(gen),
        "generation_trace_figure": v.generation_trace_figure(trace_summary(), band_label="mean ± std over 4 samples"),
    }


def render_svgs(figures: dict, folder: Path) -> dict[str, Path]:
    """Every figure drawn as SVG at its own size, in one kaleido call (one browser session)."""
    paths = {kind: folder / f"{kind}.svg" for kind in figures}
    figs = list(figures.values())
    pio.write_images(figs, [str(p) for p in paths.values()], format="svg",
                     width=[f.layout.width or 700 for f in figs], height=[f.layout.height or 500 for f in figs])
    return paths


# Each text element's role, from the classes plotly gives it or its group; point labels (heatmap cells, bar
# values) are left out: they belong to the data, inside the plot.
_MEASURE = r"""
const ROLES = [["g-gtitle", "title"], ["gtitle", "title"], ["annotation", "annotation"], ["legendtext", "legend"],
               ["legendtitletext", "legend"], ["cbtitle", "colorbar"], ["cbaxis", "colorbar"], ["xtick", "tick"],
               ["ytick", "tick"], ["g-xtitle", "axistitle"], ["g-ytitle", "axistitle"]];
const TICK = /^[xy]\d*tick$/;
function role(el) {
  for (let n = el; n && n.nodeName !== "DIV"; n = n.parentNode) {
    const cls = (n.getAttribute && n.getAttribute("class")) || "";
    if (/\btextpoint\b|\bpoints\b/.test(cls)) return null;
    for (const [key, name] of ROLES) {
      if (cls.split(/\s+/).some(c => c === key || (name === "axistitle" && /^[xy]\d*title$/.test(c))
                                   || (name === "tick" && TICK.test(c)))) {
        return name;
      }
    }
  }
  return "other";
}
function measure(roots, name) {
  const out = {};
  for (const root of document.querySelectorAll(roots)) {
    const box = root.getBoundingClientRect();
    const texts = [];
    for (const t of root.querySelectorAll("text")) {
      if (!t.textContent.trim()) continue;
      const r = role(t);
      if (r === null) continue;
      const b = t.getBoundingClientRect();
      if (!b.width) continue;
      let axis = "";
      for (let n = t; n && n !== root; n = n.parentNode) {
        const m = ((n.getAttribute && n.getAttribute("class")) || "").match(/\b([xy]\d*)(tick|title)\b/);
        if (m) { axis = m[1]; break; }
      }
      texts.push({role: r, axis: axis, text: t.textContent, x0: b.left - box.left, x1: b.right - box.left,
                  y0: b.top - box.top, y1: b.bottom - box.top});
    }
    out[name(root)] = {width: box.width, height: box.height, texts: texts};
  }
  return out;
}
const out = window.LP_ROOTS ? measure(window.LP_ROOTS, r => r.id) : measure("div.fig > svg", r => r.parentNode.id);
const pre = document.createElement("pre");
pre.id = "lp-measured";
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
"""


def measure_svgs(svgs: dict[str, Path], folder: Path) -> dict:
    """The box of every text element of every SVG, measured by Chromium in one page load."""
    body = "".join(f'<div class="fig" id="{kind}">{path.read_text(encoding="utf-8")}</div>'
                   for kind, path in svgs.items())
    page = folder / "measure.html"
    page.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><style>body{{margin:0}} div.fig{{display:block;"
                    f"line-height:0}}</style></head><body>{body}<script>{_MEASURE}</script></body></html>",
                    encoding="utf-8")
    dom = _browser(folder, "--dump-dom", page.resolve().as_uri())
    found = re.search(r'<pre id="lp-measured">(.*?)</pre>', dom, re.S)
    assert found, f"the measuring script did not run: {dom[-500:]}"
    return json.loads(html.unescape(found.group(1)))


def _overlap(a: dict, b: dict, slack: float = 1.0) -> bool:
    return (min(a["x1"], b["x1"]) - max(a["x0"], b["x0"]) > slack
            and min(a["y1"], b["y1"]) - max(a["y0"], b["y0"]) > slack)


def problems(measured: dict) -> list[str]:
    """What is wrong in one measured figure: text outside the figure, text of one role over text of another
    (a title over the legend, an axis title over tick labels, a panel title over a panel title)."""
    out = []
    w, h = measured["width"], measured["height"]
    texts = measured["texts"]
    for t in texts:
        if t["x0"] < -1 or t["x1"] > w + 1 or t["y0"] < -1 or t["y1"] > h + 1:
            out.append(f"{t['role']} {t['text']!r} sticks out of the {w:.0f}x{h:.0f} figure: "
                       f"x {t['x0']:.0f}-{t['x1']:.0f}, y {t['y0']:.0f}-{t['y1']:.0f}")
    for i, a in enumerate(texts):
        for b in texts[i + 1:]:
            if a["role"] == b["role"] == "tick" and a["axis"] == b["axis"]:
                continue  # plotly thins out the ticks of one axis itself
            if a["role"] == b["role"] == "legend" or a["role"] == b["role"] == "colorbar":
                continue
            if _overlap(a, b):
                out.append(f"{a['role']} {a['text']!r} overlaps {b['role']} {b['text']!r}")
    return out


def _browser(folder: Path, *args: str) -> str:
    return subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--no-first-run", "--hide-scrollbars",
                           f"--user-data-dir={folder / 'profile'}", "--virtual-time-budget=15000", *args],
                          capture_output=True, text=True, timeout=300, check=True).stdout


def measure_page(page: Path, window: tuple[int, int]) -> dict:
    """The text boxes of every plotly figure of an HTML page (a report), drawn by plotly.js in Chromium in a
    ``window`` of that many pixels, keyed by the figure's element id."""
    text = page.read_text(encoding="utf-8")
    probe = page.with_name("measure-" + page.name)
    cut = text.rindex("</body>")
    script = (f"<script>window.LP_ROOTS = '.lp-figure .js-plotly-plot'; "
              f"setTimeout(function () {{ {_MEASURE} }}, 3000);</script>")
    probe.write_text(text[:cut] + script + text[cut:], encoding="utf-8")
    dom = _browser(page.parent, f"--window-size={window[0]},{window[1]}", "--dump-dom", probe.resolve().as_uri())
    probe.unlink()
    found = re.search(r'<pre id="lp-measured">(.*?)</pre>', dom, re.S)
    assert found, f"the measuring script did not run: {dom[-500:]}"
    return json.loads(html.unescape(found.group(1)))


def screenshot(page: Path, out: Path, window: tuple[int, int]) -> bytes:
    """A PNG of ``page`` as headless Chromium shows it in a ``window`` of that many pixels."""
    _browser(page.parent, f"--window-size={window[0]},{window[1]}", f"--screenshot={out}", page.resolve().as_uri())
    return out.read_bytes()
