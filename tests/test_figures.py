"""course_lab.figures: the course's colours, and the check every notebook figure passes (the
notebook tests install it before running each notebook: tests/test_notebooks.py)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest

from course_lab import figures


def test_one_colour_per_category():
    memory = [figures.color(c) for c in figures.MEMORY_CATEGORIES]
    assert len(set(memory)) == len(memory)


def test_overlapping_titles_are_found():
    fig, axes = plt.subplots(1, 3, figsize=(6, 2))
    for ax in axes:
        ax.set_title("a title far too long for a third of six inches")
    assert any("title overlaps" in p for p in figures.problems(fig))
    plt.close(fig)


def test_crowded_tick_labels_are_found():
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.set_xticks(range(10), [f"label {i}" for i in range(10)])
    assert any("x tick" in p and "overlaps" in p for p in figures.problems(fig))
    plt.close(fig)


def test_several_series_need_a_legend():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    ax.plot([0, 1], [1, 0])
    ax.axvline(0.5)
    assert figures.problems(fig) == ["2 series and no legend"]
    ax.lines[0].set_label("a")
    ax.lines[1].set_label("b")
    ax.legend(loc="upper center")
    assert figures.problems(fig) == []
    plt.close(fig)


def test_a_figure_that_reads_passes_and_show_checks_it(monkeypatch):
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.bar(["params", "grads"], [1, 2], color=[figures.color("params"), figures.color("grads")])
    ax.set_title("memory")
    ax.set_xlabel("category")
    ax.set_ylabel("MiB")
    assert figures.problems(fig) == []
    monkeypatch.setattr(plt, "show", lambda *a, **k: None)
    figures.install_checks()
    plt.show()
    assert figures.CHECKED[-1] == "memory"
    _, axes = plt.subplots(1, 2, figsize=(3, 2))
    for a in axes:
        a.set_title("overlapping titles here")
    with pytest.raises(AssertionError, match="does not read at a glance"):
        plt.show()
    plt.close("all")


def test_a_legend_over_bars_is_found():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.bar(["a", "b"], [10, 10], label="tall", color=figures.color("params"))
    ax.set_ylim(0, 10)
    ax.legend(loc="upper left")
    assert any("covers" in p for p in figures.problems(fig))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    assert figures.problems(fig) == []
    plt.close(fig)
