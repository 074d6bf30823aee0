"""Terminal front end: python -m quizzes {list,take,grade,progress,seal,unseal}."""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import nullcontext
from pathlib import Path

from . import claims, corpus, present, progress, reader
from .bank import (
    BANK_DIR,
    LANGS,
    QuizError,
    dump_bank,
    from_authoring,
    known_lessons,
    load_bank,
    to_authoring,
)
from .grading import grade_question
from .i18n import msg, say

EXAMPLES = """\
examples:
  python -m quizzes list                          lessons, question counts, your progress
  python -m quizzes take lesson1                  take the quiz of lesson 1 in the terminal
  python -m quizzes take lesson1 --lang zh --only q_full_vs_shard_grad_op
  python -m quizzes grade answers.json --json     grade a file of answers (for instructors, CI)
  python -m quizzes progress                      your scores per lesson
  python -m quizzes unseal lesson1 > /tmp/l1.json # authoring: edit, then
  python -m quizzes seal /tmp/l1.json             # writes quizzes/banks/lesson1.json
  python -m quizzes explain lesson1 q_full_vs_shard_grad_op "FULL_SHARD frees ..."
  python -m quizzes corpus quizzes/labelled_answers/lesson1.json
  python -m quizzes report                        open-answer grader: tuning corpus, held-out set
  python -m quizzes report quizzes/labelled_answers --source "heldout round 2" --source none

answers file for `grade` (JSON):
  {"lesson": "lesson1", "lang": "en",
   "answers": {"q_zero_mapping": "b", "q_shard_optimizer_state": ["a", "b"],
               "q_model_state_bytes": 2e8, "q_full_vs_shard_grad_op": "FULL_SHARD frees ..."}}
  `grade` exits 0 whenever the file was graded, whatever the score; 1 when it was graded but
  --record could not save the results (they are printed all the same); 2 on an unknown lesson
  or question, a malformed file or an answer of the wrong type (one line on stderr). Ctrl-C in
  `take` exits 130.

progress file: $FSDP_COURSE_PROGRESS, else ~/.fsdp_course/progress.json
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, like every other error of this tool
        raise QuizError(f"{message} (see: python -m quizzes --help)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m quizzes",
        description="Quizzes of the fsdp-course, in the terminal.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("list", help="lessons with question counts and your progress")
    t = sub.add_parser("take", help="take a lesson's quiz interactively")
    t.add_argument("lesson", help="lesson1 (or just 1)")
    t.add_argument("--lang", choices=LANGS, help="language (default: your last choice, else en)")
    t.add_argument("--only", metavar="QID", help="ask only this question")
    g = sub.add_parser("grade", help="grade a JSON file of answers (non-interactive)")
    g.add_argument("answers_file", metavar="ANSWERS_FILE")
    g.add_argument(
        "--lang", choices=LANGS, help="feedback language (default: the file's 'lang', else en)"
    )
    g.add_argument("--json", action="store_true", help="print the results as JSON")
    g.add_argument("--record", action="store_true", help="also record the results in your progress")
    sub.add_parser("progress", help="table of your scores per lesson")
    s = sub.add_parser("seal", help="authoring: seal a plain authoring file into quizzes/banks/")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--out", help="write here instead of quizzes/banks/<lesson>.json")
    u = sub.add_parser("unseal", help="authoring: print a bank in plain, editable JSON")
    u.add_argument("lesson")
    e = sub.add_parser("explain", help="authoring: how an open answer is read, clause by clause")
    e.add_argument("lesson")
    e.add_argument("qid")
    e.add_argument("answer")
    e.add_argument("--lang", choices=LANGS, default="en")
    c = sub.add_parser(
        "corpus",
        help="authoring: grade labelled corpora, list every answer graded against its label",
    )
    c.add_argument("files", nargs="+", metavar="CORPUS_FILE")
    r = sub.add_parser(
        "report",
        help="the open-answer grader's confusion matrices and targets on labelled answer sets",
    )
    r.add_argument(
        "sets",
        nargs="*",
        metavar="CORPUS_DIR",
        help="folders (or files) of labelled answers, each reported on its own "
        "(default: quizzes/labelled_answers, tests/data/quiz_validation and "
        "tests/data/quiz_heldout)",
    )
    r.add_argument(
        "--cross-validate",
        action="store_true",
        help="grade each group of answers (its 'source': one writer or round) with second-reading "
        "classifiers trained without it, and report the groups together and apart",
    )
    r.add_argument(
        "--source",
        action="append",
        metavar="SOURCE",
        help="only the answers whose 'source' is SOURCE, each source reported on its own "
        "(repeatable; 'none': the answers without a source)",
    )
    r.add_argument(
        "--rules-only",
        action="store_true",
        help="grade by the rules alone, without the second reading (what the rules read)",
    )
    return p


# --- list / progress -----------------------------------------------------------------------


def cmd_list(args) -> int:
    print(f"{'lesson':<10}{'questions':>10}{'code':>6}{'correct':>9}  title")
    for name in known_lessons():
        bank = load_bank(name)
        graded = [q.id for q in bank.graded()]
        done = progress.lesson_summary(bank.lesson, graded)
        print(
            f"{bank.lesson:<10}{len(graded):>10}{len(bank) - len(graded):>6}"
            f"{done['correct']:>5} / {len(graded):<2} {bank.title['en']}"
        )
    return 0


def cmd_progress(args) -> int:
    """Per lesson: questions answered, graded correct by the quiz, marked right by the learner
    (an open answer the grader was unsure of, compared with the key ideas), the grader's score,
    and the code exercises passed."""
    print(f"progress file: {progress.progress_path()}")
    print(
        f"{'lesson':<10}{'answered':>10}{'correct':>9}{'self-assessed':>15}{'score':>12}{'exercises':>11}"
    )
    for name in known_lessons():
        bank = load_bank(name)
        quiz = progress.lesson_summary(bank.lesson, [q.id for q in bank.graded()])
        code = progress.lesson_summary(bank.lesson, [q.id for q in bank if q.type == "code"])
        print(
            f"{bank.lesson:<10}{quiz['answered']:>6} / {quiz['total']:<2}{quiz['correct']:>6}"
            f"{quiz['self_assessed']:>12}   {quiz['score']:>9.2f} / {quiz['total']:<2}"
            f"{code['correct']:>7} / {code['total']}"
        )
    print(
        "correct: graded correct by the quiz; self-assessed: answers the grader could not read "
        "whole, marked right by you against the key ideas"
    )
    return 0


# --- take ------------------------------------------------------------------------------------

HINTS = {
    "single": {"en": "one letter", "zh": "一个字母"},
    "multi": {"en": "letters, e.g. a,c", "zh": "多个字母，例如 a,c"},
    "numeric": {"en": "a number, in {unit}", "zh": "一个数字，单位：{unit}"},
    "open": {"en": "your answer in one line", "zh": "用一行文字作答"},
}


def cmd_take(args) -> int:
    """Ask each question; Enter skips, Ctrl-D stops (exit 0), Ctrl-C interrupts (exit 130).
    An answer the grader is unsure of is shown with the key ideas found and missed and the
    reference; the learner then marks it against the key ideas (recorded as self-assessed)."""
    bank = load_bank(args.lesson)
    lang = args.lang or progress.get_setting("lang", "en")
    questions = [bank.question(args.only)] if args.only else list(bank)
    graded = [q for q in questions if q.type != "code"]
    print(msg("take_header", lang, title=bank.title[lang], lesson=bank.lesson, n=len(graded)))
    right, selfs, status, unsaved = 0, 0, 0, None

    def keep(mark):
        nonlocal unsaved
        saved = progress.record(bank.lesson, mark)
        if not saved.ok and saved.problem != unsaved:  # said once, not after every question
            unsaved = saved.problem
            _say_err(saved.line(lang))

    try:
        for q in questions:
            if q.type == "code":
                print(
                    f"\n{msg('exercise_tag', lang)} {q.prompt[lang]}\n  -> "
                    f"{msg('exercise_here', lang)}"
                )
                continue
            print(
                f"\n[{graded.index(q) + 1}/{len(graded)}] {q.prompt[lang]}"
            )  # counts what the header counts
            for o in q.options:
                print(f"  {o.id}) {o.text[lang]}")
            result = _ask(q, lang)
            if result is None:
                continue
            right += result.correct
            kind = present.look(result)
            if result.verdict == "unsure":
                print(f"{present.badge_text(kind, lang)}\n{present.unsure_text(result, lang)}")
            else:  # the result first: it is shown even if it cannot be saved
                print(f"{present.badge_text(kind, lang)}\n{present.body(result, lang)}")
            keep(progress.Mark.of(q.id, result))
            if result.verdict == "unsure":
                mark = _self_check(result, lang)
                if mark is not None:
                    selfs += mark == "correct"
                    print(
                        present.badge_text("self_" + mark, lang) + "  " + msg("self_recorded", lang)
                    )
                    keep(progress.Mark(q.id, mark, graded_by="self"))
    except EOFError:
        print("\n" + msg("stopped", lang))
    except KeyboardInterrupt:
        print("\n" + msg("interrupted", lang))
        status = 130  # as a shell reports a command stopped by Ctrl-C
    score = msg("score", lang, k=right, n=len(graded))
    print("\n" + (msg("score_self", lang, base=score, s=selfs) if selfs else score))
    return status


def _yes_no(prompt: str, lang: str) -> bool | None:
    """y / n (also 是 / 否); None on an empty line (the learner skips the self-check)."""
    while True:
        line = input(f"  {prompt} ").strip().lower()
        if not sys.stdin.isatty():
            print(line)
        if not line:
            return None
        if line in ("y", "yes", "是", "对"):
            return True
        if line in ("n", "no", "否", "不"):
            return False
        print(f"  {msg('ask_yn', lang)}")


def _self_check(result, lang: str) -> str | None:
    """The self-test's method in the terminal: each key idea y/n, then right or not right.
    "correct" / "wrong", or None when the learner skips it (Enter)."""
    print(f"\n{msg('checklist_head', lang)} {msg('checklist_rule', lang)}")
    ticks = []
    for label in present.unsure_parts(result, lang)["checklist"]:
        print(f"  - {label}")
        tick = _yes_no(msg("ask_idea", lang), lang)
        if tick is None:
            print(f"  {msg('self_skipped', lang)}")
            return None
        ticks.append(tick)
    if not all(ticks):
        print(f"  {msg('ask_missing', lang)}")
        return "wrong"
    sure = _yes_no(msg("ask_right", lang), lang)
    if sure is None:
        print(f"  {msg('self_skipped', lang)}")
        return None
    return "correct" if sure else "wrong"


def _ask(q, lang):
    """Read answers until one can be graded; None when the learner skips (empty line)."""
    hint = HINTS[q.type][lang].format(unit=q.unit[lang] if q.unit else "")
    while True:
        line = input(f"> ({hint}) ").strip()
        if not sys.stdin.isatty():  # piped answers: echo them so the transcript reads right
            print(line)
        if not line:
            print("  " + msg("skipped", lang))
            return None
        try:
            return grade_question(q, line, lang)
        except QuizError as exc:  # a typo is not the end of the quiz: say why and ask again
            print(f"  {say(exc, lang)}")


def _say_err(line: str) -> None:
    os.write(2, (f"quizzes: {line}\n").encode())


# --- grade -----------------------------------------------------------------------------------

MAX_ANSWERS_BYTES = 1_000_000  # a whole lesson's answers are a few kB
MAX_NESTING = 20  # {"answers": {"q": ["a", "b"]}} is 3 deep


def _no_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise QuizError(f"key {key!r} appears twice in one object: keep one of them")
        seen[key] = value
    return seen


def _depth(obj, limit: int, level: int = 1) -> bool:
    """Is obj nested no deeper than limit? (iterative: a deep file must not recurse here either)"""
    stack = [(obj, level)]
    while stack:
        item, lvl = stack.pop()
        if lvl > limit:
            return False
        if isinstance(item, dict):
            stack += [(v, lvl + 1) for v in item.values()]
        elif isinstance(item, list):
            stack += [(v, lvl + 1) for v in item]
    return True


def read_answers(path: str) -> dict:
    p = Path(path)
    try:
        size = p.stat().st_size
        if p.is_dir():
            raise QuizError(f"answers file {path} is a folder")
        if size > MAX_ANSWERS_BYTES:
            raise QuizError(
                f"answers file {path} is {size / 1e6:.1f} MB; an answers file is at most "
                f"{MAX_ANSWERS_BYTES // 1_000_000} MB"
            )
        raw = p.read_bytes()
    except FileNotFoundError:
        raise QuizError(f"answers file {path} not found") from None
    except OSError as exc:
        raise QuizError(f"cannot read answers file {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise QuizError(f"answers file {path} is not UTF-8 text (byte {exc.start})") from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except QuizError as exc:
        raise QuizError(f"answers file {path}: {exc}") from None
    except RecursionError:
        raise QuizError(f"answers file {path} is nested too deeply to be answers") from None
    except ValueError as exc:
        raise QuizError(f"answers file {path} is not valid JSON: {exc}") from None
    if not _depth(data, MAX_NESTING):
        raise QuizError(
            f"answers file {path} is nested more than {MAX_NESTING} levels deep; answers are "
            "an option id, a list of ids, a number or text"
        )
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("lesson"), str)
        or not isinstance(data.get("answers"), dict)
    ):
        raise QuizError(
            f"answers file {path} must be an object with 'lesson' (string) and "
            "'answers' (object of question id -> answer)"
        )
    return data


def cmd_grade(args) -> int:
    """Exit 0 when graded (whatever the score); 1 when graded but --record could not save; 2 on
    a bad file (nothing graded)."""
    data = read_answers(args.answers_file)
    lang = args.lang or data.get("lang", "en")
    if lang not in LANGS:
        raise QuizError(f"answers file: unknown lang {lang!r} (use one of: {', '.join(LANGS)})")
    bank = load_bank(data["lesson"])
    for qid in data["answers"]:
        bank.question(qid)  # unknown ids fail before anything is printed
    results = {}
    for q in bank.graded():
        if q.id in data["answers"]:
            results[q.id] = grade_question(q, data["answers"][q.id], lang)
    for qid in data["answers"]:
        if qid not in results:  # the only graded-question ids left out are code exercises
            raise QuizError(
                f"{qid} is a code exercise: it is graded in the notebook, not by answers"
            )
    total = len(bank.graded())
    right = sum(r.correct for r in results.values())
    score = sum(r.score for r in results.values())
    if args.json:
        rows = [
            {
                "id": q.id,
                "answered": q.id in results,
                "correct": results[q.id].correct if q.id in results else False,
                "verdict": results[q.id].verdict if q.id in results else None,
                "score": results[q.id].score if q.id in results else 0.0,
                "feedback": results[q.id].feedback if q.id in results else "",
            }
            for q in bank.graded()
        ]
        print(
            json.dumps(
                {
                    "lesson": bank.lesson,
                    "lang": lang,
                    "correct": right,
                    "total": total,
                    "score": round(score, 4),
                    "results": rows,
                },
                ensure_ascii=False,
                indent=1,
            )
        )
    else:
        for q in bank.graded():
            r = results.get(q.id)
            if r is None:
                print(f"{msg('tag_unanswered', lang)} {q.id}")
                continue
            print(f"{msg('tag_' + r.verdict, lang)} {q.id} ({r.score:.2f})")
            print("    " + r.feedback.replace("\n", "\n    "))
        print(msg("total", lang, right=right, total=total, score=score))
    sys.stdout.flush()  # the results are out before anything can go wrong with recording them
    if args.record:
        saved = progress.record(
            bank.lesson, *(progress.Mark.of(qid, r) for qid, r in results.items())
        )
        if not saved.ok:
            _say_err(saved.line(lang))
            return 1
    return 0


# --- authoring -------------------------------------------------------------------------------


def cmd_seal(args) -> int:
    try:
        data = json.loads(Path(args.file).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise QuizError(f"cannot read authoring file {args.file}: {exc}") from None
    bank_dict = from_authoring(data)
    out = Path(args.out) if args.out else BANK_DIR / f"{bank_dict['lesson']}.json"
    out.write_text(dump_bank(bank_dict), encoding="utf-8")
    print(f"wrote {out} ({len(bank_dict['questions'])} questions)")
    return 0


def cmd_unseal(args) -> int:
    print(json.dumps(to_authoring(load_bank(args.lesson)), ensure_ascii=False, indent=1))
    return 0


def cmd_explain(args) -> int:
    q = load_bank(args.lesson).question(args.qid)
    if q.type != "open":
        raise QuizError(f"{args.qid} is a {q.type} question; explain reads open answers")
    reading = claims.read_answer(args.answer, q.secret)
    for line in reading.trace or ["(no phrasing of any claim found)"]:
        print(line)
    print()
    print(grade_question(q, args.answer, args.lang).feedback)
    return 0


def cmd_corpus(args) -> int:
    """Exit 0 when no answer is graded against its label, 1 otherwise (a right answer graded
    unsure is not against its label: the learner marks it)."""
    ok = True
    for g in corpus.grade_corpus(args.files):
        label, verdict = g.item["label"], g.verdict
        if verdict == label or (label == "correct" and verdict == "unsure"):
            continue
        ok = False
        print(
            f"{g.lesson} {g.qid}: labelled {label} ({g.item['kind']}, {g.item['lang']}), graded "
            f"{verdict}: {g.item['answer']}"
        )
        d = g.result.details
        print(
            f"    found {d['found']}, missing {d['missing']}, false "
            f"{[f['quote'] for f in d['false']]}, unread {d['unread']}"
        )
    print("every label holds" if ok else "some answers are graded against their label")
    return 0 if ok else 1


REPORT_SETS = (
    "quizzes/labelled_answers",
    "tests/data/quiz_validation",
    "tests/data/quiz_heldout",
)


def cmd_report(args) -> int:
    """Exit 0 when every set meets the targets, 1 when one does not."""
    root = Path(__file__).resolve().parent.parent
    sets = args.sets or [str(root / s) for s in REPORT_SETS if (root / s).is_dir()]
    if not sets:
        raise QuizError("no labelled answer sets found: name a folder of corpus files")
    if args.rules_only and args.cross_validate:
        raise QuizError("--rules-only has no second reading to cross-validate")
    with reader.trained_on({}) if args.rules_only else nullcontext():
        return _report(sets, args)


def _report(sets, args) -> int:
    ok = True
    for s in sets:
        if args.cross_validate:
            graded = corpus.cross_validated([s])
            title = f"{s}, each source graded by a second reading trained without it"
        else:
            graded, title = corpus.grade_corpus([s]), s
        parts = [(title, graded)]
        if args.source:
            parts = [
                (f"{title}, source {src!r}", corpus.of_source(graded, src)) for src in args.source
            ]
        for title, part in parts:
            if not part:
                raise QuizError(f"{title}: no answers")
            text, met = corpus.report(part, title)
            print(text + "\n")
            ok &= met
        if args.cross_validate:
            for group in sorted({corpus.source(g.item) for g in graded}):
                part = corpus.of_source(graded, group)
                print(f"  {group:40} {len(part):>4} answers  {corpus.targets_line(part)}")
            print()
    return 0 if ok else 1


COMMANDS = {
    "list": cmd_list,
    "take": cmd_take,
    "grade": cmd_grade,
    "progress": cmd_progress,
    "seal": cmd_seal,
    "unseal": cmd_unseal,
    "explain": cmd_explain,
    "corpus": cmd_corpus,
    "report": cmd_report,
}


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except QuizError as exc:
        print(f"quizzes: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C anywhere else: a clean stop, the status a shell expects
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:  # `python -m quizzes ... | head`: stop quietly, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
