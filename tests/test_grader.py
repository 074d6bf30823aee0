"""The claim reader (quizzes/claims.py) on its own: phrasings, clauses, subjects, negation,
keyword lists, and the bank lint of the open-question format. Uses a small demo question so
these tests do not depend on any lesson's wording."""
import copy
import json
import re
from pathlib import Path

import pytest

import quizzes
from quizzes import bank as bankmod
from quizzes import claims
from quizzes.bank import QuizError

A, B = "FULL_SHARD", "SHARD_GRAD_OP"


def _bi(en, zh):
    return {"en": en, "zh": zh}


DEMO = {
    "min_claims": 2,
    "subjects": {A: _bi(["full shard", "the former"], ["前者"]), B: _bi(["shard grad op", "the latter"], ["后者"])},
    "claims": [
        {"id": "frees", "label": _bi("A frees params", "A 释放参数"), "forms": [
            {"subject": A, "rival": B,
             "says": _bi(["(free*|re shard*) ... (param*|weight*|them)"], ["释放"]),
             "wrong": _bi("you wrote that A does not free them", "你写的是 A 不释放"),
             "swapped": _bi("you wrote that B frees them; it is A", "你写的是 B 释放；释放的是 A")}]},
        {"id": "memory", "label": _bi("B uses more memory", "B 显存更多"), "forms": [
            {"subject": B, "rival": A, "says": _bi(["more memory"], ["(显存|内存) ... 更多"]),
             "wrong": _bi("you wrote that B does not use more memory", "你写的是 B 显存不更多"),
             "swapped": _bi("you wrote that A uses more memory; it is B", "你写的是 A 显存更多；是 B")}]},
        {"id": "fit", "label": _bi("a full copy may not fit", "完整副本可能放不下"), "forms": [
            {"says": _bi(["rank ... (has|holds|hold) ... (whole|full) model"], ["rank ... 完整模型"]),
             "negated": True,
             "wrong": _bi("you wrote that every rank holds the whole model", "你写的是每个 rank 都有完整模型")}]},
    ],
    "misconceptions": [{"id": "same", "says": _bi(["no ... difference"], ["没有区别"]),
                        "wrong": _bi("you wrote there is no difference", "你写的是没有区别")}],
    "reference": _bi("A frees the parameters after forward; B keeps them and uses more memory.",
                     "A 在前向之后释放参数；B 保留参数，显存更多。"),
}


def read(text):
    return claims.read_answer(text, DEMO)


@pytest.fixture
def demo_bank(tmp_path, monkeypatch):
    authoring = {"lesson": "lessondemo", "title": _bi("Demo", "演示"), "questions": [
        {"id": "q_open", "type": "open", "prompt": _bi("Difference?", "区别？"), "secret": copy.deepcopy(DEMO)}]}
    folder = tmp_path / "banks"
    folder.mkdir()
    (folder / "lessondemo.json").write_text(bankmod.dump_bank(bankmod.from_authoring(authoring)))
    monkeypatch.setenv(bankmod.BANK_PATH_ENV, str(folder))
    return "lessondemo"


# --- phrasings -------------------------------------------------------------------------------

@pytest.mark.parametrize("phrase,text,hit", [
    ("rank", "frankly i would go watch a video", False),   # ASCII matches whole words only
    ("rank", "each rank holds a shard", True),
    ("oom", "zoom into the logs", False),
    ("dcp", "and cpu", False),
    ("all gather", claims.normalise("FULL_SHARD all-gathers"), False),  # no * : the word ends there
    ("all gather*", claims.normalise("FULL_SHARD all-gathers"), True),
    ("all gather*", claims.normalise("an all_gather call"), True),
    ("all gather*", "allgathers", True),
    ("re shard*", claims.normalise("re-shards the parameters"), True),
    ("free* ... param*", "frees the full params", True),
    ("再次all gather", claims.normalise("反向时再次 all-gather"), True),   # Chinese: spaces optional
    ("释放", "前者释放参数", True),
    ("完整(的|)模型", "完整模型", True),
])
def test_phrase_matching(phrase, text, hit):
    assert bool(claims.compile_phrase(phrase).search(text)) is hit


def test_phrase_lint():
    assert claims.phrase_error("(rank|ranks) ... world size") is None
    assert "optional" in claims.phrase_error("ranks?")
    assert "lower case" in claims.phrase_error("Rank")
    assert "unbalanced" in claims.phrase_error("(rank")


def test_clauses_split_at_punctuation_and_contrast_words():
    parts = [c for _, c in claims.split_clauses(
        "FULL_SHARD frees them, while SHARD_GRAD_OP keeps them; torch.save(model.state_dict()) is one word. 前者释放而后者保留")]
    assert parts == ["full shard frees them", "shard grad op keeps them", "torch save model state dict is one word",
                     "前者释放", "后者保留"]


# --- subjects, negation, misconceptions -------------------------------------------------------

def test_right_subject_supports_and_pronoun_inherits():
    r = read("FULL_SHARD frees the parameters after forward, so SHARD_GRAD_OP uses more memory.")
    assert set(r.supported) == {"frees", "memory"} and not r.misconceptions
    r = read("SHARD_GRAD_OP keeps the weights, so it uses more memory.")
    assert "memory" in r.supported  # 'it' is SHARD_GRAD_OP


def test_swapped_subject_is_a_named_misconception():
    r = read("SHARD_GRAD_OP frees the parameters after forward.")
    assert not r.supported and r.misconceptions[0][1]["en"] == "you wrote that B frees them; it is A"


def test_comparand_is_not_the_subject():
    r = read("FULL_SHARD uses more memory than SHARD_GRAD_OP.")
    assert [m[0] for m in r.misconceptions] == ["memory"]
    r = read("SHARD_GRAD_OP 的显存比 FULL_SHARD 更多。")
    assert "memory" in r.supported and not r.misconceptions


@pytest.mark.parametrize("text", [
    "FULL_SHARD does not free the parameters.", "FULL_SHARD doesn't free the parameters.",
    "FULL_SHARD never frees the weights.", "FULL_SHARD 不释放参数。", "FULL_SHARD 前向之后不会释放参数。",
])
def test_negation_makes_a_misconception(text):
    r = read(text)
    assert not r.supported and [m[0] for m in r.misconceptions] == ["frees"]


def test_denied_rival_supports():
    r = read("SHARD_GRAD_OP does not free the parameters after forward.")
    assert "frees" in r.supported and not r.misconceptions
    assert "frees" in read("SHARD_GRAD_OP 不释放参数。").supported


def test_negation_reaches_only_nearby_words():
    # the 'not' belongs to 'worth it', far before the phrasing
    r = claims.read_answer("It is not worth it for models so big that each rank holds the whole model in memory.", DEMO)
    assert [m[0] for m in r.misconceptions] == ["fit"]  # the form reads as affirmed: a misconception
    r = read("No rank holds the whole model.")
    assert "fit" in r.supported  # a quantifier reaches the whole clause


def test_negated_form_and_misconception_entries():
    assert "fit" in read("Each rank does not hold the whole model, only a shard.").supported
    assert [m[0] for m in read("There is no real difference between them.").misconceptions] == ["same"]


def test_keyword_lists_are_not_read():
    assert not read("full_shard free params shard_grad_op more memory").supported
    assert not read("前者 释放 参数 后者 显存 更多").supported


# --- grading an answer -------------------------------------------------------------------------

def test_grade_open_answer_feedback(demo_bank):
    good = quizzes.grade(demo_bank, "q_open", "FULL_SHARD frees the parameters after forward; SHARD_GRAD_OP uses more memory.")
    assert good.correct and good.score == 1.0 and good.details["found"] == ["frees", "memory"]
    bad = quizzes.grade(demo_bank, "q_open", "SHARD_GRAD_OP frees the parameters after forward and it uses more memory.")
    assert not bad.correct and bad.score < 1.0 and bad.details["misconceptions"] == ["frees"]
    assert "you wrote that B frees them; it is A" in bad.feedback and "A frees params" in bad.feedback
    zh = quizzes.grade(demo_bank, "q_open", "SHARD_GRAD_OP 在前向之后释放参数，后者显存更多。", "zh")
    assert not zh.correct and "你写的是 B 释放；释放的是 A" in zh.feedback and "你写了不成立的说法" in zh.feedback


def test_short_answers_and_keyword_lists_are_never_correct(demo_bank):
    r = quizzes.grade(demo_bank, "q_open", "FULL_SHARD frees them")
    assert not r.correct and r.details["too_short"] and "too short" in r.feedback
    r = quizzes.grade(demo_bank, "q_open", "full_shard free params, shard_grad_op more memory, zero3 zero2 etc")
    assert not r.correct and not r.details["statement"] and "keywords" in r.feedback


# --- bank lint ---------------------------------------------------------------------------------

def _authoring(secret):
    return {"lesson": "lessondemo", "title": _bi("Demo", "演示"), "questions": [
        {"id": "q_open", "type": "open", "prompt": _bi("Difference?", "区别？"), "secret": secret}]}


@pytest.mark.parametrize("change,match", [
    (lambda s: s.update(ideas=[], min_ideas=1), "keyword rubric fields"),
    (lambda s: s["claims"][0]["forms"][0].pop("swapped"), "'swapped' text"),
    (lambda s: s["claims"][0]["forms"][0].update(subject="NOBODY"), "not in secret.subjects"),
    (lambda s: s["claims"][0]["forms"][0]["says"].update(en=["ranks?"]), "optional"),
    (lambda s: s["claims"][1].update(id="frees"), "unique string id"),
    (lambda s: s.update(min_claims=9), "min_claims"),
    (lambda s: s["claims"][2]["forms"][0].pop("wrong"), "'wrong' text"),
])
def test_open_question_lint(change, match):
    secret = copy.deepcopy(DEMO)
    change(secret)
    with pytest.raises(QuizError, match=match):
        bankmod.from_authoring(_authoring(secret))


def test_one_way_forms_need_no_wrong_text():
    secret = copy.deepcopy(DEMO)
    form = secret["claims"][2]["forms"][0]
    del form["wrong"]
    form["one_way"] = True
    bankmod.from_authoring(_authoring(secret))


# --- the README's worked example is a real, valid question that reads answers as its table says --

README = Path(quizzes.__file__).resolve().parent / "README.md"


def readme_example():
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### Worked example"):]
    block = section[section.index("```json") + len("```json"):]
    question = json.loads(block[:block.index("```")])
    table = section[section.index("| answer | correct | read as |"):]
    rows = []
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        answer, correct = [c.strip() for c in line.strip("|").split("|")][:2]
        rows.append((answer, correct == "yes"))
    return question, rows


def test_readme_worked_example(tmp_path, monkeypatch):
    question, rows = readme_example()
    assert len(rows) >= 6
    authoring = {"lesson": "lessonreadme", "title": _bi("README", "README"), "questions": [question]}
    folder = tmp_path / "banks"
    folder.mkdir()
    (folder / "lessonreadme.json").write_text(bankmod.dump_bank(bankmod.from_authoring(authoring)))
    monkeypatch.setenv(bankmod.BANK_PATH_ENV, str(folder))
    for answer, correct in rows:
        lang = "zh" if re.search("[\u4e00-\u9fff]", answer) else "en"
        r = quizzes.grade("lessonreadme", question["id"], answer, lang)
        assert r.correct is correct, (answer, r.details)
    r = quizzes.grade("lessonreadme", question["id"], rows[3][0])
    assert len(r.details["misconceptions"]) == 3
    assert "you wrote that SHARD_GRAD_OP frees the parameters after forward; it is FULL_SHARD that does" in r.feedback
