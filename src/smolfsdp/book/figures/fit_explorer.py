"""The interactive "does it fit?" figure: pick a setting, read the per-GPU bytes and the verdict.

Chapter "Where the memory goes" (``notebooks/00_memory.ipynb``). :func:`fit_states` runs
``smolfsdp.estimate.memory.estimate_memory`` for every combination of the :data:`CONTROLS` (the GPU only
moves the line and the verdict, so it multiplies nothing); :func:`plot_fit_explorer` draws one bar per
memory component, the tensor peak and what the GPU must hold (reserved + CUDA context + NCCL), a dashed line
at the GPU's memory, the verdict of ``smolfsdp.estimate.hardware.fit_of_bytes`` in its printed form
(``hardware.format_fit``), and one dropdown per control. All states ride in the figure (``layout.meta``); a
small script (:data:`COMPOSE_SCRIPT`, no server) combines the dropdowns' choices into one state, and adds a
number box for the reader's own card (GiB) that decides with the same rule (:data:`VERDICT_JS`, held to
``hardware.verdict_word`` and ``format_fit`` by ``tests/test_fit_explorer.py``). Without the script
(JupyterLab's plotly mimetype) each dropdown still shows its own setting changed from :data:`BASE`.

    python -c "from smolfsdp.book.figures.fit_explorer import *; save_explorer(plot_fit_explorer(fit_states()), 'fit')"
"""

from __future__ import annotations

import copy
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

from smolfsdp.book.figures import palette
from smolfsdp.book.figures.memory_bars import COMPONENT_COLORS
from smolfsdp.book.figures.plotting import fit_layout, save_figure
from smolfsdp.estimate.hardware import GPUS, FitVerdict, fit_of_bytes
from smolfsdp.estimate.memory import estimate_memory
from smolfsdp.estimate.params import llama3_70b_config, resolve_model_config
from smolfsdp.estimate.recipes import GIB


@dataclass(frozen=True)
class Control:
    key: str  # estimate_memory's argument (or "gpu", "model")
    label: str
    values: tuple


CONTROLS = (
    Control("model", "model", ("smollm3-3b", "llama-3-70b-like")),
    Control("gpu", "GPU", ("A10G", "L40S", "A100 40GB", "H100 SXM")),
    Control("world_size", "GPUs", (1, 2, 4, 8)),
    Control("strategy", "strategy", ("NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD")),
    Control("seq_len", "sequence", (1024, 4096, 8192)),
    Control("micro_batch", "micro-batch", (1, 4)),
    Control("lora", "LoRA", (False, True)),
    Control("offload", "CPU offload", (False, True)),
    Control("activation_checkpointing", "act. checkpointing", (False, True)),
)
BASE = {
    "model": "smollm3-3b", "gpu": "A100 40GB", "world_size": 2, "strategy": "FULL_SHARD", "seq_len": 4096,
    "micro_batch": 1, "lora": False, "offload": False, "activation_checkpointing": False,
}  # fmt: skip
#: the bars, in order; components that are zero in every state (the recipe keeps no master) are dropped
COMPONENT_LABELS = {
    "params": "parameter shards", "grads": "gradient shards", "master": "fp32 master", "optimizer": "Adam m, v",
    "gathered": "gathered units", "grad_buffer": "gradient buffer", "no_sync_grads": "no_sync gradients",
    "activations": "activations", "logits": "logits", "cuda_context": "CUDA context",
    "comm_buffers": "NCCL buffers",
}  # fmt: skip
PEAK_LABEL = (
    "tensor peak"  # the tensors of the fullest moment + CUDA context + NCCL (MemoryEstimate.peak_bytes)
)
NEED_LABEL = (
    "needed (reserved)"  # reserved + CUDA context + NCCL (device_need_bytes): what the verdict decides on
)
# The dropdowns in two columns, each starting at a half of the plot's width: a dropdown is as wide as its
# longest label (about 215 px for "strategy: SHARD_GRAD_OP" and "act. checkpointing: off"), so two columns
# fit from a plot 440 px wide (a figure of ~520 px). Three columns at fixed fractions overlapped in a
# book's column at 820 px. Rows are MENU_ROW_PX apart, the first MENU_TOP_PX above a plot of PLOT_PX.
MENU_COLUMNS, MENU_ROW_PX, PLOT_PX = 2, 40, 340
MENU_TOP_PX = 45 + MENU_ROW_PX * ((len(CONTROLS) - 1) // MENU_COLUMNS)
MODELS = {"llama-3-70b-like": llama3_70b_config}


def _state_controls() -> list[Control]:
    return [c for c in CONTROLS if c.key != "gpu"]


def state_key(setting: dict) -> str:
    """``"i-j-..."``: the index of each non-GPU control's value in ``setting`` (what the script builds)."""
    return "-".join(str(c.values.index(setting[c.key])) for c in _state_controls())


def state_fit(state: dict, gpu: str) -> FitVerdict:
    """The verdict of one :func:`fit_states` state on a GPU of ``smolfsdp.estimate.hardware.GPUS``: the state's
    need and tensor peak through ``hardware.fit_of_bytes``, as ``hardware.fit_verdict`` gives it for the
    estimate itself (``.line`` is the sentence the figure shows). KeyError for a GPU not in the table."""
    return fit_of_bytes(state["need"], state["peak"], GPUS[gpu].memory_bytes, gpu)


def fit_states(recipe: str = "hf-fsdp-bf16", fsdp_version: int = 2) -> dict[str, dict]:
    """``estimate_memory`` for every combination of the non-GPU :data:`CONTROLS`: ``{state_key: {
    component: bytes, ..., "peak": bytes, "need": bytes, "host": bytes}}`` (per GPU, rank 0, device unless
    ``host``; ``peak`` = ``peak_bytes``, the tensor peak + CUDA context + NCCL; ``need`` =
    ``device_need_bytes``, reserved + CUDA context + NCCL, what the verdict is decided on)."""
    configs = {m: (MODELS[m]() if m in MODELS else resolve_model_config(m)) for m in CONTROLS[0].values}
    controls = _state_controls()
    states = {}
    for combo in itertools.product(*(c.values for c in controls)):
        s = dict(zip((c.key for c in controls), combo, strict=True))
        est = estimate_memory(
            configs[s["model"]], recipe=recipe, fsdp_version=fsdp_version,
            **{k: v for k, v in s.items() if k != "model"},
        )  # fmt: skip
        states[state_key(s)] = {
            **est.components(), "peak": est.peak_bytes, "need": est.device_need_bytes, "host": est.host_bytes
        }  # fmt: skip
    return states


def _bars(state: dict, components: list[str]) -> list[float]:
    """The bars' heights in GiB (3 decimals): the components, the tensor peak, the need."""
    return [round(state[c] / GIB, 3) for c in [*components, "peak", "need"]]


def _colors(components: list[str], word: str) -> list[str]:
    """The components' colours, then the tensor peak and the need in the colour of the verdict ``word``."""
    return [COMPONENT_COLORS[c] for c in components] + [palette.verdict_colour(word)] * 2


def plot_fit_explorer(states: dict[str, dict], base: dict | None = None) -> go.Figure:
    """Bars (GiB per GPU) of the ``base`` setting, a line at the GPU's memory, the verdict (:func:`state_fit`),
    and one dropdown per control. Raises KeyError when ``base`` names a value no control offers."""
    base = {**BASE, **(base or {})}
    components = [c for c in COMPONENT_LABELS if any(s[c] for s in states.values())]
    x = [COMPONENT_LABELS[c] for c in components] + [PEAK_LABEL, NEED_LABEL]
    state, cap = states[state_key(base)], GPUS[base["gpu"]].memory_bytes
    fit = state_fit(state, base["gpu"])
    fig = go.Figure(
        go.Bar(
            x=x, y=_bars(state, components), marker_color=_colors(components, fit.word),
            hovertemplate="%{x}: %{y:.2f} GiB<extra></extra>", showlegend=False,
        )
    )  # fmt: skip
    fig.add_shape(type="line", xref="paper", x0=0, x1=1, y0=cap / GIB, y1=cap / GIB, line_dash="dot")
    fig.add_annotation(
        text=fit.line, xref="paper", yref="paper", x=0, y=1.02, xshift=-50,
        xanchor="left", yanchor="bottom", showarrow=False, font={"size": 13},
    )  # fmt: skip
    menus, top = [], MENU_TOP_PX + 135  # the title above the first row of menus, the verdict below the last
    for i, c in enumerate(CONTROLS):
        buttons = []
        for v in c.values:
            one = {**base, c.key: v}  # the fallback without the script: this setting changed from the base
            s, g = states[state_key(one)], GPUS[one["gpu"]].memory_bytes
            one_fit = state_fit(s, one["gpu"])
            buttons.append(
                {
                    "label": f"{c.label}: {_show(v)}",
                    "method": "update",
                    "args": [
                        {"y": [_bars(s, components)], "marker.color": [_colors(components, one_fit.word)]},
                        {
                            "shapes[0].y0": g / GIB,
                            "shapes[0].y1": g / GIB,
                            "annotations[0].text": one_fit.line,
                        },
                    ],  # fmt: skip
                }
            )
        row, col = divmod(i, MENU_COLUMNS)
        menus.append(
            {
                "buttons": buttons, "active": c.values.index(base[c.key]), "direction": "down",
                "x": col / MENU_COLUMNS, "xanchor": "left", "y": 1 + (MENU_TOP_PX - MENU_ROW_PX * row) / PLOT_PX,
                "yanchor": "bottom", "showactive": True, "pad": {"r": 2, "t": 2},
            }
        )  # fmt: skip
    fig.update_layout(
        # the top row last: plotly draws later menus above earlier ones, so an open list covers the rows below
        updatemenus=menus[::-1],
        meta={"fit_explorer": _meta(states, components, base)},
        title="Does it fit? Per-GPU memory of one training step (estimate)",
        yaxis_title="GiB per GPU (device)", template="plotly_white", height=PLOT_PX + top + 60,
        margin={"l": 60, "r": 20, "t": top, "b": 60},
    )  # fmt: skip
    return fig


def _show(v) -> str:
    return "on" if v is True else "off" if v is False else f"{v:,}" if isinstance(v, int) else str(v)


def _meta(states: dict, components: list[str], base: dict) -> dict:
    """What :data:`COMPOSE_SCRIPT` reads: per state the bars (GiB, as drawn) then the tensor peak and the need
    in bytes (the verdict's inputs, exact), the GPUs' bytes, the colours, the menus' order."""
    controls = [c.key for c in CONTROLS][::-1]  # in the order of layout.updatemenus
    return {
        "menus": controls,
        "state_keys": [c.key for c in _state_controls()],
        "active": {c.key: c.values.index(base[c.key]) for c in CONTROLS},
        "gpus": [[g, GPUS[g].memory_bytes] for g in CONTROLS[1].values],
        "colors": [COMPONENT_COLORS[c] for c in components],
        "verdict_colors": dict(palette.VERDICT),
        "states": {k: [*_bars(s, components), s["peak"], s["need"]] for k, s in states.items()},
    }


#: The verdict rule and its printed line in JavaScript, for the states and the reader's own card: the same
#: comparisons as ``hardware.verdict_word`` and the same text as ``hardware.format_fit`` (Python's ``:.1f``
#: rounds an exact tie to even, ``toFixed`` up: ``gib1`` does as Python does). ``cardBytes``: a card of
#: ``gib`` GiB in bytes, the same arithmetic as ``hardware.get_gpu(None, gib).memory_bytes``.
VERDICT_JS = """
var GIB = 1073741824;
function fitWord(need, peak, cap) {
  if (need <= cap) { return 'fits'; }
  return peak <= cap ? 'tight' : 'does not fit';
}
function gib1(bytes) {
  var x = bytes / GIB, t = x * 10, s = x.toFixed(1);
  if (t % 1 === 0.5 && Math.floor(t) % 2 === 0) { s = (Math.floor(t) / 10).toFixed(1); }
  return s;
}
function fitLine(need, peak, cap) {
  return fitWord(need, peak, cap) + ': needs ' + gib1(need) + ' GiB reserved (tensor peak ' + gib1(peak) +
    ') of ' + gib1(cap) + ' GiB';
}
function cardBytes(gib) { return Math.trunc(gib * GIB / 1e9 * 1e9); }
"""
#: The label of the reader's-own-card box (GiB, as ``smolfsdp memory --gpu-memory-gib`` takes it).
CARD_LABEL = "Your GPU's memory in GiB (nvidia-smi's MiB / 1024), instead of the GPU menu's card:"

# Reads every dropdown's choice and shows that combination: restyles the bars, moves the GPU line and
# rewrites the verdict with VERDICT_JS. Runs after plotly's own button command (setTimeout), so the combined
# state, not the button's one-setting fallback, is what stays drawn. A number box above the figure replaces
# the GPU menu's card while it holds a positive number.
COMPOSE_SCRIPT = (
    """
(function () {
  var gd = document.getElementById('{plot_id}');
  var m = gd.layout.meta && gd.layout.meta.fit_explorer;
  if (!m) { return; }
"""
    + VERDICT_JS
    + """
  var active = Object.assign({}, m.active), custom = null;
  function show() {
    var key = m.state_keys.map(function (k) { return active[k]; }).join('-');
    var s = m.states[key], n = s.length, peak = s[n - 2], need = s[n - 1];
    var cap = custom !== null ? custom : m.gpus[active.gpu][1], colour = m.verdict_colors[fitWord(need, peak, cap)];
    Plotly.update(gd, {y: [s.slice(0, n - 2)], 'marker.color': [m.colors.concat([colour, colour])]},
      {'shapes[0].y0': cap / GIB, 'shapes[0].y1': cap / GIB, 'annotations[0].text': fitLine(need, peak, cap)});
  }
  var box = document.createElement('div');
  box.className = 'fit-explorer-card';
  box.style.margin = '0 0 0.4em 0';
  var label = document.createElement('label');
  label.textContent = """
    + json.dumps(CARD_LABEL + " ")  # a JavaScript string literal (the label has an apostrophe)
    + """;
  var input = document.createElement('input');
  input.type = 'number'; input.min = '0.1'; input.step = '0.1'; input.style.width = '6em';
  label.appendChild(input);
  box.appendChild(label);
  gd.parentNode.insertBefore(box, gd);
  input.addEventListener('input', function () {
    var v = parseFloat(input.value);
    custom = v > 0 ? cardBytes(v) : null;
    show();
  });
  gd.on('plotly_buttonclicked', function (ev) {
    active[m.menus[ev.menu._index]] = ev.active;
    setTimeout(show, 0);
  });
})();
"""
)


def explorer_renderer():
    """The book's notebook renderer with :data:`COMPOSE_SCRIPT` added to its own post-scripts."""
    base = pio.renderers["smolfsdp"]
    r = copy.copy(base)
    scripts = base.post_script if isinstance(base.post_script, list) else [base.post_script or ""]
    r.post_script = [s for s in scripts if s] + [COMPOSE_SCRIPT]
    return r


class FitExplorer:
    """Displays a :func:`plot_fit_explorer` figure in a notebook with the combining script (HTML) and
    as plain plotly JSON (JupyterLab: each dropdown changes its one setting from the base)."""

    def __init__(self, fig: go.Figure):
        self.fig = fig

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = dict(pio.renderers["smolfsdp_mimetype"].to_mimebundle(self.fig.to_dict()))
        bundle.update(explorer_renderer().to_mimebundle(self.fig.to_dict()))
        return bundle


def save_explorer(fig: go.Figure, name: str, out_dir: str | Path | None = None) -> list[Path]:
    """``plotting.save_figure``, then the HTML written again with :data:`COMPOSE_SCRIPT` (standalone page)."""
    paths = save_figure(fig, name, out_dir)
    page = go.Figure(fig.to_dict() | {"layout": fit_layout(fig.to_dict()["layout"])})
    page.write_html(paths[0], include_plotlyjs="directory", full_html=True, post_script=COMPOSE_SCRIPT)
    return paths
