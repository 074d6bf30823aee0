"""Every open question of every bank is graded against its labelled corpus of learner answers
(quizzes/labelled_answers/<lesson>.json): every label must hold, and a bank's open question
without a corpus of at least 15 correct and 15 wrong answers fails. New banks are found
automatically."""

import json
import re
from functools import lru_cache
from pathlib import Path

import pytest

import quizzes
from quizzes import corpus
from quizzes.bank import BANK_DIR

CORPUS_DIR = Path(__file__).resolve().parents[1] / "quizzes" / "labelled_answers"
MIN_EACH = 15
# kinds of wrong answers a corpus must show (the ways learners get it wrong)
WRONG_KINDS = {"negated", "fine", "off_topic", "keywords", "partial"}
LESSONS = sorted(p.stem for p in BANK_DIR.glob("*.json"))


def open_questions():
    return [
        (lesson, q.id) for lesson in LESSONS for q in quizzes.load_bank(lesson) if q.type == "open"
    ]


def corpus_items(lesson, qid):
    path = CORPUS_DIR / f"{lesson}.json"
    if not path.is_file():
        return None
    return corpus.read_corpus(path)["questions"].get(qid)


# answers of the held-out rounds, moved into the corpus after each was measured, and the training
# rounds (4, 5, 7-12), each by a writer blind to the rules: the rules were tuned to them (rounds
# 3-5, then 7-10, then 11-12), but a few answers still need what the engine cannot read
# (quizzes/README.md, 'Measured (round 6)'), so each round is measured as a whole
# (test_pseudo_heldout_matrix) against what the grader now gives, not held to every label
PSEUDO_HELDOUT = (
    "heldout round 1",
    "heldout round 2",
    "heldout round 3",
    "training round 4",
    "training round 5",
    "training round 7",
    "training round 8",
    "training round 9",
    "training round 10",
    "training round 11",
    "training round 12",
    "heldout round 6",
    "training round 16",
    "training round 17",
    "training round 18",
    "training round 19",
    "training round 20",
    "training round 21",
    "training round 22",
    "training round 23",
    "training round 24",
)


def labelled_answers():
    params = []
    for lesson, qid in open_questions():
        for n, item in enumerate(corpus_items(lesson, qid) or []):
            if item.get("source") in PSEUDO_HELDOUT:
                continue
            params.append(
                pytest.param(
                    lesson, qid, item, id=f"{lesson}-{qid}-{n:02d}-{item['label']}-{item['kind']}"
                )
            )
    return params


def test_there_are_open_questions():
    assert len(open_questions()) >= 5


@pytest.mark.parametrize("lesson,qid", open_questions())
def test_every_open_question_has_a_full_corpus(lesson, qid):
    items = corpus_items(lesson, qid)
    assert items is not None, (
        f"{lesson} {qid}: no labelled corpus in {CORPUS_DIR / (lesson + '.json')} "
        "(see quizzes/README.md, 'Labelled corpus')"
    )
    correct = [i for i in items if i["label"] == "correct"]
    wrong = [i for i in items if i["label"] == "wrong"]
    assert len(correct) >= MIN_EACH and len(wrong) >= MIN_EACH, (len(correct), len(wrong))
    assert {i["lang"] for i in correct} == {"en", "zh"}
    zh = [i["answer"] for i in correct if i["lang"] == "zh"]
    assert any(re.search("[A-Za-z]", a) for a in zh), "a Chinese answer with English terms inside"
    assert any(not re.search("[A-Za-z]", a) for a in zh), "a Chinese answer without English terms"
    lengths = sorted(len(i["answer"]) for i in correct)
    assert lengths[0] < 80 and lengths[-1] > 250, "short and long correct answers"
    assert WRONG_KINDS <= {i["kind"] for i in wrong}, WRONG_KINDS - {i["kind"] for i in wrong}
    assert len({i["answer"] for i in items}) == len(items), "duplicate answers"


@pytest.mark.parametrize("lesson,qid,item", labelled_answers())
def test_corpus_label(lesson, qid, item):
    """The tuning corpus: no wrong answer graded correct, no right answer graded wrong (unsure:
    the learner marks it); a swapped, negated or 'fine' answer is wrong and quotes the learner."""
    r = quizzes.grade(lesson, qid, item["answer"], item["lang"])
    if item["label"] == "correct":
        assert r.verdict in ("correct", "unsure"), f"{item['answer']!r}\n{r.details}\n{r.feedback}"
    else:
        assert r.verdict in ("wrong", "unsure") and r.score < 1.0, (
            f"{item['answer']!r}\n{r.details}\n{r.feedback}"
        )
        if item["kind"] in corpus.NAMES_A_MISCONCEPTION:
            assert r.verdict == "wrong" and r.details["false"], r.details
            assert ("你写道：「" if item["lang"] == "zh" else "You wrote: «") in r.feedback


@lru_cache(maxsize=1)
def graded_corpus() -> tuple:
    """Every labelled answer graded once (5,600 answers: the matrix tests share one grading)."""
    return tuple(corpus.grade_corpus([CORPUS_DIR]))


def test_tuning_corpus_matrix(capsys):
    text, _ = corpus.report(graded_corpus(), "tuning corpus")
    with capsys.disabled():
        print("\n" + text)
    tuned = [g for g in graded_corpus() if g.item.get("source") not in PSEUDO_HELDOUT]
    m = corpus.matrices(tuned)["all"]
    assert m.counts["wrong", "correct"] == 0 and m.counts["correct", "wrong"] == 0


# per round: its size and, as the rules left it (quizzes/README.md, 'Measured'), the most wrong
# answers graded correct, right answers graded wrong and right answers not graded correct (wrong or
# unsure: a rule that stops reading a right answer as false may leave it unread), and the fewest
# wrong answers graded wrong: a rule change that makes a round worse than that fails here
PSEUDO_HELDOUT_BOUNDS = {
    "heldout round 1": dict(
        n=216, wrong_correct=0, correct_wrong=0, right_missed=3, wrong_wrong=134
    ),
    "heldout round 2": dict(
        n=240, wrong_correct=0, correct_wrong=0, right_missed=4, wrong_wrong=136
    ),
    "heldout round 3": dict(
        n=240, wrong_correct=0, correct_wrong=0, right_missed=3, wrong_wrong=140
    ),
    "training round 4": dict(
        n=240, wrong_correct=0, correct_wrong=0, right_missed=2, wrong_wrong=140
    ),
    "training round 5": dict(
        n=239, wrong_correct=0, correct_wrong=1, right_missed=5, wrong_wrong=139
    ),
    "training round 7": dict(
        n=239, wrong_correct=0, correct_wrong=0, right_missed=4, wrong_wrong=139
    ),
    "training round 8": dict(
        n=240, wrong_correct=0, correct_wrong=0, right_missed=3, wrong_wrong=140
    ),
    "training round 9": dict(
        n=240, wrong_correct=0, correct_wrong=0, right_missed=1, wrong_wrong=140
    ),
    "training round 10": dict(
        n=240, wrong_correct=0, correct_wrong=0, right_missed=2, wrong_wrong=139
    ),
    "training round 11": dict(
        n=240, wrong_correct=0, correct_wrong=0, right_missed=1, wrong_wrong=138
    ),
    "training round 12": dict(
        n=240, wrong_correct=0, correct_wrong=0, right_missed=5, wrong_wrong=135
    ),
    "heldout round 6": dict(
        n=240, wrong_correct=0, correct_wrong=0, right_missed=4, wrong_wrong=131
    ),
    "training round 16": dict(
        n=240, wrong_correct=0, correct_wrong=0, right_missed=5, wrong_wrong=135
    ),
    "training round 17": dict(
        n=237, wrong_correct=0, correct_wrong=0, right_missed=1, wrong_wrong=128
    ),
    "training round 18": dict(
        n=238, wrong_correct=0, correct_wrong=0, right_missed=13, wrong_wrong=133
    ),
    "training round 19": dict(
        n=236, wrong_correct=0, correct_wrong=0, right_missed=1, wrong_wrong=130
    ),
    "training round 20": dict(
        n=237, wrong_correct=0, correct_wrong=0, right_missed=10, wrong_wrong=132
    ),
    "training round 21": dict(
        n=237, wrong_correct=0, correct_wrong=0, right_missed=7, wrong_wrong=134
    ),
    "training round 22": dict(
        n=236, wrong_correct=0, correct_wrong=0, right_missed=9, wrong_wrong=130
    ),
    "training round 23": dict(
        n=237, wrong_correct=0, correct_wrong=0, right_missed=5, wrong_wrong=132
    ),
    "training round 24": dict(
        n=240, wrong_correct=0, correct_wrong=0, right_missed=10, wrong_wrong=133
    ),
}


@pytest.mark.parametrize("source", PSEUDO_HELDOUT)
def test_pseudo_heldout_matrix(source, capsys):
    """A held-out round moved into the tuning corpus, measured as a whole: never worse than the
    rules left it."""
    graded = [g for g in graded_corpus() if g.item.get("source") == source]
    text, _ = corpus.report(graded, f"pseudo-held-out ({source})")
    with capsys.disabled():
        print("\n" + text)
    c = corpus.matrices(graded)["all"].counts
    b = PSEUDO_HELDOUT_BOUNDS[source]
    assert len(graded) == b["n"]
    assert c["wrong", "correct"] <= b["wrong_correct"], dict(c)
    assert c["correct", "wrong"] <= b["correct_wrong"], dict(c)
    assert c["correct", "wrong"] + c["correct", "unsure"] <= b["right_missed"], dict(c)
    assert c["wrong", "wrong"] >= b["wrong_wrong"], dict(c)


HELDOUT_DIR = Path(__file__).resolve().parent / "data" / "quiz_heldout"


@pytest.mark.parametrize("lesson,qid", open_questions())
def test_every_open_question_has_a_heldout_set(lesson, qid):
    items = corpus.read_corpus(HELDOUT_DIR / f"{lesson}.json")["questions"].get(qid) or []
    assert len(items) >= 24 and {i["lang"] for i in items} == {"en", "zh"}


VALIDATION_DIR = Path(__file__).resolve().parent / "data" / "quiz_validation"


def test_validation_answers_are_in_neither_the_labelled_nor_the_heldout_answers():
    """The validation rounds choose between versions of the grader: none of their answers may be
    one the rules or the second reading were tuned on, or one the held-out set measures."""
    seen = {g.item["answer"] for g in corpus.grade_corpus([HELDOUT_DIR])} | {
        i["answer"]
        for path in CORPUS_DIR.glob("*.json")
        for items in corpus.read_corpus(path)["questions"].values()
        for i in items
    }
    validation = corpus.grade_corpus([VALIDATION_DIR])
    assert {g.item["source"] for g in validation} == {
        f"validation round {n}" for n in (13, 14, 25, 26, 27)
    }
    both = [g.item["answer"] for g in validation if g.item["answer"] in seen]
    assert not both, both[:3]


def test_heldout_answers_are_not_in_the_tuning_corpus():
    """The held-out set measures answers neither the rules nor the second reading (trained on the
    labelled answers) have seen: none of its answers may be among the labelled answers."""
    tuned = {
        i["answer"]
        for path in CORPUS_DIR.glob("*.json")
        for items in corpus.read_corpus(path)["questions"].values()
        for i in items
    }
    seen = [
        g.item["answer"] for g in corpus.grade_corpus([HELDOUT_DIR]) if g.item["answer"] in tuned
    ]
    assert not seen, seen[:3]


def test_heldout_targets(capsys):
    """Issue 21's targets on the held-out set, which neither the rules nor the second reading were
    tuned or trained on. Held-out round 15, measured once at 11:43 UTC on 2026-12-02
    (quizzes/README.md, 'Measured (round 15)'): wrong graded correct 0.0%, right graded wrong 0.0%,
    right graded unsure 20.0%, wrong graded wrong 88.6%: all four pass."""
    graded = corpus.grade_corpus([HELDOUT_DIR])
    text, met = corpus.report(graded, "held-out set")
    with capsys.disabled():
        print("\n" + text)
    failed = [t for t in corpus.targets(corpus.matrices(graded)["all"]) if not t[4]]
    assert met and not failed, failed


@pytest.mark.parametrize("lesson,qid", open_questions())
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_reference_answer_is_correct(lesson, qid, lang):
    q = quizzes.load_bank(lesson).question(qid)
    r = quizzes.grade(lesson, qid, q.secret["reference"][lang], lang)
    assert r.verdict == "correct" and not r.details["misconceptions"], r.details


def test_corpus_files_belong_to_banks():
    for path in CORPUS_DIR.glob("*.json"):
        data = json.loads(path.read_text(encoding="utf-8"))
        assert data["lesson"] == path.stem
        bank = quizzes.load_bank(path.stem)
        for qid in data["questions"]:
            assert bank.question(qid).type == "open"
