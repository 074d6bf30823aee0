"""Grading: one pure function per question type, shared by the widget, the CLI and the tests.

Nothing here writes progress; callers that want it recorded call ``progress.record``.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, InvalidOperation, localcontext

from . import claims, reader
from .bank import Question, QuizError, load_bank
from .i18n import AnswerError, check_lang, msg

VERDICTS = ("correct", "wrong", "unsure")


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
    # "correct", "wrong" or "unsure" (an open answer the grader could not read whole: the
    # learner compares it with the reference and marks it). Left empty, it follows `correct`;
    # `correct` is True only for the verdict "correct".
    verdict: str = ""

    def __post_init__(self):
        if not self.verdict:
            self.verdict = "correct" if self.correct else "wrong"
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if self.correct != (self.verdict == "correct"):
            raise ValueError(f"correct={self.correct} contradicts verdict {self.verdict!r}")

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
        raise QuizError(
            f"{q.id} is a code exercise: it is graded by quizzes.check_exercise(...) "
            "in its notebook cell, not by an answer"
        )
    return _GRADERS[q.type](q, answer, lang)


# --- choice questions ----------------------------------------------------------------------


def _option_id(q: Question, value) -> str:
    if not isinstance(value, str):
        raise AnswerError(
            "option_type",
            qid=q.id,
            options=", ".join(q.option_ids()),
            kind=type(value).__name__,
            value=repr(value),
        )
    oid = value.strip().lower().rstrip(")")
    if oid not in q.option_ids():
        raise AnswerError(
            "unknown_option", qid=q.id, value=repr(value), options=", ".join(q.option_ids())
        )
    return oid


def _grade_single(q: Question, answer, lang: str) -> Result:
    if isinstance(answer, (list, tuple, set)):
        raise AnswerError("single_list", qid=q.id)
    chosen = _option_id(q, answer)
    why = q.secret["why"][chosen][lang]
    sp = _space(lang)
    if chosen == q.secret["correct"]:
        return Result(True, 1.0, f"{msg('correct', lang)}{sp}{why}", {"chosen": chosen})
    return Result(
        False,
        0.0,
        f"{msg('wrong', lang)}{sp}{msg('selected_wrong', lang, opt=chosen + ')')}{sp}{why}",
        {"chosen": chosen},
    )


def _space(lang: str) -> str:
    """Between sentences: a space in English, none in Chinese (its punctuation is full width)."""
    return "" if lang == "zh" else " "


def _grade_multi(q: Question, answer, lang: str) -> Result:
    if isinstance(answer, str):  # "a,c" or "a c": what a terminal user types
        answer = [a for a in re.split(r"[\s,;]+", answer) if a]
    if not isinstance(answer, (list, tuple, set)):
        raise AnswerError(
            "multi_type", qid=q.id, kind=type(answer).__name__, value=repr(answer)[:60]
        )
    chosen = {_option_id(q, a) for a in answer}
    right = set(q.secret["correct"])
    why = q.secret["why"]
    lines = []
    for oid in q.option_ids():  # explain every option the learner judged wrongly, in order
        if oid in chosen and oid not in right:
            lines.append(
                f"- {msg('selected_wrong', lang, opt=oid + ')')}{_space(lang)}{why[oid][lang]}"
            )
        elif oid in right and oid not in chosen:
            lines.append(
                f"- {msg('missed_right', lang, opt=oid + ')')}{_space(lang)}{why[oid][lang]}"
            )
    # partial credit: right picks minus wrong picks, over the number of right options
    score = max(0.0, (len(chosen & right) - len(chosen - right)) / len(right))
    if not lines:
        return Result(True, 1.0, msg("correct", lang), {"chosen": sorted(chosen)})
    head = msg("partly" if score > 0 else "wrong", lang)
    return Result(False, score, "\n".join([head] + lines), {"chosen": sorted(chosen)})


# --- numeric -------------------------------------------------------------------------------

MAX_NUMBER_CHARS = 100  # longer than any answer a learner means; refused before it is parsed
# thousands separators: 1,234,567 (groups of exactly three digits after the first group)
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d*)?([eE][+-]?\d+)?")


def parse_number(q: Question, answer) -> Decimal:
    """Numbers, or strings like '4e7', '40,000,000', '40 000 000 bytes', read exactly (Decimal:
    a 400-digit integer is a number, not an OverflowError). A comma that is not a thousands
    separator ('0,8', '1,5e3') is refused rather than guessed: is it 0.8 or 8?"""
    if isinstance(answer, bool) or isinstance(answer, (list, tuple, set, dict)) or answer is None:
        raise AnswerError(
            "numeric_type", qid=q.id, kind=type(answer).__name__, value=repr(answer)[:60]
        )
    if isinstance(answer, int):
        value = Decimal(answer)
    elif isinstance(answer, float):
        value = Decimal(repr(answer))  # the shortest decimal that is this float: 0.1 stays 0.1
    else:
        text = unicodedata.normalize("NFKC", str(answer)).strip()
        if len(text) > MAX_NUMBER_CHARS:
            raise AnswerError("numeric_long", qid=q.id, n=len(text), limit=MAX_NUMBER_CHARS)
        for unit in (q.unit or {}).values():  # tolerate the unit typed after the number
            if text.lower().endswith(unit.lower()):
                text = text[: -len(unit)].strip()
        text = re.sub(r"[\s_]", "", text)
        if "," in text:
            if not _THOUSANDS.fullmatch(text):
                raise AnswerError("numeric_comma", qid=q.id, value=repr(answer))
            text = text.replace(",", "")
        try:
            value = Decimal(text)
        except InvalidOperation:
            raise AnswerError("numeric_unreadable", qid=q.id, value=repr(answer)) from None
    if not value.is_finite():
        raise AnswerError("numeric_infinite", qid=q.id, value=repr(answer))
    return value


def _exact():
    """A decimal context that neither rounds an answer's digits nor overflows on its exponent."""
    return localcontext(Context(prec=5000, Emax=MAX_EMAX, Emin=MIN_EMIN))


def show_number(value: Decimal) -> str:
    """The number as the learner gave it, never rounded: 250000.75 -> '250,000.75'; a huge or
    tiny one in scientific notation with all its digits."""
    with _exact():
        value = value.normalize()
    sign, digits, exp = value.as_tuple()
    if value == 0:
        return "0"
    if len(digits) > 30:  # cut (not rounded) and marked: the digits shown are the learner's
        head = "".join(map(str, digits[:20]))
        return (
            f"{'-' if sign else ''}{head[0]}.{head[1:]}…e{len(digits) + exp - 1} "
            f"({len(digits)} digits)"
        )
    if len(digits) + exp > 21 or len(digits) + exp < -6:  # beyond what reads well in plain digits
        return f"{value:E}".replace("E+", "e").replace("E", "e")
    return f"{value:,f}"


def _grade_numeric(q: Question, answer, lang: str) -> Result:
    value = parse_number(q, answer)
    s = q.secret
    ((kind, tol),) = s["tolerance"].items()
    target = Decimal(repr(s["value"])) if isinstance(s["value"], float) else Decimal(s["value"])
    tol = Decimal(repr(tol)) if isinstance(tol, float) else Decimal(tol)
    allowed = tol if kind == "abs" else tol * abs(target)
    with _exact():
        inside = abs(value - target) <= allowed
        details = {"value": float(value) if abs(value) < Decimal("1e308") else str(value)}
    given = show_number(value)
    if inside:
        sp = _space(lang)
        return Result(
            True,
            1.0,
            f"{msg('correct', lang)}{sp}{msg('numeric_ok', lang, given=given)}{sp}"
            f"{s['explanation'][lang]}",
            details,
        )
    return Result(
        False,
        0.0,
        f"{msg('wrong', lang)}{_space(lang)}"
        f"{msg('numeric_bad', lang, given=given, unit=q.unit[lang])}\n"
        f"{msg('how', lang)}{_space(lang)}{s['explanation'][lang]}",
        details,
    )


# --- open answers graded by the claims they make (claims.py) ---------------------------------

MAX_OPEN_CHARS = 20_000  # a long essay is ~5,000; beyond this the answer is refused, not read

# An answer this short cannot state an idea and its subject; a Chinese character counts as
# 0.6 of a word (about ten characters say what six English words say).
MIN_WORDS = 6


def too_short(text: str) -> bool:
    norm = claims.normalise(text)
    words = len(re.findall(r"[a-z0-9']+", norm)) + 0.6 * len(claims.CJK_RE.findall(norm))
    return words < MIN_WORDS


def key_ideas(secret: dict) -> list:
    """The question's key ideas: [{"id", "label", "claims": [claim ids]}]. A key idea is met when
    any of its claims is stated the right way (two ways of saying one thing: "FULL_SHARD gathers
    again in backward" or "SHARD_GRAD_OP uses more memory" both state the trade-off). Without
    `key_ideas` every claim is a key idea of its own. A claim in no key idea is a supporting idea:
    credited, and it reads its sentence, but an answer is complete without it."""
    if "key_ideas" in secret:
        return secret["key_ideas"]
    return [{"id": c["id"], "label": c["label"], "claims": [c["id"]]} for c in secret["claims"]]


def open_verdict(reading, secret: dict, short: bool) -> tuple:
    """(verdict, reason). `correct` only when the whole answer was read and is right: a statement,
    long enough, no misconception, every key idea, and no sentence about the topic left unread.
    A sentence the grader cannot read makes it at best `unsure` (never `correct`)."""
    ideas = key_ideas(secret)
    met = [k for k in ideas if any(c in reading.supported for c in k["claims"])]
    if short:
        return "wrong", "too_short"
    if reading.stated_sentences == 0:
        return "wrong", "no_statement"
    if reading.misconceptions:
        return "wrong", "misconception"
    if reading.unread and not reading.supported:
        # nothing it read states any idea of the question: whatever the unread sentences say,
        # the answer does not give the key ideas in a form anyone could check
        return "wrong", "off_topic"
    if reading.unread:
        return "unsure", "unread"
    if len(met) == len(ideas):
        return "correct", "complete"
    if reading.supported:
        return "wrong", "partial"
    return "wrong", "off_topic"


# The rules' verdicts the second reading (reader.py) may withhold: a keyword list or an answer
# too short to state anything is wrong however much it sounds like the right answers.
DOUBTABLE = ("complete", "misconception", "partial", "off_topic")


def _grade_open(q: Question, answer, lang: str) -> Result:
    if not isinstance(answer, str):
        raise AnswerError("open_type", qid=q.id, kind=type(answer).__name__)
    if len(answer) > MAX_OPEN_CHARS:
        raise AnswerError("open_long", qid=q.id, n=len(answer), limit=MAX_OPEN_CHARS)
    s = q.secret
    reading = claims.read_answer(answer, s)
    keys = key_ideas(s)
    found = [c for c in s["claims"] if c["id"] in reading.supported]
    # what the learner is told was found and missed, and the checklist they mark, are key ideas
    # (two claims of one key idea are one idea found; a supporting claim is in no key idea)
    met_ideas = [k for k in keys if any(c in reading.supported for c in k["claims"])]
    missing = [k for k in keys if k not in met_ideas]
    short = too_short(answer)
    verdict, reason = open_verdict(reading, s, short)
    second = None
    if reason in DOUBTABLE:
        second = reader.p_right(q.lesson, q.id, answer)
        if reader.second_opinion(verdict, second):
            verdict, reason = "unsure", f"doubted_{verdict}"
    met = len(keys) - len(missing)
    score = (
        1.0
        if verdict == "correct"
        else round(0.5 * max(0, met - len(reading.misconceptions)) / len(keys), 4)
    )
    false = [
        {"quote": quote, "fix": fix[lang], "id": cid} for cid, fix, quote in reading.misconceptions
    ]

    def bullets(items):
        return [f"- {i}" for i in items] or [f"- {msg('none', lang)}"]

    lines = [msg(f"open_{reason}", lang)]
    for f in false:
        lines.append(msg("you_wrote", lang, quote=f["quote"], fix=f["fix"].rstrip(".。")))
    lines += [msg("found", lang)] + bullets(k["label"][lang] for k in met_ideas)
    lines += [msg("missing" if verdict != "unsure" else "not_found", lang)] + bullets(
        c["label"][lang] for c in missing
    )
    if reading.unread:
        lines += [msg("unread", lang)] + bullets(
            f"«{u}»" if lang == "en" else f"「{u}」" for u in reading.unread
        )
    lines += [msg("reference", lang), s["reference"][lang]]
    if verdict == "unsure":
        lines += [msg("mark_yourself", lang)] + bullets(c["label"][lang] for c in keys)
    details = {
        "found": [c["id"] for c in found],
        "missing": [k["id"] for k in missing],
        "found_ideas": [k["id"] for k in met_ideas],
        "found_labels": [k["label"][lang] for k in met_ideas],
        "missing_labels": [c["label"][lang] for c in missing],
        "unread": list(reading.unread),
        "false": [{"quote": f["quote"], "fix": f["fix"]} for f in false],
        "checklist": [c["label"][lang] for c in keys],
        "reference": s["reference"][lang],
        "too_short": short,
        "statement": reading.stated_sentences > 0,
        "misconceptions": [f["id"] for f in false],
        "reason": reason,
        "second_reading": None if second is None else round(second, 3),
    }
    return Result(verdict == "correct", score, "\n".join(lines), details, verdict=verdict)


_GRADERS = {
    "single": _grade_single,
    "multi": _grade_multi,
    "numeric": _grade_numeric,
    "open": _grade_open,
}
