"""The claim reader (quizzes/claims.py) on its own: phrasings, clauses, subjects, negation,
keyword lists, and the bank lint of the open-question format. Uses a small demo question so
these tests do not depend on any lesson's wording."""

import copy
import json
import re
from pathlib import Path

import pytest

import quizzes
from helpers import use_bank
from quizzes import bank as bankmod
from quizzes import claims, reader
from quizzes.bank import QuizError

A, B = "FULL_SHARD", "SHARD_GRAD_OP"


@pytest.fixture(autouse=True)
def rules_only():
    """These tests are about the rules (claims.py): the second reading (reader.py, tested in
    tests/test_reader.py) is off, so a verdict here is the rules' own."""
    with reader.trained_on({}):
        yield


def _bi(en, zh):
    return {"en": en, "zh": zh}


DEMO = {
    "subjects": {
        A: _bi(["full shard", "the former"], ["前者"]),
        B: _bi(["shard grad op", "the latter"], ["后者"]),
    },
    "claims": [
        {
            "id": "frees",
            "label": _bi("A frees params", "A 释放参数"),
            "forms": [
                {
                    "subject": A,
                    "rival": B,
                    "says": _bi(["(free*|re shard*) ... (param*|weight*|them)"], ["释放"]),
                    "wrong": _bi("A does free them", "A 会释放"),
                    "swapped": _bi("it is A that frees them", "释放的是 A"),
                }
            ],
        },
        {
            "id": "memory",
            "label": _bi("B uses more memory", "B 显存更多"),
            "forms": [
                {
                    "subject": B,
                    "rival": A,
                    "says": _bi(["more memory"], ["(显存|内存) ... 更多"]),
                    "wrong": _bi("B does use more memory", "B 显存确实更多"),
                    "swapped": _bi("it is B that uses more memory", "显存更多的是 B"),
                }
            ],
        },
        {
            "id": "fit",
            "label": _bi("a full copy may not fit", "完整副本可能放不下"),
            "forms": [
                {
                    "says": _bi(
                        ["rank ... (has|holds|hold) ... (whole|full) model"], ["rank ... 完整模型"]
                    ),
                    "negated": True,
                    "wrong": _bi("each rank holds only a shard", "每个 rank 只有一个分片"),
                }
            ],
        },
    ],
    "misconceptions": [
        {
            "id": "same",
            "says": _bi(["no ... difference"], ["没有区别"]),
            "wrong": _bi(
                "they differ in when the parameters are freed", "两者的区别在于何时释放参数"
            ),
        }
    ],
    "key_ideas": [
        {"id": "frees", "label": _bi("A frees params", "A 释放参数"), "claims": ["frees"]},
        {"id": "memory", "label": _bi("B uses more memory", "B 显存更多"), "claims": ["memory"]},
    ],
    "topic": _bi(["param*", "memory", "rank*", "model"], ["参数", "显存", "模型"]),
    "neutral": [{"id": "both_shard", "says": _bi(["both shard*"], ["都分片"])}],
    "reference": _bi(
        "A frees the parameters after forward; B keeps them and uses more memory.",
        "A 在前向之后释放参数；B 保留参数，显存更多。",
    ),
}


def read(text):
    return claims.read_answer(text, DEMO)


@pytest.fixture
def demo_bank(tmp_path, monkeypatch):
    authoring = {
        "lesson": "lessondemo",
        "title": _bi("Demo", "演示"),
        "questions": [
            {
                "id": "q_open",
                "type": "open",
                "prompt": _bi("Difference?", "区别？"),
                "secret": copy.deepcopy(DEMO),
            }
        ],
    }
    use_bank(authoring, tmp_path / "banks", monkeypatch)
    return "lessondemo"


# --- phrasings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "phrase,text,hit",
    [
        ("rank", "frankly i would go watch a video", False),  # ASCII matches whole words only
        ("rank", "each rank holds a shard", True),
        ("oom", "zoom into the logs", False),
        ("dcp", "and cpu", False),
        (
            "all gather",
            claims.normalise("FULL_SHARD all-gathers"),
            False,
        ),  # no * : the word ends there
        ("all gather*", claims.normalise("FULL_SHARD all-gathers"), True),
        ("all gather*", claims.normalise("an all_gather call"), True),
        ("all gather*", "allgathers", True),
        ("re shard*", claims.normalise("re-shards the parameters"), True),
        ("free* ... param*", "frees the full params", True),
        (
            "再次all gather",
            claims.normalise("反向时再次 all-gather"),
            True,
        ),  # Chinese: spaces optional
        ("释放", "前者释放参数", True),
        ("完整(的|)模型", "完整模型", True),
    ],
)
def test_phrase_matching(phrase, text, hit):
    assert bool(claims.compile_phrase(phrase).search(text)) is hit


def test_phrase_lint():
    assert claims.phrase_error("(rank|ranks) ... world size") is None
    assert "optional" in claims.phrase_error("ranks?")
    assert "lower case" in claims.phrase_error("Rank")
    assert "unbalanced" in claims.phrase_error("(rank")


def test_clauses_split_at_punctuation_and_contrast_words():
    parts = [
        c
        for _, c in claims.split_clauses(
            "FULL_SHARD frees them, while SHARD_GRAD_OP keeps them; torch.save(model.state_dict()) "
            "is one word. 前者释放而后者保留"
        )
    ]
    assert parts == [
        "full shard frees them",
        "shard grad op keeps them",
        "torch save model state dict is one word",
        "前者释放",
        "后者保留",
    ]


# --- subjects, negation, misconceptions -------------------------------------------------------


def test_right_subject_supports_and_pronoun_inherits():
    r = read("FULL_SHARD frees the parameters after forward, so SHARD_GRAD_OP uses more memory.")
    assert set(r.supported) == {"frees", "memory"} and not r.misconceptions
    r = read("SHARD_GRAD_OP keeps the weights, so it uses more memory.")
    assert "memory" in r.supported  # 'it' is SHARD_GRAD_OP


def test_swapped_subject_is_a_named_misconception():
    r = read("SHARD_GRAD_OP frees the parameters after forward.")
    assert not r.supported and r.misconceptions[0][1]["en"] == "it is A that frees them"
    assert (
        r.misconceptions[0][2] == "SHARD_GRAD_OP frees the parameters after forward"
    )  # the learner's own clause


def test_comparand_is_not_the_subject():
    r = read("FULL_SHARD uses more memory than SHARD_GRAD_OP.")
    assert [m[0] for m in r.misconceptions] == ["memory"]
    r = read("SHARD_GRAD_OP 的显存比 FULL_SHARD 更多。")
    assert "memory" in r.supported and not r.misconceptions


@pytest.mark.parametrize(
    "text",
    [
        "FULL_SHARD does not free the parameters.",
        "FULL_SHARD doesn't free the parameters.",
        "FULL_SHARD never frees the weights.",
        "FULL_SHARD 不释放参数。",
        "FULL_SHARD 前向之后不会释放参数。",
    ],
)
def test_negation_makes_a_misconception(text):
    r = read(text)
    assert not r.supported and [m[0] for m in r.misconceptions] == ["frees"]


def test_denied_rival_supports():
    r = read("SHARD_GRAD_OP does not free the parameters after forward.")
    assert "frees" in r.supported and not r.misconceptions
    assert "frees" in read("SHARD_GRAD_OP 不释放参数。").supported


def test_negation_reaches_only_nearby_words():
    # the 'not' belongs to 'worth it', far before the phrasing
    r = claims.read_answer(
        "It is not worth it for models so big that each rank holds the whole model in memory.", DEMO
    )
    assert [m[0] for m in r.misconceptions] == [
        "fit"
    ]  # the form reads as affirmed: a misconception
    r = read("No rank holds the whole model.")
    assert "fit" in r.supported  # a quantifier reaches the whole clause


def test_negated_form_and_misconception_entries():
    assert "fit" in read("Each rank does not hold the whole model, only a shard.").supported
    assert [m[0] for m in read("There is no real difference between them.").misconceptions] == [
        "same"
    ]


def test_keyword_lists_are_not_read():
    assert not read("full_shard free params shard_grad_op more memory").supported
    assert not read("前者 释放 参数 后者 显存 更多").supported


# --- grading an answer -------------------------------------------------------------------------


def test_grade_open_answer_feedback(demo_bank):
    good = quizzes.grade(
        demo_bank,
        "q_open",
        "FULL_SHARD frees the parameters after forward; SHARD_GRAD_OP uses more memory.",
    )
    assert (
        good.verdict == "correct"
        and good.correct
        and good.score == 1.0
        and good.details["found"] == ["frees", "memory"]
    )
    assert (
        good.feedback.splitlines()[0].startswith("Correct:")
        and "right:" not in good.feedback.splitlines()[0]
    )
    bad = quizzes.grade(
        demo_bank,
        "q_open",
        "SHARD_GRAD_OP frees the parameters after forward and it uses more memory.",
    )
    assert (
        bad.verdict == "wrong"
        and not bad.correct
        and bad.score < 1.0
        and bad.details["misconceptions"] == ["frees"]
    )
    # the learner's own words, then what is true: never a canned line about the opposite
    assert bad.details["false"] == [
        {
            "quote": "SHARD_GRAD_OP frees the parameters after forward and it uses more memory",
            "fix": "it is A that frees them",
        }
    ]
    assert (
        "You wrote: «SHARD_GRAD_OP frees the parameters after forward and it uses more memory» — "
        "in fact it is A that frees them." in bad.feedback
    )
    zh = quizzes.grade(
        demo_bank, "q_open", "SHARD_GRAD_OP 在前向之后释放参数，后者显存更多。", "zh"
    )
    assert (
        zh.verdict == "wrong"
        and "你写道：「SHARD_GRAD_OP 在前向之后释放参数」——实际上释放的是 A。" in zh.feedback
    )


def test_every_key_idea_is_needed(demo_bank):
    half = quizzes.grade(
        demo_bank, "q_open", "FULL_SHARD frees the parameters right after the forward pass."
    )
    assert half.verdict == "wrong" and half.details["missing"] == ["memory"]
    assert half.details["missing_labels"] == ["B uses more memory"] and half.details[
        "found_labels"
    ] == ["A frees params"]
    assert "Key ideas missing:\n- B uses more memory" in half.feedback


def test_found_missing_and_checklist_are_key_ideas(demo_bank, monkeypatch, tmp_path):
    """An unsure result names what was found and missed in the checklist's unit, the key idea:
    two claims of one key idea are one idea found, a supporting claim (in no key idea) is not
    listed, and found + missing is the checklist, in its order, in the feedback too."""
    from quizzes import present

    secret = copy.deepcopy(DEMO)
    secret["claims"].append(
        {
            "id": "keeps",
            "label": _bi("B keeps params", "B 保留参数"),
            "forms": [
                {
                    "subject": B,
                    "rival": A,
                    "says": _bi(["(keep*|kept|hold*) ... (param*|them)"], ["保留"]),
                    "wrong": _bi("B does keep them", "B 确实保留"),
                    "swapped": _bi("it is B that keeps them", "保留的是 B"),
                }
            ],
        }
    )
    when = _bi("when the parameters are freed", "参数何时释放")
    secret["key_ideas"][0] = {"id": "when", "label": when, "claims": ["frees", "keeps"]}
    authoring = {
        "lesson": "lessonkeys",
        "title": _bi("Demo", "演示"),
        "questions": [
            {
                "id": "q_open",
                "type": "open",
                "prompt": _bi("Difference?", "区别？"),
                "secret": secret,
            }
        ],
    }
    use_bank(authoring, tmp_path / "keybanks", monkeypatch)
    text = (
        "FULL_SHARD frees the parameters after forward, while SHARD_GRAD_OP keeps them, and no "
        "rank holds the full model. The parameters are also compressed on the model's way to disk."
    )
    for lang, label in (("en", when["en"]), ("zh", when["zh"])):
        r = quizzes.grade("lessonkeys", "q_open", text, lang)
        assert r.verdict == "unsure" and {"frees", "keeps", "fit"} <= set(r.details["found"])
        assert r.details["found_ideas"] == ["when"] and r.details["found_labels"] == [label]
        assert r.details["missing_labels"] == [secret["key_ideas"][1]["label"][lang]]
        parts = present.unsure_parts(r, lang)
        assert parts["found"] + parts["missing"] == parts["checklist"] == r.details["checklist"]
        head = "Key ideas found:" if lang == "en" else "已答到的要点："
        assert f"{head}\n- {label}\n" in r.feedback
        assert f"- {label}" in present.unsure_text(r, lang)
        claim_label = secret["claims"][0]["label"][lang]
        assert claim_label not in r.feedback and claim_label not in present.unsure_text(r, lang)


def test_an_unread_sentence_makes_it_unsure(demo_bank):
    text = (
        "FULL_SHARD frees the parameters after forward; SHARD_GRAD_OP uses more memory. "
        "The parameters are also compressed on the model's way to disk."
    )
    r = quizzes.grade(demo_bank, "q_open", text)
    assert r.verdict == "unsure" and not r.correct and r.score < 1.0
    assert r.details["unread"] == ["The parameters are also compressed on the model's way to disk"]
    assert r.details["checklist"] == ["A frees params", "B uses more memory"]
    assert r.details["reference"] == DEMO["reference"]["en"]
    assert "could not read" in r.feedback and "mark it yourself" in r.feedback
    # a known neutral remark is read: nothing is left over
    r = quizzes.grade(
        demo_bank,
        "q_open",
        "Both shard the parameters. FULL_SHARD frees the parameters after forward; "
        "SHARD_GRAD_OP uses more memory.",
    )
    assert r.verdict == "correct", r.details
    # a sentence off the topic costs nothing
    r = quizzes.grade(
        demo_bank,
        "q_open",
        "FULL_SHARD frees the parameters after forward; SHARD_GRAD_OP uses more memory. "
        "I learned this yesterday.",
    )
    assert r.verdict == "correct", r.details


def test_short_answers_and_keyword_lists_are_never_correct(demo_bank):
    r = quizzes.grade(demo_bank, "q_open", "FULL_SHARD frees them")
    assert r.verdict == "wrong" and r.details["too_short"] and "too short" in r.feedback
    for text in [
        "full_shard free params, shard_grad_op more memory, zero3 zero2 etc",
        "FULL_SHARD、释放参数、SHARD_GRAD_OP、显存更多、all-gather",
    ]:
        r = quizzes.grade(demo_bank, "q_open", text)
        assert r.verdict == "wrong" and not r.details["statement"] and "keywords" in r.feedback, (
            text
        )


@pytest.mark.parametrize(
    "word,verb",
    [
        ("shards", False),
        ("params", False),
        ("frees", True),
        ("kept", True),
        ("resharded", True),
        ("unsharded", False),
    ],
)
def test_plurals_are_not_verbs(word, verb):
    assert claims.carries_verb(f"the {word}") is verb


def test_chinese_negation_is_read_per_word():
    assert not claims.negation_cues("两者差不多")  # 差不多 is one word, not 不 + 多
    assert not claims.negation_cues("不同的 rank")
    assert claims.negation_cues("前者不会释放参数")
    r = read("参数被 FULL_SHARD 释放。")  # 被: the agent is the subject
    assert "frees" in r.supported and not r.misconceptions
    r = read("参数被 SHARD_GRAD_OP 释放。")
    assert [m[0] for m in r.misconceptions] == ["frees"]


# --- bank lint ---------------------------------------------------------------------------------


def _authoring(secret):
    return {
        "lesson": "lessondemo",
        "title": _bi("Demo", "演示"),
        "questions": [
            {
                "id": "q_open",
                "type": "open",
                "prompt": _bi("Difference?", "区别？"),
                "secret": secret,
            }
        ],
    }


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda s: s.update(ideas=[], min_ideas=1), "keyword rubric fields"),
        (lambda s: s["claims"][0]["forms"][0].pop("swapped"), "'swapped' text"),
        (lambda s: s["claims"][0]["forms"][0].update(subject="NOBODY"), "not in secret.subjects"),
        (lambda s: s["claims"][0]["forms"][0]["says"].update(en=["ranks?"]), "optional"),
        (lambda s: s["claims"][1].update(id="frees"), "unique string id"),
        (lambda s: s.update(min_claims=2), "min_claims"),
        (lambda s: s["claims"][0].update(weight=2), "weight"),
        (
            lambda s: s["claims"][0]["forms"][0].update(
                wrong=_bi("you wrote that A does not", "你写的是 A 不")
            ),
            "what is true instead",
        ),
        (lambda s: s.pop("topic"), "topic"),
        (lambda s: s["key_ideas"][0].update(claims=["nope"]), "not a claim"),
        (lambda s: s["claims"][2]["forms"][0].pop("wrong"), "'wrong' text"),
    ],
)
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
    section = text[text.index("### Worked example") :]
    block = section[section.index("```json") + len("```json") :]
    question = json.loads(block[: block.index("```")])
    table = section[section.index("| answer | verdict | read as |") :]
    rows = []
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        answer, verdict = [c.strip() for c in line.strip("|").split("|")][:2]
        rows.append((answer, verdict))
    return question, rows


def test_readme_worked_example(tmp_path, monkeypatch):
    question, rows = readme_example()
    assert len(rows) >= 6
    authoring = {
        "lesson": "lessonreadme",
        "title": _bi("README", "README"),
        "questions": [question],
    }
    use_bank(authoring, tmp_path / "banks", monkeypatch)
    assert {v for _, v in rows} == {"correct", "wrong", "unsure"}
    for answer, verdict in rows:
        lang = "zh" if re.search("[\u4e00-\u9fff]", answer) else "en"
        r = quizzes.grade("lessonreadme", question["id"], answer, lang)
        assert r.verdict == verdict, (answer, r.details)
    r = quizzes.grade("lessonreadme", question["id"], rows[3][0])
    assert len(r.details["misconceptions"]) == 3
    feedback = (
        README.read_text(encoding="utf-8")
        .split("Feedback (en), for the fourth answer:")[1]
        .split("```")[1]
    )
    shown = [
        line for line in feedback.strip().splitlines() if not line.startswith(("- ...", "..."))
    ]
    assert all(line in r.feedback.splitlines() for line in shown), (shown, r.feedback)


# --- issue 22's open-question facts (checked against the lessons) -------------------------------


def test_full_state_dict_file_loads_into_a_plain_model_is_not_wrong():
    """Classic FSDP's default FULL_STATE_DICT file is a full copy that lesson 4 loads into a
    plain GPT."""
    r = quizzes.grade(
        "lesson4",
        "q_why_not_torch_save",
        "With classic FSDP's default FULL_STATE_DICT, model.state_dict() all-gathers every unit, "
        "so the file is a full copy that loads into a plain model, but that collective must run on "
        "every rank and puts the whole model in each rank's memory.",
    )
    assert r.verdict != "wrong", r.feedback


def test_per_block_wrapping_moves_more_bytes_not_the_same():
    r = quizzes.grade(
        "lesson2",
        "q_why_wrap_per_block",
        "Per-block wrapping reduces the number of all-gathers compared with one big unit.",
    )
    assert r.verdict == "wrong" and "more bytes" in r.feedback and "same bytes" not in r.feedback


# --- the command line: verdicts in grade, the report on any folder of labelled answers ----------


def test_cli_grade_shows_the_verdict(demo_bank, tmp_path, capsys):
    from quizzes import cli

    unsure = (
        "FULL_SHARD frees the parameters after forward; SHARD_GRAD_OP uses more memory. "
        "The parameters are also compressed on the model's way to disk."
    )
    answers = tmp_path / "a.json"
    answers.write_text(
        json.dumps({"lesson": demo_bank, "lang": "en", "answers": {"q_open": unsure}})
    )
    assert cli.main(["grade", str(answers), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["results"][0]
    assert row["verdict"] == "unsure" and row["correct"] is False
    assert cli.main(["grade", str(answers)]) == 0
    out = capsys.readouterr().out
    assert (
        "[unsure: mark it yourself] q_open" in out and "Sentences the grader could not read:" in out
    )


def test_cli_report_on_a_folder(demo_bank, tmp_path, capsys):
    from quizzes import cli

    folder = tmp_path / "set"
    folder.mkdir()
    items = [
        {
            "label": "correct",
            "lang": "en",
            "kind": "right",
            "answer": "FULL_SHARD frees the parameters after forward; "
            "SHARD_GRAD_OP uses more memory.",
        },
        {
            "label": "wrong",
            "lang": "en",
            "kind": "swapped",
            "answer": "SHARD_GRAD_OP frees the parameters after forward and it uses more memory.",
        },
    ]
    (folder / f"{demo_bank}.json").write_text(
        json.dumps({"lesson": demo_bank, "questions": {"q_open": items}})
    )
    assert cli.main(["report", str(folder)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"correct \(all\)\s+1\s+0\s+0\s+1", out) and re.search(
        r"wrong \(all\)\s+0\s+1\s+0\s+1", out
    )
    assert "wrong graded correct" in out and "FAIL" not in out
    items[1]["label"] = "correct"  # a right answer graded wrong: a target fails, exit 1
    (folder / f"{demo_bank}.json").write_text(
        json.dumps({"lesson": demo_bank, "questions": {"q_open": items}})
    )
    assert cli.main(["report", str(folder)]) == 1 and "FAIL" in capsys.readouterr().out
    items[1]["source"] = "round 9"  # --source: each part on its own; 'none' has no source
    (folder / f"{demo_bank}.json").write_text(
        json.dumps({"lesson": demo_bank, "questions": {"q_open": items}})
    )
    cli.main(["report", str(folder), "--source", "none", "--source", "round 9"])
    none, round9 = capsys.readouterr().out.split("source 'round 9'")
    assert "source 'none': 1 answers" in none and re.search(
        r"correct \(all\)\s+1\s+0\s+0\s+1", none
    )
    assert round9.startswith(": 1 answers") and re.search(
        r"correct \(all\)\s+0\s+1\s+0\s+1", round9
    )
    assert cli.main(["report", str(folder), "--source", "round 8"]) == 2
    assert "no answers" in capsys.readouterr().err
    assert cli.main(["report", str(tmp_path / "nope")]) == 2
    assert "not found" in capsys.readouterr().err


def test_language_libraries_load_lazily_and_quietly():
    """import quizzes pulls in neither torch nor the language libraries nor scikit-learn; the first
    Chinese answer loads jieba and the second reading without a word on stderr."""
    import subprocess
    import sys

    code = (
        "import sys, quizzes; assert not {'torch', 'jieba', 'lemminflect', 'sklearn'} & "
        "set(sys.modules), sys.modules.keys(); r = quizzes.grade('lesson1', "
        "'q_full_vs_shard_grad_op', 'FULL_SHARD 在前向之后释放参数，"
        "SHARD_GRAD_OP 保留到反向，所以显存更多。', 'zh'); "
        "assert {'jieba', 'sklearn'} <= set(sys.modules), 'not loaded'; "
        "assert r.details['reason'] in ('complete', 'doubted_correct'), r.details"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


# --- round 2: mechanisms that generalise (each with answers written for this test) --------------


@pytest.mark.parametrize(
    "text,is_list",
    [
        (
            "进程组 RANK WORLD_SIZE 会合 MASTER_PORT 重启 --nnodes",
            True,
        ),  # spaced terms, Chinese and English
        (
            "分片、重新分片、预取、峰值显存、前向反向重叠",
            True,
        ),  # 、-list, one term of six characters
        ("all-gather、reshard、显存峰值、通信计算重叠、粒度", True),  # mixed-language 、-list
        (
            "每个 rank 只有自己的 shard 和优化器状态",
            False,
        ),  # spaces around English terms: a sentence
        ("参数、梯度和优化器状态都分片到各个 rank 上", False),  # a list inside a statement
        ("FULL_SHARD 前向之后 会 释放 参数", False),  # an auxiliary makes it a statement
        (
            "RANK, LOCAL_RANK, WORLD_SIZE, MASTER_PORT, restarts, one worker per GPU",
            True,
        ),  # a noun phrase is a term
        ("RANK, LOCAL_RANK, WORLD_SIZE, and torchrun restarts failed workers", False),
    ],
)
def test_keyword_lists_in_chinese_and_mixed(text, is_list):
    assert claims.keyword_list(text) is is_list


def test_an_s_form_after_a_plural_noun_is_the_verb():
    assert claims.carries_verb(
        claims.normalise("only the all-reduce of gradient shards crosses nodes")
    )
    assert not claims.carries_verb(
        claims.normalise("gradient shards, parameter shards, optimizer states")
    )


def test_a_statement_interrupted_by_brackets_is_read_whole():
    # the layout alone: its two halves, around the bracket, are read together and credited; the
    # answer never says why (the slower links between nodes), so it is partial
    r = quizzes.grade(
        "lesson8",
        "q_hsdp_why",
        "The bulk of the traffic (parameter all-gathers and gradient reduce-scatters) remains "
        "inside each node, and only a small all-reduce of gradient shards goes between the nodes.",
    )
    assert r.details["found_ideas"] == ["layout"] and not r.details["unread"], r.feedback
    assert r.details["missing"] == ["reason"] and r.verdict != "correct", r.feedback


@pytest.mark.parametrize(
    "lesson,qid,answer",
    [
        # the comparison the other way round, in both languages
        (
            "lesson8",
            "q_hsdp_why",
            "The shard group stays inside each node for the all-gathers and reduce-scatters, and "
            "only an all-reduce of gradient shards crosses nodes, because the inter-node network "
            "is faster than NVLink.",
        ),
        (
            "lesson8",
            "q_hsdp_why",
            "all-gather 和 reduce-scatter 留在节点内，跨节点的只有梯度分片的 all-reduce，"
            "因为节点之间的链路比节点内快。",
        ),
        # a right answer, then a false figure
        (
            "lesson7",
            "q_ac_when_and_cost",
            "It pays when activations dominate memory, with long sequences; backward recomputes "
            "each block's forward. That doubles the training time.",
        ),
        (
            "lesson7",
            "q_ac_when_and_cost",
            "序列长、激活占大头的时候划算；代价是反向重算前向，计算量差不多翻倍。",
        ),
        # the condition swapped: it pays when the model state dominates
        (
            "lesson7",
            "q_ac_when_and_cost",
            "参数和优化器状态占显存大头的时候最划算，代价是反向重新计算前向。",
        ),
        # only rank 0 may call it / DCP gathers to rank 0
        (
            "lesson4",
            "q_why_not_torch_save",
            "每个 rank 只有自己的参数分片；完整的 state dict 要 all-gather，只能在 rank 0 上调用，"
            "而且一个 rank 放不下整个模型，换 world size 要用 DCP。",
        ),
        (
            "lesson4",
            "q_why_not_torch_save",
            "Each rank holds only its shard, so a full state dict needs an all-gather that every "
            "rank joins and may not fit in one rank's memory. DCP also gathers the whole model "
            "to rank 0 first and writes a single file.",
        ),
        # per-block wrapping does not move fewer bytes
        (
            "lesson2",
            "q_why_wrap_per_block",
            "Each block is gathered, used and freed in turn, so the peak is about one block, "
            "and wrapping per block halves the bytes sent per step.",
        ),
    ],
)
def test_a_false_statement_beside_right_ones_makes_it_wrong(lesson, qid, answer):
    r = quizzes.grade(lesson, qid, answer, "zh" if claims.CJK_RE.search(answer) else "en")
    assert r.verdict == "wrong" and r.details["false"], r.feedback


@pytest.mark.parametrize(
    "lesson,qid,answer",
    [
        # half of the answer: the mechanism without its trade-off, the heavy traffic without what
        # crosses
        (
            "lesson1",
            "q_full_vs_shard_grad_op",
            "After forward FULL_SHARD reshards the parameters; SHARD_GRAD_OP holds on to them "
            "until backward.",
        ),
        (
            "lesson8",
            "q_hsdp_why",
            "Because the reduce-scatters and all-gathers of the shard group then happen inside one "
            "node.",
        ),
        # a noun phrase is no condition: '自己那个小 batch' says nothing about when to sync
        (
            "lesson6",
            "q_bn_sync",
            "每个 rank 拿自己那个小 batch 算均值和方差，"
            "和全局的不一样，所以输出和梯度都和单卡不同。",
        ),
        # loose words for the heavy traffic: 'the communication' is not the all-gathers
        (
            "lesson8",
            "q_hsdp_why",
            "The network between nodes is slow, so we keep the communication inside the node.",
        ),
    ],
)
def test_each_key_idea_needs_its_own_evidence(lesson, qid, answer):
    r = quizzes.grade(lesson, qid, answer, "zh" if claims.CJK_RE.search(answer) else "en")
    assert r.verdict == "wrong" and r.details["reason"] == "partial" and r.details["missing"], (
        r.feedback
    )


@pytest.mark.parametrize(
    "answer,verdict",
    [
        # a frame announces what follows, an elliptic denial repeats the statement before it: both
        # read
        (
            "What differs is the fate of the gathered weights. FULL_SHARD drops them after forward "
            "and gathers them again in backward; SHARD_GRAD_OP does not.",
            "correct",
        ),
        (
            "区别在于前向之后参数怎么处理。FULL_SHARD 前向后释放参数、反向再 all-gather "
            "一次；SHARD_GRAD_OP 则不会。",
            "correct",
        ),
        # a frame that names a subject states something about it: not a frame
        (
            "The key is that SHARD_GRAD_OP compresses its parameters. FULL_SHARD drops them after "
            "forward and gathers them again in backward.",
            "unsure",
        ),
    ],
)
def test_frames_and_elliptic_denials_are_read(answer, verdict):
    r = quizzes.grade(
        "lesson1", "q_full_vs_shard_grad_op", answer, "zh" if claims.CJK_RE.search(answer) else "en"
    )
    assert r.verdict == verdict, r.feedback


def test_a_statement_in_the_course_vocabulary_is_checked_whatever_the_question_topic():
    """An added sentence about activations under a question about wrapping is still checked."""
    r = quizzes.grade(
        "lesson2",
        "q_why_wrap_per_block",
        "每个 block 算完就释放参数，所以峰值只有一两个 block，下一个 block 还能提前 all-gather。"
        "另外这样每个 rank 只需要存 1/N 的激活。",
        "zh",
    )
    assert r.verdict == "unsure" and "1/N" in r.details["unread"][0], r.feedback
    assert (
        quizzes.grade(
            "lesson2",
            "q_why_wrap_per_block",
            "Each block is gathered, used and freed in turn, so the peak is about one block, and "
            "the next block is prefetched. I learned this yesterday.",
        ).verdict
        == "correct"
    )


@pytest.mark.parametrize(
    "answer,lang",
    [
        (
            "Sync BatchNorm when the per-rank batch is large, because each rank normalises with "
            "its own micro-batch's statistics, not the global batch's.",
            "en",
        ),
        (
            "每个 rank 的 batch 很大的时候才需要同步 BN，因为各 rank 用自己微批的均值方差；batch "
            "小的时候各 rank 的统计量跟全局差不多。",
            "zh",
        ),
    ],
)
def test_the_batch_size_condition_the_wrong_way_round_is_wrong(answer, lang):
    r = quizzes.grade("lesson6", "q_bn_sync", answer, lang)
    assert r.verdict == "wrong" and r.details["false"], r.feedback


def test_a_clause_after_a_comma_is_not_read_by_the_phrasing_before_it():
    q = quizzes.load_bank("lesson0").question("q_torchrun_setup")
    reading = claims.read_answer(
        "It starts one process per GPU and restarts them, sets RANK, LOCAL_RANK and WORLD_SIZE, "
        "and MASTER_ADDR for the rendezvous, and it also copies the model to every GPU.",
        q.secret,
    )
    assert any(
        "[and it also copies the model to every gpu] about the topic" in t for t in reading.trace
    ), reading.trace


def test_a_subject_in_a_relative_clause_is_not_the_subject():
    """'what you pass' names YOU inside a relative clause: the statement is about LOCAL_RANK."""
    r = quizzes.grade(
        "lesson0",
        "q_torchrun_setup",
        "torchrun starts one process per GPU on each node and restarts it when it fails. Each "
        "process finds RANK, LOCAL_RANK and WORLD_SIZE in its environment, and MASTER_ADDR and "
        "MASTER_PORT say where to rendezvous. LOCAL_RANK is what you hand to "
        "torch.cuda.set_device.",
    )
    assert r.verdict != "wrong" and not r.details["false"], r.feedback


@pytest.mark.parametrize(
    "lesson,qid,answer,lang",
    [
        # the one an action is done for is not its subject ('帮你', 'for you')
        (
            "lesson0",
            "q_torchrun_setup",
            "torchrun 帮你把活都干了：每个节点每张卡起一个进程，挂了会重启。"
            "每个进程的身份是通过环境变量传进去的（RANK、LOCAL_RANK、WORLD_SIZE），"
            "MASTER_ADDR 和 MASTER_PORT 用来会合。",
            "zh",
        ),
        # a bottleneck of memory is not a slow network
        (
            "lesson3",
            "q_when_worth_it",
            "no_sync skips K-1 of the K reduce-scatters, but every rank holds the full unsharded "
            "gradient meanwhile. Worth it on a slow network with a large K; not worth it when "
            "memory is the bottleneck.",
            "en",
        ),
    ],
)
def test_right_answers_that_once_read_as_false(lesson, qid, answer, lang):
    r = quizzes.grade(lesson, qid, answer, lang)
    assert r.verdict != "wrong" and not r.details["false"], r.feedback


def test_what_a_colon_introduces_completes_the_clause():
    q = quizzes.load_bank("lesson0").question("q_torchrun_setup")
    reading = claims.read_answer(
        "For every process it fills in the environment: RANK, LOCAL_RANK and WORLD_SIZE.", q.secret
    )
    assert "env" in reading.supported and not reading.unread, reading.trace


def test_only_while_is_a_condition_not_a_new_clause():
    assert [
        c.norm
        for c in claims.clauses(
            "FSDP gathers a unit's weights only while it runs, but frees them after"
        )
    ] == ["fsdp gathers a unit's weights only while it runs", "frees them after"]


def test_elliptic_denial_with_an_apostrophe():
    r = quizzes.grade(
        "lesson6",
        "q_ddp_hides_init",
        "DDP broadcasts rank 0's parameters in its constructor, so all ranks start the same. FSDP "
        "doesn't; each rank keeps the shard of its own init, so the gathered model mixes the "
        "ranks' inits.",
    )
    assert r.verdict == "correct", r.feedback


def test_a_modal_makes_a_requirement_not_a_state():
    """'one rank must hold the entire model' is what a full state dict needs, not a claim that
    a rank holds it."""
    r = quizzes.grade(
        "lesson4",
        "q_why_not_torch_save",
        "Each rank owns only a slice of every parameter. A full state dict is a gather every rank "
        "has to join, and then one rank must hold the entire model in memory; DCP saves the slices "
        "with metadata and loads them on another world size.",
    )
    assert r.verdict != "wrong" and not r.details["false"], r.feedback
    r = quizzes.grade(
        "lesson4",
        "q_why_not_torch_save",
        "Every rank holds the entire model, so torch.save just works.",
    )
    assert r.verdict == "wrong" and r.details["false"], r.feedback


def test_a_clause_about_the_alternative_denies_nothing():
    r = quizzes.grade(
        "lesson6",
        "q_bn_sync",
        "Sync them when the per-rank batch is small: otherwise every rank normalises with its own "
        "micro-batch's mean and variance, not the global batch's, so the outputs differ.",
    )
    assert r.verdict == "correct", r.feedback


# --- mechanisms that read a true sentence as false (held-out round 2) --------------------------


@pytest.mark.parametrize(
    "lesson,qid,lang,text",
    [
        # a trade's turn: what is paid is not what is saved ('...' does not cross it)
        (
            "lesson1",
            "q_full_vs_shard_grad_op",
            "en",
            "FULL_SHARD frees the gathered parameters after forward and all-gathers them again in "
            "backward; SHARD_GRAD_OP keeps them until backward, saving the second all-gather at "
            "the expense of memory.",
        ),
        # a role: what the shards are, not a copy they have
        (
            "lesson9",
            "q_master_copy_why",
            "en",
            "ZeRO-3 keeps a separate fp32 master copy of its partition even in fp32 training. "
            "FSDP2 steps the parameter shards in place and needs no copy: the fp32 shards serve "
            "as the master weights.",
        ),
        # a remedy says what to do, not what the subject does by default
        (
            "lesson6",
            "q_ddp_hides_init",
            "en",
            "DDP broadcasts rank 0's parameters and buffers when it is constructed, so the ranks' "
            "different inits never show. FSDP does not broadcast: each rank keeps the shard of its "
            "own init. The fix: one seed everywhere, or sync_module_states=True in FSDP.",
        ),
        # a verb that undoes its object, denied: the own init is kept
        (
            "lesson6",
            "q_ddp_hides_init",
            "zh",
            "DDP 构造时会把 rank 0 的参数广播给所有 rank。FSDP 默认不广播，"
            "没有任何东西覆盖每个 rank 自己的初始化，每个 rank 保留的是自己那份初始化的分片。",
        ),
    ],
)
def test_true_sentences_are_not_read_as_false(lesson, qid, lang, text):
    r = quizzes.grade(lesson, qid, text, lang)
    assert r.verdict != "wrong" and not r.details["misconceptions"], (r.details, r.feedback)


@pytest.mark.parametrize(
    "lesson,qid,lang,text",
    [
        (
            "lesson1",
            "q_full_vs_shard_grad_op",
            "en",
            "SHARD_GRAD_OP frees the parameters after forward to save memory, at the cost of a "
            "second all-gather in backward.",
        ),
        (
            "lesson6",
            "q_ddp_hides_init",
            "en",
            "DDP overwrites every rank's own init with rank 0's when it is built; FSDP also "
            "overwrites each rank's own init.",
        ),
    ],
)
def test_the_same_mechanisms_still_catch_the_false_way_round(lesson, qid, lang, text):
    r = quizzes.grade(lesson, qid, text, lang)
    assert r.verdict == "wrong" and r.details["misconceptions"], (r.details, r.feedback)


@pytest.mark.parametrize(
    "text,is_list",
    [
        # a long list with one item that could be read as a verb phrase is still a list
        ("sharding, prefetching, gathered params, memory, backward, forward, communication", True),
        # ... or an item of spaced terms
        ("分片、all-gather、集合通信、rank 0、检查点、DCP 元数据 FULL_STATE_DICT 优化器状态", True),
        # a statement with commas is not
        (
            "FULL_SHARD frees the parameters, SHARD_GRAD_OP keeps them, so it uses more memory",
            False,
        ),
        ("它为每个 GPU 启动一个进程，并设置 RANK、LOCAL_RANK、WORLD_SIZE 这些环境变量", False),
    ],
)
def test_keyword_lists_with_a_stray_item(text, is_list):
    assert claims.keyword_list(text) is is_list


@pytest.mark.parametrize(
    "lang,text",
    [
        (
            "en",
            "Each block is gathered just before it computes and freed right after, so the peak of "
            "full parameters is about one block, not the whole model, and the next block's "
            "all-gather is prefetched while the current one computes. Without a wrap policy, the "
            "root unit holds every parameter and they are all gathered together.",
        ),
        (
            "zh",
            "按 block 包以后，每个 block 算之前才 all-gather，算完马上释放，峰值只有大约一个 block "
            "的参数，而不是整个模型；下一个 block 的 all-gather 还能和当前 block 的计算重叠。"
            "不按 block 包的话，root 就是整个模型，前向一开始所有参数一起 gather 进来。",
        ),
        (
            "zh",
            "按 block 包的好处：\n每个 block 算之前才 all-gather，算完马上释放，"
            "峰值只有大约一个 block 的参数，而不是整个模型；"
            "下一个 block 的 all-gather 还能和当前 block 的计算重叠。",
        ),
    ],
)
def test_what_the_alternative_does_and_a_heading_are_read(lang, text):
    """A sentence about the alternative ('Without a wrap policy ...', '不按 block 包的话 ...')
    and a heading ('...的好处：') leave nothing unread: they credit nothing either."""
    r = quizzes.grade("lesson2", "q_why_wrap_per_block", text, lang)
    assert r.verdict == "correct" and not r.details["unread"], r.details


def test_a_comparison_stated_of_its_rival_is_a_swap():
    """A restriction true of one subject (a plain sharded save loads only at the same world size)
    stated of its rival (DCP) is caught and quoted."""
    r = quizzes.grade(
        "lesson4",
        "q_why_not_torch_save",
        "Each rank holds only its shard of the parameters and optimizer state, so a full state "
        "dict needs an all-gather every rank joins and the whole model in one rank's memory. But "
        "a checkpoint written with DCP can still only be read back at the same world size.",
    )
    assert r.verdict == "wrong" and "You wrote: «But a checkpoint written with DCP" in r.feedback


def test_a_relative_clause_is_read_with_the_noun_it_describes():
    """', which is ...' says it of the noun right before it: RANK and LOCAL_RANK swapped inside
    relative clauses is caught and quoted; the right way round is not."""
    swapped = quizzes.grade(
        "lesson0",
        "q_torchrun_setup",
        "It launches one worker per GPU and watches them, restarting on failure, and it exports "
        "LOCAL_RANK, which is the global index across all nodes, and WORLD_SIZE and MASTER_ADDR "
        "so the workers can meet.",
    )
    assert (
        swapped.verdict == "wrong"
        and "rank_local_rank_swapped" in swapped.details["misconceptions"]
    )
    right = quizzes.grade(
        "lesson0",
        "q_torchrun_setup",
        "It launches one worker per GPU and watches them, restarting on failure, and it exports "
        "RANK, which is the global index across all nodes, and WORLD_SIZE and MASTER_ADDR so the "
        "workers can meet.",
    )
    assert right.verdict != "wrong" and not right.details["misconceptions"], right.details


def test_connectives_split_clauses_but_not_the_words_they_are_part_of():
    parts = [
        c
        for _, c in claims.split_clauses(
            "按 block 包之后反而更快，而且显存更少；前者释放而后者保留"
        )
    ]
    assert parts == ["按 block 包之后反而更快", "而且显存更少", "前者释放", "后者保留"]


def test_a_negative_object_denies_the_verb():
    """'FSDP frees nothing until the end of backward' denies that it frees."""
    r = quizzes.grade(
        "lesson2",
        "q_why_wrap_per_block",
        "With per-block units FSDP gathers one block at a time, but it frees nothing until the end "
        "of backward, so the whole model's parameters are in memory at the peak anyway.",
    )
    assert r.verdict == "wrong" and r.details["misconceptions"], r.details


@pytest.mark.parametrize(
    "tail,false",
    [
        ("Only ZeRO-3 keeps a separate master copy, ZeRO-1 and ZeRO-2 do not.", True),
        ("ZeRO-3 keeps a separate master copy, FSDP2 does not.", False),
    ],
)
def test_an_elliptic_denial_of_the_subject_the_statement_was_about_is_false(tail, false):
    """'X does it, Y does not' is fine of the rival; denied of the same subject ('ZeRO-1 and
    ZeRO-2 do not', the bank's one ZeRO) it contradicts what is true of that subject."""
    r = quizzes.grade(
        "lesson9",
        "q_master_copy_why",
        "ZeRO-3 keeps a separate fp32 master copy of its partition even in fp32, 4P/N more bytes "
        "per rank; FSDP2's AdamW steps the parameter shards in place, so it needs no copy. " + tail,
    )
    assert (r.verdict == "wrong" and bool(r.details["misconceptions"])) is false, r.details


@pytest.mark.parametrize(
    "lang,text,false",
    [
        (
            "en",
            "Each block is gathered, used and freed in turn, so about one block is unsharded at a "
            "time. Finer wrapping would be faster still, so wrap every Linear.",
            True,
        ),
        (
            "en",
            "Each block is gathered, used and freed in turn, so about one block is unsharded at a "
            "time. Finer wrapping would not be faster: many tiny all-gathers, each paying latency.",
            False,
        ),
        (
            "zh",
            "不包的话 FSDP 也是一个 block 一个 block 地 gather，按 block 包以后反而所有 block 一起 "
            "all-gather。",
            True,
        ),
    ],
)
def test_granularity_and_policy_swaps_are_caught(lang, text, false):
    r = quizzes.grade("lesson2", "q_why_wrap_per_block", text, lang)
    assert bool(r.details["misconceptions"]) is false, r.details


@pytest.mark.parametrize(
    "lang,gain,text",
    [
        (
            "en",
            True,
            "Until the last micro-batch, the first K-1 micro-batches do not reduce-scatter.",
        ),
        ("zh", True, "前 K-1 个微批都不用 reduce-scatter，到最后一个才同步。"),
        ("zh", True, "K 次 reduce-scatter 省掉了 K-1 次。"),
        ("en", False, "The first K-1 micro-batches reduce-scatter as usual."),
    ],
)
def test_the_saving_stated_as_a_denial_is_credited(lang, gain, text):
    """'the first K-1 micro-batches do not reduce-scatter' states the gain as skipping does; said
    affirmatively it states nothing (no misconception either)."""
    r = quizzes.grade("lesson3", "q_when_worth_it", text, lang)
    assert ("gain" not in r.details["missing"]) is gain and not r.details["misconceptions"], (
        r.details
    )


@pytest.mark.parametrize(
    "lang,text",
    [
        (
            "en",
            "The all-gathers and reduce-scatters stay inside a node on NVLink, and only a small "
            "all-reduce of the gradient shards crosses the slower network between nodes. The price "
            "is memory: each node holds a full copy of the sharded state.",
        ),
        (
            "zh",
            "分片组的 all-gather 和 reduce-scatter 都留在节点内走 NVLink，"
            "跨节点只有梯度分片的一次小 all-reduce。节点内带宽比节点间高得多。"
            "代价是显存：每个节点都存一整份分片状态。",
        ),
    ],
)
def test_true_side_remarks_of_the_hsdp_answer_are_read(lang, text):
    r = quizzes.grade("lesson8", "q_hsdp_why", text, lang)
    assert r.verdict == "correct" and not r.details["unread"], r.details


def test_an_enumeration_with_dun_commas_is_read_as_one_statement():
    """'两者都把参数、梯度、优化器状态分片' is one statement (a known neutral remark of lesson 1),
    though 、 separates its items."""
    r = quizzes.grade(
        "lesson1",
        "q_full_vs_shard_grad_op",
        "两者都把参数、梯度、优化器状态分片。FULL_SHARD 前向之后释放参数，反向再 all-gather 一次；"
        "SHARD_GRAD_OP 保留到反向，显存更多。",
        "zh",
    )
    assert r.verdict == "correct" and not r.details["unread"], r.details


@pytest.mark.parametrize(
    "tail,false",
    [
        ("Under DDP the different seeds are harmless.", False),
        ("Under FSDP the different seeds are harmless too.", True),
    ],
)
def test_a_misconception_true_of_one_subject_is_false_only_of_the_others(tail, false):
    """lesson 6's 'harmless' is `true_of` DDP: said of DDP it is true, of FSDP it is not."""
    r = quizzes.grade(
        "lesson6",
        "q_ddp_hides_init",
        "DDP broadcasts rank 0's parameters and buffers when it is constructed. FSDP does not "
        "broadcast: each rank keeps the shard of its own init. " + tail,
    )
    assert ("harmless" in r.details["misconceptions"]) is false, r.details


@pytest.mark.parametrize(
    "first,false",
    [("FULL_SHARD", False), ("SHARD_GRAD_OP", True)],
)
def test_resharding_as_soon_as_forward_is_done_names_when(first, false):
    r = quizzes.grade(
        "lesson1",
        "q_full_vs_shard_grad_op",
        f"With {first} each unit reshards as soon as its forward is done, so backward has to "
        "all-gather the parameters again: less memory, more communication.",
    )
    assert ("when_freed" not in r.details["missing"]) is not false, r.details
    assert bool(r.details["misconceptions"]) is false, r.details


def test_a_verb_that_undoes_reaches_only_its_own_object():
    """'discards' denies what it discards, not a later verb of the clause ('gathers them anew')."""
    r = quizzes.grade(
        "lesson1",
        "q_full_vs_shard_grad_op",
        "FULL_SHARD discards each unit's gathered parameters once its forward ends and gathers "
        "them anew for backward; SHARD_GRAD_OP keeps them until backward and uses more memory.",
    )
    assert r.verdict == "correct" and not r.details["misconceptions"], r.details


def test_denying_a_bare_noun_phrasing_denies_nothing():
    """'not dominated by latency' denies the latency, not the granularity trade-off it names."""
    r = quizzes.grade(
        "lesson2",
        "q_why_wrap_per_block",
        "Each block is gathered, used and freed in turn, so about one block is unsharded at a "
        "time, not the whole model, and the next block's all-gather overlaps with the current "
        "block's compute. Blocks are big enough that each collective is not dominated by latency.",
    )
    assert not r.details["misconceptions"] and r.verdict != "wrong", r.details


@pytest.mark.parametrize(
    "lang,text",
    [
        (
            "en",
            "When each rank only has a few samples its own batch statistics are far from the "
            "global ones, so sync. With a large per-rank batch of the same distribution it isn't "
            "necessary.",
        ),
        (
            "zh",
            "看每张卡上的 batch 大不大。"
            "每个 rank 只有几个样本时，自己算的均值和方差跟全局差很多，要同步。",
        ),
    ],
)
def test_bn_sync_side_remarks_and_what_it_depends_on_are_read(lang, text):
    r = quizzes.grade("lesson6", "q_bn_sync", text, lang)
    assert not r.details["unread"] and r.verdict == "correct", r.details


@pytest.mark.parametrize(
    "lang,text,verdict",
    [
        (
            "zh",
            "torchrun 在每个节点上给每张卡起一个进程，进程挂了可以重启；"
            "每个进程的环境变量里有 RANK、LOCAL_RANK、WORLD_SIZE 和 MASTER_ADDR。"
            "LOCAL_RANK 是节点内的编号，用来选卡。",
            "correct",
        ),
        (
            "en",
            "It starts one process per GPU and restarts them when one fails, and sets RANK, "
            "LOCAL_RANK, WORLD_SIZE and MASTER_ADDR/PORT in each one's environment. That is why "
            "init_process_group with env:// needs no arguments.",
            "correct",
        ),
        (
            "en",
            "It starts one process per GPU and restarts them when one fails, and sets RANK, "
            "LOCAL_RANK, WORLD_SIZE and MASTER_ADDR/PORT in each one's environment. LOCAL_RANK is "
            "the global index across all nodes.",
            "wrong",
        ),
    ],
)
def test_torchrun_side_remarks_are_read_and_the_swap_still_caught(lang, text, verdict):
    r = quizzes.grade("lesson0", "q_torchrun_setup", text, lang)
    assert r.verdict == verdict, r.details


# --- how fresh writers write: abbreviations, API names, arrows, negation scope --------------------

MINI = {
    "subjects": {"DCP": _bi(["dcp"], ["dcp"]), "FSDP": _bi(["fsdp"], ["fsdp"])},
    "claims": [
        {
            "id": "differs",
            "label": _bi("local statistics differ", "本地统计量不同"),
            "forms": [{"says": _bi(["differ*"], ["不同"]), "wrong": _bi("they differ", "不同")}],
        },
        {
            "id": "full_grad",
            "label": _bi("it holds the full gradient", "它持有完整梯度"),
            "forms": [
                {
                    "says": _bi(["(full|complete) grad*"], ["完整梯度"]),
                    "wrong": _bi("it holds the full gradient", "它持有完整梯度"),
                }
            ],
        },
        {
            "id": "copy",
            "label": _bi("it needs a copy", "它需要副本"),
            "forms": [
                {"says": _bi(["need* ... copy"], ["用 ... 副本"]), "wrong": _bi("it does", "要")}
            ],
        },
        {
            "id": "metadata",
            "label": _bi("DCP's metadata allows resharding", "DCP 的元数据允许换布局"),
            "forms": [
                {
                    "subject": "DCP",
                    "says": _bi(["(metadata|load* ... another world size)"], ["元数据"]),
                    "wrong": _bi("DCP's metadata is what allows it", "正是 DCP 的元数据"),
                }
            ],
        },
    ],
    "topic": _bi(["grad*", "copy", "metadata"], ["梯度", "副本", "元数据"]),
    "reference": _bi("ref", "参考"),
}


def test_abbreviations_are_read_as_the_words_phrasings_use():
    norm = claims.normalise("SGO keeps params fwd->bwd: 1 AG, 2 AGs, an RS, an AR, lowest mem")
    for words in ("shard grad op", "forward", "backward", "1 all gather", "2 all gathers"):
        assert words in norm
    assert "reduce scatter" in norm and "all reduce" in norm and "lowest memory" in norm
    assert "memory" in read("SGO uses more mem than FULL_SHARD.").supported
    # a bank that writes the abbreviation still matches the answer that spells it out
    assert claims.compile_phrase("more mem").search(claims.normalise("it uses more memory"))
    assert claims.normalise("a bag of rags") == "a bag of rags"  # whole words only


def test_a_verb_after_two_collectives_named_together():
    assert claims.carries_verb(claims.normalise("AG/RS stay on fast NVLink inside the node"))
    # a noun phrase is not a verb: 'one block at a time'
    assert not claims._is_verb_form("one block at a time".split(), 1)


def test_a_keyword_argument_names_a_switch_and_states_nothing():
    # read as words, 'reshard_params=False' would state that SHARD_GRAD_OP reshards the params
    r = read("In FSDP2 SHARD_GRAD_OP is reshard_params=False.")
    assert not r.misconceptions and not r.unread
    assert any("names an API" in t for t in r.trace)
    r = read("FSDP2 里 SHARD_GRAD_OP 对应的开关就是 reshard_params=False")
    assert not r.misconceptions and not r.unread
    # an upper-case constant is a subject, not a keyword argument
    assert "full shard" in claims.normalise("FULL_SHARD=free after fwd")
    r = read("FULL_SHARD=frees the params after fwd")
    assert "frees" in r.supported


def test_arrows_between_points_and_between_statements():
    assert [c.norm for c in claims.clauses("SGO keeps params fwd->bwd")] == [
        "shard grad op keeps params forward to backward"
    ]
    assert "rank 0到所有 rank" in claims.clauses("DDP 构造时 rank 0 → 所有 rank")[0].norm
    # an arrow between statements: the denial before it does not reach past it
    r = read("FULL_SHARD: nothing kept -> frees the parameters after forward.")
    assert "frees" in r.supported and not r.misconceptions


def test_dashes_split_clauses_and_so_big_that_does_not():
    assert len(claims.clauses("FSDP has no such step — classic FSDP only does it on request")) == 2
    assert len(claims.clauses("Skip it when the model is so big that a rank can't hold it")) == 1
    assert claims._REMEDY.match(claims.normalise("and the fixes are the same seed"))


@pytest.mark.parametrize(
    "text,supported",
    [
        # a denial reaches its verb across adverbs and a prepositional phrase
        ("SHARD_GRAD_OP 不会在前向之后继续释放参数。", True),
        ("SHARD_GRAD_OP 不在前向后释放参数。", True),
        ("SHARD_GRAD_OP 前向之后不会把参数释放掉。", True),
        ("FULL_SHARD 不在前向后释放参数。", False),
        # 不能不 is a double negation: it must
        ("FULL_SHARD 不能不释放参数。", True),
        # one denial before both subjects
        ("Neither SHARD_GRAD_OP nor the latter frees the parameters.", True),
        # denied, unless the subject named after 'unless'
        ("Nothing frees the parameters unless it is FULL_SHARD.", True),
    ],
)
def test_negation_scope_of_fresh_writers(text, supported):
    r = read(text)
    if supported:
        assert "frees" in r.supported and not r.misconceptions, r.trace
    else:
        assert [m[0] for m in r.misconceptions] == ["frees"], r.trace


def test_negation_still_stops_at_another_verb():
    # 不 denies 分片, not the memory the unsharded gradient costs
    assert claims._reaches("梯度不分片会多占显存", 2, 5) is False
    assert claims._reaches("不会在前向之后继续持有", 1, 9) is True


def test_chinese_gap_does_not_read_past_a_comparative():
    # 显存低通信更多: 低 is said of 显存, 更多 of 通信
    assert "memory" not in read("SHARD_GRAD_OP 显存低通信更多。").supported
    assert "memory" in read("SHARD_GRAD_OP 的显存占用更多。").supported


def test_double_negations_and_conditions():
    mini = lambda text: claims.read_answer(text, MINI)  # noqa: E731
    # 不同步 is 不 + 同步 ("not in sync"), not 不同 ("different")
    assert "differs" not in mini("FSDP 不切也不同步这些 buffer。").supported
    assert "differs" in mini("每个 rank 的统计量不同。").supported
    # a noun phrase denied: what is denied is holding it, not the claim it names
    r = mini("Skip it when a rank can't hold one full gradient.")
    assert not r.misconceptions
    # 用不着: the cue is its 不, inside the phrasing's gap
    r = mini("FSDP2 用不着副本。")
    assert [m[0] for m in r.misconceptions] == ["copy"]
    # without X, can't Y: X is what Y needs
    r = mini("没有 DCP 的元数据就没法换 world size 加载。")
    assert "metadata" in r.supported and not r.misconceptions, r.trace
    r = mini("DCP 没有元数据。")  # a plain denial is still one
    assert [m[0] for m in r.misconceptions] == ["metadata"], r.trace


def test_a_requirement_before_a_negated_form_states_nothing():
    r = read("A full state dict needs one rank to hold the whole model in memory.")
    assert not r.misconceptions


def test_a_topic_form_denied_of_a_subject_named_in_the_sentence_is_no_misconception():
    mini = lambda text: claims.read_answer(text, MINI)  # noqa: E731
    # what DCP does not need, said of DCP named before the colon
    r = mini("用 DCP 就没这些问题：每个 rank 写自己的那份，不会持有完整梯度。")
    assert not r.misconceptions, r.trace
    # said on its own, the denial is still a misconception
    r = mini("用 DCP 就没这些问题。不会持有完整梯度。")
    assert [m[0] for m in r.misconceptions] == ["full_grad"], r.trace


@pytest.mark.parametrize(
    "sentence",
    [
        "It's a memory-vs-communication knob.",
        "So SHARD_GRAD_OP is a memory-for-communication swap.",
        "后者本质上是拿显存换通信。",
        "I believe it's about the peak memory.",
        "关键就差在一次广播。",
    ],
)
def test_frames_fresh_writers_use_are_read_and_credit_nothing(sentence):
    r = read("FULL_SHARD frees the parameters after forward. " + sentence)
    assert not r.unread and not r.misconceptions and set(r.supported) == {"frees"}, r.trace


PERSON = {
    "subjects": {"YOU": _bi(["you", "yourself"], ["你", "你自己"])},
    "claims": [
        {
            "id": "env",
            "label": _bi("the launcher sets RANK", "启动器设置 RANK"),
            "forms": [
                {
                    "rival": "YOU",
                    "says": _bi(["(set*|writ*) ... rank"], ["(设置|写) ... rank"]),
                    "wrong": _bi("the launcher sets it", "由启动器设置"),
                    "swapped": _bi("the launcher sets it, not you", "是启动器设置的，不是你"),
                }
            ],
        }
    ],
    "topic": _bi(["rank*"], ["rank"]),
    "reference": _bi("ref", "参考"),
}


def test_the_person_addressed_is_not_carried_over_to_a_clause_with_its_own_agent():
    person = lambda text: claims.read_answer(text, PERSON)  # noqa: E731
    for text in (
        "You don't compute anything yourself: torchrun writes RANK into the environment.",
        "你不用自己算。torchrun 在每个节点上给每个进程设置 RANK。",
    ):
        r = person(text)
        assert "env" in r.supported and not r.misconceptions, r.trace
    # named in the clause, or carried over to a clause with no agent of its own: still the person
    assert [m[0] for m in person("You set RANK yourself.").misconceptions] == ["env"]
    assert [m[0] for m in person("You start the job, and then set RANK.").misconceptions] == ["env"]


def test_a_denial_right_before_a_phrasing_that_names_its_subject_denies_it():
    secret = copy.deepcopy(PERSON)
    secret["misconceptions"] = [
        {
            "id": "manual",
            "says": _bi(["you (set|pass) ... yourself"], ["自己手动传"]),
            "wrong": _bi("the launcher passes it", "启动器会传"),
        }
    ]
    assert not claims.read_answer(
        "不用自己手动传 rank，torchrun 会设置 RANK。", secret
    ).misconceptions
    r = claims.read_answer("要自己手动传 rank。", secret)
    assert [m[0] for m in r.misconceptions] == ["manual"]


def test_a_bulleted_line_is_a_statement_not_a_keyword_list():
    line = (
        "- Each worker gets RANK, LOCAL_RANK and WORLD_SIZE, plus MASTER_ADDR/MASTER_PORT for the "
        "rendezvous, as environment variables."
    )
    assert not claims.keyword_list(line)
    # a flag stays a term, and a bulleted run of terms is still a list
    assert claims.keyword_list("- RANK, LOCAL_RANK, WORLD_SIZE, --max-restarts")
    assert claims.keyword_list(
        "sharded state dict, FULL_STATE_DICT, all-gather, rank 0, DCP, get_state_dict, metadata"
    )


@pytest.mark.parametrize(
    "text,verb",
    [
        ("the copy costs 8P/N bytes per rank", True),  # an -s verb after a singular noun
        ("nothing big crosses nodes", True),
        ("Keep those inside a node", True),  # an instruction
        ("Put the shard group inside a node", True),
        ("all-reduce the grads across the replicas", True),
        ("reshard after fwd", True),  # a note
        ("起 worker + 设 env", True),
        ("optimizer states", False),  # a noun phrase stays one
        ("copy of the model", False),
        ("peak memory", False),
        ("the gradient shards", False),
    ],
)
def test_notes_instructions_and_s_verbs_after_a_singular_noun_are_statements(text, verb):
    assert claims.carries_verb(claims.normalise(text)) is verb


def test_a_verb_opening_an_item_after_a_comma_does_not_make_a_list_a_statement():
    r = read("peak memory, one block at a time, prefetch, overlap, reshard after use")
    assert r.stated_sentences == 0
    r = read("Keep those inside a node, so nothing big crosses nodes.")
    assert r.stated_sentences == 1


@pytest.mark.parametrize(
    "text",
    [
        "It's not that full shard frees the params after forward.",
        "Nor does full shard free the params after forward.",
        "不是前者释放了参数。",
    ],
)
def test_a_denial_before_the_subject_denies_the_whole_clause(text):
    r = read(text)
    assert "frees" not in r.supported and [m[0] for m in r.misconceptions] == ["frees"], r.trace
    # without it the same clause is the statement
    plain = read(re.sub(r"^(It's not that|Nor does|不是)\s?", "", text).replace("free ", "frees "))
    assert "frees" in plain.supported, plain.trace


@pytest.mark.parametrize(
    "text",
    [
        "不包的话就是整个模型一次性收集",
        "不做 wrap 的话 root 就是整个模型",
        "不按 block 包，峰值就是整模型",
    ],
)
def test_not_wrapping_opens_a_sentence_about_the_alternative(text):
    assert claims._COUNTERFACTUAL.match(claims.normalise(text))
    # '包' alone is no denial of wrapping ('不包括' is 'does not include')
    assert not claims._COUNTERFACTUAL.match(claims.normalise("不包括优化器状态"))


def test_a_verb_that_undoes_does_not_reach_across_and():
    r = quizzes.grade(
        "lesson6",
        "q_ddp_hides_init",
        "DDP overwrites the other ranks' weights and each rank keeps its own init.",
        "en",
    )
    assert r.details["misconceptions"], r.details


def test_a_note_keeps_its_verb_before_an_adjective_and_its_thing():
    assert claims.carries_verb(claims.normalise("keep full params fwd->bwd"))
    # a comparative before a thing is a noun phrase
    assert not claims.carries_verb(claims.normalise("lower peak memory"))


@pytest.mark.parametrize(
    "text,false",
    [
        (
            "Each worker gets LOCAL_RANK, its global index over the whole job, plus WORLD_SIZE.",
            True,
        ),
        ("Each worker gets RANK, its global index over the whole job, plus WORLD_SIZE.", False),
    ],
)
def test_a_description_after_a_name_is_read_of_that_name(text, false):
    r = quizzes.grade("lesson0", "q_torchrun_setup", text, "en")
    assert bool(r.details["misconceptions"]) is false, (r.details, r.feedback)


@pytest.mark.parametrize(
    "text,false",
    [
        ("分片文件没有 DCP 的元数据也没法换布局加载。", False),  # 没法 reaches past 换布局
        ("没有 DCP 的元数据就没法在别的布局上加载。", False),
        ("没有 DCP 的元数据也能换 world size 加载。", True),
    ],
)
def test_without_its_own_without_and_a_chinese_modal_denial(text, false):
    r = quizzes.grade("lesson4", "q_why_not_torch_save", text, "zh")
    assert bool(r.details["misconceptions"]) is false, (r.details, r.feedback)


def test_a_denial_of_redoing_is_not_a_denial_of_the_thing():
    # '没法重新切分' denies re-sharding: it reaches no phrasing of sharding itself
    assert not claims._reaches("也没法重新切分", 2, 5)
    assert claims._reaches("也没法切分", 2, 3)


@pytest.mark.parametrize(
    "text",
    [
        "FULL_SHARD frees each block after its forward. The root stays gathered from forward to "
        "backward.",
        "FULL_SHARD 每个 block 前向后就释放。根单元从前向一直留到反向。",
    ],
)
def test_a_clause_about_the_root_unit_takes_no_subject_from_before(text):
    r = quizzes.grade("lesson1", "q_full_vs_shard_grad_op", text, "zh" if "根" in text else "en")
    assert not r.details["misconceptions"], (r.details, r.feedback)


def test_a_misconception_entry_supposed_by_an_if_clause_is_no_statement():
    secret = copy.deepcopy(DEMO)
    r = claims.read_answer("If the shard size makes no difference, the model still trains.", secret)
    assert not r.misconceptions, r.trace
    r = claims.read_answer("There is no difference in memory at all.", secret)
    assert [m[0] for m in r.misconceptions] == ["same"], r.trace


def test_an_omission_after_the_phrasing_denies_it():
    assert claims._NEG_AFTER.match("第二次收集省掉了".replace("第二次收集", ""))
    assert claims._NEG_AFTER.match(" is skipped")


@pytest.mark.parametrize(
    "sentence",
    [
        "我理解 torchrun 主要干两件事。",
        "Basically torchrun does two jobs.",
        "The difference comes after forward.",
        "不同点在于 gather 出来的完整参数活多久。",
        "选择依据就是显存和带宽哪个更紧。",
        "这题其实就是看显存和通信哪个更紧张。",
    ],
)
def test_frames_that_announce_what_follows(sentence):
    assert claims._framing(sentence, {}), sentence
    # a frame is short: a long sentence with a count in it is a statement
    assert not claims._framing(
        "torchrun does two jobs and also shards the model over every rank so that each rank "
        "only keeps its own slice of the parameters.",
        {},
    )


def test_a_condition_with_its_own_negation_denies_nothing_around_it():
    # "而不是不 wrap 时的整个模型": the 不 of "when not wrapped" is the condition's
    cues = claims.negation_cues(claims.normalise("而不是不 wrap 时的整个模型"))
    assert len(cues) == 1, cues
    assert len(claims.negation_cues(claims.normalise("不分片的话整个模型都在"))) == 0
    # a negation of the verb itself still counts
    assert claims.negation_cues(claims.normalise("前向之后不释放参数"))


def test_a_number_with_a_slash_or_plus_is_one_item_of_a_note():
    note = "代价：重计算，反向阶段重新执行被检查点 block 的 forward，FLOPs 约 +1/3，不增加通信。"
    assert not claims.keyword_list(claims.sentences(note)[0])
    assert claims.keyword_list("get_state_dict/set_state_dict, DCP, .metadata")


def test_a_participle_before_its_noun_is_a_term_of_a_keyword_list():
    assert claims.keyword_list(
        "sharded params, sharded optimizer state, FULL_STATE_DICT, all-gather, collective, DCP"
    )
    assert not claims.keyword_list("freed after forward, gathered in backward, sharded")


@pytest.mark.parametrize(
    "text, n",
    [
        ("a model that only fits because it's sharded, so it pays off", 2),
        ("the optimizer never steps anything but the shards", 1),
        ("nothing but its slice is kept on the rank", 1),
        ("FSDP only shards but DDP replicates", 2),
        ("it is slow because every rank waits", 2),
    ],
)
def test_because_after_only_and_but_as_except_end_no_clause(text, n):
    assert len(claims.clauses(text)) == n, [c.norm for c in claims.clauses(text)]


@pytest.mark.parametrize(
    "text", ["why not wrap finer", "why don't we keep them", "为什么不包得更细"]
)
def test_a_why_not_question_denies_nothing(text):
    assert claims.negation_cues(claims.normalise(text)) == []
    assert claims.negation_cues(claims.normalise("we don't keep them"))


def test_nobody_is_a_negation_and_no_more_than_is_at_most():
    assert claims.negation_cues("nobody knows")
    m = claims.compile_phrase("holds ... one block").search(
        "no rank holds more than about one block"
    )
    assert claims._polarity("no rank holds more than about one block", m, 0)
    m = claims.compile_phrase("holds ... one block").search("no rank holds one block")
    assert not claims._polarity("no rank holds one block", m, 0)


@pytest.mark.parametrize(
    "sentence",
    [
        "Which one keeps the parameters in memory?",
        "Problem: the model needs too much memory on each GPU.",
        "Analogy: a library book. The former returns the book after reading, the latter keeps the "
        "parameters on its desk.",
        "打个比方，前者像借书看完就还，后者把参数一直放在桌上。",
        "For a 7B model on 8 GPUs that is 14 GB of parameters per rank.",
        "举个例子，7B 模型 8 卡，每张卡的参数大约 3.5GB。",
        "汇报一下参数和显存的问题。",
        "Firstly, it is important to understand what happens to the parameters.",
    ],
)
def test_questions_remarks_analogies_and_worked_examples_state_nothing(sentence):
    """A question, a remark about the answer itself, a restated problem, an analogy (to the end of
    its paragraph) and a worked example in numbers are read and credit nothing."""
    r = read(
        "The former frees the parameters after forward. The latter uses more memory. " + sentence
    )
    assert not r.unread and not r.misconceptions and set(r.supported) == {"frees", "memory"}, (
        r.trace
    )


def test_an_analogy_is_unread_while_a_key_idea_is_missing():
    """The missing key idea may be said in the analogy, in words no rule reads: unsure, not
    wrong."""
    r = read(
        "The former frees the parameters after forward. Analogy: a library book. The latter keeps "
        "the book on its desk, the model stays in memory."
    )
    assert r.unread == ["The latter keeps the book on its desk, the model stays in memory"], r.trace


def test_a_misconception_in_a_worked_example_is_still_false():
    r = read(
        "The former frees the parameters after forward. The latter uses more memory. For a 7B "
        "model there is no difference in memory, 14 GB each."
    )
    assert [m[0] for m in r.misconceptions] == ["same"], r.trace


def test_tldr_is_one_heading():
    """'TL;DR:' does not end a sentence at its semicolon."""
    assert claims.sentences("TL;DR: put the heavy traffic on NVLink.") == [
        "TLDR: put the heavy traffic on NVLink"
    ]


@pytest.mark.parametrize(
    "text",
    [
        "The latter keeps the parameters until backward and uses more memory. The main difference "
        "is when they free the parameters. The former frees them after forward.",
        "后者一直留着参数，显存更多。区别在于何时释放参数。前者在前向之后释放参数。",
    ],
)
def test_a_frame_takes_no_subject_from_before_it(text):
    """'The main difference is when they free the parameters' names what differs: it says
    nothing of the subject of the sentence before it."""
    r = read(text)
    assert not r.misconceptions and set(r.supported) == {"frees", "memory"}, r.trace


def test_not_only_denies_nothing_zh():
    """'并不是只释放一部分' (not only a part) does not deny that it frees."""
    r = read("前者在前向之后释放参数，而且并不是只释放一部分。后者显存更多。")
    assert not r.misconceptions and set(r.supported) == {"frees", "memory"}, r.trace


@pytest.mark.parametrize(
    "sentence", ["Some people think there is no difference between them.", "有人以为两者没有区别。"]
)
def test_what_others_believe_is_not_the_learners_claim(sentence):
    r = read(
        "The former frees the parameters after forward. The latter uses more memory. " + sentence
    )
    assert not r.misconceptions and not r.unread, r.trace


@pytest.mark.parametrize(
    "sentence",
    [
        "Therefore the block is a sensible compromise between memory and the number of "
        "collectives.",
        "Therefore wrapping the model per block is a sensible compromise.",
        "因此按 block 包参数是一个比较合理的折中。",
        "只对部分 block 做检查点、省一部分显存是一种折中方案。",
    ],
)
def test_a_verdict_of_compromise_is_a_frame(sentence):
    """'X is a sensible compromise' judges a choice and states no fact: read, credits nothing."""
    r = read(
        "The former frees the parameters after forward. The latter uses more memory. " + sentence
    )
    assert not r.unread and not r.misconceptions and set(r.supported) == {"frees", "memory"}, (
        r.trace
    )


def test_an_analogy_announced_as_a_heading_runs_to_a_blank_line():
    parts = claims._sentence_parts(
        "前者在前向之后释放参数。\n打个比方，参数就像图书馆的书：\n前者看完就还回去。\n后者一直摆在桌上。"
        "\n\n后者显存更多。"
    )
    assert claims._non_claims(parts) == {1, 2, 3}


@pytest.mark.parametrize(
    "clause, phrase",
    [
        ("the unsharded peak does not exceed roughly one block", "peak ... one block"),
        ("no rank ever goes beyond one block", "rank ... one block"),
        ("峰值不会超出一个 block", "峰值 ... 一个 block"),
    ],
)
def test_a_denied_exceed_is_at_most(clause, phrase):
    m = claims.compile_phrase(phrase).search(clause)
    assert claims._polarity(clause, m, 0)


@pytest.mark.parametrize(
    "clause",
    ["这部分显存直到反向才得以释放", "留到 backward 用完才释放", "一直到反向算完再释放"],
)
def test_kept_until_a_time_denies_the_release_before_it(clause):
    m = claims.compile_phrase("释放").search(clause)
    assert not claims._polarity(clause, m, 0)
    # the time named inside the phrasing is the phrasing's own: 反向时再 all-gather
    clause = "等到反向时再 all gather 一次"
    m = claims.compile_phrase("反向 ... all gather").search(clause)
    assert claims._polarity(clause, m, 0)


def test_a_denied_unsharded_state_is_sharded():
    clause = "两种策略都不会让梯度或优化器状态处于未分片状态"
    m = claims.compile_phrase("都 ... 梯度 ... 分片").search(clause)
    assert claims._polarity(clause, m, 0)
    # 未分片 alone is an adjective: the phrasing that reads it decides
    clause = "前向到反向之间要放下整份未分片参数"
    m = claims.compile_phrase("放下 ... 分片").search(clause)
    assert claims._polarity(clause, m, 0)


@pytest.mark.parametrize(
    "clause, phrase",
    [
        ("nothing checks that the shards come from the same init", "same init"),
        ("fsdp does not verify that every rank has the same weights", "same weights"),
        ("没有任何检查会发现分片来自不同 init", "分片来自不同"),
    ],
)
def test_what_nothing_checks_states_nothing(clause, phrase):
    m = claims.compile_phrase(phrase).search(clause)
    assert claims._unchecked(clause, m)
    for said in ("the shards come from the same init", "fsdp checks that x and the same init"):
        m = claims.compile_phrase("same init").search(said)
        assert not claims._unchecked(said, m)


@pytest.mark.parametrize(
    "clause, verb",
    [
        ("each worker finds rank, local rank and world size in its environment", True),
        ("every rank keeps its own slice", True),
        ("the replicas all reduce the full gradient", True),
        ("the optimizer states and the grads", False),
        ("optimizer states, gradient shards", False),
        ("the gradient shards and params", False),
    ],
)
def test_an_s_form_after_a_determiner_and_a_thing_is_the_verb(clause, verb):
    assert claims.carries_verb(clause) is verb


@pytest.mark.parametrize(
    "text, unread",
    [
        ("Let P = #params, N = ranks.", {0}),
        ("设 P = 参数量，N = rank 数。", {0}),
        ("Let P = params, N = ranks, and FSDP keeps everything unsharded on each rank.", set()),
        ("With N = 8, FSDP stores the full model on every rank.", set()),
    ],
)
def test_a_definition_of_symbols_states_nothing(text, unread):
    assert claims._non_claims(claims._sentence_parts(text)) == unread


@pytest.mark.parametrize(
    "text",
    [
        "When there is no difference in memory, the former frees the parameters.",
        "If the latter frees the parameters, the former frees them too.",
        "两者没有区别的话，前者释放参数。",
        "后者释放参数时，前者也释放参数。",
    ],
)
def test_a_condition_before_its_consequence_supposes_nothing_false(text):
    # a condition (if/when/…的话/…时) split from its consequence by a comma supposes what it
    # says: no misconception from it alone; the consequence is read as a statement
    r = read(text)
    assert not r.misconceptions, r.trace
    assert "frees" in r.supported


def test_a_false_consequence_after_a_condition_is_still_wrong():
    r = read("When memory is tight, shard grad op frees the parameters.")
    assert r.misconceptions and r.misconceptions[0][0] == "frees"
    r = read("内存紧张的时候，两者没有区别。")
    assert r.misconceptions and r.misconceptions[0][0] == "same"
