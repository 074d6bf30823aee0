"""Question banks: loading, sealing and validating ``quizzes/banks/<lesson>.json``.

A bank keeps what a learner may see (ids, prompts, option texts, units) readable, and everything
that gives the answer away (correct options, values, rubrics, reference answers, explanations,
checker paths) in a per-question ``sealed`` field: base64 of zlib-compressed JSON. That is not
security (anyone can unseal it); it only keeps answers from being read by accident while
browsing the repository.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from .claims import phrase_error

FORMAT = 1
TYPES = ("single", "multi", "numeric", "open", "code")
LANGS = ("en", "zh")
BANK_DIR = Path(__file__).resolve().parent / "banks"
# Extra bank folders (os.pathsep-separated), searched before the package's own: lets tests and
# authors try a bank without touching the course's files.
BANK_PATH_ENV = "QUIZZES_BANK_PATH"
# The only keys a question may show in plain text; anything else belongs in the sealed field.
PUBLIC_KEYS = {"id", "type", "prompt", "options", "unit", "sealed"}


class QuizError(Exception):
    """A problem the user can fix (unknown lesson or question, malformed answer or bank)."""


@dataclass(frozen=True)
class Option:
    id: str
    text: dict  # {"en": ..., "zh": ...}


@dataclass
class Question:
    id: str
    type: str
    prompt: dict
    options: list = field(default_factory=list)
    unit: dict | None = None
    sealed: str = ""
    _secret: dict | None = field(default=None, repr=False, compare=False)
    lesson: str = ""  # set by the bank that holds it

    @property
    def secret(self) -> dict:
        """The unsealed answer data (decoded once, on first use)."""
        if self._secret is None:
            self._secret = unseal_text(self.sealed, where=f"question {self.id!r}")
        return self._secret

    def option_ids(self) -> list:
        return [o.id for o in self.options]

    def text(self, lang: str) -> str:
        return self.prompt[lang]


@dataclass
class Bank:
    lesson: str
    title: dict
    questions: list
    path: Path | None = None

    def question(self, qid: str) -> Question:
        for q in self.questions:
            if q.id == qid:
                return q
        known = ", ".join(q.id for q in self.questions)
        raise QuizError(f"unknown question {qid!r} in {self.lesson} (known: {known})")

    def graded(self) -> list:
        """Questions the quiz itself grades (code exercises are graded in their notebook cell)."""
        return [q for q in self.questions if q.type != "code"]

    def __iter__(self):
        return iter(self.questions)

    def __len__(self):
        return len(self.questions)


# --- sealing -------------------------------------------------------------------------------


def seal_obj(obj) -> str:
    raw = json.dumps(obj, ensure_ascii=False, sort_keys=True).encode("utf-8")
    return base64.b64encode(zlib.compress(raw, 9)).decode("ascii")


def unseal_text(text: str, where: str = "sealed field") -> dict:
    try:
        return json.loads(zlib.decompress(base64.b64decode(text.encode("ascii"), validate=True)))
    except Exception as exc:  # any decoding failure means the bank file was damaged
        raise QuizError(f"cannot unseal {where}: {type(exc).__name__}") from None


# --- finding and loading banks -------------------------------------------------------------


def bank_dirs() -> list:
    extra = [Path(p) for p in os.environ.get(BANK_PATH_ENV, "").split(os.pathsep) if p]
    return extra + [BANK_DIR]


def known_lessons() -> list:
    names = set()
    for d in bank_dirs():
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.json"))
    # natural order: lesson2 before lesson10
    return sorted(
        names, key=lambda s: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]
    )


def normalise_lesson(lesson) -> str:
    """'lesson1', 'Lesson1', '1' and 1 all mean lesson1."""
    name = str(lesson).strip().lower()
    return f"lesson{name}" if name.isdigit() else name


def bank_path(lesson) -> Path:
    name = normalise_lesson(lesson)
    for d in bank_dirs():
        p = d / f"{name}.json"
        if p.is_file():
            return p
    known = ", ".join(known_lessons()) or "none"
    raise QuizError(f"unknown lesson {str(lesson)!r} (known lessons: {known})")


_cache: dict = {}


def load_bank(lesson) -> Bank:
    """Load and validate the bank of `lesson` ('lesson1' or 1). Unknown lesson -> QuizError."""
    path = bank_path(lesson)
    key = (str(path), path.stat().st_mtime_ns)
    if key not in _cache:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise QuizError(f"cannot read bank {path}: {exc}") from None
        _cache[key] = bank_from_dict(data, path)
    return _cache[key]


def bank_from_dict(data: dict, path: Path | None = None) -> Bank:
    where = str(path) if path else "bank"
    if not isinstance(data, dict) or not isinstance(data.get("questions"), list):
        raise QuizError(f"{where}: a bank is an object with a 'questions' list")
    questions = []
    for i, qd in enumerate(data["questions"]):
        if not isinstance(qd, dict):
            raise QuizError(f"{where}: question #{i + 1} is not an object")
        extra = set(qd) - PUBLIC_KEYS
        if extra:
            raise QuizError(
                f"{where}: question {qd.get('id')!r} has non-public keys {sorted(extra)}"
                " (answers belong in 'sealed')"
            )
        options = [Option(o["id"], o["text"]) for o in qd.get("options", [])]
        questions.append(
            Question(
                qd["id"], qd["type"], qd["prompt"], options, qd.get("unit"), qd.get("sealed", "")
            )
        )
    bank = Bank(
        data.get("lesson", path.stem if path else "?"), data.get("title", {}), questions, path
    )
    for q in questions:
        q.lesson = bank.lesson
    problems = validate(bank)
    if problems:
        raise QuizError(
            f"{where}: {problems[0]}"
            + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
        )
    return bank


# --- authoring: sealed bank <-> plain authoring dict ---------------------------------------


def to_authoring(bank: Bank) -> dict:
    """The plain, editable form of a bank: each question's sealed data under 'secret'."""
    out = {"format": FORMAT, "lesson": bank.lesson, "title": bank.title, "questions": []}
    for q in bank.questions:
        qd = {"id": q.id, "type": q.type, "prompt": q.prompt}
        if q.options:
            qd["options"] = [{"id": o.id, "text": o.text} for o in q.options]
        if q.unit:
            qd["unit"] = q.unit
        qd["secret"] = copy.deepcopy(q.secret)  # edits must not reach the cached bank
        out["questions"].append(qd)
    return out


def from_authoring(data: dict) -> dict:
    """Seal an authoring dict into the bank-file dict (validated)."""
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("questions"), list)
        or "lesson" not in data
    ):
        raise QuizError("an authoring file is an object with 'lesson' and a 'questions' list")
    questions = []
    for qd in data["questions"]:
        if "secret" not in qd:
            raise QuizError(f"question {qd.get('id')!r} has no 'secret'")
        public = {k: v for k, v in qd.items() if k != "secret"}
        public["sealed"] = seal_obj(qd["secret"])
        questions.append(public)
    bank_dict = {
        "format": FORMAT,
        "lesson": data["lesson"],
        "title": data.get("title", {}),
        "questions": questions,
    }
    bank_from_dict(bank_dict)  # raises QuizError on any problem
    return bank_dict


def dump_bank(bank_dict: dict) -> str:
    return json.dumps(bank_dict, ensure_ascii=False, indent=1) + "\n"


# --- validation (also the bank lint the tests run) -----------------------------------------


def _bilingual(d) -> bool:
    return isinstance(d, dict) and all(isinstance(d.get(k), str) and d[k].strip() for k in LANGS)


def validate(bank: Bank) -> list:
    """Return a list of problems (empty when the bank is sound)."""
    problems = []
    seen = set()
    if not _bilingual(bank.title):
        problems.append("title needs en and zh text")
    for q in bank.questions:
        tag = f"question {q.id!r}"
        if q.id in seen:
            problems.append(f"{tag}: duplicate id")
        seen.add(q.id)
        if q.type not in TYPES:
            problems.append(f"{tag}: type {q.type!r} is not one of {TYPES}")
            continue
        if not _bilingual(q.prompt):
            problems.append(f"{tag}: prompt needs en and zh text")
        try:
            s = q.secret
        except QuizError as exc:
            problems.append(str(exc))
            continue
        problems += [f"{tag}: {p}" for p in _validate_secret(q, s)]
    return problems


def _validate_secret(q: Question, s: dict) -> list:
    p = []
    if q.type in ("single", "multi"):
        ids = q.option_ids()
        if len(ids) < 2 or len(set(ids)) != len(ids):
            p.append("needs at least two options with unique ids")
        p += [f"option {o.id!r} needs en and zh text" for o in q.options if not _bilingual(o.text)]
        correct = s.get("correct")
        correct_set = {correct} if q.type == "single" else set(correct or [])
        if q.type == "single" and not isinstance(correct, str):
            p.append("secret.correct must be one option id")
        if q.type == "multi" and not isinstance(correct, list):
            p.append("secret.correct must be a list of option ids")
        if not correct_set <= set(ids):
            p.append(f"secret.correct {correct!r} names options that do not exist")
        why = s.get("why", {})
        # every option gets a why: wrong ones say why they are wrong, right ones why they are right
        p += [
            f"option {i!r} has no en+zh explanation in secret.why"
            for i in ids
            if not _bilingual(why.get(i))
        ]
    elif q.type == "numeric":
        if not isinstance(s.get("value"), (int, float)):
            p.append("secret.value must be a number")
        tol = s.get("tolerance", {})
        if not (
            isinstance(tol, dict)
            and len(tol) == 1
            and set(tol) <= {"abs", "rel"}
            and isinstance(next(iter(tol.values())), (int, float))
            and next(iter(tol.values())) >= 0
        ):
            p.append("secret.tolerance must be {'abs': x} or {'rel': x} with x >= 0")
        if not _bilingual(s.get("explanation")):
            p.append("secret.explanation needs en and zh text")
        if not _bilingual(q.unit):
            p.append("unit needs en and zh text")
    elif q.type == "open":
        p += validate_open(s)
    elif q.type == "code" and s:
        # Checkers register themselves (quizzes.exercise.exercise); a bank names none.
        p.append(
            f"a code question keeps no secret (its checker registers itself with "
            f"@exercise(lesson, id)); found {sorted(s)}"
        )
    return p


def _says_problems(where: str, says) -> list:
    if not (
        isinstance(says, dict) and all(isinstance(says.get(k), list) and says[k] for k in LANGS)
    ):
        return [f"{where}: 'says' needs en and zh phrasings"]
    return [
        f"{where}: phrasing {ph!r}: {err}"
        for k in LANGS
        for ph in says[k]
        for err in [phrase_error(ph) if isinstance(ph, str) else "not a string"]
        if err
    ]


def _fix_problems(where: str, entry: dict, keys) -> list:
    """The 'wrong' / 'swapped' texts say what is true instead; the feedback quotes the learner
    before them ("You wrote: «...» — in fact <text>")."""
    out = []
    for key in keys:
        text = entry.get(key)
        if _bilingual(text) and (
            text["en"].lower().startswith("you wrote") or text["zh"].startswith("你写")
        ):
            out.append(
                f"{where}: '{key}' says what is true instead (the feedback quotes the learner "
                "before it), not 'you wrote that ...'"
            )
    return out


def validate_open(s: dict) -> list:
    """Problems of an open question's claims (README: "Open questions graded by claims")."""
    p = []
    old = sorted({"ideas", "min_ideas", "samples"} & set(s))
    if old:
        p.append(
            f"keyword rubric fields {old} are no longer graded: write claims "
            "(quizzes/README.md, 'Open questions graded by claims')"
        )
    subjects = s.get("subjects", {})
    if not isinstance(subjects, dict):
        p.append("secret.subjects must be an object of name -> {en, zh} phrasings")
        subjects = {}
    for name, says in subjects.items():
        p += _says_problems(f"subject {name!r}", says)
    claims = s.get("claims")
    if not isinstance(claims, list) or not claims:
        p.append("secret.claims must be a non-empty list")
        claims = []
    ids = set()
    for c in claims:
        cid = c.get("id") if isinstance(c, dict) else None
        if not isinstance(cid, str) or cid in ids:
            p.append(f"claim {cid!r}: needs a unique string id")
            continue
        ids.add(cid)
        if not _bilingual(c.get("label")):
            p.append(f"claim {cid!r}: needs an en and zh label")
        if "weight" in c:
            p.append(
                f"claim {cid!r}: 'weight' is no longer graded: every key idea is required "
                "(group the claims into secret.key_ideas)"
            )
        forms = c.get("forms")
        if not isinstance(forms, list) or not forms:
            p.append(f"claim {cid!r}: needs a non-empty list of forms")
            continue
        for i, f in enumerate(forms):
            where = f"claim {cid!r} form #{i + 1}"
            p += _says_problems(where, f.get("says"))
            for key in ("subject", "rival"):
                if key in f and f[key] not in subjects:
                    p.append(f"{where}: {key} {f[key]!r} is not in secret.subjects")
            if not f.get("one_way") and not _bilingual(f.get("wrong")):
                p.append(
                    f"{where}: needs an en and zh 'wrong' text (what is true instead of the denied "
                    "statement)"
                )
            if "rival" in f and not _bilingual(f.get("swapped")):
                p.append(f"{where}: a form with a rival needs an en and zh 'swapped' text")
            p += _fix_problems(where, f, ("wrong", "swapped"))
            if f.get("own_subject") and "rival" not in f:
                p.append(
                    f"{where}: own_subject needs a rival (it says the rival's denial credits "
                    "nothing)"
                )
    for i, m in enumerate(s.get("misconceptions", [])):
        where = f"misconception {m.get('id', '#' + str(i + 1))!r}"
        if not isinstance(m.get("id"), str) or m["id"] in ids:
            p.append(f"{where}: needs a unique string id")
        ids.add(m.get("id"))
        p += _says_problems(where, m.get("says"))
        if not _bilingual(m.get("wrong")):
            p.append(f"{where}: needs an en and zh 'wrong' text")
        p += _fix_problems(where, m, ("wrong",))
        if "subject" in m and m["subject"] not in subjects:
            p.append(f"{where}: subject {m['subject']!r} is not in secret.subjects")
        true_of = m.get("true_of", [])
        if not isinstance(true_of, list) or any(x not in subjects for x in true_of):
            p.append(f"{where}: true_of must list subjects of secret.subjects")
    if "min_claims" in s:
        p.append(
            "secret.min_claims is no longer graded: an answer is correct when it states every key "
            "idea (secret.key_ideas)"
        )
    for i, k in enumerate(s.get("key_ideas", [])):
        where = f"key idea #{i + 1}"
        if not (
            isinstance(k, dict)
            and isinstance(k.get("id"), str)
            and _bilingual(k.get("label"))
            and isinstance(k.get("claims"), list)
            and k["claims"]
        ):
            p.append(f"{where}: needs an id, an en and zh label and a non-empty list of claim ids")
            continue
        for cid in k["claims"]:
            if cid not in ids:
                p.append(f"key idea {k['id']!r}: claim {cid!r} is not a claim of this question")
    grouped = [
        cid for k in s.get("key_ideas", []) if isinstance(k, dict) for cid in k.get("claims") or []
    ]
    if len(grouped) != len(set(grouped)):
        p.append(
            "key_ideas: a claim belongs to one key idea at most (else one sentence meets two ideas)"
        )
    if "key_ideas" in s and not s["key_ideas"]:
        p.append("key_ideas: at least one key idea")
    if "topic" in s:
        p += _says_problems("topic", s["topic"])
    else:
        p.append(
            "secret.topic needs en and zh phrasings of what the question is about: a sentence "
            "that names them and matches no claim is 'unread', and the verdict is at best unsure"
        )
    for i, r in enumerate(s.get("neutral", [])):
        where = (
            f"neutral remark {r.get('id', '#' + str(i + 1))!r}"
            if isinstance(r, dict)
            else f"neutral #{i + 1}"
        )
        if not isinstance(r, dict) or not isinstance(r.get("id"), str) or r["id"] in ids:
            p.append(f"{where}: needs a unique string id")
            continue
        ids.add(r["id"])
        p += _says_problems(where, r.get("says"))
    if not _bilingual(s.get("reference")):
        p.append("secret.reference needs en and zh text")
    return p
