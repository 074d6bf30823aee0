"""Every open question of every bank is graded against its labelled corpus of learner answers
(tests/data/quiz_corpus/<lesson>.json): every label must hold, and a bank's open question
without a corpus of at least 15 correct and 15 wrong answers fails. New banks are found
automatically."""
import json
import re
from pathlib import Path

import pytest

import quizzes
from quizzes import corpus
from quizzes.bank import BANK_DIR

CORPUS_DIR = Path(__file__).resolve().parent / "data" / "quiz_corpus"
MIN_EACH = 15
# kinds of wrong answers a corpus must show (the ways learners get it wrong)
WRONG_KINDS = {"negated", "fine", "off_topic", "keywords", "partial"}
LESSONS = sorted(p.stem for p in BANK_DIR.glob("*.json"))


def open_questions():
    return [(lesson, q.id) for lesson in LESSONS for q in quizzes.load_bank(lesson) if q.type == "open"]


def corpus_items(lesson, qid):
    path = CORPUS_DIR / f"{lesson}.json"
    if not path.is_file():
        return None
    return corpus.read_corpus(path)["questions"].get(qid)


def labelled_answers():
    params = []
    for lesson, qid in open_questions():
        for n, item in enumerate(corpus_items(lesson, qid) or []):
            params.append(pytest.param(lesson, qid, item, id=f"{lesson}-{qid}-{n:02d}-{item['label']}-{item['kind']}"))
    return params


def test_there_are_open_questions():
    assert len(open_questions()) >= 5


@pytest.mark.parametrize("lesson,qid", open_questions())
def test_every_open_question_has_a_full_corpus(lesson, qid):
    items = corpus_items(lesson, qid)
    assert items is not None, (f"{lesson} {qid}: no labelled corpus in {CORPUS_DIR / (lesson + '.json')} "
                               "(see quizzes/README.md, 'Labelled corpus')")
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
    r = quizzes.grade(lesson, qid, item["answer"], item["lang"])
    assert r.correct == (item["label"] == "correct"), f"{item['answer']!r}\n{r.details}\n{r.feedback}"
    if item["label"] == "wrong":
        assert r.score < 1.0
        if item["kind"] in corpus.NAMES_A_MISCONCEPTION:
            # the feedback names what the answer got wrong, in the learner's language
            assert r.details["misconceptions"], r.details
            assert ("你写的是" if item["lang"] == "zh" else "you wrote that") in r.feedback


@pytest.mark.parametrize("lesson,qid", open_questions())
def test_precision_and_recall(lesson, qid, capsys):
    """The note's numbers: measured here over the whole corpus (every label asserted above)."""
    (m,) = [m for m in corpus.measure(CORPUS_DIR / f"{lesson}.json") if m.qid == qid]
    with capsys.disabled():
        print("\n" + m.line())
    assert m.precision == 1.0 and m.recall == 1.0, [(i["answer"], r.details) for i, r in m.mislabelled]


@pytest.mark.parametrize("lesson,qid", open_questions())
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_reference_answer_is_correct(lesson, qid, lang):
    q = quizzes.load_bank(lesson).question(qid)
    r = quizzes.grade(lesson, qid, q.secret["reference"][lang], lang)
    assert r.correct and not r.details["misconceptions"], r.details


def test_corpus_files_belong_to_banks():
    for path in CORPUS_DIR.glob("*.json"):
        data = json.loads(path.read_text(encoding="utf-8"))
        assert data["lesson"] == path.stem
        bank = quizzes.load_bank(path.stem)
        for qid in data["questions"]:
            assert bank.question(qid).type == "open"
