"""course_lab.predict: a guess box whose measurement stays hidden until a guess is locked in."""

from __future__ import annotations

import pytest

from course_lab import predict as pr
from course_lab.notebook import compare_prediction


@pytest.fixture
def widget_mode(monkeypatch):
    """Widget mode as in JupyterLab, without a kernel: displays are collected."""
    shown = []
    monkeypatch.setattr(pr, "_widgets_on", lambda: True)
    monkeypatch.setattr("IPython.display.display", lambda *objs, **kw: shown.extend(objs))
    monkeypatch.setattr(pr, "_ALL", [])
    return shown


def test_run_all_keeps_the_measurement_hidden_until_a_guess(widget_mode):
    guess = pr.predict("all-gather bytes per step / 4P", "x 4P")
    box = widget_mode[0]
    text_box, button = box.children[1].children
    compare_prediction(guess, 1.5, "x 4P", "all-gather per step")  # Run All: no one typed
    reveal = widget_mode[1]
    assert guess.measured == 1.5 and "1.5" not in reveal.value and "hidden" in reveal.value
    button.click()  # nothing typed: asks for a guess, reveals nothing
    assert "1.5" not in reveal.value and "Type a guess" in box.children[2].value
    text_box.value = "2"
    button.click()
    for shown in (reveal.value, box.children[2].value):
        assert "you predicted 2 x 4P" in shown and "1.5 x 4P" in shown and "gap +0.5" in shown
    assert text_box.disabled and button.disabled  # a prediction, once revealed, stays as given
    text_box.value = "1.5"
    button.click()
    assert guess.guess == "2"


def test_a_guess_before_the_measurement_is_compared_when_it_runs(widget_mode):
    guess = pr.predict("dtype of the optimizer state", choices=["float32", "bfloat16"])
    buttons = widget_mode[0].children[1].children[0]
    buttons.value = "bfloat16"
    widget_mode[0].children[1].children[1].click()
    assert "locked in" in widget_mode[0].children[2].value
    compare_prediction(guess, "float32", what="optimizer state dtype")
    assert "not quite" in widget_mode[1].value and "float32" in widget_mode[1].value


def test_reveal_all_prints_every_measurement_and_refuses_an_unmeasured_one(widget_mode, capsys):
    measured = pr.predict("a")
    compare_prediction(measured, 0.123456789, what="first")
    assert pr.reveal_all() == ["first: 0.123457 (0.123)"]
    pr.predict("never measured")
    with pytest.raises(AssertionError, match="never measured"):
        pr.reveal_all()


def test_outside_jupyterlab_the_line_is_printed(monkeypatch, capsys):
    monkeypatch.setattr(pr, "_ALL", [])
    monkeypatch.setenv(pr.REVEAL_ENV, "1")
    guess = pr.predict("rows", "rows")
    compare_prediction(guess, 33, "rows", "rank 1's local rows")
    out = capsys.readouterr().out
    assert "Predict: rows" in out and "no prediction given; rank 1's local rows: 33 rows" in out


@pytest.mark.parametrize(
    "guess, measured, expected",
    [
        ("16", 41.4, "gap -25.4 (-61%)"),
        ("1e-3", 0.25, "a factor 250 off"),
        ("2,048", 2048, "gap +0 (+0%)"),
        ("lots", 3, "'lots' is not a number"),
        ("yes", True, "right"),
        ("False", True, "not this time"),
        ("broadcast, same-seed", ["same-seed", "broadcast"], ": right"),
        ("broadcast", ["same-seed", "broadcast"], "missing same-seed"),
        ("bfloat16", "float32", "not quite"),
        ("Silent", "silent", "right"),
        (None, 7, "no prediction given"),
    ],
)
def test_gap_line(guess, measured, expected):
    assert expected in pr.gap_line(guess, measured)


def test_a_table_in_the_measuring_cell_waits_for_the_guess(widget_mode, capsys):
    first, second = pr.predict("a"), pr.predict("b", choices=["yes", "no"])
    with pr.until_locked(first, second):
        print("the table: 42")
    block = widget_mode[-1]
    note, output = block.children
    assert capsys.readouterr().out == ""  # nothing answered under Run All
    assert output.layout.display == "none" and "a; b" in note.value
    assert output.outputs[0]["text"] == "the table: 42\n"
    first.give("40")
    assert output.layout.display == "none" and "<i>b</i>" in note.value
    second.give("no")
    assert output.layout.display is None and note.value == ""


def test_outside_jupyterlab_the_table_prints_at_once(capsys):
    with pr.until_locked(pr.predict("c")):
        print("the table: 42")
    assert "the table: 42" in capsys.readouterr().out
