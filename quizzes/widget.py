"""The notebook quiz: one ipywidgets box per question, a Check button, feedback, a score at the
top and at the bottom.

The feedback shows the verdict at a glance (icon, colour, word) and the explanation under it,
wrapped at word boundaries. An open answer the grader could not read whole ("unsure") shows what
it found and missed, the sentences it could not read and the reference answer, then a checklist
of the key ideas, a box to confirm that nothing in the answer is false (never ticked for the
learner) and two buttons: the learner marks their own answer, recorded as self-assessed; "right"
needs every box ticked.
Switching the language re-renders everything, feedback included (graded again in the new
language; nothing is recorded twice).

CSS classes for tests and styling: quiz-root, quiz-lang, quiz-score (quiz-score-top,
quiz-score-bottom), quiz-question, quiz-q-<id>, quiz-check, quiz-feedback, quiz-verdict-<look>,
quiz-selfcheck, quiz-idea, quiz-nothing-false, quiz-self-right, quiz-self-wrong, quiz-self-status.
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from . import present, progress
from .bank import Question, QuizError, load_bank
from .grading import grade_question
from .i18n import check_lang, msg, say

LANG_LABELS = [("English", "en"), ("中文", "zh")]
TEXT_STYLE = "white-space:pre-wrap;overflow-wrap:break-word;word-break:normal;line-height:1.5"


def _esc(text: str) -> str:
    """Escaped for HTML; `code` in the banks' texts shown as code, not as backticks."""
    parts = html.escape(str(text), quote=False).split("`")
    if len(parts) % 2 == 0:  # an odd number of backticks: not code marks, keep them
        return "`".join(parts)
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def _badge(kind: str, lang: str) -> str:
    _, _, fg, bg = present.LOOKS[kind]
    return (
        f"<span class='quiz-verdict quiz-verdict-{kind}' style='display:inline-block;"
        f"padding:1px 10px;border-radius:10px;font-weight:600;color:{fg};background:{bg};"
        f"border:1px solid {fg}'>{_esc(present.badge_text(kind, lang))}</span>"
    )


def _panel(kind: str, inner: str) -> str:
    _, _, fg, _ = present.LOOKS[kind]
    return (
        f"<div style='border-left:4px solid {fg};padding:4px 0 4px 10px;margin:4px 0;"
        f"max-width:60em'>{inner}</div>"
    )


def _text(text: str) -> str:
    return f"<div style='{TEXT_STYLE};margin-top:4px'>{_esc(text)}</div>"


def _feedback(text: str) -> str:
    """The grader's feedback as HTML: a short line ending in a colon is a heading, "- " lines are
    a list with a hanging indent, the rest wraps at word boundaries."""
    out = []
    for line in text.splitlines():
        if line.startswith("- "):
            out.append(_items([line[2:]], "•", "#57606a"))
        elif line.rstrip().endswith((":", "：")) and len(line) <= 60:
            out.append(f"<div style='{TEXT_STYLE};margin-top:6px'><b>{_esc(line)}</b></div>")
        else:
            out.append(f"<div style='{TEXT_STYLE}'>{_esc(line)}</div>")
    return f"<div style='margin-top:4px'>{''.join(out)}</div>"


def _items(items, mark: str, colour: str) -> str:
    return "".join(
        f"<div style='{TEXT_STYLE};padding-left:1.4em;text-indent:-1.4em'>"
        f"<span style='color:{colour};font-weight:600'>{mark}</span>&nbsp;{_esc(i)}</div>"
        for i in items
    )


class QuestionBox:
    """Widgets for one question; `answer()` reads them in the shape grade() expects."""

    def __init__(self, quiz: Quiz, q: Question):
        self.quiz, self.q = quiz, q
        self.prompt = widgets.HTML(layout={"width": "100%"})
        self.feedback = widgets.HTML(layout={"width": "100%"})
        self.feedback.add_class("quiz-feedback")
        self.feedback_text = ""  # what the feedback says, as plain text (tests, logs)
        self.correct = False  # graded correct at least once in this quiz
        self.self_mark = None  # "correct" / "wrong": the learner's own mark after "unsure"
        self.graded = None  # the answer last graded (re-graded on a language switch)
        self.note = None  # ("pick_first",) or ("error", exc): shown instead of a result
        self.save_problem = None  # why the last result could not be saved, if it could not
        self.self_problem = None  # the same for the learner's own mark
        children = [self.prompt]
        if q.type == "single":
            self.input = widgets.RadioButtons(
                options=[], value=None, layout={"width": "max-content"}
            )
        elif q.type == "multi":
            self.checks = [
                widgets.Checkbox(value=False, indent=False, layout={"width": "auto"})
                for _ in q.options
            ]
            self.input = widgets.VBox(self.checks)
        elif q.type == "numeric":
            self.input = widgets.Text(placeholder="")
        elif q.type == "open":
            self.input = widgets.Textarea(rows=4, layout={"width": "95%"})
        else:  # code: graded by check_exercise in the notebook
            self.input = widgets.HTML()
        self.input.add_class(f"quiz-input-{q.type}")
        self._relabelling = False
        for choice in (
            self.checks if q.type == "multi" else [self.input] if q.type == "single" else []
        ):
            choice.observe(self._choice_changed, names="value")
        children.append(self.input)
        if q.type != "code":
            self.button = widgets.Button(button_style="primary")
            self.button.add_class("quiz-check")
            self.button.on_click(self.check)
            children += [self.button, self.feedback]
        if q.type == "open":
            self._build_selfcheck()
            children.append(self.selfcheck)
        self.box = widgets.VBox(children, layout={"margin": "0 0 14px 0"})
        self.box.add_class("quiz-question")
        self.box.add_class(f"quiz-q-{q.id}")

    # --- the self-check after "unsure" -------------------------------------------------------

    def _build_selfcheck(self) -> None:
        self.ideas_head = widgets.HTML(layout={"width": "100%"})
        self.ideas = widgets.VBox([])
        self.idea_checks: list[widgets.Checkbox] = []
        # never ticked for the learner: the grader did not find anything false, but an unsure
        # answer may still say something false (the second reading doubts it, or it is unread)
        self.nothing_false = widgets.Checkbox(
            value=False, indent=False, layout={"width": "28px", "flex": "0 0 28px"}
        )
        self.nothing_false.add_class("quiz-nothing-false")
        self.nothing_false.observe(lambda _c: self._update_self_buttons(), names="value")
        self.nothing_false_label = widgets.HTML(layout={"width": "100%"})
        self.self_right = widgets.Button(button_style="success", icon="check")
        self.self_right.add_class("quiz-self-right")
        self.self_wrong = widgets.Button(button_style="warning", icon="times")
        self.self_wrong.add_class("quiz-self-wrong")
        self.self_right.on_click(lambda _b: self.mark_self("correct"))
        self.self_wrong.on_click(lambda _b: self.mark_self("wrong"))
        self.self_hint = widgets.HTML()
        self.self_status = widgets.HTML(layout={"width": "100%"})
        self.self_status.add_class("quiz-self-status")
        self.selfcheck = widgets.VBox(
            [
                self.ideas_head,
                self.ideas,
                widgets.HBox(
                    [self.nothing_false, self.nothing_false_label],
                    layout={"align_items": "flex-start"},
                ),
                widgets.HBox(
                    [self.self_right, self.self_wrong, self.self_hint],
                    layout={"align_items": "center"},
                ),
                self.self_status,
            ],
            layout={
                "display": "none",
                "width": "100%",
                "border_left": f"4px solid {present.LOOKS['unsure'][2]}",
                "padding": "0 0 6px 10px",
                "margin": "0 0 0 2px",
            },
        )
        self.selfcheck.add_class("quiz-selfcheck")

    def _show_selfcheck(self, parts: dict, lang: str) -> None:
        labels = parts["checklist"]
        if len(self.idea_checks) != len(
            labels
        ):  # a new checklist: ticked where the grader found the idea
            self.idea_checks = []
            self.nothing_false.value = False
            rows = []
            for label in labels:
                cb = widgets.Checkbox(
                    value=label not in parts["missing"],
                    indent=False,
                    layout={"width": "28px", "flex": "0 0 28px"},
                )
                cb.add_class("quiz-idea")
                cb.observe(lambda _c: self._update_self_buttons(), names="value")
                self.idea_checks.append(cb)
                rows.append(
                    widgets.HBox(
                        [cb, widgets.HTML(layout={"width": "100%"})],
                        layout={"align_items": "flex-start"},
                    )
                )
            self.ideas.children = rows
        for row, label in zip(self.ideas.children, labels):
            row.children[1].value = f"<div style='{TEXT_STYLE}'>{_esc(label)}</div>"
        self.nothing_false_label.value = (
            f"<div style='{TEXT_STYLE}'><i>{_esc(msg('nothing_false', lang))}</i></div>"
        )
        self.ideas_head.value = (
            f"<div style='{TEXT_STYLE};margin-top:6px'><b>{_esc(msg('checklist_head', lang))}</b> "
            f"{_esc(msg('checklist_rule', lang))}</div>"
        )
        self.self_right.description = msg("self_right", lang)
        self.self_wrong.description = msg("self_wrong", lang)
        self.self_right.layout.width = self.self_wrong.layout.width = "auto"
        self._update_self_buttons()
        self._show_self_status(lang)
        self.selfcheck.layout.display = "flex"

    def _update_self_buttons(self) -> None:
        all_ticked = all(cb.value for cb in self.idea_checks) and self.nothing_false.value
        self.self_right.disabled = not all_ticked
        self.self_hint.value = (
            "" if all_ticked else f"<i>{_esc(msg('self_needs_all', self.quiz.lang))}</i>"
        )

    def _hide_selfcheck(self) -> None:
        if self.q.type == "open":
            self.selfcheck.layout.display = "none"
            self.idea_checks, self.ideas.children = [], ()
            self.self_status.value = ""

    def mark_self(self, verdict: str) -> None:
        """The learner's own mark on an answer the grader was unsure of: saved as self-assessed."""
        self.self_mark = verdict
        saved = progress.record(
            self.quiz.bank.lesson, progress.Mark(self.q.id, verdict, graded_by="self")
        )
        self.self_problem = saved.problem
        self._show_self_status(self.quiz.lang)
        self.quiz.update_score()

    def _show_self_status(self, lang: str) -> None:
        if self.self_mark is None:
            self.self_status.value = ""
            return
        line = msg("self_recorded", lang)
        if self.self_problem:
            line = progress.Saved(problem=self.self_problem).line(lang)
        self.self_status.value = (
            f"<div style='margin-top:4px'>{_badge('self_' + self.self_mark, lang)} "
            f"<span style='{TEXT_STYLE}'>{_esc(line)}</span></div>"
        )

    # --- rendering -------------------------------------------------------------------------------

    def render(self, lang: str, number: int | None, of: int) -> None:
        q = self.q
        if number is None:  # the code exercise: graded in its own cell, not part of the score
            self.prompt.value = (
                f"<div style='{TEXT_STYLE}'><b>{_esc(msg('exercise_title', lang))}</b><br>"
                f"{_esc(q.prompt[lang])}</div>"
            )
        else:
            self.prompt.value = (
                f"<div style='{TEXT_STYLE}'><span style='color:#57606a;font-size:90%'>"
                f"{_esc(msg('question_n', lang, k=number, n=of))}</span><br>"
                f"<b>{_esc(q.prompt[lang])}</b></div>"
            )
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
            self.input.value = f"<i>{_esc(msg('code_here', lang))}</i>"
        if q.type != "code":
            self.button.description = msg("check", lang)
            self._redraw(lang)

    def _redraw(self, lang: str) -> None:
        """The feedback in `lang`: the last result graded again (grading is pure), or the note."""
        if self.graded is not None:
            self._show(grade_question(self.q, self.graded, lang), lang, self.save_problem)
        elif self.note is not None:
            self._say(
                self.note[0] == "pick_first" and msg("pick_first", lang) or say(self.note[1], lang)
            )

    def _say(self, text: str) -> None:
        self.feedback_text = text
        self.feedback.value = _text(text)
        self._hide_selfcheck()

    def _show(self, result, lang: str, problem: str | None = None) -> None:
        kind = present.look(result)
        if result.verdict == "unsure":
            parts = present.unsure_parts(result, lang)
            inner = [_badge(kind, lang), _text(parts["why"])]
            if parts["false"]:
                inner.append(
                    f"<div style='margin-top:6px'><b>{_esc(msg('false_head', lang))}</b></div>"
                )
                inner.append(
                    _items(
                        [
                            msg("ui_you_wrote", lang, quote=f["quote"], fix=f.get("fix", ""))
                            for f in parts["false"]
                        ],
                        "✘",
                        "#a40e26",
                    )
                )
            inner.append(f"<div style='margin-top:6px'><b>{_esc(msg('ui_found', lang))}</b></div>")
            inner.append(_items(parts["found"] or [msg("none", lang)], "✔", "#116329"))
            inner.append(
                f"<div style='margin-top:6px'><b>{_esc(msg('ui_missing', lang))}</b></div>"
            )
            inner.append(_items(parts["missing"] or [msg("none", lang)], "○", "#57606a"))
            if parts["unread"]:
                inner.append(
                    f"<div style='margin-top:6px'><b>{_esc(msg('ui_unread', lang))}</b></div>"
                )
                inner.append(
                    _items([present.quote(u, lang) for u in parts["unread"]], "?", "#0a3069")
                )
            if parts["reference"]:
                inner.append(
                    f"<div style='margin-top:6px'><b>{_esc(msg('reference', lang))}</b></div>"
                    f"<div style='{TEXT_STYLE};background:#f6f8fa;padding:4px 8px;"
                    f"border-radius:4px'>{_esc(parts['reference'])}</div>"
                )
            self.feedback_text = "\n".join(
                [present.badge_text(kind, lang), present.unsure_text(result, lang)]
            )
            self._show_selfcheck(parts, lang)
        else:
            text = present.body(result, lang)
            inner = [_badge(kind, lang), _feedback(text)]
            self.feedback_text = f"{present.badge_text(kind, lang)}\n{text}"
            self._hide_selfcheck()
        if problem:
            line = progress.Saved(problem=problem).line(lang)
            inner.append(
                f"<div style='{TEXT_STYLE};color:#a40e26;margin-top:4px'>{_esc(line)}</div>"
            )
            self.feedback_text += "\n" + line
        self.feedback.value = _panel(kind, "".join(inner))

    def _choice_changed(self, _change) -> None:
        """Another choice than the one graded: its feedback no longer applies, so it goes. (In
        a browser this also shows that the kernel has the new choice: the widgets send a choice
        and a click as separate messages, and a choice can wait while the kernel is busy.)"""
        if not self._relabelling:
            self.graded = self.note = None
            self.feedback.value, self.feedback_text = "", ""

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
        self.graded = None
        if answer is None or answer == []:
            self.note = ("pick_first",)
            self._say(msg("pick_first", lang))
            return
        try:
            result = grade_question(self.q, answer, lang)
        except QuizError as exc:  # e.g. "abc" typed for a number: say so in the feedback area
            self.note = ("error", exc)
            self._say(say(exc, lang))
            return
        self.graded, self.note = answer, None
        self.correct = self.correct or result.correct
        # a new answer: the old self-mark was on another
        self.self_mark, self.self_problem = None, None
        self.idea_checks = []
        self._show(result, lang)  # shown first: it must show even if saving fails
        self.quiz.update_score()
        saved = progress.record(self.quiz.bank.lesson, progress.Mark.of(self.q.id, result))
        self.save_problem = saved.problem
        if not saved.ok:
            self._show(result, lang, saved.problem)


class Quiz:
    def __init__(self, lesson, lang=None):
        self.bank = load_bank(lesson)
        self._displayed = False
        self.lang = check_lang(lang or progress.get_setting("lang", "en"))
        self.notice = ""
        self.title = widgets.HTML()
        self.score_top, self.score = widgets.HTML(), widgets.HTML()
        for label, where in ((self.score_top, "top"), (self.score, "bottom")):
            label.add_class("quiz-score")
            label.add_class(f"quiz-score-{where}")
        self.lang_toggle = widgets.ToggleButtons(options=LANG_LABELS, value=self.lang)
        self.lang_toggle.add_class("quiz-lang")
        self.lang_toggle.observe(self._on_lang, names="value")
        self.boxes = [QuestionBox(self, q) for q in self.bank.questions]
        self.root = widgets.VBox(
            [self.title, self.lang_toggle, self.score_top]
            + [b.box for b in self.boxes]
            + [self.score]
        )
        self.root.add_class("quiz-root")
        self.render()

    def render(self) -> None:
        self.title.value = f"<h3>{_esc(self.bank.title[self.lang])}</h3>"
        graded = [b for b in self.boxes if b.q.type != "code"]
        for b in self.boxes:
            b.render(self.lang, graded.index(b) + 1 if b in graded else None, len(graded))
        self.update_score()

    def score_text(self) -> str:
        graded = [b for b in self.boxes if b.q.type != "code"]
        base = msg("score", self.lang, k=sum(b.correct for b in graded), n=len(graded))
        selfs = sum(1 for b in graded if not b.correct and b.self_mark == "correct")
        return msg("score_self", self.lang, base=base, s=selfs) if selfs else base

    def update_score(self) -> None:
        text = self.score_text() + (f"  ({self.notice})" if self.notice else "")
        for label in (self.score_top, self.score):
            label.value = f"<b>{_esc(text)}</b>"

    def _ipython_display_(self):
        # show() displays the quiz and returns it; when the returned quiz is also a cell's
        # result, it must not appear a second time.
        if not self._displayed:
            self._displayed = True
            from IPython.display import display

            display(self.root)

    def _on_lang(self, change) -> None:
        self.lang = change["new"]
        try:
            progress.set_setting("lang", self.lang)  # remembered for the next quiz and the CLI
            self.notice = ""
        except (
            progress.ProgressError
        ) as exc:  # the quiz still switches; say once why it is not kept
            self.notice = str(exc)
        self.render()


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
