"""Labelled corpora of learner answers: grade each answer, compare with its label, measure.

A corpus file (README: "Labelled corpus") lists, per open question, answers labelled correct or
wrong. `measure` grades them all with the one grader and returns precision and recall per
question (positive = graded correct), plus every answer graded against its label.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .bank import QuizError, load_bank
from .grading import grade_question

LABELS = ("correct", "wrong")
# wrong answers of these kinds state something false: the feedback must name it
NAMES_A_MISCONCEPTION = ("swapped", "negated", "fine", "partial")


@dataclass
class Measured:
    lesson: str
    qid: str
    correct: int = 0
    wrong: int = 0
    true_pos: int = 0
    false_pos: int = 0
    false_neg: int = 0
    mislabelled: list = field(default_factory=list)  # (item, Result)

    @property
    def precision(self) -> float:
        graded_correct = self.true_pos + self.false_pos
        return self.true_pos / graded_correct if graded_correct else 1.0

    @property
    def recall(self) -> float:
        return self.true_pos / self.correct if self.correct else 1.0

    def line(self) -> str:
        return (f"{self.lesson} {self.qid}: {self.correct} correct + {self.wrong} wrong answers, "
                f"precision {self.precision:.2f}, recall {self.recall:.2f}")


def read_corpus(path) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise QuizError(f"cannot read corpus {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("questions"), dict) \
            or not isinstance(data.get("lesson"), str):
        raise QuizError(f"corpus {path}: an object with 'lesson' and 'questions' (id -> list of answers)")
    for qid, items in data["questions"].items():
        for i, item in enumerate(items):
            if not (isinstance(item, dict) and item.get("label") in LABELS and item.get("lang") in ("en", "zh")
                    and isinstance(item.get("answer"), str) and isinstance(item.get("kind"), str)):
                raise QuizError(f"corpus {path}: {qid} item #{i + 1} needs label (correct/wrong), "
                                "lang (en/zh), kind and answer")
    return data


def measure(path) -> list:
    data = read_corpus(path)
    bank = load_bank(data["lesson"])
    out = []
    for qid, items in data["questions"].items():
        q = bank.question(qid)
        m = Measured(bank.lesson, qid)
        for item in items:
            result = grade_question(q, item["answer"], item["lang"])
            good = item["label"] == "correct"
            m.correct += good
            m.wrong += not good
            m.true_pos += good and result.correct
            m.false_pos += (not good) and result.correct
            m.false_neg += good and not result.correct
            if result.correct != good or (item["kind"] in NAMES_A_MISCONCEPTION and not good
                                          and not result.details.get("misconceptions")):
                m.mislabelled.append((item, result))
        out.append(m)
    return out
