"""How a graded result is shown to the learner, the same in the widget and in `take`: a verdict
(icon, colour, word) and the feedback under it, said once; and, for an answer the grader could
not read whole ("unsure"), what it found and missed, what it could not read, and the reference,
for the learner to mark their own answer against the key ideas.

The grader's feedback starts with its verdict phrase ("Correct.", "不太对。"); the verdict is shown
apart here, so that phrase is taken off the feedback, and so is an explanation's own opening that
says it again ("Right: ...", "正确：...") after a right answer.
"""

from __future__ import annotations

import re

from .i18n import MESSAGES, msg

# key of the badge text, icon, colour (text), colour (background)
LOOKS = {
    "correct": ("badge_correct", "✔", "#116329", "#dafbe1"),
    "partly": ("badge_partly", "◐", "#7d4e00", "#fff8c5"),
    "wrong": ("badge_wrong", "✘", "#a40e26", "#ffebe9"),
    "unsure": ("badge_unsure", "?", "#0a3069", "#ddf4ff"),
    "self_correct": ("badge_self_correct", "✔", "#3e1f79", "#fbefff"),
    "self_wrong": ("badge_self_wrong", "✘", "#3e1f79", "#fbefff"),
}
_HEADS = ("correct", "wrong", "partly", "unsure")
# A verdict the badge already says, as the first words of a sentence ("Not quite: the answer ...").
_SAYS_VERDICT = re.compile(
    r"^(correct|not quite|unsure|正确|不太对|无法判定)\s*[:：]\s*", re.IGNORECASE
)
# An explanation that opens by saying "right" again, after a right answer.
_SAYS_RIGHT = re.compile(
    r"^\s*(right|correct|yes)\s*[:.,—-]\s*|^\s*(正确|对|没错)\s*[：:。，,]\s*", re.IGNORECASE
)


def look(result) -> str:
    """correct, partly (wrong with part of the score), wrong or unsure."""
    if result.verdict == "wrong" and 0 < result.score < 1:
        return "partly"
    return result.verdict


def body(result, lang: str) -> str:
    """The feedback without the verdict phrase the badge already says."""
    text = result.feedback.strip()
    heads = sorted((MESSAGES[k][lang] for k in _HEADS if k in MESSAGES), key=len, reverse=True)
    for head in heads:
        if text.startswith(head):
            text = text[len(head) :].lstrip()
            break
    else:
        said = _SAYS_VERDICT.match(text)
        if said:
            text = text[said.end() :]
            text = text[:1].upper() + text[1:]
    if result.verdict == "correct":
        text = _SAYS_RIGHT.sub("", text, count=1)
    return text


def quote(text: str, lang: str) -> str:
    """The learner's own words, quoted as the language quotes."""
    return f"「{text}」" if lang == "zh" else f"«{text}»"


def badge_text(kind: str, lang: str) -> str:
    key, icon, _, _ = LOOKS[kind]
    return f"{icon} {msg(key, lang)}"


# Why the grader gives no verdict, by the result's reason (grading.py): it could not read a
# sentence, or its second reading (reader.py) disagreed with the rules.
_UNSURE_WHY = {
    "doubted_correct": "unsure_why_doubted_correct",
    "doubted_wrong": "unsure_why_doubted_wrong",
}


def unsure_parts(result, lang: str) -> dict:
    """The parts of an unsure result, from its details (grading's contract), with defaults so a
    result without some of them still shows."""
    d = result.details or {}
    checklist = list(d.get("checklist") or [])
    found = list(d.get("found_labels") or [])
    missing = list(
        d["missing_labels"] if "missing_labels" in d else [x for x in checklist if x not in found]
    )
    if checklist:  # found and missing in the checklist's unit, the key ideas, in its order
        found = [x for x in checklist if x not in missing]
    return {
        "why": msg(_UNSURE_WHY.get(d.get("reason"), "unsure_why"), lang),
        "found": found,
        "missing": missing,
        "unread": list(d.get("unread") or []),
        "false": [f for f in d.get("false") or [] if isinstance(f, dict)],
        "checklist": checklist or found + missing,
        "reference": d.get("reference") or "",
    }


def unsure_text(result, lang: str) -> str:
    """The unsure result as plain text (terminal)."""
    p = unsure_parts(result, lang)
    lines = [p["why"]]
    if p["false"]:
        lines.append(msg("false_head", lang))
        lines += [
            "- " + msg("ui_you_wrote", lang, quote=f["quote"], fix=f.get("fix", ""))
            for f in p["false"]
        ]
    lines.append(msg("ui_found", lang))
    lines += [f"- {x}" for x in p["found"]] or [f"- {msg('none', lang)}"]
    lines.append(msg("ui_missing", lang))
    lines += [f"- {x}" for x in p["missing"]] or [f"- {msg('none', lang)}"]
    if p["unread"]:
        lines.append(msg("ui_unread", lang))
        lines += [f"- {quote(x, lang)}" for x in p["unread"]]
    if p["reference"]:
        lines += [msg("reference", lang), p["reference"]]
    return "\n".join(lines)
