"""The course's figures: one colour per category in every lesson, and a check that a figure reads.

    from course_lab.figures import color
    ax.bar(x, values, color=color("optimizer"), label="optimizer")

``COLORS`` gives each memory category, collective and precision one colour, the same in every
lesson (optimizer state is green wherever it is drawn). ``problems(fig)`` lists what makes a
figure hard to read: two pieces of text on top of each other (titles, axis labels, tick labels,
legends, annotations), a legend drawn over bars, or several series and no legend. The notebook
tests run it on every figure a notebook shows (``install_checks``).
"""

from __future__ import annotations

from itertools import combinations

# Matplotlib's tab10, assigned once for the whole course.
COLORS = {
    # memory by category (lessons 0, 1, 5, 7)
    "params": "#1f77b4",
    "grads": "#ff7f0e",
    "optimizer": "#2ca02c",
    "gathered": "#d62728",
    "activations": "#9467bd",
    "grad buffers": "#8c564b",
    "temp": "#e377c2",
    "other": "#7f7f7f",
    "buffers": "#bcbd22",
    "working": "#17becf",
    # collectives (lessons 0 to 5, 8)
    "all_gather": "#d62728",
    "reduce_scatter": "#ff7f0e",
    "all_reduce": "#1f77b4",
    "broadcast": "#17becf",
    # phases of a step (lessons 2, 7): light, so the collectives drawn over them stay readable
    "forward": "#aec7e8",
    "backward": "#c5b0d5",
    "held": "#d9d9d9",
    # measured against theory (every lesson): measured solid, theory dashed, both black-grey
    "measured": "#1f77b4",
    "theory": "#7f7f7f",
    "planner": "#7f7f7f",
    "reference": "#000000",
}
MEMORY_CATEGORIES = [
    "params",
    "grads",
    "optimizer",
    "gathered",
    "grad buffers",
    "activations",
    "temp",
    "other",
]


def color(name: str) -> str:
    """The course's colour for a category, a collective or measured / theory."""
    return COLORS[name]


# --- the check -----------------------------------------------------------------------------------


def _texts(fig):
    """(what, Text) for every piece of text the figure draws."""
    found = []
    if fig._suptitle is not None:
        found.append(("suptitle", fig._suptitle))
    for i, ax in enumerate(fig.axes):
        if not ax.get_visible():
            continue
        name = f"axes {i}"
        for title in (ax.title, ax._left_title, ax._right_title):
            found.append((f"{name} title", title))
        found.append((f"{name} x label", ax.xaxis.label))
        found.append((f"{name} y label", ax.yaxis.label))
        for axis, which in ((ax.xaxis, "x"), (ax.yaxis, "y")):
            try:
                ticks = axis._update_ticks()  # the ticks drawn: those inside the view limits
            except AttributeError:
                ticks = axis.get_major_ticks() + axis.get_minor_ticks()
            for tick in ticks:
                for label in (tick.label1, tick.label2):
                    found.append((f"{name} {which} tick {label.get_text()!r}", label))
        for text in ax.texts:
            found.append((f"{name} text {text.get_text()!r}", text))
    return [(what, t) for what, t in found if t.get_visible() and t.get_text().strip()]


def _legends(fig):
    legends = [("figure legend", leg) for leg in fig.legends]
    for i, ax in enumerate(fig.axes):
        if ax.get_legend() is not None:
            legends.append((f"axes {i} legend", ax.get_legend()))
    return legends


def _series(ax) -> int:
    """Data series drawn in data coordinates: lines of 2+ points, scatters, filled areas, bars
    (axvline/axhline and single markers are guides, not series)."""
    lines = [
        line
        for line in ax.get_lines()
        if len(line.get_xdata()) > 1 and line.get_transform() == ax.transData
    ]
    collections = [c for c in ax.collections if c.get_transform() == ax.transData]
    return len(lines) + len(collections) + len(ax.containers)


def _overlap(a, b) -> float:
    """The smaller side of the intersection of two boxes in pixels (0: apart)."""
    return max(0.0, min(min(a.x1, b.x1) - max(a.x0, b.x0), min(a.y1, b.y1) - max(a.y0, b.y0)))


def problems(fig, tolerance_px: float = 1.0) -> list[str]:
    """What makes ``fig`` hard to read: overlapping text, a legend over bars, several series and
    no legend."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(what, t.get_window_extent(renderer)) for what, t in _texts(fig)]
    boxes += [(what, leg.get_window_extent(renderer)) for what, leg in _legends(fig)]
    found = []
    for (a, box_a), (b, box_b) in combinations(boxes, 2):
        width = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
        height = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
        if width > tolerance_px and height > tolerance_px:
            found.append(f"{a} overlaps {b}")
    for what, legend in _legends(fig):  # a legend drawn over bars hides what they measure
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            covered = [
                bar
                for bar in ax.patches
                if bar.get_visible()
                and _overlap(box, bar.get_window_extent(renderer)) > tolerance_px
            ]
            if covered:
                found.append(f"{what} covers {len(covered)} bar(s)")
                break
    series = sum(_series(ax) for ax in fig.axes)
    annotated = any(ax.texts for ax in fig.axes)
    if series > 1 and not _legends(fig) and not annotated:
        found.append(f"{series} series and no legend")
    return found


def check(fig) -> None:
    """Raise AssertionError naming what makes ``fig`` hard to read."""
    found = problems(fig)
    if found:
        title = next((t.get_text() for _, t in _texts(fig) if "title" in _), "") or "a figure"
        raise AssertionError(f"{title!r} does not read at a glance: " + "; ".join(found))


CHECKED: list[str] = []  # the figures install_checks has passed, by title


def install_checks(report: list | None = None) -> None:
    """Check every figure before ``plt.show`` shows it (the notebook tests call this first):
    raise AssertionError for one that does not read, or append its problems to ``report``."""
    import matplotlib.pyplot as plt

    if getattr(plt.show, "_course_checked", False):
        return
    show = plt.show

    def checked_show(*args, **kwargs):
        for number in plt.get_fignums():
            fig = plt.figure(number)
            if report is None:
                check(fig)
            else:
                report.extend(problems(fig))
            CHECKED.append(next((t.get_text() for w, t in _texts(fig) if "title" in w), "untitled"))
        return show(*args, **kwargs)

    checked_show._course_checked = True
    plt.show = checked_show
