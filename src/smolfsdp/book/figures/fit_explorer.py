"""The interactive "does it fit?" figure: pick a setting, read the per-GPU bytes and the verdict.

Chapter "Where the memory goes" (``notebooks/00_memory.ipynb``). :func:`fit_states` runs
``smolfsdp.estimate.memory.estimate_memory`` for every combination of the :data:`CONTROLS` (the GPU only
moves the line and the verdict, so it multiplies nothing); :func:`plot_fit_explorer` draws one bar per
memory component plus the peak, a dashed line at the GPU's memory, and one dropdown per control. All
states ride in the figure (``layout.meta``); a small script (:data:`COMPOSE_SCRIPT`, no server) combines
the dropdowns' choices into one state. Without the script (JupyterLab's plotly mimetype) each dropdown
still shows its own setting changed from :data:`BASE`.

    python -c "from smolfsdp.book.figures.fit_explorer import *; save_explorer(plot_fit_explorer(fit_states()), 'fit')"
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

from smolfsdp.book.figures import palette
from smolfsdp.book.figures.memory_bars import COMPONENT_COLORS
from smolfsdp.book.figures.plotting import fit_layout, save_figure
from smolfsdp.estimate.hardware import GPUS
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
    Control("world_size", "GPUs", (1, 2, 8)),
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
PEAK_LABEL = "peak (fullest moment)"
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


def verdict(peak_bytes: int, gpu: str) -> str:
    """``"fits: peak 30.9 GiB of 37.3 GiB (83%)"`` or ``"does not fit: ..."`` against the datasheet bytes
    of ``gpu`` (``smolfsdp.estimate.hardware.GPUS``). The script formats changed states the same way."""
    cap = GPUS[gpu].memory_bytes
    word = "fits" if peak_bytes <= cap else "does not fit"
    return f"{word}: peak {peak_bytes / GIB:.1f} GiB of {cap / GIB:.1f} GiB ({100 * peak_bytes / cap:.0f}%)"


def fit_states(recipe: str = "hf-fsdp-bf16", fsdp_version: int = 2) -> dict[str, dict]:
    """``estimate_memory`` for every combination of the non-GPU :data:`CONTROLS`: ``{state_key: {
    component: bytes, ..., "peak": bytes, "host": bytes}}`` (per GPU, rank 0, device unless ``host``)."""
    configs = {m: (MODELS[m]() if m in MODELS else resolve_model_config(m)) for m in CONTROLS[0].values}
    controls = _state_controls()
    states = {}
    for combo in itertools.product(*(c.values for c in controls)):
        s = dict(zip((c.key for c in controls), combo, strict=True))
        est = estimate_memory(
            configs[s["model"]], recipe=recipe, fsdp_version=fsdp_version,
            **{k: v for k, v in s.items() if k != "model"},
        )  # fmt: skip
        states[state_key(s)] = {**est.components(), "peak": est.peak_bytes, "host": est.host_bytes}
    return states


def _bars(state: dict, components: list[str]) -> list[float]:
    return [round(state[c] / GIB, 3) for c in components] + [round(state["peak"] / GIB, 3)]


def _colors(components: list[str], fits: bool) -> list[str]:
    return [COMPONENT_COLORS[c] for c in components] + [palette.verdict_colour(fits)]


def plot_fit_explorer(states: dict[str, dict], base: dict | None = None) -> go.Figure:
    """Bars (GiB per GPU) of the ``base`` setting, a line at the GPU's memory, the verdict, and one
    dropdown per control. Raises KeyError when ``base`` names a value no control offers."""
    base = {**BASE, **(base or {})}
    components = [c for c in COMPONENT_LABELS if any(s[c] for s in states.values())]
    x = [COMPONENT_LABELS[c] for c in components] + [PEAK_LABEL]
    state, cap = states[state_key(base)], GPUS[base["gpu"]].memory_bytes
    fig = go.Figure(
        go.Bar(
            x=x, y=_bars(state, components), marker_color=_colors(components, state["peak"] <= cap),
            hovertemplate="%{x}: %{y:.2f} GiB<extra></extra>", showlegend=False,
        )
    )  # fmt: skip
    fig.add_shape(type="line", xref="paper", x0=0, x1=1, y0=cap / GIB, y1=cap / GIB, line_dash="dot")
    fig.add_annotation(
        text=verdict(state["peak"], base["gpu"]), xref="paper", yref="paper", x=0, y=1.02,
        xanchor="left", yanchor="bottom", showarrow=False, font={"size": 14},
    )  # fmt: skip
    menus, top = [], MENU_TOP_PX + 135  # the title above the first row of menus, the verdict below the last
    for i, c in enumerate(CONTROLS):
        buttons = []
        for v in c.values:
            one = {**base, c.key: v}  # the fallback without the script: this setting changed from the base
            s, g = states[state_key(one)], GPUS[one["gpu"]].memory_bytes
            buttons.append(
                {
                    "label": f"{c.label}: {_show(v)}",
                    "method": "update",
                    "args": [
                        {"y": [_bars(s, components)], "marker.color": [_colors(components, s["peak"] <= g)]},
                        {
                            "shapes[0].y0": g / GIB,
                            "shapes[0].y1": g / GIB,
                            "annotations[0].text": verdict(s["peak"], one["gpu"]),
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
    controls = [c.key for c in CONTROLS][::-1]  # in the order of layout.updatemenus
    return {
        "menus": controls,
        "state_keys": [c.key for c in _state_controls()],
        "active": {c.key: c.values.index(base[c.key]) for c in CONTROLS},
        "gpus": [[g, GPUS[g].memory_bytes] for g in CONTROLS[1].values],
        "colors": [COMPONENT_COLORS[c] for c in components],
        "verdict_colors": [palette.verdict_colour(True), palette.verdict_colour(False)],
        "states": {k: [*(s[c] for c in components), s["peak"]] for k, s in states.items()},
    }


# Reads every dropdown's choice and shows that combination: restyles the bars, moves the GPU line and
# rewrites the verdict as :func:`verdict` does. Runs after plotly's own button command (setTimeout), so
# the combined state, not the button's one-setting fallback, is what stays drawn.
COMPOSE_SCRIPT = """
(function () {
  var gd = document.getElementById('{plot_id}');
  var m = gd.layout.meta && gd.layout.meta.fit_explorer;
  if (!m) { return; }
  var active = Object.assign({}, m.active), GIB = Math.pow(2, 30);
  function show() {
    var key = m.state_keys.map(function (k) { return active[k]; }).join('-');
    var s = m.states[key], peak = s[s.length - 1], gpu = m.gpus[active.gpu];
    var fits = peak <= gpu[1];
    var y = s.map(function (b) { return Math.round(b / GIB * 1000) / 1000; });
    var text = (fits ? 'fits' : 'does not fit') + ': peak ' + (peak / GIB).toFixed(1) + ' GiB of ' +
      (gpu[1] / GIB).toFixed(1) + ' GiB (' + (100 * peak / gpu[1]).toFixed(0) + '%)';
    Plotly.update(gd, {y: [y], 'marker.color': [m.colors.concat([fits ? m.verdict_colors[0] : m.verdict_colors[1]])]},
      {'shapes[0].y0': gpu[1] / GIB, 'shapes[0].y1': gpu[1] / GIB, 'annotations[0].text': text});
  }
  gd.on('plotly_buttonclicked', function (ev) {
    active[m.menus[ev.menu._index]] = ev.active;
    setTimeout(show, 0);
  });
})();
"""


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
