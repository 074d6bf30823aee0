"""The few fixed phrases the quiz prints, in English and Chinese."""

from __future__ import annotations

from .bank import LANGS, QuizError

MESSAGES = {
    "correct": {"en": "Correct.", "zh": "正确。"},
    "wrong": {"en": "Not quite.", "zh": "不太对。"},
    "partly": {"en": "Partly right.", "zh": "部分正确。"},
    "selected_wrong": {"en": "You chose {opt}, but", "zh": "你选了 {opt}，但"},
    "missed_right": {"en": "You left out {opt}:", "zh": "你漏选了 {opt}："},
    "numeric_ok": {"en": "{given} is within tolerance.", "zh": "{given} 在允许误差之内。"},
    "numeric_bad": {
        "en": "{given} {unit} is outside the accepted range.",
        "zh": "{given} {unit} 不在可接受的范围内。",
    },
    "how": {"en": "How to compute it:", "zh": "计算方法："},
    # --- open answers (the grader's feedback; one block, kept together) ---
    "open_complete": {
        "en": "Correct: your answer states every key idea, each the right way round.",
        "zh": "正确：你的回答说到了每个要点，方向都对。",
    },
    "open_misconception": {
        "en": "Not quite: part of your answer is not so.",
        "zh": "不太对：回答中有一处说法不成立。",
    },
    "open_partial": {
        "en": "Not quite: what you wrote holds, but a key idea is missing.",
        "zh": "不太对：你写的没有错，但缺少要点。",
    },
    "open_off_topic": {
        "en": "Not quite: the answer does not state the key ideas of this question.",
        "zh": "不太对：回答没有说到这道题的要点。",
    },
    "open_too_short": {
        "en": "Not quite: the answer is too short to show the idea: write a sentence or two.",
        "zh": "不太对：回答太短，无法体现要点：请写一两句完整的话。",
    },
    "open_no_statement": {
        "en": "Not quite: a list of keywords is not an answer: say what happens, in a sentence.",
        "zh": "不太对：只列关键词不算回答：请用完整的句子说明发生了什么。",
    },
    "open_unread": {
        "en": "Unsure: the grader could not read your whole answer, so it gives no verdict.",
        "zh": "无法判定：评分程序没能读懂你的全部回答，因此不下结论。",
    },
    "open_doubted_correct": {
        "en": "Unsure: the grader found every key idea, but your answer as a whole does not read "
        "like the right answers to this question, so it gives no verdict.",
        "zh": "无法判定：评分程序找到了每个要点，但整体读起来不像这道题的正确回答，因此不下结论。",
    },
    "open_doubted_wrong": {
        "en": "Unsure: the grader's rules object to your answer (below), but as a whole it reads "
        "like the right answers to this question, so it gives no verdict.",
        "zh": "无法判定：评分规则对你的回答有异议（见下），"
        "但整体读起来像这道题的正确回答，因此不下结论。",
    },
    "you_wrote": {
        "en": "You wrote: «{quote}» — in fact {fix}.",
        "zh": "你写道：「{quote}」——实际上{fix}。",
    },
    "found": {"en": "Key ideas found:", "zh": "已答到的要点："},
    "missing": {"en": "Key ideas missing:", "zh": "缺少的要点："},
    "not_found": {
        "en": "Key ideas not found (they may be in the sentences it could not read):",
        "zh": "没有找到的要点（可能在没能读懂的句子里）：",
    },
    "unread": {"en": "Sentences the grader could not read:", "zh": "没能读懂的句子："},
    "mark_yourself": {
        "en": "Compare your answer with the reference and mark it yourself: "
        "does it state each key idea, the right way round?",
        "zh": "请对照参考答案自己判断：你的回答是否说到了下面每个要点，且方向正确？",
    },
    "none": {"en": "(none)", "zh": "（无）"},
    # --- end of the open answers' block ---
    "reference": {"en": "Reference answer:", "zh": "参考答案："},
    "code_here": {"en": "graded in the exercise cell above", "zh": "在上面的练习单元格中评分"},
    "score": {"en": "Score: {k} / {n}", "zh": "得分：{k} / {n}"},
    "pick_first": {"en": "Choose an answer first.", "zh": "请先作答。"},
    # terminal: take and grade
    "tag_correct": {"en": "[correct]", "zh": "[正确]"},
    "tag_wrong": {"en": "[wrong]", "zh": "[错误]"},
    "tag_unsure": {"en": "[unsure: mark it yourself]", "zh": "[无法判定：请自行对照]"},
    "tag_unanswered": {"en": "[not answered]", "zh": "[未作答]"},
    "total": {
        "en": "Total: {right} / {total} correct (score {score:.2f} / {total})",
        "zh": "总计：{right} / {total} 正确（得分 {score:.2f} / {total}）",
    },
    "take_header": {
        "en": "{title}  ({lesson}: {n} questions; Enter skips one, Ctrl-D stops)",
        "zh": "{title}  （{lesson}：{n} 题；回车跳过，Ctrl-D 结束）",
    },
    "exercise_tag": {"en": "[exercise]", "zh": "[练习]"},
    "exercise_here": {
        "en": "skipped here: run the exercise cell in the notebook",
        "zh": "此处跳过：请在 notebook 中运行练习单元格",
    },
    "skipped": {"en": "(skipped)", "zh": "（已跳过）"},
    "stopped": {"en": "stopped.", "zh": "已结束。"},
    "interrupted": {"en": "interrupted.", "zh": "已中断。"},
    "not_recorded": {"en": "progress not recorded: {why}", "zh": "进度未保存：{why}"},
    # --- the quiz's faces (widget, take, progress, course home): keep these together ---
    "check": {"en": "Check", "zh": "检查"},
    "badge_correct": {"en": "Correct", "zh": "正确"},
    "badge_wrong": {"en": "Not right", "zh": "不对"},
    "badge_partly": {"en": "Partly right", "zh": "部分正确"},
    "badge_unsure": {"en": "Not sure: compare it yourself", "zh": "无法确定：请自己对照"},
    "badge_self_correct": {"en": "You marked it right", "zh": "你判定为正确"},
    "badge_self_wrong": {"en": "You marked it not right", "zh": "你判定为不正确"},
    "unsure_why_doubted_correct": {
        "en": "The grader found every key idea, but your answer as a whole does not read like the "
        "right answers to this question, so it does not say right or wrong. Compare your answer "
        "with the key ideas and the reference answer, then mark it.",
        "zh": "评分器找到了每个要点，但整体读起来不像这道题的正确回答，所以不判对错。"
        "请对照要点和参考答案，再自己判定。",
    },
    "unsure_why_doubted_wrong": {
        "en": "The grader's rules object to your answer (below), but as a whole it reads like the "
        "right answers to this question, so it does not say right or wrong. Compare your answer "
        "with the key ideas and the reference answer, then mark it.",
        "zh": "评分规则对你的回答有异议（见下），但整体读起来像这道题的正确回答，所以不判对错。"
        "请对照要点和参考答案，再自己判定。",
    },
    "unsure_why": {
        "en": "The grader could not read all of your answer, so it does not say right or wrong. "
        "Compare your answer with the key ideas and the reference answer, then mark it.",
        "zh": "评分器没能读懂你的全部回答，所以不判对错。请对照要点和参考答案，再自己判定。",
    },
    "ui_found": {"en": "Key ideas found:", "zh": "已答到的要点："},
    "ui_missing": {"en": "Key ideas not found:", "zh": "没有找到的要点："},
    "ui_unread": {"en": "Sentences the grader could not read:", "zh": "评分器没能读懂的句子："},
    "ui_you_wrote": {"en": "You wrote «{quote}»: {fix}", "zh": "你写的是「{quote}」：{fix}"},
    "false_head": {"en": "Not so:", "zh": "不成立的说法："},
    "checklist_head": {
        "en": "Tick each key idea your answer states (in its true direction):",
        "zh": "勾选你的回答（以正确的方向）说到的每个要点：",
    },
    "checklist_rule": {
        "en": "It is right when it states every key idea and nothing false.",
        "zh": "说到了所有要点、且没有错误说法，才算正确。",
    },
    "self_right": {"en": "My answer is right", "zh": "我的回答正确"},
    "self_wrong": {"en": "My answer is not right", "zh": "我的回答不正确"},
    "self_needs_all": {
        "en": "(tick every key idea, and that nothing is false, first)",
        "zh": "（请先勾选所有要点，并确认没有错误说法）",
    },
    "nothing_false": {
        "en": "Nothing I wrote is false: I compared each of my sentences with the reference.",
        "zh": "我写的没有错误说法：每一句都和参考答案对照过。",
    },
    "self_recorded": {"en": "Recorded as self-assessed.", "zh": "已记为自评。"},
    "ask_idea": {"en": "Does your answer say this? (y/n)", "zh": "你的回答说到了这一点吗？(y/n)"},
    "ask_right": {
        "en": "Is your answer right: every key idea, nothing false? (y/n)",
        "zh": "你的回答正确吗：所有要点都有、没有错误说法？(y/n)",
    },
    "ask_missing": {
        "en": "Not every key idea is in your answer: marked not right.",
        "zh": "你的回答没有包含所有要点：记为不正确。",
    },
    "ask_yn": {
        "en": "please answer y or n (Enter skips the self-check)",
        "zh": "请回答 y 或 n（回车跳过自评）",
    },
    "self_skipped": {
        "en": "(self-check skipped; the answer stays marked unsure)",
        "zh": "（已跳过自评；这道题仍记为无法确定）",
    },
    "score_self": {
        "en": "{base} (+{s} self-assessed right)",
        "zh": "{base}（另有 {s} 题自评正确）",
    },
    "exercise_title": {"en": "Exercise (not counted in the score)", "zh": "练习（不计入得分）"},
    "question_n": {"en": "Question {k} of {n}", "zh": "第 {k} 题，共 {n} 题"},
    # what is wrong with the shape of an answer (QuizError raised by grading, shown to learners)
    "single_list": {
        "en": "{qid} is single-choice: answer with one option id such as 'b', not a list",
        "zh": "{qid} 是单选题：请回答一个选项字母（例如 'b'），不要给列表",
    },
    "option_type": {
        "en": "{qid}: an option is given by its id as a string (one of {options}), "
        "not {kind} {value}",
        "zh": "{qid}：选项要用字母字符串表示（{options} 之一），而不是 {kind} {value}",
    },
    "unknown_option": {
        "en": "{qid}: unknown option {value} (choose from {options})",
        "zh": "{qid}：没有选项 {value}（请从 {options} 中选择）",
    },
    "multi_type": {
        "en": "{qid} is multiple-choice: answer with a list of option ids such as ['a', 'c'], "
        "not {kind} {value}",
        "zh": "{qid} 是多选题：请回答选项字母的列表（例如 ['a', 'c']），而不是 {kind} {value}",
    },
    "numeric_type": {
        "en": "{qid} is numeric: answer with a number, not {kind} {value}",
        "zh": "{qid} 是数值题：请回答一个数字，而不是 {kind} {value}",
    },
    "numeric_long": {
        "en": "{qid} is numeric: {n} characters is not a number answer (at most {limit})",
        "zh": "{qid} 是数值题：{n} 个字符不是一个数字答案（最多 {limit} 个）",
    },
    "numeric_comma": {
        "en": "{qid} is numeric: cannot tell what the comma in {value} means; "
        "write a decimal point (0.8) and, if you like, commas between thousands (1,000,000)",
        "zh": "{qid} 是数值题：无法判断 {value} 中逗号的含义；"
        "小数请用小数点（0.8），千位分隔可用逗号（1,000,000）",
    },
    "numeric_unreadable": {
        "en": "{qid} is numeric: cannot read {value} as a number",
        "zh": "{qid} 是数值题：无法把 {value} 读成数字",
    },
    "numeric_infinite": {
        "en": "{qid} is numeric: {value} is not a finite number",
        "zh": "{qid} 是数值题：{value} 不是有限的数字",
    },
    "open_type": {
        "en": "{qid} is an open question: answer with text, not {kind}",
        "zh": "{qid} 是简答题：请用文字回答，而不是 {kind}",
    },
    "open_long": {
        "en": "{qid}: an answer of {n} characters is too long to grade (at most {limit})",
        "zh": "{qid}：回答有 {n} 个字符，太长无法评分（最多 {limit} 个）",
    },
}


class AnswerError(QuizError):
    """An answer of the wrong shape; str() is English, text(lang) says it in the learner's
    language."""

    def __init__(self, key: str, **kw):
        self.key, self.kw = key, kw
        super().__init__(msg(key, "en", **kw))

    def text(self, lang: str) -> str:
        return msg(self.key, lang if lang in LANGS else "en", **self.kw)


def say(exc: Exception, lang: str) -> str:
    """An error's message in the learner's language where there is one."""
    return exc.text(lang) if isinstance(exc, AnswerError) else str(exc)


def check_lang(lang) -> str:
    if lang not in LANGS:
        raise QuizError(f"unknown language {lang!r} (use one of: {', '.join(LANGS)})")
    return lang


def msg(key: str, lang: str, **kw) -> str:
    return MESSAGES[key][lang].format(**kw)
