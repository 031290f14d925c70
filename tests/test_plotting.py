"""The book's figure defaults: every figure fits the text column and keeps its title below the modebar."""

import plotly.graph_objects as go
import plotly.io as pio

from smolfsdp.book.figures.plotting import (
    DEFAULT_HEIGHT_PX,
    LEGEND_GAP_PX,
    LEGEND_ROW_PX,
    MODEBAR_PX,
    PLOTLYJS,
    TITLE_CHARS,
    TITLE_CLIMB_PX,
    TITLE_LINE_PX,
    fit_figure,
    fit_layout,
    legend_names,
    legend_rows,
    needs_tex,
    write_plotlyjs,
)


def test_fit_layout_drops_fixed_width_and_makes_room_for_the_title():
    long = "Per-GPU memory of every recipe, sharded over two ranks, with and without offload to the host"
    layout = {"title": long, "width": 1200, "height": 400, "margin": {"l": 60, "t": 50}}
    out = fit_layout(layout)
    assert "width" not in out and out["autosize"] is True and out["height"] == 400
    lines = out["title"]["text"].split("<br>")
    assert len(lines) == 2 and all(len(line) <= TITLE_CHARS for line in lines)
    assert " ".join(lines) == long  # wrapped at a space, nothing lost
    pad = MODEBAR_PX + TITLE_CLIMB_PX
    assert out["title"]["pad"]["t"] == pad and out["title"]["yanchor"] == "top"
    assert out["margin"] == {"l": 60, "t": pad + 2 * TITLE_LINE_PX + 8}
    assert layout["width"] == 1200 and layout["title"] == long  # the input is left alone


def test_fit_layout_keeps_a_larger_margin_and_marked_up_lines():
    sub = "<sup>" + "<br>".join(["assumption; " * 9] * 3) + "</sup>"  # lines of 108 characters
    out = fit_layout({"title": {"text": f"Scaling<br>{sub}", "x": 0.5}, "margin": {"t": 200}})
    assert out["title"]["text"] == f"Scaling<br>{sub}" and out["title"]["x"] == 0.5
    assert out["margin"]["t"] == 200
    # subplot titles (annotations on the plot area's top edge) get room under the title
    sub_titles = [{"text": "a", "yref": "paper", "y": 1.0}]
    low = fit_layout({"title": "t", "margin": {"t": 0}})["margin"]["t"]
    assert low == MODEBAR_PX + TITLE_CLIMB_PX + TITLE_LINE_PX + 8
    assert (
        fit_layout({"title": "t", "margin": {"t": 0}, "annotations": sub_titles})["margin"]["t"] == low + 24
    )
    assert fit_layout({"xaxis": {"title": "x"}}) == {"xaxis": {"title": "x"}, "autosize": True}


def test_notebook_output_is_fitted_and_carries_no_plotlyjs_nor_mathjax():
    """A figure's HTML is a div and its script: plotly.js (4.8 MB) comes once per page from the site, and the renderer
    displays nothing of its own (plotly's notebook renderer displays all of plotly.js on activation)."""
    assert pio.renderers.default == "smolfsdp_mimetype+smolfsdp"
    fig = go.Figure(go.Scatter(y=[1, 2]), layout={"title": "t", "width": 1500})
    html = pio.renderers["smolfsdp"].to_mimebundle(fig.to_dict())["text/html"]
    assert '"width":1500' not in html and '"autosize":true' in html
    assert "ResizeObserver" in html and '"responsive": true' in html
    assert "plotly.js v" not in html and "<script src=" not in html  # no plotly.js, no MathJax, no CDN
    assert len(html) < 12_000 and 'class="plotly-graph-div"' in html and "Plotly.newPlot" in html
    assert pio.renderers["smolfsdp"].global_init is False
    spec = pio.renderers["smolfsdp_mimetype"].to_mimebundle(fig.to_dict())["application/vnd.plotly.v1+json"]
    assert "width" not in spec["layout"] and spec["config"]["displaylogo"] is False


def test_only_a_figure_with_tex_loads_mathjax():
    plain = go.Figure(go.Bar(x=["a $5 b"], y=[1]), layout={"title": "costs $3 or $4"})
    assert not needs_tex(plain.to_dict())
    tex = go.Figure(go.Scatter(y=[1, 2]), layout={"yaxis": {"title": {"text": "$\\sigma^2$"}}})
    assert needs_tex(tex.to_dict())
    html = pio.renderers["smolfsdp"].to_mimebundle(tex.to_dict())["text/html"]
    assert "mathjax" in html.lower()


def test_write_plotlyjs_writes_the_installed_bundle_once(tmp_path):
    from plotly.offline import get_plotlyjs

    path = write_plotlyjs(tmp_path / "site")
    assert path == tmp_path / "site" / PLOTLYJS and path.read_text() == get_plotlyjs()
    before = path.stat().st_mtime_ns
    assert write_plotlyjs(tmp_path / "site") == path and path.stat().st_mtime_ns == before  # same bytes: kept
    path.write_text("old plotly")
    assert write_plotlyjs(tmp_path / "site").read_text() == get_plotlyjs()


def test_a_horizontal_legend_gets_a_band_under_the_title():
    """Below the plot, a legend covered axis labels turned on their side in a narrow column (Figure 3.4)."""
    names = ["all-reduce", "reduce-scatter", "all-gather"]
    out = fit_layout({"title": "t", "legend": {"orientation": "h", "y": -0.2}, "margin": {"b": 90}}, names)
    assert legend_rows(names) == 1 and out["height"] == DEFAULT_HEIGHT_PX
    top = MODEBAR_PX + TITLE_CLIMB_PX + TITLE_LINE_PX + LEGEND_GAP_PX  # under the title's line
    assert out["legend"] == {
        "orientation": "h", "yref": "container", "y": 1 - top / DEFAULT_HEIGHT_PX, "yanchor": "top",
        "x": 0, "xanchor": "left",
    }  # fmt: skip
    assert out["margin"] == {"b": 90, "t": top + LEGEND_ROW_PX + 8 + 8}  # the legend, then the plot
    # 11 entries of 117 px: 4 a row in 520 px; a vertical legend or none is left alone
    many = [f"component {i}" for i in range(11)]
    assert legend_rows(many) == 3 and legend_rows(many, width=2000) == 1 and legend_rows([]) == 0
    assert fit_layout({"title": "t", "legend": {"orientation": "h"}, "height": 400}, many)["margin"]["t"] == (
        top + 3 * LEGEND_ROW_PX + 16
    )
    untitled = fit_layout({"legend": {"orientation": "h"}}, names)
    assert untitled["legend"]["y"] == 1 - (MODEBAR_PX + LEGEND_GAP_PX) / DEFAULT_HEIGHT_PX
    assert "legend" not in fit_layout({"title": "t"}, names)
    assert fit_layout({"showlegend": False, "legend": {"orientation": "h"}}, names) == {
        "showlegend": False, "legend": {"orientation": "h"}, "autosize": True,
    }  # fmt: skip


def test_legend_names_are_what_plotly_lists():
    data = [{"name": "a"}, {"name": "b", "showlegend": False}, {"type": "bar"}]
    assert legend_names(data) == ["a", "trace 2"]
    assert legend_names([{"name": "only"}]) == [] and legend_names([{"name": "x", "showlegend": True}]) == [
        "x"
    ]
    fig = go.Figure(
        [go.Bar(name="a", y=[1]), go.Bar(name="b", y=[2])], layout={"legend": {"orientation": "h"}}
    )
    layout = fit_figure(fig.to_dict())["layout"]
    assert layout["legend"]["yref"] == "container" and layout["legend"]["yanchor"] == "top"
