"""Tests of the quiz engine (quizzes/): every bank's answers, bank lint, exercises, progress,
CLI and widget. Banks added later (lesson2..5) are covered automatically."""

import json
import re

import pytest

import quizzes
from helpers import quiz_cli
from quizzes import bank as bankmod
from quizzes import grading, progress, reader
from quizzes.bank import BANK_DIR, QuizError

BANK_FILES = sorted(BANK_DIR.glob("*.json"))
LESSONS = [p.stem for p in BANK_FILES]
OFF_TOPIC = {
    "en": "I had pizza for lunch and the weather was sunny.",
    "zh": "今天午饭吃了披萨，天气很好。",
}


@pytest.fixture(autouse=True)
def quiz_progress_file(tmp_path, monkeypatch):
    """Every test writes its progress into its own folder, never into ~/.fsdp_course."""
    path = tmp_path / "progress" / "progress.json"
    monkeypatch.setenv(progress.ENV, str(path))
    monkeypatch.delenv(bankmod.BANK_PATH_ENV, raising=False)
    return path


def quiz_questions(types_=("single", "multi", "numeric", "open")):
    return [
        pytest.param(lesson, q.id, id=f"{lesson}-{q.id}")
        for lesson in LESSONS
        for q in quizzes.load_bank(lesson)
        if q.type in types_
    ]


def right_answer(q):
    s = q.secret
    return {
        "single": lambda: s["correct"],
        "multi": lambda: list(s["correct"]),
        "numeric": lambda: s["value"],
        "open": lambda: s["reference"]["en"],
    }[q.type]()


def wrong_answers(q):
    """Wrong answers generated from the sealed data, so any bank can be tested."""
    s = q.secret
    if q.type == "single":
        return [o for o in q.option_ids() if o != s["correct"]]
    if q.type == "multi":
        ids, right = q.option_ids(), set(s["correct"])
        flipped = [sorted(right ^ {o}) for o in ids]  # one option judged wrongly
        return [f for f in flipped if f] + [sorted(set(ids) - right) or [ids[0]]]
    if q.type == "numeric":
        ((kind, tol),) = s["tolerance"].items()
        allowed = tol if kind == "abs" else tol * abs(s["value"])
        return [s["value"] + 10 * max(allowed, 1.0), s["value"] - 10 * max(allowed, 1.0)]
    return [OFF_TOPIC["en"], OFF_TOPIC["zh"]]


# --- every question of every bank ------------------------------------------------------------


def test_banks_exist():
    assert "lesson0" in LESSONS and "lesson1" in LESSONS


@pytest.mark.parametrize("lesson,qid", quiz_questions())
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_right_answer_is_correct(lesson, qid, lang):
    q = quizzes.load_bank(lesson).question(qid)
    r = quizzes.grade(lesson, qid, right_answer(q), lang)
    assert r.correct and r.score == 1.0, r.feedback
    assert r.feedback.strip()


@pytest.mark.parametrize("lesson,qid", quiz_questions())
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_wrong_answers_are_explained(lesson, qid, lang):
    q = quizzes.load_bank(lesson).question(qid)
    for wrong in wrong_answers(q):
        r = quizzes.grade(lesson, qid, wrong, lang)
        assert not r.correct, (wrong, r.feedback)
        assert 0.0 <= r.score < 1.0
        assert len(r.feedback.strip()) > 20
        if q.type in ("single", "multi"):
            # the explanation of why a chosen (or missed) option is wrong is in the feedback
            chosen = [wrong] if q.type == "single" else wrong
            judged = set(chosen) ^ (
                {q.secret["correct"]} if q.type == "single" else set(q.secret["correct"])
            )
            for oid in judged:
                if q.type == "multi" or oid in chosen:
                    assert q.secret["why"][oid][lang] in r.feedback
        if q.type == "numeric":
            assert q.secret["explanation"][lang] in r.feedback


@pytest.mark.parametrize("lesson,qid", quiz_questions(("open",)))
def test_open_answers_in_both_languages(lesson, qid):
    """The reference answer passes in both languages; an off-topic one gets every key idea named
    as missing, then the reference answer (the labelled corpora: tests/test_grader_corpus.py)."""
    q = quizzes.load_bank(lesson).question(qid)
    for lang in ("en", "zh"):
        assert quizzes.grade(lesson, qid, q.secret["reference"][lang], lang).correct
        r = quizzes.grade(lesson, qid, OFF_TOPIC[lang], lang)
        assert r.verdict == "wrong" and not r.correct
        ideas = grading.key_ideas(q.secret)
        assert r.details["missing"] == [k["id"] for k in ideas]
        for idea in ideas:
            assert idea["label"][lang] in r.feedback
        assert q.secret["reference"][lang] in r.feedback


def test_open_rubric_normalises_text():
    with reader.trained_on({}):  # the rules alone: the second reading is tests/test_reader.py's
        rules_only_normalise()


def rules_only_normalise():
    r = quizzes.grade(
        "lesson1",
        "q_full_vs_shard_grad_op",
        "FULL_SHARD: frees   PARAMETERS after forward; ALL-GATHERS them again in backward!",
    )
    assert r.correct and {"reshard_after_forward", "gather_again"} <= set(r.details["found"])
    mixed = quizzes.grade(
        "lesson1", "q_full_vs_shard_grad_op", "FULL_SHARD 反向时再次 all-gather，显存更少", "zh"
    )
    # every part read and true, but the key idea (when the parameters are freed) is missing
    assert mixed.verdict == "wrong" and {"gather_again", "memory"} <= set(mixed.details["found"])
    assert mixed.details["missing"] == ["when_freed"]
    assert (
        "已答到的要点" in mixed.feedback
        and "缺少的要点" in mixed.feedback
        and "参考答案" in mixed.feedback
    )


# --- bank lint -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", BANK_FILES, ids=LESSONS)
def test_bank_lint(path):
    raw = path.read_text(encoding="utf-8")
    data = json.loads(raw)
    assert set(data) <= {"format", "lesson", "title", "questions"}
    assert data["lesson"] == path.stem
    bank = quizzes.load_bank(path.stem)
    assert bankmod.validate(bank) == []  # en+zh everywhere, why for every option, ids unique
    ids = [q.id for q in bank]
    assert len(ids) == len(set(ids))
    # nothing that gives an answer away may be readable outside the sealed fields
    assert not re.search(
        r'"(correct|answer|answers|value|tolerance|checker|why|claims|subjects|says|'
        r'misconceptions|reference|explanation|key_ideas|topic|neutral)"\s*:',
        raw,
    )
    for q in bank:
        assert set(data["questions"][ids.index(q.id)]) <= bankmod.PUBLIC_KEYS
        s = q.secret
        secrets = []
        if q.type in ("single", "multi"):
            secrets += [w[lang] for w in s["why"].values() for lang in ("en", "zh")]
        if q.type == "numeric":
            secrets += list(s["explanation"].values())
        if q.type == "open":
            secrets += list(s["reference"].values())
            secrets += [
                c["label"][lang]
                for c in s["claims"] + s.get("key_ideas", [])
                for lang in ("en", "zh")
            ]
            secrets += [
                f[key][lang]
                for c in s["claims"]
                for f in c["forms"]
                for key in ("wrong", "swapped")
                if key in f
                for lang in ("en", "zh")
            ]
        if q.type == "code":
            assert s == {}, (
                f"{q.id}: a code question keeps no secret (its checker registers itself)"
            )
        for text in secrets:
            assert text not in raw, f"{q.id}: {text[:40]!r} readable in {path.name}"
            assert json.dumps(text, ensure_ascii=False)[1:-1] not in raw


def test_lesson1_required_questions():
    bank = quizzes.load_bank("lesson1")
    assert bank.question("q_full_vs_shard_grad_op").type == "open"
    assert [
        k["id"] for k in grading.key_ideas(bank.question("q_full_vs_shard_grad_op").secret)
    ] == ["when_freed", "trade_off"]
    assert bank.question("ex_predict_bytes").type == "code"
    assert len(bank.graded()) >= 7 and len(quizzes.load_bank("lesson0").graded()) >= 6


def test_seal_refuses_a_broken_bank(tmp_path):
    authoring = bankmod.to_authoring(quizzes.load_bank("lesson1"))
    q = next(q for q in authoring["questions"] if q["type"] == "single")
    del q["secret"]["why"][q["options"][0]["id"]]
    with pytest.raises(QuizError, match="explanation"):
        bankmod.from_authoring(authoring)


# --- API errors ------------------------------------------------------------------------------


def test_load_bank_errors_and_aliases():
    with pytest.raises(
        QuizError, match=r"unknown lesson 'lesson99' \(known lessons: lesson0, lesson1"
    ):
        quizzes.load_bank("lesson99")
    assert quizzes.load_bank("1").lesson == "lesson1" == quizzes.load_bank(1).lesson


@pytest.mark.parametrize(
    "qid,answer,match",
    [
        ("nope", "a", "unknown question 'nope'"),
        ("q_zero_mapping", ["b"], "single-choice"),
        ("q_zero_mapping", "z", "unknown option 'z'"),
        ("q_zero_mapping", 2, "option"),
        ("q_shard_optimizer_state", 3, "multiple-choice"),
        ("q_shard_optimizer_state", ["a", "q"], "unknown option 'q'"),
        ("q_model_state_bytes", "lots", "cannot read 'lots'"),
        ("q_model_state_bytes", ["1"], "numeric"),
        ("q_model_state_bytes", True, "numeric"),
        ("q_full_vs_shard_grad_op", 42, "open question"),
        ("ex_predict_bytes", "x", "code exercise"),
    ],
)
def test_grade_rejects_bad_answers(qid, answer, match):
    with pytest.raises(QuizError, match=re.escape(match)):
        quizzes.grade("lesson1", qid, answer)


def test_grade_accepts_friendly_forms():
    assert quizzes.grade("lesson1", "q_model_state_bytes", "200,000,000 bytes").correct
    assert quizzes.grade("lesson1", "q_model_state_bytes", "2e8").correct
    assert quizzes.grade("lesson1", "q_zero_mapping", " B ").correct
    assert quizzes.grade("lesson1", "q_shard_optimizer_state", "a, b d").correct
    partial = quizzes.grade("lesson1", "q_shard_optimizer_state", ["a", "b"])
    assert not partial.correct and 0 < partial.score < 1
    with pytest.raises(QuizError, match="unknown language"):
        quizzes.grade("lesson1", "q_zero_mapping", "b", lang="fr")


# --- progress --------------------------------------------------------------------------------


def test_progress_atomic_write(quiz_progress_file, monkeypatch, capfd):
    progress.record("lesson1", progress.Mark("q_zero_mapping", "wrong", 0.0))
    progress.record("lesson1", progress.Mark("q_zero_mapping", "correct", 1.0))
    progress.record("lesson1", progress.Mark("q_zero_mapping", "wrong", 0.0))
    assert sorted(p.name for p in quiz_progress_file.parent.iterdir()) == [
        "progress.json",
        "progress.json.lock",
    ]
    rec = json.loads(quiz_progress_file.read_text())["lessons"]["lesson1"]["q_zero_mapping"]
    assert rec["attempts"] == 3 and rec["best_score"] == 1.0 and rec["correct"] is True
    assert rec["last_answered"]
    before = quiz_progress_file.read_text()

    def crash(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(progress.json, "dump", crash)
    saved = progress.record("lesson1", progress.Mark("q_no_shard", "correct", 1.0))  # no traceback
    assert not saved.ok and saved.records == {}
    assert saved.line() == (
        f"progress not recorded: cannot save progress to {quiz_progress_file}: "
        "No space left on device"
    )
    assert saved.line("zh").startswith("进度未保存：cannot save progress")
    assert capfd.readouterr().err == ""  # the caller says it, where its learner reads
    assert quiz_progress_file.read_text() == before  # the old file survives a failed write
    assert sorted(p.name for p in quiz_progress_file.parent.iterdir()) == [
        "progress.json",
        "progress.json.lock",
    ]


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"lessons": {"lesson1": 3}}'])
def test_corrupt_progress_is_moved_aside(quiz_progress_file, capfd, content):
    quiz_progress_file.parent.mkdir(parents=True)
    quiz_progress_file.write_text(content)
    progress.record("lesson1", progress.Mark("q_zero_mapping", "correct", 1.0))
    moved = list(quiz_progress_file.parent.glob("progress.json.corrupt-*"))
    assert len(moved) == 1 and moved[0].read_text() == content  # preserved, not lost
    assert re.fullmatch(r"progress\.json\.corrupt-\d{8}-\d{6}", moved[0].name)
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and str(moved[0]) in err
    assert json.loads(quiz_progress_file.read_text())["lessons"]["lesson1"]["q_zero_mapping"][
        "correct"
    ]


def test_language_setting_is_remembered():
    quiz = quizzes.show("lesson1")
    assert quiz.lang == "en"
    radio = next(b for b in quiz.boxes if b.q.type == "single").input
    radio.value = radio.options[2][1]
    quiz.lang_toggle.value = "zh"
    assert radio.value == radio.options[2][1]  # switching language keeps the learner's choice
    assert progress.get_setting("lang") == "zh"
    assert "主要区别" in quiz.boxes[0].prompt.value and quiz.score_text().startswith("得分")
    assert quizzes.show("lesson1").lang == "zh"  # a new quiz opens in the remembered language
    assert quizzes.show("lesson1", lang="en").lang == "en"


# --- widget ----------------------------------------------------------------------------------


def test_widget_answers_a_single_choice_question():
    import ipywidgets as widgets

    quiz = quizzes.show("lesson1")
    assert isinstance(quiz.root, widgets.VBox) and "quiz-root" in quiz.root._dom_classes
    n = len(quizzes.load_bank("lesson1").graded())
    assert quiz.score_text() == f"Score: 0 / {n}"
    # the score at the top and at the bottom
    assert quiz.root.children[2] is quiz.score_top and quiz.root.children[-1] is quiz.score
    assert f"Score: 0 / {n}" in quiz.score_top.value and f"Score: 0 / {n}" in quiz.score.value
    box = next(b for b in quiz.boxes if b.q.id == "q_zero_mapping")
    assert isinstance(box.input, widgets.RadioButtons) and box.button.description == "Check"
    box.button.click()  # nothing chosen yet
    assert box.feedback_text == "Choose an answer first."
    wrong = next(o for o in box.q.option_ids() if o != box.q.secret["correct"])
    box.input.value = wrong
    box.button.click()
    assert box.feedback_text.startswith("✘ Not right\nYou chose")
    assert "quiz-verdict-wrong" in box.feedback.value and "✘" in box.feedback.value
    assert "Not quite." not in box.feedback_text  # the verdict is said once, by the badge
    assert quiz.score_text() == f"Score: 0 / {n}"
    quiz.lang_toggle.value = "zh"  # new labels, the same choice: its feedback follows the language
    assert box.input.value == wrong and box.feedback_text.startswith("✘ 不对\n你选了")
    assert box.button.description == "检查"
    quiz.lang_toggle.value = "en"
    assert box.input.value == wrong and box.feedback_text.startswith("✘ Not right")
    box.input.value = box.q.secret["correct"]
    assert box.feedback.value == "" and box.feedback_text == ""  # it was about the other choice
    box.button.click()
    assert (
        box.feedback_text.startswith("✔ Correct\n") and "quiz-verdict-correct" in box.feedback.value
    )
    assert quiz.score_text() == f"Score: 1 / {n}"
    rec = progress.load()["lessons"]["lesson1"]["q_zero_mapping"]
    assert rec["attempts"] == 2 and rec["correct"] and rec["graded_by"] == "grader"
    # every question type has its widget; the code exercise says it is not in the score
    kinds = {b.q.type: type(b.input).__name__ for b in quiz.boxes}
    assert kinds == {
        "open": "Textarea",
        "single": "RadioButtons",
        "multi": "VBox",
        "numeric": "Text",
        "code": "HTML",
    }
    code = next(b for b in quiz.boxes if b.q.type == "code")
    assert "graded in the exercise cell above" in code.input.value
    assert "Exercise (not counted in the score)" in code.prompt.value
    graded = [b for b in quiz.boxes if b.q.type != "code"]
    assert f"Question {n} of {n}" in graded[-1].prompt.value  # graded questions count 1..n


def test_widget_numeric_and_open_feedback():
    quiz = quizzes.show("lesson1")
    box = next(b for b in quiz.boxes if b.q.id == "q_model_state_bytes")
    box.input.value = "not a number"
    box.button.click()
    assert "cannot read" in box.feedback_text
    quiz.lang_toggle.value = "zh"  # the message follows the language too
    assert "无法把" in box.feedback_text
    quiz.lang_toggle.value = "en"
    box.input.value = "200000000"
    box.button.click()
    assert box.feedback_text.startswith("✔ Correct\n")
    box = next(b for b in quiz.boxes if b.q.id == "q_full_vs_shard_grad_op")
    box.input.value = OFF_TOPIC["en"]
    box.button.click()
    assert (
        box.feedback_text.startswith("✘ Not right\n")
        and box.q.secret["reference"]["en"] in box.feedback_text
    )
    assert not re.match(
        r"✘ Not right\n(Not quite|Correct)", box.feedback_text
    )  # the verdict said once
    assert (
        "white-space:pre-wrap" in box.feedback.value and "word-break:normal" in box.feedback.value
    )


def test_feedback_says_right_once():
    """No "Correct. Right: ..." / "正确。正确：...": the badge says it, the explanation does
    not again."""
    from quizzes import present

    for lesson in LESSONS:
        for q in quizzes.load_bank(lesson).graded():
            if q.type != "single":
                continue
            for lang in ("en", "zh"):
                r = quizzes.grade(lesson, q.id, q.secret["correct"], lang=lang)
                text = present.body(r, lang)
                assert not re.match(r"(Correct|Right|正确|对)\s*[.:：。]", text), (
                    lesson,
                    q.id,
                    lang,
                    text,
                )
                assert text, (lesson, q.id, lang)


LABELS = {
    "en": [
        "FULL_SHARD frees the parameters after forward",
        "SHARD_GRAD_OP keeps them until backward",
        "SHARD_GRAD_OP uses more memory",
    ],
    "zh": ["FULL_SHARD 前向后释放参数", "SHARD_GRAD_OP 保留到反向", "SHARD_GRAD_OP 显存更多"],
}


def unsure_result(lang):
    """An "unsure" open result in the shape grading's contract gives it."""
    from quizzes.grading import Result

    labels = LABELS[lang]
    return Result(
        False,
        0.5,
        {"en": "Not sure.", "zh": "无法确定。"}[lang],
        {
            "found": ["reshard_after_forward"],
            "missing": ["keep", "memory"],
            "found_labels": labels[:1],
            "missing_labels": labels[1:],
            "unread": ["and then it does the gather thing in a weird way"],
            "false": [
                {
                    "quote": "FULL_SHARD keeps them",
                    "fix": {"en": "it frees them", "zh": "它会释放"}[lang],
                }
            ],
            "checklist": labels,
            "reference": {"en": "Reference text.", "zh": "参考答案文字。"}[lang],
            "too_short": False,
        },
        verdict="unsure",
    )


@pytest.fixture
def unsure_quiz(monkeypatch):
    """lesson1's quiz whose open question the grader is unsure of (any answer)."""
    from quizzes import widget

    real = widget.grade_question
    monkeypatch.setattr(
        widget,
        "grade_question",
        lambda q, answer, lang="en": (
            unsure_result(lang) if q.type == "open" else real(q, answer, lang)
        ),
    )
    quiz = quizzes.show("lesson1")
    box = next(b for b in quiz.boxes if b.q.type == "open")
    box.input.value = (
        "FULL_SHARD frees them after forward and then it does the gather thing in a weird way"
    )
    box.button.click()
    return quiz, box


def test_widget_unsure_shows_what_was_read_and_asks_for_a_self_mark(unsure_quiz):
    quiz, box = unsure_quiz
    n = len(quiz.bank.graded())
    text = box.feedback_text
    assert text.startswith("? Not sure: compare it yourself")
    for part in [
        "Key ideas found:\n- FULL_SHARD frees",
        "Key ideas not found:\n- SHARD_GRAD_OP keeps",
        "Sentences the grader could not read:\n- «and then it does the gather thing",
        "You wrote «FULL_SHARD keeps them»: it frees them",
        "Reference answer:\nReference text.",
    ]:
        assert part in text, text
    assert "quiz-verdict-unsure" in box.feedback.value
    assert box.selfcheck.layout.display == "flex"
    rec = progress.load()["lessons"]["lesson1"][box.q.id]
    assert rec["verdict"] == "unsure" and rec["graded_by"] == "grader" and not rec["correct"]
    # the checklist starts from what the grader found; "right" needs every key idea ticked
    assert [cb.value for cb in box.idea_checks] == [True, False, False]
    assert box.self_right.disabled and not box.self_wrong.disabled
    assert "tick every key idea, and that nothing is false, first" in box.self_hint.value
    for cb in box.idea_checks:
        cb.value = True
    # every key idea is not enough: the learner confirms nothing in the answer is false
    assert not box.nothing_false.value and box.self_right.disabled
    box.nothing_false.value = True
    assert not box.self_right.disabled and box.self_hint.value == ""
    box.self_right.click()
    assert (
        "You marked it right" in box.self_status.value
        and "Recorded as self-assessed." in box.self_status.value
    )
    assert quiz.score_text() == f"Score: 0 / {n} (+1 self-assessed right)"
    rec = progress.load()["lessons"]["lesson1"][box.q.id]
    assert rec == {
        **rec,
        "graded_by": "self",
        "verdict": "correct",
        "self_correct": True,
        "correct": False,
        "attempts": 1,
    }
    assert (
        progress.lesson_summary("lesson1", [q.id for q in quiz.bank.graded()])["self_assessed"] == 1
    )
    box.self_wrong.click()  # a learner may change their mind
    assert progress.load()["lessons"]["lesson1"][box.q.id]["self_correct"] is False
    assert quiz.score_text() == f"Score: 0 / {n}"


def test_widget_unsure_in_chinese_keeps_the_ticks(unsure_quiz):
    quiz, box = unsure_quiz
    box.idea_checks[1].value = True
    quiz.lang_toggle.value = "zh"
    assert [cb.value for cb in box.idea_checks] == [True, True, False]
    assert (
        box.self_right.description == "我的回答正确"
        and box.self_wrong.description == "我的回答不正确"
    )
    shown = (
        box.feedback_text
        + box.ideas_head.value
        + "".join(r.children[1].value for r in box.ideas.children)
    )
    assert (
        "已答到的要点" in shown and "SHARD_GRAD_OP 保留到反向" in shown and "参考答案文字" in shown
    )
    assert (
        "「and then it does the gather thing in a weird way」" in box.feedback_text
    )  # quoted as Chinese quotes
    # no English left but the learner's own words (quoted) and the API's names
    ui = re.sub(
        r"«[^»]*»|「[^」]*」|SHARD_GRAD_OP|FULL_SHARD|<[^>]*>",
        "",
        box.feedback_text + box.ideas_head.value,
    )
    assert not re.search(r"[A-Za-z]{3,}", ui), ui
    box.self_wrong.click()
    assert "你判定为不正确" in box.self_status.value and "已记为自评" in box.self_status.value


def test_widget_says_when_a_self_mark_cannot_be_saved(unsure_quiz, quiz_progress_file):
    _, box = unsure_quiz
    quiz_progress_file.unlink()
    quiz_progress_file.mkdir()
    box.self_wrong.click()
    assert (
        "progress not recorded" in box.self_status.value and "is a folder" in box.self_status.value
    )


# --- CLI -------------------------------------------------------------------------------------


def quiz_answers_file(tmp_path, lesson, answers, name="answers.json", lang="en"):
    path = tmp_path / name
    path.write_text(json.dumps({"lesson": lesson, "lang": lang, "answers": answers}))
    return str(path)


def test_cli_help_and_list(quiz_progress_file):
    r = quiz_cli("--help", progress_file=quiz_progress_file)
    assert r.returncode == 0 and "examples:" in r.stdout and "grade" in r.stdout
    r = quiz_cli("list", progress_file=quiz_progress_file)
    assert r.returncode == 0, r.stderr
    assert re.search(r"lesson1\s+\d+\s+1\s+0 / \d+", r.stdout)
    assert "lesson0" in r.stdout


@pytest.mark.parametrize("lesson", LESSONS)
def test_cli_grade_right_and_wrong(tmp_path, quiz_progress_file, lesson):
    bank = quizzes.load_bank(lesson)
    n = len(bank.graded())
    right = quiz_answers_file(tmp_path, lesson, {q.id: right_answer(q) for q in bank.graded()})
    r = quiz_cli("grade", right, "--json", progress_file=quiz_progress_file)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["correct"] == n == out["total"] and out["score"] == n
    r = quiz_cli("grade", right, progress_file=quiz_progress_file)
    assert r.returncode == 0 and f"Total: {n} / {n} correct" in r.stdout
    wrong = quiz_answers_file(
        tmp_path, lesson, {q.id: wrong_answers(q)[0] for q in bank.graded()}, "w.json"
    )
    r = quiz_cli("grade", wrong, progress_file=quiz_progress_file)
    assert r.returncode == 0, r.stderr  # graded: exit 0 whatever the score
    assert f"Total: 0 / {n} correct" in r.stdout and "[wrong]" in r.stdout
    assert not quiz_progress_file.exists()  # grade records only with --record


def test_cli_grade_partial_and_zh(tmp_path, quiz_progress_file):
    path = quiz_answers_file(tmp_path, "lesson1", {"q_zero_mapping": "c"}, lang="zh")
    r = quiz_cli("grade", path, "--record", progress_file=quiz_progress_file)
    assert r.returncode == 0 and "不太对" in r.stdout and "[未作答] q_no_shard" in r.stdout
    assert "[错误] q_zero_mapping" in r.stdout and "总计：0 / " in r.stdout  # all of it in Chinese
    assert "[not answered]" not in r.stdout and "Total" not in r.stdout
    assert (
        json.loads(quiz_progress_file.read_text())["lessons"]["lesson1"]["q_zero_mapping"][
            "attempts"
        ]
        == 1
    )


@pytest.mark.parametrize(
    "answers_text,match",
    [
        (json.dumps({"lesson": "lesson99", "answers": {}}), "unknown lesson 'lesson99'"),
        (
            json.dumps({"lesson": "lesson1", "answers": {"q_nope": "a"}}),
            "unknown question 'q_nope'",
        ),
        ("{oops", "not valid JSON"),
        (json.dumps({"lesson": "lesson1"}), "must be an object with 'lesson'"),
        (json.dumps({"lesson": "lesson1", "answers": {"q_zero_mapping": ["b"]}}), "single-choice"),
        (
            json.dumps({"lesson": "lesson1", "answers": {"q_model_state_bytes": "lots"}}),
            "cannot read",
        ),
        (json.dumps({"lesson": "lesson1", "answers": {"ex_predict_bytes": "x"}}), "code exercise"),
    ],
)
def test_cli_grade_errors(tmp_path, quiz_progress_file, answers_text, match):
    path = tmp_path / "answers.json"
    path.write_text(answers_text)
    r = quiz_cli("grade", str(path), progress_file=quiz_progress_file)
    assert r.returncode == 2 and r.stdout == ""
    assert (
        r.stderr.startswith("quizzes: error: ") and r.stderr.count("\n") == 1 and match in r.stderr
    )
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "args,match",
    [
        (("take", "lesson99"), "unknown lesson"),
        (("take", "lesson1", "--only", "q_nope"), "unknown question"),
        (("grade", "/nonexistent/answers.json"), "not found"),
        (("unseal", "lesson42"), "unknown lesson"),
        (("frobnicate",), "invalid choice"),
    ],
)
def test_cli_errors_are_one_line(quiz_progress_file, args, match):
    r = quiz_cli(*args, progress_file=quiz_progress_file)
    assert r.returncode == 2 and r.stderr.startswith("quizzes: error: ")
    assert r.stderr.count("\n") == 1 and match in r.stderr


def test_cli_take_with_piped_answers(quiz_progress_file):
    bank = quizzes.load_bank("lesson1")
    first, second = bank.questions[0], bank.questions[1]
    assert first.type == "open" and second.type == "single"
    stdin = "\n".join([first.secret["reference"]["en"], "zz", second.secret["correct"]]) + "\n"
    r = quiz_cli("take", "lesson1", stdin=stdin, progress_file=quiz_progress_file)  # then EOF
    assert r.returncode == 0, r.stderr
    assert "unknown option 'zz'" in r.stdout  # a typo is explained and asked again
    assert "stopped." in r.stdout and f"Score: 2 / {len(bank.graded())}" in r.stdout
    assert "Traceback" not in r.stderr
    recs = json.loads(quiz_progress_file.read_text())["lessons"]["lesson1"]
    assert recs[first.id]["correct"] and recs[second.id]["correct"]


def test_cli_take_zh_only_and_code_skipped(quiz_progress_file):
    r = quiz_cli(
        "take",
        "lesson1",
        "--lang",
        "zh",
        "--only",
        "q_zero_mapping",
        stdin="b\n",
        progress_file=quiz_progress_file,
    )
    assert r.returncode == 0 and "对应 ZeRO 的哪个阶段" in r.stdout and "得分：1 / 1" in r.stdout
    r = quiz_cli("take", "lesson1", "--only", "ex_predict_bytes", progress_file=quiz_progress_file)
    assert r.returncode == 0 and "run the exercise cell in the notebook" in r.stdout


def test_cli_progress_and_corrupt_file(quiz_progress_file):
    quiz_progress_file.parent.mkdir(parents=True)
    quiz_progress_file.write_text("{broken")
    r = quiz_cli("progress", progress_file=quiz_progress_file)
    assert r.returncode == 0 and "lesson1" in r.stdout  # the command carries on
    assert "moved it to" in r.stderr and r.stderr.count("\n") == 1
    assert (
        list(quiz_progress_file.parent.glob("progress.json.corrupt-*"))[0].read_text() == "{broken"
    )
    quiz_cli(
        "take", "lesson1", "--only", "q_zero_mapping", stdin="b\n", progress_file=quiz_progress_file
    )
    r = quiz_cli("progress", progress_file=quiz_progress_file)
    assert re.search(r"lesson1\s+1 / \d+\s+1\s+0\s+1\.00", r.stdout)


def test_cli_unseal_then_seal_round_trip(tmp_path, quiz_progress_file):
    r = quiz_cli("unseal", "lesson1", progress_file=quiz_progress_file)
    assert r.returncode == 0
    authoring = json.loads(r.stdout)
    assert authoring["questions"][0]["secret"]["key_ideas"][0]["id"] == "when_freed"
    src, out = tmp_path / "lesson1.json", tmp_path / "banks" / "lesson1.json"
    out.parent.mkdir()
    src.write_text(r.stdout)
    r = quiz_cli("seal", str(src), "--out", str(out), progress_file=quiz_progress_file)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text()) == json.loads((BANK_DIR / "lesson1.json").read_text())


def test_unsure_with_every_key_idea_found_ticks_them_all(monkeypatch):
    """What is not found comes from missing_labels, even when it is empty; what is found is shown
    in the checklist's unit, the key ideas (a result whose found_labels are per claim, as the
    grader once wrote them, still shows one key idea found, as its checklist does)."""
    from quizzes import present, widget
    from quizzes.grading import Result

    result = Result(
        False,
        0.5,
        "",
        {
            "found": ["c1", "c2"],
            "missing": [],
            "found_labels": ["claim one", "claim two"],
            "missing_labels": [],
            "unread": ["a sentence"],
            "false": [],
            "checklist": ["key idea"],
            "reference": "ref",
            "too_short": False,
        },
        verdict="unsure",
    )
    assert present.unsure_parts(result, "en")["missing"] == []
    assert present.unsure_parts(result, "en")["found"] == ["key idea"]
    monkeypatch.setattr(widget, "grade_question", lambda q, answer, lang="en": result)
    quiz = quizzes.show("lesson1")
    box = next(b for b in quiz.boxes if b.q.type == "open")
    box.input.value = "anything at all, really"
    box.button.click()
    assert [cb.value for cb in box.idea_checks] == [True] and box.self_right.disabled
    box.nothing_false.value = True
    assert not box.self_right.disabled
    assert "Key ideas not found:\n- (none)" in box.feedback_text
    assert "Key ideas found:\n- key idea\n" in box.feedback_text
    assert "claim one" not in box.feedback_text
