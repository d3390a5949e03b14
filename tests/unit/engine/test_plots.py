"""The compare figure: a long title is wrapped inside the figure, never clipped at its edges."""

from matplotlib.backends.backend_agg import FigureCanvasAgg

from raysim.engine.plots import Panel, Series, curves_figure


def test_a_long_title_stays_inside_the_figure():
    names = ", ".join(f"quickstart/variant_{i}_with_a_long_name" for i in range(6))
    panel = Panel("accuracy", [Series("a", "clients", [0, 1, 2], [0.1, 0.5, 0.7])])
    fig = curves_figure([panel], "raysim compare: " + names)
    renderer = FigureCanvasAgg(fig).get_renderer()
    [title] = [text for text in fig.texts if text.get_text() == fig.get_suptitle()]
    box = title.get_window_extent(renderer)
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width  # unwrapped, it ran ~1.6 figure widths
    assert names.split(", ")[-1] in fig.get_suptitle().replace("\n", " ")  # wrapped, not cut
