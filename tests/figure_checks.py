"""Layout checks of a rendered figure: no text box overlaps another, none is cut by the figure's edge, and
no legend covers a bar."""

from __future__ import annotations

from itertools import combinations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.legend import Legend
from matplotlib.patches import Rectangle
from matplotlib.text import Text

GAP_PX = 3.0  # texts closer than this (at 100 dpi) read as one, as "+0.250+0.250" did 1.2 px apart


def drawn_texts(fig) -> list[Text]:
    """The non-empty texts a draw of `fig` actually renders (tick labels outside the view are not drawn)."""
    drawn, draw = [], Text.draw

    def record(self, renderer):
        draw(self, renderer)
        if self.get_visible() and self.get_text().strip():
            drawn.append(self)

    Text.draw = record
    try:
        FigureCanvasAgg(fig).draw()
    finally:
        Text.draw = draw
    return drawn


def layout_problems(fig) -> list[str]:
    """Every overlap of two text boxes, text outside the figure and legend over a bar, as lines."""
    texts = drawn_texts(fig)
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    problems = [f"{text!r} is cut by the figure's edge" for text, box in boxes
                if box.x0 < page.x0 or box.y0 < page.y0 or box.x1 > page.x1 or box.y1 > page.y1]
    boxes = [(text, box.padded(GAP_PX / 2)) for text, box in boxes]
    problems += [f"{a!r} overlaps {b!r}" for (a, box_a), (b, box_b) in combinations(boxes, 2) if box_a.overlaps(box_b)]
    for ax in fig.axes:
        legend = ax.get_legend()
        if not isinstance(legend, Legend):
            continue
        frame = legend.get_window_extent(renderer)
        bars = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_height()]
        problems += [f"the legend of {ax.get_title()!r} covers a bar" for p in bars
                     if frame.overlaps(p.get_window_extent(renderer))]
    return problems
