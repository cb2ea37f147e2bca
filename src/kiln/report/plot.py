"""matplotlib, set up once for reproducible charts: imported only when a chart is drawn.

Every figure goes through `figure()` and `render()`: the Agg backend (no display), text kept as
text in SVGs (searchable, small, and what the tests read), a fixed `svg.hashsalt` so element ids
do not change from run to run, and no creation date in the metadata. Same data, same bytes.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from kiln.core.errors import InputError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Colours that stay apart for colour-blind readers (Tableau 10's first ones).
BLUE, ORANGE, RED, TEAL, GREEN, GREY = "#4C78A8", "#F58518", "#E45756", "#72B7B2", "#54A24B", "#BAB0AC"

_STYLE: dict[str, Any] = {
    "svg.hashsalt": "kiln",
    "svg.fonttype": "none",
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "figure.dpi": 100,
    "savefig.dpi": 100,
}


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend; a clear error when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        raise InputError(
            "drawing charts needs matplotlib, which is not installed: pip install 'kiln-os[report]' "
            "(in a checkout: pip install -c constraints.txt -e '.[report]')"
        ) from None
    matplotlib.use("Agg", force=True)
    params: Any = matplotlib.rcParams  # typed by literal keys; _STYLE's are checked by matplotlib itself
    params.update(_STYLE)
    import matplotlib.pyplot as plt

    return plt


def figure(width: float, height: float, layout: str | None = None) -> Figure:
    """A new figure of width x height inches (layout "constrained" lets a legend sit outside the axes)."""
    plt = _pyplot()
    fig: Figure = plt.figure(figsize=(width, height), layout=layout)
    return fig


def render(fig: Figure, fmt: str) -> bytes:
    """The figure as SVG or PNG bytes, reproducibly, and the figure closed."""
    plt = _pyplot()
    buffer = io.BytesIO()
    metadata: dict[str, Any] = {"Date": None} if fmt == "svg" else {"Software": None}
    try:
        fig.savefig(buffer, format=fmt, metadata=metadata, bbox_inches="tight")
    finally:
        plt.close(fig)
    return buffer.getvalue()
