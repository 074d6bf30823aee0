"""Reading an open answer for the claims it makes (see "Open questions graded by claims" in README).

The answer is cut into clauses; in each clause a claim's phrasing is looked for, its subject is
found (nearest mention, else the previous clause's), and its direction is read (negation, the
rival subject, a form that is true only when denied). A claim stated the true way supports it;
stated the false way it is a misconception. Nothing here knows about any lesson: every rule
comes from the question's sealed data.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from functools import lru_cache

CJK = "\u3400-\u9fff\uf900-\ufaff"
_CJK_CHAR = re.compile(f"[{CJK}]")
CJK_RE = _CJK_CHAR

# Sentences end at . ! ? ; (a dot only when a space or the end follows: torch.save stays whole)
# and at their Chinese forms and line breaks; clauses split further at commas, colons, brackets
# and contrast words, where a new statement (often about another subject) begins.
_SENTENCE_END = re.compile(r"(?:[!?;]|\.(?=\s|$))+|[。！？；\n]+")
_CLAUSE_SPLIT = re.compile(
    r"[,:()\[\]，、：（）]+"
    r"|\s(?:but|while|whereas|although|though|however|yet|so|because|since|which|therefore|thus|hence)\s"
    r"|而|但|则|却|不过|然而|所以|因为|因此|于是|从而")

# What makes a mention the thing compared with rather than the subject of the clause.
_COMPARAND = re.compile(r"(?:\b(?:than|unlike|like|compared (?:to|with)|versus|vs|as opposed to|instead of|"
                        r"rather than|same as|similar to|as with|without)\s+(?:the\s+|with\s+|a\s+|any\s+)?$)"
                        r"|(?:(?:比|相比|比起|不像|不同于|与|和|跟|像)\s*$)")

# Negation. English cues are whole words; "no" before "sync"/"shard" is the name no_sync /
# NO_SHARD. Chinese cues are characters, except in the words listed where they negate nothing.
_NEG_EN = re.compile(
    r"(?<![a-z0-9])(?:not(?! only)|no(?! (?:sync|shard|matter))|never|without|nothing|none|neither|nor|"
    r"cannot|hardly|instead of|rather than|prevent\w*|avoid\w*|skip\w*|omit\w*|\w+n't|doesnt|dont|isnt|cant|wont|"
    r"arent|didnt|wasnt|werent|shouldnt|wouldnt|couldnt|hasnt|havent|neednt|mustnt)(?![a-z0-9])")
_NEG_ZH = re.compile(r"避免|阻止|妨碍|防止|跳过|省去|省掉|免去|[不没无未非别勿]")
_NOT_NEG_ZH = re.compile(r"不同|不仅|不只|不但|不过|不断|不管|不论|无论|非常|不少|不久|除非|未来|无关紧要|是不是|"
                         r"要不要|能不能|会不会|并非只|未分片|非分片|"  # 未分片 is "unsharded", one word
                         f"[{CJK}]不[下了动到起出进上完够]")  # 放不下: a complement, read after the verb

# A clause "carries a verb" when it is a statement, not a keyword list.
_VERBS = """add allocate cross travel allow apply ask assign avoid become begin break bring build call cause change
materialize materialise exceed explode crash deadlock communicate accumulate synchronize synchronise
pickle serialize serialise broadcast collect concatenate combine duplicate replicate partition
distribute spread reach wait finish participate involve matter affect lower raise double halve
check choose compute connect contain copy cost create cut decide define depend discard divide drop
eat end export fail fill find finish fit flush follow free gather get give go grow handle hang happen
have help hide hold increase init initialize issue join keep kill know launch lead leave let limit
live load lose lower make manage mean measure merge monitor move need overlap own pass pay peak pick
prefetch prevent produce put reach read receive reduce release reload remain remove repeat replace
require reshard restart restore resume retain return run save scale scatter see send set shard
shrink skip slow spawn speed split start stay stop store sum support sync take tell throw track
train trade turn update use wait want watch work wrap write""".split()
_IRREGULAR = """held kept thrown written sent made gave given built took taken ran began begun brought
chose chosen cut fed fit found got gotten grew grown hid hidden hung knew known led left let lost
meant paid put read saw seen set shown split spent stood told won wrote""".split()
_VERB_FORM = re.compile(
    r"(?<![a-z0-9])(?:(?:" + "|".join(_VERBS) + r")(?:s|es|d|ed|ing|ped|ted|ned|ged|ded|ling|ning|ting|ping|ging)"
    r"|" + "|".join(_IRREGULAR) + r")(?![a-z0-9])")
_AUX_EN = re.compile(
    r"(?<![a-z0-9])(?:is|are|was|were|be|been|being|am|has|have|had|does|do|did|can|could|will|would|"
    r"must|should|shall|may|might|need|needs|it|they|we|you|i|both|there|which|who|because|"
    r"to (?:" + "|".join(_VERBS) + r")|\w+n't|\w+'s|\w+'re|\w+'ll|\w+'d|cannot)(?![a-z0-9])")
_ZH_KEYWORD_RUN = re.compile(f"[{CJK}]\\s+[{CJK}]")


def normalise(text: str) -> str:
    """NFKC (full-width letters become ASCII), lower case, curly quotes straightened, and the
    separators - _ . / inside and between words turned into spaces: 'FULL_SHARD re-shards'
    -> 'full shard re shards'. Whitespace collapsed."""
    text = unicodedata.normalize("NFKC", text).lower().replace("\u2019", "'").replace("\u2018", "'")
    text = re.sub(r"[-_./\\]+", " ", text)
    return " ".join(text.split())


def split_clauses(text: str) -> list:
    """[(sentence_index, clause_text_normalised)] in order, empty clauses dropped."""
    out = []
    # a call is a word, not a parenthesis: torch.save(model.state_dict()) -> torch.save model.state_dict
    text = unicodedata.normalize("NFKC", text).replace("()", "")
    while re.search(r"(?<=\w)\(([^()]*)\)", text):
        text = re.sub(r"(?<=\w)\(([^()]*)\)", r" \1", text)
    for s, sentence in enumerate(_SENTENCE_END.split(text)):
        for clause in _CLAUSE_SPLIT.split(sentence):
            norm = normalise(clause)
            if norm:
                out.append((s, norm))
    return out


def word_count(text: str) -> int:
    """English words plus Chinese characters counted as words."""
    norm = normalise(text)
    return len(re.findall(r"[a-z0-9']+", norm)) + len(_CJK_CHAR.findall(norm))


def carries_verb(clause: str) -> bool:
    """Is the clause a statement rather than a keyword list? English: an auxiliary, a pronoun
    subject, '=', an inflected verb or 'to' + verb. Chinese (no inflection to go by): three
    characters or more, not written as space-separated keywords ('释放 参数 显存')."""
    if len(_CJK_CHAR.findall(clause)) >= 3:
        return not _ZH_KEYWORD_RUN.search(clause)
    return bool("=" in clause or _AUX_EN.search(clause) or _VERB_FORM.search(clause))


# --- phrasings -----------------------------------------------------------------------------------

def _is_ascii_word(ch: str) -> bool:
    return ch.isascii() and ch.isalnum()


# "..." in a phrasing: a few words in between, not across "and" (that starts another statement:
# "saves memory and pays with an extra all-gather" does not say "saves ... all-gather").
_GAP = r"(?:(?!\sand\s)[^\n]){0,40}?"


@lru_cache(maxsize=4096)
def compile_phrase(phrase: str) -> re.Pattern:
    """Translate a phrasing (see README) into a regex over normalised clause text. Every literal
    run is a named group lit<n>, so negation cues inside the literal words can be told apart
    from those in the gaps ('params are not freed': 'not' sits in the gap)."""
    if phrase.startswith("re:"):
        return re.compile(phrase[3:])
    counter = [0]

    def literal(run: str) -> str:
        pieces, prev = [], None
        for ch in run:
            if ch == " ":
                prev = " "
                continue
            if ch == "*":
                pieces.append(r"[a-z0-9']*")
                prev = "*"
                continue
            if prev is not None and pieces:
                # a space in the phrase, or any CJK boundary: optional whitespace in the answer
                if prev == " " or _CJK_CHAR.match(ch) or _CJK_CHAR.match(prev):
                    pieces.append(r"\s?")
            pieces.append(re.escape(ch))
            prev = ch
        body = "".join(pieces)
        if _is_ascii_word(run[0]):
            body = r"(?<![a-z0-9])" + body
        if _is_ascii_word(run[-1]):
            body += r"(?![a-z0-9])"
        counter[0] += 1
        return f"(?P<lit{counter[0]}>{body})"

    def sequence(text: str) -> str:
        """Top-level '...' gaps between runs of literal words and (a|b) groups."""
        return _GAP.join(run(seg.strip()) for seg in _split_top(text, "...") if seg.strip())

    def run(text: str) -> str:
        out, i, buf = [], 0, ""
        while i < len(text):
            if text[i] == "(":
                if buf.strip():
                    out.append(literal(buf.strip()))
                buf = ""
                depth, j = 1, i + 1
                while j < len(text) and depth:
                    depth += {"(": 1, ")": -1}.get(text[j], 0)
                    j += 1
                parts = _split_top(text[i + 1:j - 1], "|")
                out.append("(?:" + "|".join(sequence(part) for part in parts) + ")")
                i = j
                continue
            buf += text[i]
            i += 1
        if buf.strip():
            out.append(literal(buf.strip()))
        return r"\s?".join(out)

    return re.compile(sequence(phrase))


def _split_top(text: str, sep: str) -> list:
    """Split at `sep` outside brackets."""
    parts, depth, cur, i = [], 0, "", 0
    while i < len(text):
        ch = text[i]
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and text.startswith(sep, i):
            parts.append(cur)
            cur, i = "", i + len(sep)
            continue
        cur += ch
        i += 1
    parts.append(cur)
    return parts


def phrase_error(phrase: str) -> str | None:
    """Why a phrasing cannot be used (None when it is fine): the bank lint runs this."""
    if phrase.count("(") != phrase.count(")"):
        return "unbalanced brackets"
    try:
        compile_phrase(phrase)
    except re.error as exc:
        return f"bad pattern: {exc}"
    if phrase != phrase.lower():
        return "phrasings are lower case"
    if not phrase.startswith("re:") and "?" in phrase:
        return "'?' is not part of the phrasing language: write the forms out ((rank|ranks)), or (的|) for optional"
    return None


# --- negation and subjects ------------------------------------------------------------------------

# Negation reaches the statement right after it: at most 3 English words or 2 Chinese characters
# in between ("not worth it for models so big that the unsharded gradient ..." does not deny
# "unsharded gradient"; "梯度不分片会多占显存" does not deny 多占显存). A quantifier ("no rank",
# 没有哪个) or a verb of omission (skip, avoid, 省去) reaches the whole clause: what it takes is
# its object ("省去了反向时的第二次 all-gather").
_NEG_REACH_WORDS, _NEG_REACH_CJK = 3, 2
_NEG_QUANTIFIER = re.compile(r"没有哪个|没有任何|没有一个|并非所有|不是所有|不是每个|避免|阻止|妨碍|防止|跳过|省去|省掉|免去|"
                             r"(?<![a-z0-9])(?:no|none of|neither|without|instead of|rather than|prevent\w*|"
                             r"avoid\w*|skip\w*|omit\w*)(?![a-z0-9])")


def negation_cues(clause: str) -> list:
    """[(start, end, reaches_whole_clause)] of the negation cues in a normalised clause."""
    cues = [(m.start(), m.end()) for m in _NEG_EN.finditer(clause)]
    skip = [range(m.start(), m.end()) for m in _NOT_NEG_ZH.finditer(clause)]
    cues += [(m.start(), m.end()) for m in _NEG_ZH.finditer(clause) if not any(m.start() in r for r in skip)]
    quantifiers = [m.start() for m in _NEG_QUANTIFIER.finditer(clause)]
    return sorted((s, e, s in quantifiers) for s, e in cues)


def _reaches(clause: str, cue_end: int, start: int) -> bool:
    between = clause[cue_end:start]
    return (len(re.findall(r"[a-z0-9']+", between)) <= _NEG_REACH_WORDS
            and len(_CJK_CHAR.findall(between)) <= _NEG_REACH_CJK)


@dataclass
class Mention:
    name: str
    start: int
    end: int
    comparand: bool


def subject_mentions(clause: str, subjects: dict) -> list:
    """Every mention of a subject in the clause, longest phrasing first where they overlap."""
    found = []
    for name, phrasings in subjects.items():
        for p in phrasings:
            for m in compile_phrase(p).finditer(clause):
                found.append(Mention(name, m.start(), m.end(), bool(_COMPARAND.search(clause[:m.start()]))))
    found.sort(key=lambda m: (m.start, -(m.end - m.start)))
    kept, last_end = [], -1
    for m in found:
        if m.start >= last_end:
            kept.append(m)
            last_end = m.end
    return kept


def resolve_subject(mentions: list, start: int, end: int, inherited):
    """(subject name or None, offset after which a negation counts, named in this clause?)."""
    before = [m for m in mentions if m.end <= start and not m.comparand]
    if before:
        return before[-1].name, before[-1].end, True
    inside = [m for m in mentions if m.start < end and m.end > start and not m.comparand]
    if inside:  # the phrasing names its subject itself ("DCP stores the metadata")
        return inside[0].name, start, True
    after = [m for m in mentions if m.start >= end and not m.comparand]
    if after:
        return after[0].name, 0, True
    return inherited, 0, False


# --- reading an answer ----------------------------------------------------------------------------

@dataclass
class Reading:
    supported: dict = field(default_factory=dict)        # claim id -> the clause that states it
    misconceptions: list = field(default_factory=list)   # [(id, {en, zh} message, clause)]
    clauses: int = 0
    verb_clauses: int = 0
    words: int = 0
    trace: list = field(default_factory=list)            # one line per match, for authors


def _phrasings(says: dict) -> list:
    return [p for lang in ("en", "zh") for p in says.get(lang, [])]


# A negation before "and" belongs to the statement before it: "the other ranks never join and it
# deadlocks" does not deny the deadlock.
_AND = re.compile(r"\sand\s|并且|并")
# Denials that follow the verb: Chinese potential complements (加载不了 cannot load, 放不下) and
# English 'X is disabled'.
_NEG_AFTER = re.compile(r"\s?(?:不了|不下|不动|不到|不起|不出|不成|不上|不进)"
                           r"|\s(?:is|are|gets|get|becomes|become|was|were) (?:disabled|turned off|impossible|lost|"
                           r"broken|gone|blocked|not possible)(?![a-z0-9])")


def _polarity(clause: str, match: re.Match, anchor: int) -> bool:
    """True when the statement is affirmed, False when denied (odd number of cues)."""
    literal = [match.span(g) for g in match.re.groupindex if g.startswith("lit") and match.span(g)[0] >= 0]
    cues = []
    for c, c_end, whole in negation_cues(clause):
        if not anchor <= c < match.end() or any(a <= c < b for a, b in literal):
            continue
        # the words it denies: the next literal of the phrasing (a cue in a gap) or the phrasing
        target = min((a for a, _ in literal if a >= c_end), default=match.end())
        if _AND.search(clause, c, target) or not (whole or _reaches(clause, c_end, target)):
            continue
        cues.append(c)
    after = _NEG_AFTER.match(clause, match.end())
    return (len(cues) + bool(after)) % 2 == 0


# An infinitive of purpose ("to save ... and load on another world size, you need ...") states
# nothing about whether the thing works.
_PURPOSE = re.compile(r"(?:^|(?<![a-z0-9]))(?:to|in order to)\s$|^(?:to|in order to|为了)\s")


def _find(clause: str, phrasings: list):
    """The leftmost, then longest, match of any phrasing: it takes in the most of the statement
    (so '省掉 ... reduce scatter' wins over 'k 1 ... reduce scatter' and 省掉 is read as a word
    of the claim, not as a negation of it)."""
    best = None
    for p in phrasings:
        m = compile_phrase(p).search(clause)
        if m and (best is None or (m.start(), -m.end()) < (best.start(), -best.end())):
            best = m
    return best


def read_answer(text: str, secret: dict) -> Reading:
    subjects = {name: _phrasings(s) for name, s in secret.get("subjects", {}).items()}
    owners = {f["subject"] for c in secret["claims"] for f in c["forms"] if f.get("subject")}
    reading = Reading(words=word_count(text))
    inherited = None
    seen_wrong = set()

    def wrong(key, message, clause):
        if key not in seen_wrong:
            seen_wrong.add(key)
            reading.misconceptions.append((key[0], message, clause))

    clauses = split_clauses(text)
    # a sentence is a statement when one of its clauses carries a verb; keyword lists have none
    stated = {s for s, clause in clauses if carries_verb(clause)}
    for s, clause in clauses:
        reading.clauses += 1
        mentions = subject_mentions(clause, subjects)
        verb = s in stated
        reading.verb_clauses += verb
        if not verb:
            reading.trace.append(f"[{clause}] no verb in its sentence: not read")
        if verb:
            for claim in secret["claims"]:
                found = [(f_index, form, m) for f_index, form in enumerate(claim["forms"])
                         for m in [_find(clause, _phrasings(form["says"]))] if m]
                for f_index, form, m in found:
                    if any(o is not m and o.start() < m.end() and m.start() < o.end()
                           and (o.start(), -o.end()) < (m.start(), -m.end()) for _, _, o in found):
                        continue  # another form of this claim reads these words first (or reads more of them)
                    if form.get("negated") and _PURPOSE.search(clause[:m.start()]):
                        continue  # "to load on another world size, you need ...": a purpose, not a statement
                    subject, anchor, named = resolve_subject(mentions, m.start(), m.end(), inherited)
                    want, rival = form.get("subject"), form.get("rival")
                    if want and (subject is None or subject not in (want, rival)):
                        continue  # a statement about something else (or about nobody named)
                    if not want and named and subject in owners and subject != rival:
                        continue  # a form about the topic at large does not read a clause about a subject with claims of its own
                    affirmed = _polarity(clause, m, anchor)
                    swapped = subject is not None and subject == rival
                    # each of denial, a form true only when denied, and the rival subject flips it
                    true = affirmed ^ bool(form.get("negated")) ^ swapped
                    reading.trace.append(f"[{clause}] {claim['id']}#{f_index + 1} {m.group(0)!r} "
                                         f"subject={subject} {'affirmed' if affirmed else 'denied'} -> "
                                         f"{'supports' if true else 'ignored (one way)' if form.get('one_way') else 'MISCONCEPTION'}")
                    if not true and form.get("one_way"):
                        continue  # a condition, not a claim: denying it says nothing false
                    if true:
                        reading.supported.setdefault(claim["id"], clause)
                    elif swapped and "swapped" in form:
                        wrong((claim["id"], f_index, "swapped"), form["swapped"], clause)
                    else:
                        wrong((claim["id"], f_index, "wrong"), form["wrong"], clause)
            for mis in secret.get("misconceptions", []):
                m = _find(clause, _phrasings(mis["says"]))
                if not m:
                    continue
                subject, anchor, _ = resolve_subject(mentions, m.start(), m.end(), inherited)
                if mis.get("subject") and subject != mis["subject"]:
                    continue
                reading.trace.append(f"[{clause}] misconception {mis['id']} {m.group(0)!r} subject={subject} "
                                     f"{'affirmed' if _polarity(clause, m, anchor) else 'denied'}")
                if _polarity(clause, m, anchor):
                    wrong((mis["id"], -1, "wrong"), mis["wrong"], clause)
        named = [m for m in mentions if not m.comparand]
        if named:
            inherited = named[-1].name
    return reading
