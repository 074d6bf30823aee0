"""The notebook quiz: one ipywidgets box per question, a Check button, feedback, a score.

CSS classes (quiz-root, quiz-question, quiz-feedback, quiz-score, quiz-lang) and the button
description "Check" stay fixed in both languages so browser tests can find them.
"""
from __future__ import annotations

import ipywidgets as widgets

from . import progress
from .bank import Question, QuizError, load_bank
from .grading import grade_question
from .i18n import check_lang, msg, say

LANG_LABELS = [("English", "en"), ("中文", "zh")]


def _write(out: widgets.Output, text: str) -> None:
    # Setting the Output's outputs (rather than print()) shows in JupyterLab even from a button
    # callback, and equally when no kernel is present (tests); a bare print would end up in the
    # log console instead.
    out.outputs = ({"output_type": "stream", "name": "stdout", "text": text + "\n"},)


class QuestionBox:
    """Widgets for one question; `answer()` reads them in the shape grade() expects."""

    def __init__(self, quiz: "Quiz", q: Question):
        self.quiz, self.q = quiz, q
        self.prompt = widgets.HTML()
        self.output = widgets.Output()
        self.output.add_class("quiz-feedback")
        self.correct = False
        children = [self.prompt]
        if q.type == "single":
            self.input = widgets.RadioButtons(options=[], value=None, layout={"width": "max-content"})
        elif q.type == "multi":
            self.checks = [widgets.Checkbox(value=False, indent=False, layout={"width": "auto"})
                           for _ in q.options]
            self.input = widgets.VBox(self.checks)
        elif q.type == "numeric":
            self.input = widgets.Text(placeholder="")
        elif q.type == "open":
            self.input = widgets.Textarea(rows=4, layout={"width": "95%"})
        else:  # code: graded by check_exercise in the notebook
            self.input = widgets.HTML()
        self.input.add_class(f"quiz-input-{q.type}")
        self._relabelling = False
        for choice in (self.checks if q.type == "multi" else [self.input] if q.type == "single" else []):
            choice.observe(self._choice_changed, names="value")
        children.append(self.input)
        if q.type != "code":
            self.button = widgets.Button(description="Check", button_style="primary")
            self.button.on_click(self.check)
            children += [self.button, self.output]
        self.box = widgets.VBox(children)
        self.box.add_class("quiz-question")
        self.box.add_class(f"quiz-q-{q.id}")

    def render(self, lang: str, number: int) -> None:
        q = self.q
        self.prompt.value = f"<b>{number}. {_esc(q.prompt[lang])}</b>"
        if q.type == "single":
            keep = self.input.value  # changing the labels must not lose the learner's choice
            self._relabelling = True
            self.input.options = [(f"{o.id}) {o.text[lang]}", o.id) for o in q.options]
            self.input.value = keep
            self._relabelling = False
        elif q.type == "multi":
            for cb, o in zip(self.checks, q.options):
                cb.description = f"{o.id}) {o.text[lang]}"
        elif q.type == "numeric":
            self.input.description = q.unit[lang]
            self.input.placeholder = "e.g. 4e6" if lang == "en" else "例如 4e6"
        elif q.type == "code":
            self.input.value = f"<i>{msg('code_here', lang)}</i>"

    def _choice_changed(self, _change) -> None:
        """Another choice than the one graded: its feedback no longer applies, so it goes. (In
        a browser this also shows that the kernel has the new choice: the widgets send a choice
        and a click as separate messages, and a choice can wait while the kernel is busy.)"""
        if not self._relabelling:
            self.output.outputs = ()

    def answer(self):
        if self.q.type == "single":
            return self.input.value
        if self.q.type == "multi":
            return [o.id for cb, o in zip(self.checks, self.q.options) if cb.value]
        value = self.input.value.strip()
        return value or None

    def check(self, _button=None) -> None:
        lang = self.quiz.lang
        answer = self.answer()
        if answer is None or answer == []:
            _write(self.output, msg("pick_first", lang))
            return
        try:
            result = grade_question(self.q, answer, lang)
        except QuizError as exc:  # e.g. "abc" typed for a number: say so in the feedback area
            _write(self.output, say(exc, lang))
            return
        self.correct = self.correct or result.correct
        _write(self.output, result.feedback)  # feedback first: it must show even if saving fails
        self.quiz.update_score()
        problem = progress.try_record(self.quiz.bank.lesson, self.q.id, result.score, result.correct)
        if problem:
            _write(self.output, result.feedback + "\n\n" + msg("not_recorded", lang, why=problem.split(": ", 1)[1]))


class Quiz:
    def __init__(self, lesson, lang=None):
        self.bank = load_bank(lesson)
        self._displayed = False
        self.lang = check_lang(lang or progress.get_setting("lang", "en"))
        self.title = widgets.HTML()
        self.score = widgets.Label()
        self.score.add_class("quiz-score")
        self.lang_toggle = widgets.ToggleButtons(options=LANG_LABELS, value=self.lang)
        self.lang_toggle.add_class("quiz-lang")
        self.lang_toggle.observe(self._on_lang, names="value")
        self.boxes = [QuestionBox(self, q) for q in self.bank.questions]
        self.root = widgets.VBox([self.title, self.lang_toggle] + [b.box for b in self.boxes] + [self.score])
        self.root.add_class("quiz-root")
        self.render()

    def render(self) -> None:
        self.title.value = f"<h3>{_esc(self.bank.title[self.lang])}</h3>"
        for n, b in enumerate(self.boxes, 1):
            b.render(self.lang, n)
        self.update_score()

    def update_score(self) -> None:
        graded = [b for b in self.boxes if b.q.type != "code"]
        self.score.value = msg("score", self.lang, k=sum(b.correct for b in graded), n=len(graded))

    def _ipython_display_(self):
        # show() displays the quiz and returns it; when the returned quiz is also a cell's
        # result, it must not appear a second time.
        if not self._displayed:
            self._displayed = True
            from IPython.display import display
            display(self.root)

    def _on_lang(self, change) -> None:
        self.lang = change["new"]
        self.render()
        try:
            progress.set_setting("lang", self.lang)  # remembered for the next quiz and the CLI
        except progress.ProgressError as exc:  # the quiz still switches; say once why it is not kept
            self.score.value = f"{msg('score', self.lang, k=sum(b.correct for b in self.boxes if b.q.type != 'code'), n=len(self.bank.graded()))}  ({exc})"


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def build(lesson, lang=None) -> Quiz:
    """The quiz of `lesson`, not yet displayed (evaluate it in a cell, or call show())."""
    return Quiz(lesson, lang)


def show(lesson, lang=None) -> Quiz:
    """Display the quiz of `lesson` in the notebook and return it (quiz.root is the widget).
    lang: 'en' or 'zh'; default: the language last chosen (progress settings), else English."""
    quiz = Quiz(lesson, lang)
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # plain Python: nothing to display on, the widgets still exist
        return quiz
    if get_ipython() is not None:
        display(quiz)
    return quiz
