"""Plots of the benchmarks (WindVE's stress curves, ESPN's prefetch study): Matplotlib figures
drawn on the Agg canvas, so no display and no global pyplot state are needed."""

__all__ = ["new_axes", "save_axes"]


def new_axes():
    """A Matplotlib figure and axes on the Agg canvas (no pyplot, no global backend)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def save_axes(fig, ax, path, xlabel, ylabel):
    """Label, grid and legend ``ax`` and save ``fig`` as a PNG at ``path``; returns ``path``."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    return path
