"""Labelled corpora of learner answers: grade each answer, compare the verdict with its label.

A corpus file (README: "Labelled corpus") lists, per open question, answers labelled correct or
wrong. `grade_corpus` grades them all with the one grader; `Matrix` counts label x verdict
(correct / wrong / unsure), per kind of answer and per language; `TARGETS` are the bars an
answer set nobody tuned the rules to must meet (issue 21), checked by `python -m quizzes report`.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from . import reader
from .bank import QuizError, load_bank
from .grading import VERDICTS, grade_question

LABELS = ("correct", "wrong")
# wrong answers of these kinds state something false: the feedback must name it
NAMES_A_MISCONCEPTION = ("swapped", "negated", "fine")

# (name, label, verdict, at most / at least, fraction)
TARGETS = [
    ("wrong graded correct", "wrong", "correct", "max", 0.02),
    ("right graded wrong", "correct", "wrong", "max", 0.05),
    ("right graded unsure", "correct", "unsure", "max", 0.30),
    ("wrong graded wrong", "wrong", "wrong", "min", 0.60),
]


def read_corpus(path) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise QuizError(f"cannot read corpus {path}: {exc}") from None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("questions"), dict)
        or not isinstance(data.get("lesson"), str)
    ):
        raise QuizError(
            f"corpus {path}: an object with 'lesson' and 'questions' (id -> list of answers)"
        )
    for qid, items in data["questions"].items():
        if not isinstance(items, list):
            raise QuizError(f"corpus {path}: {qid} needs a list of answers")
        for i, item in enumerate(items):
            if not (
                isinstance(item, dict)
                and item.get("label") in LABELS
                and item.get("lang") in ("en", "zh")
                and isinstance(item.get("answer"), str)
                and isinstance(item.get("kind"), str)
            ):
                raise QuizError(
                    f"corpus {path}: {qid} item #{i + 1} needs label (correct/wrong), "
                    "lang (en/zh), kind and answer"
                )
    return data


def corpus_files(paths) -> list:
    """Corpus files from files and folders (a folder: its *.json, sorted)."""
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.json"))
            if not found:
                raise QuizError(f"no corpus files (*.json) in {p}")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise QuizError(f"corpus {p} not found")
    return out


@dataclass
class Graded:
    lesson: str
    qid: str
    item: dict
    result: object

    @property
    def verdict(self) -> str:
        return self.result.verdict


def grade_corpus(paths) -> list:
    out = []
    for path in corpus_files(paths):
        data = read_corpus(path)
        bank = load_bank(data["lesson"])
        for qid, items in data["questions"].items():
            q = bank.question(qid)
            if q.type != "open":
                raise QuizError(f"corpus {path}: {qid} is not an open question")
            for item in items:
                out.append(
                    Graded(bank.lesson, qid, item, grade_question(q, item["answer"], item["lang"]))
                )
    return out


def source(item: dict) -> str:
    """Who wrote an answer, and when (its ``source`` field): one group of cross-validation."""
    return item.get("source") or "none"


def cross_validated(paths) -> list:
    """Grade every answer with second-reading classifiers trained without its group (its
    ``source``): how the grader does on a writer it has not been trained on."""
    loaded = [read_corpus(path) for path in corpus_files(paths)]
    everything: dict = {}
    for data in loaded:
        for qid, items in data["questions"].items():
            everything.setdefault((data["lesson"], qid), []).extend(items)
    groups = sorted({source(i) for items in everything.values() for i in items})
    out = []
    for group in groups:
        others = {
            qid: [i for i in items if source(i) != group] for qid, items in everything.items()
        }
        with reader.trained_on(others):
            for data in loaded:
                bank = load_bank(data["lesson"])
                for qid, items in data["questions"].items():
                    q = bank.question(qid)
                    for item in items:
                        if source(item) == group:
                            result = grade_question(q, item["answer"], item["lang"])
                            out.append(Graded(bank.lesson, qid, item, result))
    return out


def of_source(graded: list, name: str) -> list:
    """The graded answers whose item's `source` is `name` ('none': those without one)."""
    return [g for g in graded if source(g.item) == name]


@dataclass
class Matrix:
    """label x verdict counts."""

    counts: Counter = field(default_factory=Counter)

    def add(self, label, verdict):
        self.counts[label, verdict] += 1

    def n(self, label) -> int:
        return sum(self.counts[label, v] for v in VERDICTS)

    def rate(self, label, verdict) -> float:
        return self.counts[label, verdict] / self.n(label) if self.n(label) else 0.0

    def rows(self) -> list:
        return [
            (label, [self.counts[label, v] for v in VERDICTS]) for label in LABELS if self.n(label)
        ]


def matrices(graded: list) -> dict:
    """The confusion matrices of graded answers, overall and per group:
    {"all": Matrix, "kind": {(label, kind): Matrix}, "lang": {lang: Matrix}, "question": {...}}"""
    out = {
        "all": Matrix(),
        "kind": defaultdict(Matrix),
        "lang": defaultdict(Matrix),
        "question": defaultdict(Matrix),
    }
    for g in graded:
        label = g.item["label"]
        out["all"].add(label, g.verdict)
        out["kind"][label, g.item["kind"]].add(label, g.verdict)
        out["lang"][g.item["lang"]].add(label, g.verdict)
        out["question"][f"{g.lesson} {g.qid}"].add(label, g.verdict)
    return out


def targets(matrix: Matrix) -> list:
    """[(name, measured fraction, bound, 'max'/'min', passed)]"""
    out = []
    for name, label, verdict, how, bound in TARGETS:
        r = matrix.rate(label, verdict)
        out.append((name, r, bound, how, r <= bound if how == "max" else r >= bound))
    return out


def targets_line(graded: list) -> str:
    """The four targets' measured rates in one line: 'w->c 0.0%  r->w 1.2%  ...'."""
    short = {
        "wrong graded correct": "w->c",
        "right graded wrong": "r->w",
        "right graded unsure": "r->u",
        "wrong graded wrong": "w->w",
    }
    return "  ".join(
        f"{short[name]} {100 * r:4.1f}%{'' if passed else '!'}"
        for name, r, _, _, passed in targets(matrices(graded)["all"])
    )


def report(graded: list, title: str) -> tuple:
    """(text, all targets met?) for one answer set."""
    m = matrices(graded)
    lines = [
        f"== {title}: {len(graded)} answers",
        "",
        f"{'':32}{'correct':>9}{'wrong':>8}{'unsure':>8}{'n':>6}",
    ]

    def row(name, mat, label):
        c = [mat.counts[label, v] for v in VERDICTS]
        lines.append(f"{name:32}{c[0]:>9}{c[1]:>8}{c[2]:>8}{sum(c):>6}")

    for label in LABELS:
        row(f"{label} (all)", m["all"], label)
    lines += ["", "per kind (label/kind):"]
    for (label, kind), mat in sorted(m["kind"].items()):
        row(f"  {label}/{kind}", mat, label)
    lines += ["", "per language:"]
    for lang, mat in sorted(m["lang"].items()):
        for label in LABELS:
            row(f"  {lang} {label}", mat, label)
    lines += ["", "per question:"]
    for name, mat in sorted(m["question"].items()):
        for label in LABELS:
            row(f"  {name} {label}", mat, label)
    lines += ["", "targets:"]
    ok = True
    for name, r, bound, how, passed in targets(m["all"]):
        ok &= passed
        lines.append(
            f"  {name:24} {100 * r:5.1f}%  ({'at most' if how == 'max' else 'at least'} "
            f"{100 * bound:.0f}%)  {'pass' if passed else 'FAIL'}"
        )
    return "\n".join(lines), ok
