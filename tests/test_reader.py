"""The second reading of open answers (quizzes/reader.py): a classifier per question that can only
withhold the rules' verdict, never give one."""

import json
import re
import subprocess
import sys

import pytest

import quizzes
from quizzes import present, reader
from quizzes.bank import BANK_DIR, load_bank

LESSON, QID = "lesson1", "q_full_vs_shard_grad_op"


def reference(lang="en"):
    return load_bank(LESSON).question(QID).secret["reference"][lang]


def answers(right: list, wrong: list) -> dict:
    items = [{"label": "correct", "lang": "en", "kind": "right", "answer": a} for a in right]
    items += [{"label": "wrong", "lang": "en", "kind": "negated", "answer": a} for a in wrong]
    return {(LESSON, QID): items}


PIZZA = [f"pizza number {i} with cheese and tomato, baked for {i} minutes" for i in range(10)]
FSDP = [
    f"FULL_SHARD frees the gathered parameters after forward and gathers them again, case {i}"
    for i in range(10)
]


def test_every_open_question_has_a_second_reading():
    for lesson in sorted(p.stem for p in BANK_DIR.glob("*.json")):
        for q in load_bank(lesson):
            if q.type == "open":
                p = reader.p_right(lesson, q.id, q.secret["reference"]["en"])
                assert p is not None and 0.0 <= p <= 1.0
                assert p > reader.DOUBT_CORRECT, (lesson, q.id, p)  # the reference reads right


def test_without_labelled_answers_there_is_no_second_reading():
    assert reader.p_right("lesson1", "q_no_such_question", "anything at all") is None
    with reader.trained_on(answers(PIZZA[:3], FSDP[:3])):  # too few of each label to train on
        assert reader.p_right(LESSON, QID, reference()) is None


def test_the_policy_only_withholds():
    assert reader.second_opinion("correct", reader.DOUBT_CORRECT - 0.01)
    assert not reader.second_opinion("correct", reader.DOUBT_CORRECT + 0.01)
    assert reader.second_opinion("wrong", reader.DOUBT_WRONG + 0.01)
    assert not reader.second_opinion("wrong", reader.DOUBT_WRONG - 0.01)
    assert not reader.second_opinion("unsure", 0.0) and not reader.second_opinion("unsure", 1.0)
    assert not reader.second_opinion("correct", None)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_complete_answer_that_reads_unlike_the_right_ones_is_unsure(lang):
    """The rules find every key idea in the reference; a reader trained to call FSDP talk wrong
    withholds the tick, says why in the learner's language, and still lists the key ideas."""
    with reader.trained_on({}):
        assert quizzes.grade(LESSON, QID, reference(lang), lang).verdict == "correct"
    with reader.trained_on(answers(PIZZA, FSDP)):
        r = quizzes.grade(LESSON, QID, reference(lang), lang)
    assert r.verdict == "unsure" and not r.correct and r.details["reason"] == "doubted_correct"
    assert r.details["second_reading"] < reader.DOUBT_CORRECT
    parts = present.unsure_parts(r, lang)
    assert parts["why"] == quizzes.i18n.msg("unsure_why_doubted_correct", lang)
    assert parts["found"] == parts["checklist"] and not parts["missing"]
    assert parts["why"] in present.unsure_text(r, lang)


def test_a_wrong_verdict_the_reader_doubts_keeps_the_rules_quote():
    negated = "There is no difference: FULL_SHARD and SHARD_GRAD_OP keep the same parameters."
    with reader.trained_on({}):
        rules = quizzes.grade(LESSON, QID, negated)
    assert rules.verdict == "wrong"
    # trained so that this very sentence reads right: the rules' objection is not overruled,
    # the verdict is withheld and the objection still shown
    with reader.trained_on(answers([negated + f" {i}" for i in range(10)], PIZZA)):
        r = quizzes.grade(LESSON, QID, negated)
    assert r.verdict == "unsure" and r.details["reason"] == "doubted_wrong"
    assert r.details["false"] == rules.details["false"]
    assert present.unsure_parts(r, "en")["false"] == rules.details["false"]


def test_a_keyword_list_stays_wrong_however_it_reads():
    keywords = "FULL_SHARD SHARD_GRAD_OP all-gather memory reshard forward backward"
    with reader.trained_on(answers([keywords + f" {i}" for i in range(10)], PIZZA)):
        r = quizzes.grade(LESSON, QID, keywords)
    assert r.verdict == "wrong" and r.details["reason"] in ("no_statement", "too_short")


def test_trained_on_restores_the_shipped_reading():
    before = reader.p_right(LESSON, QID, reference())
    with reader.trained_on(answers(PIZZA, FSDP)):
        assert reader.p_right(LESSON, QID, reference()) != before
    assert reader.p_right(LESSON, QID, reference()) == before


def test_cross_validation_grades_each_source_with_a_reader_trained_without_it(tmp_path):
    """`report --cross-validate`: each source's answers graded by a reader that never saw them."""
    shipped = reader.labelled_answers()[(LESSON, QID)]
    folder = tmp_path / "answers"
    folder.mkdir()
    (folder / "lesson1.json").write_text(
        json.dumps({"lesson": LESSON, "questions": {QID: shipped}}, ensure_ascii=False)
    )
    proc = subprocess.run(
        [sys.executable, "-m", "quizzes", "report", "--cross-validate", str(folder)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode in (0, 1), proc.stderr
    sources = {i.get("source") or "none" for i in shipped}
    for name in sources:
        assert f"  {name}" in proc.stdout
    assert "graded by a second reading trained without it" in proc.stdout


def test_report_rules_only_grades_without_the_second_reading(tmp_path, capsys):
    """`report --rules-only`: what the rules read, the second reading switched off (the README's
    'rules alone' rows); it has no second reading to cross-validate."""
    from quizzes import cli

    folder = tmp_path / "answers"
    folder.mkdir()
    item = {"label": "correct", "lang": "en", "kind": "right", "answer": reference()}
    (folder / "lesson1.json").write_text(
        json.dumps({"lesson": LESSON, "questions": {QID: [item]}}, ensure_ascii=False)
    )
    with reader.trained_on(answers(PIZZA, FSDP)):  # a reader that doubts every FSDP answer
        cli.main(["report", str(folder)])
        assert re.search(r"correct \(all\)\s+0\s+0\s+1\s+1", capsys.readouterr().out)
        cli.main(["report", str(folder), "--rules-only"])
        assert re.search(r"correct \(all\)\s+1\s+0\s+0\s+1", capsys.readouterr().out)
        assert reader.p_right(LESSON, QID, reference()) is not None  # switched back on
    assert cli.main(["report", str(folder), "--rules-only", "--cross-validate"]) == 2
    assert "no second reading" in capsys.readouterr().err
