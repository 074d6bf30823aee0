"""Predict, then measure: a guess the notebook keeps, and a measurement hidden until it is given.

    guess = predict("all-gather bytes per step / 4P, FULL_SHARD")   # the cell before the launch
    ...
    compare_prediction(guess, measured, "x 4P", "all-gather per step")  # the cell that measured it

In JupyterLab ``predict`` shows a box and a button. The measurement cell runs as usual (Run All
runs it too), but where it would print the measured value it shows a locked line instead; typing a
guess and pressing the button reveals, in both cells, the measurement and the gap. A guess given
before the measurement cell runs is shown against it straight away. Outside JupyterLab (a
terminal, or ``COURSE_REVEAL_PREDICTIONS=1``) nothing is hidden: the line is printed, as a plain
``None`` guess always was.

Each prediction keeps its measurement (``.measured``), so the test suite can check, after running
a notebook top to bottom with no one typing, that every prediction was measured
(``reveal_all``).
"""

from __future__ import annotations

import contextlib
import html
import io
import math
import os
import re

from course_lab.kernel import in_notebook

REVEAL_ENV = "COURSE_REVEAL_PREDICTIONS"
_UNSET = object()
_ALL: list[Prediction] = []  # every prediction made in this kernel, in order


def _widgets_on() -> bool:
    if os.environ.get(REVEAL_ENV, "").strip() not in ("", "0"):
        return False

    if not in_notebook():
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def show(value) -> str:
    """A measured value as the comparison line prints it."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.6g}"
    if isinstance(value, (list, tuple, set)):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def parse_number(text) -> float | None:
    """A typed guess as a number: "16", "2,048", "1e-3", "0.5x", "4 MiB" -> float; else None."""
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        return float(text)
    match = re.match(
        r"^\s*([-+]?(?:\d[\d,_]*\.?\d*|\.\d+)(?:e[-+]?\d+)?)\s*[a-z%/ ]*$", str(text), re.IGNORECASE
    )
    if not match:
        return None
    try:
        return float(match.group(1).replace(",", "").replace("_", ""))
    except ValueError:
        return None


def _words(value) -> list[str]:
    if isinstance(value, (list, tuple, set)):
        return sorted(str(v).strip().lower() for v in value)
    return sorted(w for w in re.split(r"[\s,;\[\]'\"]+", str(value).lower()) if w)


def gap_line(guess, measured, unit: str = "", what: str = "the measurement") -> str:
    """The learner's guess next to the measurement: the gap for numbers, right or not for the
    rest (True/False, a word, a list of names)."""
    unit = f" {unit}" if unit else ""
    if guess is None or guess is Ellipsis or (isinstance(guess, str) and not guess.strip()):
        return f"no prediction given; {what}: {show(measured)}{unit}"
    if isinstance(measured, bool):
        said = str(guess).strip().lower()
        if said in ("true", "yes", "y", "1", "false", "no", "n", "0"):
            right = (said in ("true", "yes", "y", "1")) == measured
            return (
                f"you predicted {guess}; {what}: {measured}: "
                f"{'right' if right else 'not this time'}"
            )
    elif isinstance(measured, (int, float)):
        number = parse_number(guess)
        if number is None:
            return f"your prediction {guess!r} is not a number; {what}: {show(measured)}{unit}"
        gap = number - measured
        rel = f" ({gap / measured:+.0%})" if measured and math.isfinite(gap / measured) else ""
        ratio = ""
        if number > 0 and measured > 0 and max(number / measured, measured / number) >= 10:
            ratio = f", a factor {max(number / measured, measured / number):.3g} off"
        return (
            f"you predicted {show(number)}{unit}; {what}: {show(measured)}{unit}; "
            f"gap {gap:+,.4g}{unit}{rel}{ratio}"
        )
    elif isinstance(measured, (list, tuple, set)):
        said, got = set(_words(guess)), set(_words(measured))
        if said == got:
            return f"you predicted {show(sorted(said))}; {what}: {show(measured)}: right"
        parts = [
            f"missing {', '.join(sorted(got - said))}" if got - said else "",
            f"not in it: {', '.join(sorted(said - got))}" if said - got else "",
        ]
        return f"you predicted {show(sorted(said))}; {what}: {show(measured)}: " + "; ".join(
            p for p in parts if p
        )
    said, got = str(guess).strip().lower(), str(measured).strip().lower()
    right = said == got or (said and said in got)
    return f"you predicted {guess}; {what}: {show(measured)}: {'right' if right else 'not quite'}"


class Prediction:
    """One prediction: what is asked, the learner's guess (None until given) and, once the
    measurement cell ran, the measured value. ``predict`` makes one and shows its input."""

    def __init__(self, what: str, unit: str = "", choices=None):
        self.what, self.unit, self.choices = what, unit, list(choices) if choices else None
        self.guess = None
        self.measured = _UNSET
        self.measured_what = what
        self._reveals = []  # the HTML lines the measurement cells show (widget mode)
        self._input = self._button = self._status = None
        self._hidden = []  # Output widgets of until_locked blocks that wait on this guess
        _ALL.append(self)

    @property
    def has_measurement(self) -> bool:
        return self.measured is not _UNSET

    @property
    def locked(self) -> bool:
        return self.guess is not None

    def line(self) -> str:
        """The comparison line (the guess, the measurement and the gap)."""
        return gap_line(self.guess, self.measured, self.unit, self.measured_what)

    # --- the input box (the guess cell) -------------------------------------------------------
    def widget(self):
        import ipywidgets as w

        if self.choices:
            self._input = w.ToggleButtons(
                options=[str(c) for c in self.choices], value=None, style={"button_width": "auto"}
            )
        else:
            self._input = w.Text(
                placeholder="your guess" + (f" ({self.unit})" if self.unit else ""),
                layout=w.Layout(width="16em"),
            )
        self._button = w.Button(
            description="Lock in and reveal",
            button_style="primary",
            icon="lock",
            layout=w.Layout(width="auto"),
        )
        self._button.on_click(lambda _: self.give(self._input.value))
        self._status = w.HTML()
        question = w.HTML(
            f"<b>Predict:</b> {html.escape(self.what)}"
            + (f" <i>({html.escape(self.unit)})</i>" if self.unit else "")
        )
        box = w.VBox([question, w.HBox([self._input, self._button]), self._status])
        box.add_class("course-prediction")
        self._refresh()
        return box

    def give(self, guess) -> None:
        """The learner's guess: kept (locked), then shown against the measurement if it ran."""
        if self.locked:
            return
        if guess is None or (isinstance(guess, str) and not guess.strip()):
            if self._status is not None:
                self._status.value = "<span style='color:#b45309'>Type a guess first.</span>"
            return
        if self.choices:
            guess = next((c for c in self.choices if str(c) == str(guess)), guess)
        self.guess = guess
        self._refresh()

    # --- the measurement (the measurement cell) -----------------------------------------------
    def reveal(self, measured, unit: str | None = None, what: str | None = None) -> None:
        """Record the measurement; show it against the guess, or a locked line until there is
        one (widget mode). Printed in full outside JupyterLab."""
        self.measured = measured
        if unit is not None:
            self.unit = unit
        if what is not None:
            self.measured_what = what
        if not _widgets_on():
            print(self.line())
            return
        import ipywidgets as w
        from IPython.display import display

        shown = w.HTML()
        shown.add_class("course-reveal")
        self._reveals.append(shown)
        self._refresh()
        display(shown)

    def _refresh(self) -> None:
        if self.locked and self.has_measurement:
            text = f"<span style='color:#1d4ed8'>&#9654; {html.escape(self.line())}</span>"
        elif self.locked:
            text = (
                f"locked in: <b>{html.escape(str(self.guess))}</b>. Run the cell that "
                "measures it (below)."
            )
        else:
            text = ""
        hidden = (
            f"<span style='color:#6b7280'>{html.escape(self.measured_what)}: <i>hidden until "
            "you lock in a guess in the cell above</i></span>"
        )
        for shown in self._reveals:
            shown.value = text if self.locked else hidden
        if self._status is not None:
            self._status.value = text
        for control in (self._input, self._button):
            if control is not None:
                control.disabled = self.locked
        for block in self._hidden:
            block.refresh()


def predict(what: str, unit: str = "", choices=None) -> Prediction:
    """Ask for a prediction: in JupyterLab a box (or buttons for ``choices``) and a button; the
    returned Prediction goes to ``compare_prediction`` in the cell that measures it."""
    prediction = Prediction(what, unit, choices)
    if _widgets_on():
        from IPython.display import display

        display(prediction.widget())
    else:
        print(
            f"Predict: {what}"
            + (f" ({unit})" if unit else "")
            + (f"; one of {', '.join(map(str, choices))}" if choices else "")
        )
    return prediction


class _HiddenBlock:
    """What an ``until_locked`` block printed and displayed, in order, in an Output widget shown
    once every one of its predictions is locked in; a grey line says what waits until then."""

    def __init__(self, predictions, outputs: list[dict]):
        import ipywidgets as w

        self.predictions = predictions
        self.output = w.Output()
        self.output.add_class("course-hidden-until-locked")
        self.output.outputs = tuple(outputs)
        self.note = w.HTML()
        self.box = w.VBox([self.note, self.output])
        self.refresh()

    def refresh(self) -> None:
        done = all(p.locked for p in self.predictions)
        self.output.layout.display = None if done else "none"
        waiting = "; ".join(html.escape(p.what) for p in self.predictions if not p.locked)
        self.note.value = (
            ""
            if done
            else (
                "<span style='color:#6b7280'>&#128274; more of this cell's output is hidden "
                f"until you lock in: <i>{waiting}</i></span>"
            )
        )


class _Collect(io.TextIOBase):
    """stdout and displays of a block, in the order they came, as notebook outputs."""

    def __init__(self):
        self.outputs: list[dict] = []

    def write(self, text: str) -> int:
        if self.outputs and self.outputs[-1]["output_type"] == "stream":
            self.outputs[-1]["text"] += text
        else:
            self.outputs.append({"output_type": "stream", "name": "stdout", "text": text})
        return len(text)

    def publish(self, data, metadata=None, **_):
        self.outputs.append(
            {"output_type": "display_data", "data": data, "metadata": metadata or {}}
        )


@contextlib.contextmanager
def until_locked(*predictions):
    """Show what the block prints and displays (a table, a figure) only once every prediction
    given is locked in, so Run All answers no question before it is asked. Outside JupyterLab,
    or with no prediction, the block prints as usual."""
    waiting = [p for p in predictions if isinstance(p, Prediction)]
    if not waiting or not _widgets_on():
        yield
        return
    from IPython import get_ipython
    from IPython.core.displaypub import CapturingDisplayPublisher
    from IPython.display import display

    shell = get_ipython()
    collect = _Collect()
    publisher = CapturingDisplayPublisher()
    publisher.publish = collect.publish
    saved = shell.display_pub if shell is not None else None
    if shell is not None:
        shell.display_pub = publisher
    try:
        with contextlib.redirect_stdout(collect):
            yield
    finally:
        if shell is not None:
            shell.display_pub = saved
        block = _HiddenBlock(waiting, collect.outputs)
        for prediction in waiting:
            prediction._hidden.append(block)
        display(block.box)


def reveal_all(require_measured: bool = True) -> list[str]:
    """Print every prediction of this kernel with its measurement (for tests and reviewers);
    with ``require_measured`` raise when one was never measured (a guess cell whose measurement
    cell does not call ``compare_prediction`` with it)."""
    lines = []
    for prediction in _ALL:
        if not prediction.has_measurement:
            if require_measured:
                raise AssertionError(f"prediction {prediction.what!r} was never measured")
            continue
        value = prediction.measured
        rounded = f" ({value:.3g})" if isinstance(value, float) else ""
        lines.append(
            f"{prediction.measured_what}: {show(value)}{rounded}"
            + (f" {prediction.unit}" if prediction.unit else "")
        )
    print("\n".join(lines))
    return lines
