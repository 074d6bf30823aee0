"""A second reading of an open answer: does it read like the right answers to this question?

The rules (claims.py) read an answer clause by clause and can say *which* sentence is false, but
they only know the phrasings they were given: a fresh writer's wrong sentence can slip past them
and a fresh writer's true sentence can trip one. This reader is the other kind of reader: a text
classifier (scikit-learn: TF-IDF of character and word n-grams, logistic regression), one per
question, trained on that question's labelled answers (``labelled_answers/<lesson>.json``, right
and wrong ones, both languages). It cannot explain or quote anything, so it never decides a
verdict alone; it only withholds one:

- the rules say ``correct`` but the answer does not read like the right ones
  (P(right) < ``DOUBT_CORRECT``): ``unsure``;
- the rules say ``wrong`` but the answer reads like the right ones (P(right) > ``DOUBT_WRONG``):
  ``unsure`` (the rules' quote of the sentence they found false is still shown).

A question with no labelled answers of both labels has no second reading. The thresholds are
chosen on answers each classifier was *not* trained on: ``python -m quizzes report
--cross-validate`` grades every group of labelled answers (one group per writer/round, the
``source`` field) with classifiers trained on the other groups only.

scikit-learn is imported and each question's classifier trained on first use (about a second
for the first open answer; then a few milliseconds).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

LABELLED = Path(__file__).resolve().parent / "labelled_answers"

# P(right) below which the rules' "correct" is withheld, and above which their "wrong" is:
# chosen on validation rounds 13, 14, 25, 26 and 27 (tests/data/quiz_validation), which neither the
# rules nor this reading had seen; 0.6 kept wrong->correct at 0.7% or less on each of them
DOUBT_CORRECT = 0.6
DOUBT_WRONG = 0.5
# Fewer labelled answers of either label than this: no second reading for the question.
MIN_PER_LABEL = 8

# (lesson, qid) -> training answers, set by trained_on() (cross-validation)
_override: dict | None = None


def labelled_answers(folder: Path = LABELLED) -> dict:
    """{(lesson, qid): [answer dicts]} of every labelled-answers file in ``folder``."""
    out: dict = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        for qid, items in data["questions"].items():
            out.setdefault((data["lesson"], qid), []).extend(items)
    return out


@lru_cache(maxsize=1)
def _shipped() -> dict:
    return labelled_answers()


def _pipeline():
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline, make_union

    return make_pipeline(
        make_union(
            # character n-grams inside word boundaries: plurals, verb forms and Chinese text
            # without spaces all share pieces
            TfidfVectorizer(analyzer="char_wb", ngram_range=(1, 4), sublinear_tf=True),
            TfidfVectorizer(
                analyzer="word",
                ngram_range=(1, 2),
                sublinear_tf=True,
                token_pattern=r"(?u)\b\w+\b",
            ),
        ),
        LogisticRegression(C=10, max_iter=3000, class_weight="balanced"),
    )


def _fit(items: tuple) -> object | None:
    texts = [text for text, _ in items]
    labels = [right for _, right in items]
    if min(labels.count(True), labels.count(False)) < MIN_PER_LABEL:
        return None
    return _pipeline().fit(texts, labels)


@lru_cache(maxsize=256)
def _model(items: tuple):
    return _fit(items)


def _training(lesson: str, qid: str) -> tuple:
    answers = (_override if _override is not None else _shipped()).get((lesson, qid), [])
    return tuple((a["answer"], a["label"] == "correct") for a in answers)


def p_right(lesson: str, qid: str, answer: str) -> float | None:
    """P(the answer is right) by the question's classifier, or None without one."""
    model = _model(_training(lesson, qid))
    if model is None:
        return None
    return float(model.predict_proba([answer])[0][list(model.classes_).index(True)])


def second_opinion(verdict: str, p: float | None) -> bool:
    """True when this reading withholds the rules' verdict (the answer becomes ``unsure``)."""
    if p is None:
        return False
    if verdict == "correct":
        return p < DOUBT_CORRECT
    if verdict == "wrong":
        return p > DOUBT_WRONG
    return False


@contextmanager
def trained_on(answers: dict):
    """Within the block, classifiers are trained on ``answers`` ({(lesson, qid): [answer dicts]})
    instead of the shipped labelled answers (cross-validation)."""
    global _override
    saved, _override = _override, answers
    try:
        yield
    finally:
        _override = saved
