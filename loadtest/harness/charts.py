"""Charts for the report pages: matplotlib on the Agg backend, inlined as SVG (no JavaScript,
nothing fetched), targets drawn as dashed lines in red (no series is red)."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf")  # no red: red is a target
TARGET_COLOR = "#c0392b"


def _pyplot() -> Any:
    """matplotlib on the Agg backend (no display), text kept as text in the SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "svg.fonttype": "none",
            "font.size": 10,
            "axes.titlesize": 12,
            "axes.titleweight": "bold",
            "axes.grid": True,
            "grid.color": "#e5e5e5",
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    )
    return plt


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    _pyplot().close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # inline: drop the XML prolog and DOCTYPE


def _ms_formatter(v: float, _pos: int) -> str:
    return f"{v:g}"


def line_chart(
    title: str,
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    y_label: str,
    *,
    targets: Sequence[tuple[str, float]] = (),
    log_y: bool = False,
    x_label: str = "seconds into the run",
    width_in: float = 10.0,
    height_in: float = 3.2,
) -> str:
    """Lines over time, with each target as a dashed horizontal line labelled with its value."""
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    fig, ax = plt.subplots(figsize=(width_in, height_in))
    ax.set_title(title, loc="left")
    plotted = False
    for i, (name, pts) in enumerate(series):
        clean = [(x, y) for x, y in pts if not math.isnan(y) and (y > 0 or not log_y)]
        if clean:
            ax.plot(
                [p[0] for p in clean],
                [p[1] for p in clean],
                label=name,
                color=COLORS[i % len(COLORS)],
                lw=1.4,
            )
            plotted = True
    for name, value in targets:
        ax.axhline(value, color=TARGET_COLOR, ls="--", lw=1.2, label=f"{name}: {value:g}")
    if not plotted:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="#888")
    if log_y:
        ax.set_yscale("log")
        # 1, 2, 5, 10, 20, 50, ...: plain numbers a reader can take in at a glance.
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(_ms_formatter))
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_locator(MaxNLocator(6))
    ax.xaxis.set_major_locator(MaxNLocator(10, integer=True))
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _svg(fig)


def bar_chart(
    title: str,
    bars: Sequence[tuple[str, float]],
    y_label: str,
    *,
    targets: Sequence[tuple[str, float]] = (),
    highlight: str | None = None,
    value_fmt: str = "{:,.0f}",
    log_y: bool = False,
) -> str:
    """Bars with their values written on them; targets as dashed lines across the chart."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8.0, 3.6))
    ax.set_title(title, loc="left")
    names = [b[0] for b in bars]
    values = [b[1] for b in bars]
    colors = [COLORS[0] if n == highlight else "#9aa7b4" for n in names]
    rects = ax.bar(names, values, color=colors, width=0.55)
    for rect, v in zip(rects, values, strict=True):
        ax.annotate(
            value_fmt.format(v),
            (rect.get_x() + rect.get_width() / 2, rect.get_height()),
            ha="center",
            va="bottom",
            xytext=(0, 3),
            textcoords="offset points",
        )
    for i, (name, value) in enumerate(targets):
        ax.axhline(
            value,
            color=TARGET_COLOR,
            ls=("--", ":", "-.")[i % 3],
            lw=1.2,
            label=f"{name}: {value_fmt.format(value)}",
        )
    ax.set_ylabel(y_label)
    top = max([*values, *(t[1] for t in targets), 1.0])
    if log_y:  # one saturated baseline would otherwise flatten the others to nothing
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        ax.set_yscale("log")
        positive = [v for v in [*values, *(t[1] for t in targets)] if v > 0] or [1.0]
        ax.set_ylim(min(positive) / 2, top * 3)
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(_ms_formatter))
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(0, top * 1.18)
    ax.grid(axis="x", visible=False)
    if targets:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _svg(fig)


def series(rows: Sequence[dict[str, Any]], x: str, y: str, scale: float = 1.0) -> list[tuple[float, float]]:
    return [(float(r[x]), float(r[y]) * scale) for r in rows if y in r and r[y] is not None]


def complete_seconds(timeline: Sequence[dict[str, Any]], duration_s: float | None) -> list[dict[str, Any]]:
    """The per-second rows of whole seconds inside the schedule: the last, partial second (and
    the stragglers answered after the schedule ended) would draw a fall to zero that is not one."""
    if not duration_s:
        return list(timeline[:-1]) if len(timeline) > 1 else list(timeline)
    return [r for r in timeline if float(r["t"]) + 1 <= duration_s]
