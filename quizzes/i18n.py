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
    "numeric_bad": {"en": "{given} {unit} is outside the accepted range.",
                    "zh": "{given} {unit} 不在可接受的范围内。"},
    "how": {"en": "How to compute it:", "zh": "计算方法："},
    "found": {"en": "Key ideas found:", "zh": "已答到的要点："},
    "missed": {"en": "Key ideas missed:", "zh": "缺少的要点："},
    "none": {"en": "(none)", "zh": "（无）"},
    "need": {"en": "Needed at least {k} of {n} key ideas, stated correctly; found {f}.",
             "zh": "至少需要正确陈述 {n} 个要点中的 {k} 个；答到 {f} 个。"},
    "need_weighted": {"en": "Needed {k} points of key ideas, stated correctly (the central idea counts {w}); got {f}.",
                      "zh": "需要正确陈述的要点达到 {k} 分（核心要点算 {w} 分）；得到 {f} 分。"},
    "misconception": {"en": "You wrote something that is not so:", "zh": "你写了不成立的说法："},
    "too_short": {"en": "The answer is too short to show the idea: write a sentence or two.",
                  "zh": "回答太短，无法体现要点：请写一两句完整的话。"},
    "no_statement": {"en": "A list of keywords is not an answer: say what happens, in a sentence.",
                     "zh": "只列关键词不算回答：请用完整的句子说明发生了什么。"},
    "reference": {"en": "Reference answer:", "zh": "参考答案："},
    "code_here": {"en": "graded in the exercise cell above", "zh": "在上面的练习单元格中评分"},
    "score": {"en": "Score: {k} / {n}", "zh": "得分：{k} / {n}"},
    "pick_first": {"en": "Choose an answer first.", "zh": "请先作答。"},
}


def check_lang(lang) -> str:
    if lang not in LANGS:
        raise QuizError(f"unknown language {lang!r} (use one of: {', '.join(LANGS)})")
    return lang


def msg(key: str, lang: str, **kw) -> str:
    return MESSAGES[key][lang].format(**kw)
