"""Grading: one pure function per question type, shared by the widget, the CLI and the tests.

Nothing here writes progress; callers that want it recorded call ``progress.record``.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from . import claims
from .bank import Question, QuizError, load_bank
from .i18n import check_lang, msg


@dataclass
class Result:
    correct: bool
    score: float  # in [0, 1]
    feedback: str
    details: dict = field(default_factory=dict)
    lesson: str = ""
    qid: str = ""
    attempted: bool = True
    printed: bool = field(default=False, repr=False, compare=False)

    @property
    def passed(self) -> bool:  # the name exercise checks read more naturally with
        return self.correct

    def _ipython_display_(self):
        # check_exercise has already printed its line: a check cell ending in the call must
        # not show it again as a long repr; a bare grade(...) shows its feedback.
        if not self.printed:
            print(self.feedback)


def grade(lesson, qid: str, answer, lang: str = "en") -> Result:
    """Grade `answer` to question `qid` of `lesson`; QuizError on an unknown question or an answer
    of the wrong type (see the README for the answer shapes)."""
    check_lang(lang)
    bank = load_bank(lesson)
    q = bank.question(qid)
    result = grade_question(q, answer, lang)
    result.lesson, result.qid = bank.lesson, q.id
    return result


def grade_question(q: Question, answer, lang: str = "en") -> Result:
    check_lang(lang)
    if q.type == "code":
        raise QuizError(f"{q.id} is a code exercise: it is graded by quizzes.check_exercise(...) "
                        "in its notebook cell, not by an answer")
    return _GRADERS[q.type](q, answer, lang)


# --- choice questions ----------------------------------------------------------------------

def _option_id(q: Question, value) -> str:
    if not isinstance(value, str):
        raise QuizError(f"{q.id}: an option is given by its id as a string (one of "
                        f"{', '.join(q.option_ids())}), not {type(value).__name__} {value!r}")
    oid = value.strip().lower().rstrip(")")
    if oid not in q.option_ids():
        raise QuizError(f"{q.id}: unknown option {value!r} (choose from {', '.join(q.option_ids())})")
    return oid


def _grade_single(q: Question, answer, lang: str) -> Result:
    if isinstance(answer, (list, tuple, set)):
        raise QuizError(f"{q.id} is single-choice: answer with one option id such as 'b', not a list")
    chosen = _option_id(q, answer)
    why = q.secret["why"][chosen][lang]
    if chosen == q.secret["correct"]:
        return Result(True, 1.0, f"{msg('correct', lang)} {why}", {"chosen": chosen})
    return Result(False, 0.0, f"{msg('wrong', lang)} {msg('selected_wrong', lang, opt=chosen + ')')} {why}",
                  {"chosen": chosen})


def _grade_multi(q: Question, answer, lang: str) -> Result:
    if isinstance(answer, str):  # "a,c" or "a c": what a terminal user types
        answer = [a for a in re.split(r"[\s,;]+", answer) if a]
    if not isinstance(answer, (list, tuple, set)):
        raise QuizError(f"{q.id} is multiple-choice: answer with a list of option ids such as "
                        f"['a', 'c'], not {type(answer).__name__} {answer!r}")
    chosen = {_option_id(q, a) for a in answer}
    right = set(q.secret["correct"])
    why = q.secret["why"]
    lines = []
    for oid in q.option_ids():  # explain every option the learner judged wrongly, in order
        if oid in chosen and oid not in right:
            lines.append(f"- {msg('selected_wrong', lang, opt=oid + ')')} {why[oid][lang]}")
        elif oid in right and oid not in chosen:
            lines.append(f"- {msg('missed_right', lang, opt=oid + ')')} {why[oid][lang]}")
    # partial credit: right picks minus wrong picks, over the number of right options
    score = max(0.0, (len(chosen & right) - len(chosen - right)) / len(right))
    if not lines:
        return Result(True, 1.0, msg("correct", lang), {"chosen": sorted(chosen)})
    head = msg("partly" if score > 0 else "wrong", lang)
    return Result(False, score, "\n".join([head] + lines), {"chosen": sorted(chosen)})


# --- numeric -------------------------------------------------------------------------------

def parse_number(q: Question, answer) -> float:
    """Numbers, or strings like '4e7', '40,000,000', '40 000 000 bytes'."""
    if isinstance(answer, bool) or isinstance(answer, (list, tuple, set, dict)) or answer is None:
        raise QuizError(f"{q.id} is numeric: answer with a number, not {type(answer).__name__} {answer!r}")
    if isinstance(answer, (int, float)):
        value = float(answer)
    else:
        text = str(answer).strip()
        for unit in (q.unit or {}).values():  # tolerate the unit typed after the number
            if text.lower().endswith(unit.lower()):
                text = text[: -len(unit)].strip()
        try:
            value = float(re.sub(r"[\s,_]", "", text))
        except ValueError:
            raise QuizError(f"{q.id} is numeric: cannot read {answer!r} as a number") from None
    if not math.isfinite(value):
        raise QuizError(f"{q.id} is numeric: {answer!r} is not a finite number")
    return value


def _grade_numeric(q: Question, answer, lang: str) -> Result:
    value = parse_number(q, answer)
    s = q.secret
    (kind, tol), = s["tolerance"].items()
    allowed = tol if kind == "abs" else tol * abs(s["value"])
    error = abs(value - s["value"])
    details = {"value": value}
    given = f"{value:,.6g}"
    if error <= allowed:
        return Result(True, 1.0, f"{msg('correct', lang)} {msg('numeric_ok', lang, given=given)} "
                                 f"{s['explanation'][lang]}", details)
    return Result(False, 0.0, f"{msg('wrong', lang)} {msg('numeric_bad', lang, given=given, unit=q.unit[lang])}\n"
                              f"{msg('how', lang)} {s['explanation'][lang]}", details)


# --- open answers graded by the claims they make (claims.py) ---------------------------------

# An answer this short cannot state an idea and its subject; a Chinese character counts as
# 0.6 of a word (about ten characters say what six English words say).
MIN_WORDS = 6


def too_short(text: str) -> bool:
    norm = claims.normalise(text)
    words = len(re.findall(r"[a-z0-9']+", norm)) + 0.6 * len(claims.CJK_RE.findall(norm))
    return words < MIN_WORDS


def _grade_open(q: Question, answer, lang: str) -> Result:
    if not isinstance(answer, str):
        raise QuizError(f"{q.id} is an open question: answer with text, not {type(answer).__name__}")
    s = q.secret
    reading = claims.read_answer(answer, s)
    found = [c for c in s["claims"] if c["id"] in reading.supported]
    missed = [c for c in s["claims"] if c["id"] not in reading.supported]
    k, n = s["min_claims"], len(s["claims"])
    weight = sum(c.get("weight", 1) for c in found)  # a central claim may count for two
    short = too_short(answer)
    statement = reading.verb_clauses > 0
    wrongs = reading.misconceptions
    correct = weight >= k and not wrongs and not short and statement
    score = min(1.0, max(0, weight - len(wrongs)) / k)
    if not correct:
        score = min(score, 0.5)

    def bullets(items):
        return "\n".join(f"- {i['label'][lang]}" for i in items) or f"- {msg('none', lang)}"

    lines = [msg("correct" if correct else "wrong", lang)]
    if wrongs:
        lines.append(msg("misconception", lang))
        lines += [f"- {text[lang]}" for _, text, _ in wrongs]
    if short:
        lines.append(msg("too_short", lang))
    elif not statement:
        lines.append(msg("no_statement", lang))
    heaviest = max(c.get("weight", 1) for c in s["claims"])
    need = (msg("need", lang, k=k, n=n, f=weight) if heaviest == 1
            else msg("need_weighted", lang, k=k, w=heaviest, f=weight))
    lines += [need,
              msg("found", lang), bullets(found),
              msg("missed", lang), bullets(missed),
              msg("reference", lang), s["reference"][lang]]
    details = {"found": [c["id"] for c in found], "missed": [c["id"] for c in missed],
               "misconceptions": [i for i, _, _ in wrongs], "too_short": short,
               "statement": statement}
    return Result(correct, score, "\n".join(lines), details)


_GRADERS = {"single": _grade_single, "multi": _grade_multi, "numeric": _grade_numeric, "open": _grade_open}
