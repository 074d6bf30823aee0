"""Reading an open answer for the claims it makes (see "Open questions graded by claims" in README).

The answer is cut into sentences and clauses; in each clause a claim's phrasing is looked for,
its subject is found (nearest mention, the agent after 被 / "by", else the previous clause's),
and its direction is read (negation per word, the rival subject, a form that is true only when
denied). A claim stated the true way supports it; stated the false way it is a misconception. A
clause that states something about the question's topic and matches nothing the question knows
is *unread*: the grader says so instead of guessing. Nothing here knows about any lesson: every
rule comes from the question's sealed data.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from functools import lru_cache

from .language import en_lemmas, zh_words

CJK = "\u3400-\u9fff\uf900-\ufaff"
_CJK_CHAR = re.compile(f"[{CJK}]")
CJK_RE = _CJK_CHAR

# Sentences end at . ! ? ; (a dot only when a space or the end follows: torch.save stays whole)
# and at their Chinese forms and line breaks; clauses split further at commas, colons, brackets
# and contrast words, where a new statement (often about another subject) begins.
_SENTENCE_END = re.compile(r"(?:[!?;]|\.(?=\s|$))+|[。！？；\n]+")
_COMMA = r"[,，、]+"
_DASH = r"—+|――+|--|–"
# An arrow between statements ("FSDP doesn't -> shards come from different inits") says what
# follows from the first: it stays inside the clause (a phrasing may read across it: "量小 →
# 跨节点也没关系"), as " → ", and no negation reaches across it (_AND)
_ARROW = re.compile(r"\s*(?:->|=>|→|⇒|⟶)\s*")
_CLAUSE_SPLIT = re.compile(
    r"(" + _COMMA + r"|[:()\[\]：（）]+"
    # a dash between statements ("FSDP has no such step — classic FSDP only ...") and an arrow
    # between them ("FSDP doesn't -> shards come from different inits": what follows from it); an
    # arrow between two points in time or two ranks ("fwd->bwd", "rank 0 → 所有 rank") was turned
    # into "to" / "到" before (_arrows)
    r"|\s*(?:" + _DASH + r"|\s--\s|\s–\s)\s*"
    # "only while it runs", "just because": a condition of the clause, not a new statement
    # "only fits because it is sharded": the reason is the condition of "only" one word before
    r"|(?<!\bonly)(?<!\bjust)"
    + "".join(rf"(?<!\bonly\s{'[a-z]' * n})" for n in range(2, 12))
    + r"\s(?:because|since)\s"
    # "anything but the shards", "nothing but its slice": 'but' as 'except' ends no clause
    r"|(?<!\bonly)(?<!\bjust)"
    r"(?<!\banything)(?<!\bnothing)(?<!\beverything)(?<!\bnone)(?<!\ball)(?<!\bno one)"
    r"\s(?:but|while|whereas|although|though|however|yet|"
    # "so big that ...", "so much that": a degree, not a consequence
    r"so(?!\s[a-z]+\s(?:that|as)\s)|"
    r"which|therefore|thus|hence)\s"
    # a connective, not the same character inside a word: 反而 (on the contrary), 而且, 进而, 不但,
    # 否则, 规则 (而 / 但 / 则 alone are 'but' / 'whereas')
    r"|(?<![反进从因继然])而(?![且言])|(?<!不)但|(?<![否规原准法])则|却|不过|然而|所以|因为|因此|于是|从而)"
)

# What makes a mention the thing compared with rather than the subject of the clause.
_COMPARAND = re.compile(
    r"(?:\b(?:than|unlike|like|compared (?:to|with)|versus|vs|as opposed to|instead of|"
    r"rather than|same as|similar to|as with|without)\s+(?:the\s+|with\s+|a\s+|any\s+)?$)"
    r"|(?:(?:比|相比|比起|不像|不同于|与|和|跟|像)\s*$)"
)
# ... and one the action is done for ("sets them for you", "帮你把多进程的活干了") is not either
_RELATIVE = re.compile(r"(?<![a-z0-9])(?:what|which|whom|whatever|for)\s+$|(?:帮|替|为|给)\s*$")
# What makes a mention the agent of a passive verb, hence the subject: "freed by FULL_SHARD",
# "被 FULL_SHARD 释放", "由前者释放".
_AGENT = re.compile(r"(?:(?<![a-z0-9])by\s+(?:the\s+)?$)|(?:[被由让]\s*$)")

# English negation: whole words; "no" before "sync"/"shard" is the name no_sync / NO_SHARD.
_NEG_EN = re.compile(
    r"(?<![a-z0-9])(?:not(?! only)|no(?! (?:sync|shard|matter))|never|without|nothing|none|"
    r"nobody|neither|nor|cannot|hardly|instead of|rather than|prevent\w*|avoid\w*|skip\w*|"
    r"omit\w*|\w+n't|doesnt|dont|isnt|cant|wont|arent|didnt|wasnt|werent|shouldnt|wouldnt|couldnt|hasnt|havent|neednt|"
    r"mustnt)(?![a-z0-9])"
)
# Chinese negation: read per word (jieba). A word is a negation when it is one of these or starts
# with 不/没/无/未/非/别/勿 and is not a word of its own meaning (不同, 差不多 is a word already).
_NEG_ZH_HEADS = "不没无未非别勿"
_NEG_ZH_WORDS = {
    "并不",
    "并没有",
    "并没",
    "并非",
    "从不",
    "从没",
    "从未",
    "决不",
    "绝不",
    "毫无",
    "没法",
    "避免",
    "阻止",
    "防止",
    "跳过",
    "省去",
    "省掉",
    "免去",
    "用不着",
    "犯不着",
}
_NOT_NEG_ZH = {
    "不同",
    "不仅",
    "不只",
    "不但",
    "不过",
    "不断",
    "不管",
    "不论",
    "无论",
    "非常",
    "不少",
    "不久",
    "除非",
    "未来",
    "无关紧要",
    "不一",
    "不等",
    "不一样",
    "无数",
    "非得",
    "别的",
    "别人",
    "不光",
    "无非",
    "未必然",
    "不然",
    "要不然",
    "不如",
    "不变",
}
# 未分片 is "unsharded", one adjective
# 要不 / 要么 ... 要不: "or else", no denial
_NOT_NEG_ZH_RE = re.compile(
    r"未\s?分片|非分片|是不是|要不要|能不能|会不会|要不(?!要)"
    # "不是只重启挂的那个" (not only the one that died): 'not only', no denial of the verb
    r"|(?:并|)(?:不是|非)\s?(?:只|仅|光|单单)"
    # "为什么不包得更细": a question that weighs the option, no denial of it
    r"|(?:为什么|为啥|为何|干嘛|怎么)\s?不"
    # "不 wrap 时的整个模型", "没有 shard 的时候", "不分片的话": a condition (when it is not
    # wrapped), which denies nothing of the clause around it
    r"|(?<![不没])(?:不|没有?)\s?(?:[a-z][a-z_]*|包装|分片|切分|包|做检查点)\s?(?:时|的时候|的话)"
)
# Verbs of omission reach their object anywhere in the clause ("省去了反向时的第二次 all-gather").
_OMIT_ZH = {"避免", "阻止", "防止", "跳过", "省去", "省掉", "免去"}

# A clause "carries a verb" when it is a statement, not a keyword list.
_DOMAIN_VERBS = set(
    """shard reshard gather prefetch checkpoint broadcast sync synchronize synchronise
all-reduce allreduce materialize materialise spawn wrap flatten unshard recompute rerun
offload""".split()
)
_AUX_EN = re.compile(
    r"(?<![a-z0-9])(?:is|are|was|were|be|been|being|am|has|have|had|does|do|did|can|could|will|"
    r"would|must|should|shall|may|might|need|needs|it|they|we|you|i|he|she|both|there|which|who|"
    r"because|not|never|always|also|\w+n't|\w+'s|\w+'re|\w+'ll|\w+'d|cannot|doesnt|dont|isnt|cant|"
    r"wont|arent)(?![a-z0-9])"
)
# after an ambiguous noun/verb form ("keeps", "gathers"), these say it is the verb
_OBJECT_START = set(
    """the a an its their them it all each every only up out off back down into across over
one both his her our your this that these those more less no nothing some any to in on at from
with for after before until once twice again everything by inside within across between
through""".split()
)
# a one-character Chinese verb right before an English term: a note's statement ('起 worker',
# '设 env', '存 shard', '传 rank')
_ZH_VERB_TERM = re.compile(f"(?<![{CJK}])[起设存算传拿发收读写跑放删换建调加载]\\s?[a-z]")
_LOCATIVE = {"on", "inside", "within", "across", "over", "between", "through", "in", "at"}
_ZH_KEYWORD_RUN = re.compile(f"[{CJK}]\\s+[{CJK}]")


# The abbreviations learners write, read as the words every bank's phrasings use: "re-AGs them in
# bwd", "SGO keeps them fwd->bwd", "lowest mem", "per-rank bs". Applied to the answer and to the
# phrasings alike (a bank that writes "comm" still matches "comm").
_ABBREVIATIONS = {
    "fwd": "forward",
    "bwd": "backward",
    "ag": "all gather",
    "ags": "all gathers",
    "rs": "reduce scatter",
    "rss": "reduce scatters",
    "ar": "all reduce",
    "ars": "all reduces",
    "sgo": "shard grad op",
    "mem": "memory",
    "comm": "communication",
    "comms": "communication",
    "bs": "batch size",
    "proc": "process",
    "procs": "processes",
    "ckpt": "checkpoint",
    "ckpts": "checkpoints",
}
_ABBREVIATION_WORD = re.compile(r"(?<![a-z0-9'*])(" + "|".join(_ABBREVIATIONS) + r")(?![a-z0-9'*])")


def expand_abbreviations(norm: str) -> str:
    return _ABBREVIATION_WORD.sub(lambda m: _ABBREVIATIONS[m.group(1)], norm)


# A keyword argument is an API name, not a statement: "reshard_after_forward=True/False",
# "sync_module_states=True", "the reshard_after_forward flag of fully_shard" name a switch; read
# as words they would state "reshards after forward" or "syncs module states" of whatever subject
# the clause has. Such a name (lower case, words joined by '_') is bracketed in the normalised
# text ("⟦reshard after forward⟧=true"): a phrasing read inside the brackets names the switch and
# states nothing (_read_clause). An upper-case constant (FULL_SHARD=..., LOCAL_RANK) is left as it
# is: it names a subject.
_API_NAME = re.compile(
    r"(?<![A-Za-z0-9_])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)"
    r"(?=\s*=(?!=)|\s+(?:flag|switch|option|argument|arg|kwarg|parameter|setting)s?\b|\s*(?:开关|参数|选项))"
)


def _api_names(text: str) -> str:
    return _API_NAME.sub(lambda m: f"{API_OPEN}{m.group(1)}{API_CLOSE}", text)


API_OPEN, API_CLOSE = "\u27e6", "\u27e7"


def names_api(norm: str, start: int, end: int) -> bool:
    """Do the words norm[start:end] overlap a keyword argument's name (see _API_NAME)?"""
    for m in re.finditer(f"{API_OPEN}[^{API_CLOSE}]*{API_CLOSE}", norm):
        if m.start() < end and start < m.end():
            return True
    return False


def normalise(text: str) -> str:
    """NFKC (full-width letters become ASCII), lower case, curly quotes straightened, and the
    separators - _ . / inside and between words turned into spaces: 'FULL_SHARD re-shards'
    -> 'full shard re shards'. Whitespace collapsed. A keyword argument's name is bracketed
    ('reshard_after_forward=True' -> '⟦reshard after forward⟧=true'), and the abbreviations
    learners use are spelled out ('AG' -> 'all gather', 'fwd' -> 'forward')."""
    text = _ARROW.sub(" \u2192 ", _api_names(unicodedata.normalize("NFKC", text)))
    text = text.lower().replace("\u2019", "'").replace("\u2018", "'")
    text = re.sub(r"[-_./\\]+", " ", text)
    return expand_abbreviations(" ".join(text.split()))


@dataclass
class Clause:
    sentence: int
    norm: str  # normalised (what phrasings match)
    text: str  # as the learner wrote it (what feedback quotes)
    after_comma: bool  # split from the previous clause of its sentence by a comma or a colon only
    aside: bool = False  # inside brackets: a side remark, which takes no subject from before it
    resumes: int | None = None  # right after a bracket closes: the index (in the answer) of the
    # clause before the bracket opened, whose statement it continues
    # ("most traffic (AG, RS) stays ...")
    opener: str = ""  # the separator it was split off at ('which', 'but', ','): lower case


def _calls_as_words(text: str) -> str:
    """A call is a word, not a parenthesis:
    torch.save(model.state_dict()) -> torch.save model.state_dict."""
    text = unicodedata.normalize("NFKC", text).replace("()", "")
    while re.search(
        r"(?<=[A-Za-z0-9_])\(([^()]*)\)", text
    ):  # ASCII identifiers only: 两倍（…） is an aside
        text = re.sub(r"(?<=[A-Za-z0-9_])\(([^()]*)\)", r" \1", text)
    return text


_ABBREVIATION = re.compile(r"(?<![A-Za-z])(i\.e|e\.g|etc|vs|cf|approx)\.", re.IGNORECASE)


# An arrow between two points in time or two ranks says "from ... to": "keeps them fwd->bwd",
# "fwd→bwd一直持有", "rank 0 → 所有 rank". Any other arrow separates a statement from what follows
# from it (a clause boundary, _CLAUSE_SPLIT).
_POINT = (
    r"(?:fwd|bwd|forward|backward|前向|反向|step|init|rank\s?\d+|all ranks|every rank|each rank|"
    r"other ranks|the others|所有\s?rank|每个\s?rank|其他\s?rank|别的\s?rank)"
)
_POINT_ARROW = re.compile(
    r"(?i)(?<![A-Za-z0-9])(" + _POINT + r")\s*(?:->|→|=>|⇒|⟶)\s*(?=" + _POINT + r"(?![A-Za-z]))"
)


def _arrows(text: str) -> str:
    return _POINT_ARROW.sub(
        lambda m: m.group(1) + ("到" if _CJK_CHAR.search(text[m.end() : m.end() + 2]) else " to "),
        text,
    )


# "TL;DR:" is a heading, not two sentences
_TLDR = re.compile(r"(?i)(?<![a-z])tl\s?;\s?dr(?![a-z])")


def _sentence_parts(text: str) -> list:
    """[(sentence, its end mark, its paragraph)]: the sentences of `sentences`, each with what
    ends it ('?' marks a question) and the number of the line break before it."""
    text = _ABBREVIATION.sub(lambda m: m.group(1) + ",", _arrows(_calls_as_words(text)))
    text = _TLDR.sub("TLDR", text)
    pieces = re.split("(" + _SENTENCE_END.pattern + ")", text)
    out, paragraph = [], 0
    for i in range(0, len(pieces), 2):
        end = pieces[i + 1] if i + 1 < len(pieces) else ""
        if pieces[i].strip():
            out.append((pieces[i].strip(), end, paragraph))
        paragraph += end.count("\n")
    return out


def sentences(text: str) -> list:
    """The answer's sentences, as written (stripped), empty ones dropped. 'i.e.', 'e.g.', 'etc.'
    and 'vs.' end no sentence."""
    return [s for s, _, _ in _sentence_parts(text)]


def clauses(text: str) -> list:
    out = []
    for s, sentence in enumerate(sentences(text)):
        parts = _CLAUSE_SPLIT.split(sentence)
        sep, depth, opened_after, closed = None, 0, None, None
        for i in range(0, len(parts), 2):
            piece = parts[i].strip()
            norm = normalise(piece)
            if norm:
                # "it sets the environment: RANK, LOCAL_RANK ...": what a colon introduces completes
                # the clause
                out.append(
                    Clause(
                        s,
                        norm,
                        piece,
                        bool(sep and re.fullmatch(_COMMA + "|[:：]|" + _DASH, sep.strip())),
                        depth > 0,
                        closed if depth == 0 else None,
                        (sep or "").strip().lower(),
                    )
                )
                closed = None
            sep = parts[i + 1] if i + 1 < len(parts) else None
            if sep:
                before = depth
                depth = max(
                    0, depth + sep.count("(") + sep.count("（") - sep.count(")") - sep.count("）")
                )
                if before == 0 and depth > 0:
                    # the clause the bracket interrupts (none when the sentence opens with it)
                    opened_after = len(out) - 1 if out and out[-1].sentence == s else None
                elif before > 0 and depth == 0:
                    closed = opened_after
    return out


def split_clauses(text: str) -> list:
    """[(sentence_index, clause_text_normalised)] in order, empty clauses dropped."""
    return [(c.sentence, c.norm) for c in clauses(text)]


def word_count(text: str) -> int:
    """English words plus Chinese characters counted as words."""
    norm = normalise(text)
    return len(re.findall(r"[a-z0-9']+", norm)) + len(_CJK_CHAR.findall(norm))


def _plural_noun(word: str) -> bool:
    nouns = en_lemmas(word).get("NOUN", ()) if word else ()
    return word.endswith("s") and bool(nouns) and word not in nouns


def _singular_noun(word: str) -> bool:
    nouns = en_lemmas(word).get("NOUN", ()) if word else ()
    return word in nouns and not word.endswith("s")


# a thing named without a noun ('nothing big crosses nodes', 'each one keeps ...')
_QUANTIFIER = {"nothing", "everything", "something", "each", "one", "none"}
# before a verb at the start of a clause: the clause is still an instruction or a note
_LEAD = {"then", "so", "just", "and", "or", "first", "also", "always", "never", "please", "only"}
# what follows a verb of an instruction or a note ('keep those inside a node', 'reshard after
# fwd', 'all-reduce the grads'): an object, a particle, a time
_AFTER_LEAD_VERB = _OBJECT_START - {"to", "in", "on", "at", "from", "with", "for", "by", "over"}


_DETERMINER = {"each", "every", "the", "a", "an", "this", "that", "its", "one"}


def _leading_verb(words: list) -> bool:
    """An instruction or a note starts with a verb in its base form: 'Put the shard group inside a
    node', 'keep those inside a node', 'reshard after fwd', 'all-reduce the grads once'. A noun
    that can be a verb ('state', 'peak', 'copy') starts one only when an object or a particle
    follows it, never a preposition ('copy of the model')."""
    j = 0
    while j < len(words) and words[j] in _LEAD:
        j += 1
    if (
        j < len(words) - 1
        and words[j] in ("all", "reduce")
        and words[j + 1]
        in (
            "reduce",
            "gather",
            "scatter",
        )
    ):
        j += 1  # 'all-reduce the grads', 'all-gather them', 'reduce-scatter the grads'
    if j >= len(words) - 1:
        return False
    w, nxt = words[j], words[j + 1]
    after = words[j + 2] if j + 2 < len(words) else ""
    verb = en_lemmas(w).get("VERB", ())
    # or an adjective, then the thing: 'keep full params', 'free gathered weights'
    # ('lower peak memory', 'higher peak mem' are things: a word that is an adjective itself)
    described = (
        "ADJ" not in en_lemmas(w)
        and ("ADJ" in en_lemmas(nxt) or nxt.endswith("ed"))
        and ("NOUN" in en_lemmas(after) or after in ("params", "grads"))
    )
    return (w in verb or w in _DOMAIN_VERBS) and (nxt in _AFTER_LEAD_VERB or described)


def _is_verb_form(words: list, i: int) -> bool:
    """Is words[i] an inflected verb? lemminflect's tables tell a plural ('shards': a noun only)
    from a verb form ('frees', 'kept'); a form that can be either ('keeps', 'gathers') is the verb
    when an object or a particle follows it ('keeps the params', 'gathers them again')."""
    w = words[i]
    nxt = words[i + 1] if i + 1 < len(words) else ""
    lemmas = en_lemmas(w)
    verb = lemmas.get("VERB", ())
    prev = words[i - 1] if i else ""
    if verb and w not in verb:  # an inflected form of a verb
        if "NOUN" not in lemmas and "ADJ" not in lemmas or nxt in _OBJECT_START:
            return True
        # a plural noun is not followed by another plural in a noun phrase ('gradient shards'):
        # after one, an -s form is the verb ('the all-reduce of gradient shards crosses nodes')
        if w.endswith("s") and _plural_noun(prev) and bool(nxt):
            return True
        # after a thing named in the singular, an -s form followed by an amount or by things is the
        # verb ('the copy costs 8P/N bytes', 'nothing big crosses nodes'); 'optimizer states' alone,
        # or before 'and', stays a noun phrase
        if (
            w.endswith("s")
            and (_singular_noun(prev) or _QUANTIFIER.intersection(words[max(0, i - 2) : i]))
            and (nxt[:1].isdigit() or _plural_noun(nxt))
        ):
            return True
        # ... and after 'each / every / the' and a thing, before another thing: 'each worker
        # finds RANK ... in its environment', 'every rank keeps its slice'
        return (
            w.endswith("s")
            and i >= 2
            and words[i - 2] in _DETERMINER
            and _singular_noun(prev)
            and bool(nxt)
            and ("NOUN" in en_lemmas(nxt) or not en_lemmas(nxt))
            and nxt not in ("and", "or")
        )
    if (
        w in ("reduce", "gather", "scatter")
        and i >= 2
        and prev in ("all", "reduce")
        and _plural_noun(words[i - 2])
        and nxt in _OBJECT_START
    ):
        return True  # 'the replicas all-reduce the full gradient': a collective as the verb
    if verb and i and _plural_noun(prev):
        # a base form after a plural noun: 'the all-gathers happen inside', 'gradients stay sharded'
        return "NOUN" not in lemmas or nxt in _OBJECT_START
    if verb and i >= 3 and "NOUN" in en_lemmas(prev) and nxt in _LOCATIVE and i + 2 < len(words):
        # a base form after two things named together, then where: 'AG/RS stay on NVLink inside
        # the node' (the '/' is gone: 'all gather reduce scatter stay on ...')
        return True
    if not lemmas:  # a word lemminflect does not know: a course verb with an ending ('resharded')
        if w.startswith("un") and w.endswith("ed"):
            return False  # 'unsharded': an adjective
        stem = re.sub(r"(?:s|es|ed|d|ing)$", "", w)
        return (
            any(stem.endswith(v) or stem.rstrip(v[-1]) == v for v in _DOMAIN_VERBS)
            and w not in _DOMAIN_VERBS
            and (w.endswith(("ed", "ing")) or nxt in _OBJECT_START)
        )
    return False


def carries_verb(clause: str, opens: bool = True) -> bool:
    """Is the clause a statement rather than a keyword list? English: an auxiliary, a pronoun
    subject, '=', or an inflected verb (lemminflect: not a plural). Chinese (no inflection to go
    by): three characters or more, not written as space-separated keywords ('释放 参数 显存')."""
    if len(_CJK_CHAR.findall(clause)) >= 3:
        return not _ZH_KEYWORD_RUN.search(clause)
    if _ZH_VERB_TERM.search(clause):
        return True  # a note: '起 worker + 设 env', '存 shard
    if "=" in clause or _AUX_EN.search(clause):
        return True
    words = re.findall(r"[a-z][a-z']*|(?<![a-z])\d\w*", clause)  # an amount is a word ('8p')
    if re.search(r"(?<![a-z])to\s+[a-z]+", clause) and any(
        "VERB" in en_lemmas(m) for m in re.findall(r"(?<![a-z])to\s+([a-z]+)", clause)
    ):
        return True
    # a verb that starts the clause counts where a statement can start: not an item after a comma
    # ('peak memory, prefetch, reshard after use' is a list)
    return (opens and _leading_verb(words)) or any(
        _is_verb_form(words, i) for i in range(len(words))
    )


_BULLET = re.compile(r"^(?:[-*•·]|\d{1,2}[.)])\s+")
# a slash or plus inside a number ('+1/3', '1/N') separates no items
_LIST_SEP = re.compile(r"\s*(?:[,，、;；|]|(?<!\d)/|/(?!\d)|\+(?!\d)|(?<![a-z])and(?![a-z])|和)\s*")


# words that make a run of Chinese a phrase rather than a term: particles, copula, auxiliaries
# (read per jieba word: 会 is an auxiliary, 会合 "rendezvous" a term)
_ZH_FUNCTION_WORDS = set("的了是在会就都也要把被让将得着过所能")


def _zh_phrase(text: str) -> bool:
    return any(w in _ZH_FUNCTION_WORDS for w, _, _ in zh_words(text))


def _spaced_terms(text: str) -> bool:
    """Five or more space-separated tokens, each one identifier or flag ('LOCAL_RANK', '--nnodes')
    or a Chinese term of at most four characters with no particle or auxiliary in it, two of them
    Chinese: 'RANK LOCAL_RANK WORLD_SIZE 会合 MASTER_ADDR 重启'. A sentence written with spaces
    around its English terms has longer Chinese runs ('每个 rank 只有自己的 shard')."""
    tokens = text.split()
    zh = [t for t in tokens if _CJK_CHAR.search(t)]
    return (
        len(tokens) >= 5
        and len(zh) >= 2
        and all(
            re.fullmatch(r"[a-z0-9_\-.']+", t)
            or (re.fullmatch(f"[{CJK}]{{1,4}}", t) and not _zh_phrase(t))
            for t in tokens
        )
    )


def _participle_term(words: list, i: int) -> bool:
    """A participle that opens an item in front of its noun names a thing, not an action:
    'sharded params', 'gathered weights' (but 'freed after forward' is a statement)."""
    return (
        i == 0
        and len(words) > 1
        and words[0].endswith("ed")
        and words[1] not in _OBJECT_START
        and not _is_verb_form(words, 1)
    )


def keyword_list(sentence: str) -> bool:
    """Three or more items of at most two words (or four Chinese characters) each, separated by
    commas, 、, slashes or spaced Chinese words, with no auxiliary and no item that is a verb
    phrase: 'RANK, LOCAL_RANK, WORLD_SIZE, --max-restarts', '释放、参数、显存',
    '环境变量 rank 会合 重启'.
    (A Chinese word is a jieba word; an identifier like LOCAL_RANK or a flag is one word.)"""
    # a bullet ('- ', '* ', '• ', '1. ') marks a line, not a flag: the line is read without it
    text = _BULLET.sub("", unicodedata.normalize("NFKC", sentence).strip().lower())
    if _AUX_EN.search(normalise(text)):
        return False
    items = [i for i in _LIST_SEP.split(text) if i.strip()]
    if len(items) < 3 and (_ZH_KEYWORD_RUN.search(text) or _spaced_terms(text)):
        items = (
            text.split()
        )  # '环境变量 rank 会合 重启', '环境变量 RANK LOCAL_RANK 会合 MASTER_ADDR 重启'

    def keyword(item):
        ascii_words = re.findall(r"[a-z0-9][a-z0-9_\-.']*", item)
        plain = re.findall(r"[a-z][a-z']*", normalise(item))
        zh = [w for w, _, _ in zh_words(item) if _CJK_CHAR.search(w)]
        # a noun phrase of up to four words is a term too ('one process per GPU'), a verb makes it a
        # statement
        short = (
            len(ascii_words) + len(zh) <= 2
            or (not zh and len(ascii_words) <= 4)
            or (len(ascii_words) <= 1 and len(_CJK_CHAR.findall(item)) <= 4)
            or (not ascii_words and len(zh) <= 3 and len(_CJK_CHAR.findall(item)) <= 6)
        )
        # a one-word item is a term ('restarts'); two words with a verb form are a statement ('frees
        # params')
        verb = (
            len(ascii_words) > 1
            and not item.strip().startswith("-")  # a flag ('--max-restarts')
            and any(
                _is_verb_form(plain, i) and not _participle_term(plain, i)
                for i in range(len(plain))
            )
        )
        return short and not verb and not _zh_phrase(item)

    if len(items) < 3:
        return False
    listed = [keyword(i) for i in items]
    # a long run of items is a list even when one of them is not a term: a verb-like compound
    # ('activation checkpointing, activations, long sequence, batch size, recompute, ...') or a
    # run of spaced terms ('分片、集合通信、rank 0、DCP 元数据 FULL_STATE_DICT 优化器状态'); but a
    # first item with a verb is the statement that introduces the run ('each worker gets RANK,
    # LOCAL_RANK, WORLD_SIZE, ...')
    first = re.findall(r"[a-z][a-z']*", normalise(items[0]))
    opens = not any(
        j and first[j].endswith("s") and _is_verb_form(first, j) for j in range(len(first))
    )
    return all(listed) or (len(items) >= 6 and opens and sum(listed) >= len(items) - 1)


# --- phrasings -----------------------------------------------------------------------------------


def _is_ascii_word(ch: str) -> bool:
    return ch.isascii() and ch.isalnum()


# "..." in a phrasing: a few words in between, not across "and" (that starts another statement:
# "saves memory and pays with an extra all-gather" does not say "saves ... all-gather"), nor
# across the turn of a trade, which puts what is paid on the far side of what is saved: "saving
# that second all-gather at the cost of memory" does not say "saves ... memory", nor 省显存费通信
# 省 ... 通信
_TRADE = (
    r"\s?at the (?:cost|expense) of|\sin (?:exchange|return) for|\sin trade for|代价|费|换取|换来"
    # "pays extra communication for lower memory": what is bought for it
    r"|\sfor (?:a |)(?:lower|less|more|higher|fewer|smaller|larger|bigger|extra|cheaper)(?![a-z])"
)
# ... nor past the comparative that is the predicate of the word before the gap, in terse Chinese
# ("显存低通信多": 低 is what is said of 显存, so "显存 ... 多" is not read across it)
_GAP = (
    r"(?:|(?!更?[低高少多大小省快慢]\s?(?:通信|通讯|显存|内存|带宽|速度|开销|延迟|峰值|计算))"
    r"(?:(?!\sand\s|" + _TRADE + r")[^\n]){1,40}?)"
)


@lru_cache(maxsize=4096)
def compile_phrase(phrase: str) -> re.Pattern:
    """Translate a phrasing (see README) into a regex over normalised clause text. Every literal
    run is a named group lit<n>, so negation cues inside the literal words can be told apart
    from those in the gaps ('params are not freed': 'not' sits in the gap)."""
    if phrase.startswith("re:"):
        return re.compile(phrase[3:])
    phrase = expand_abbreviations(phrase)
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
                parts = _split_top(text[i + 1 : j - 1], "|")
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
        return (
            "'?' is not part of the phrasing language: write the forms out ((rank|ranks)), "
            "or (的|) for optional"
        )
    return None


# --- negation and subjects ------------------------------------------------------------------------

# Negation reaches the statement right after it: at most 3 English words or 2 Chinese characters in
# between ("not worth it for models so big that the unsharded gradient ..." does not deny "unsharded
# gradient"; "梯度不分片会多占显存" does not deny 多占显存). A quantifier ("no rank", 没有哪个) or a
# Chinese verb of omission (省去, 跳过) reaches the whole clause: what it takes is its object
# ("省去了反向时的第二次 all-gather"). English "skip / avoid / prevent" reach 4 words, like a
# negation: "skips the reduce-scatter" denies the reduce-scatter, not the rest of the clause.
_NEG_REACH_WORDS, _NEG_REACH_CJK = 3, 2
_NEG_QUANTIFIER_EN = re.compile(r"(?<![a-z0-9])(?:no|none of|neither)(?![a-z0-9])")
_NEG_QUANTIFIER_ZH = re.compile(
    r"没有哪个|没有任何|没有一个|并非所有|不是所有|不是每个"
    # "通信也不会有什么额外开销": no ... whatsoever
    r"|(?:不会|并不会|并没|没)\s?有\s?(?:什么|任何|多少)|没什么|不存在"
)


def _zh_negations(clause: str) -> list:
    """[(start, end, whole_clause)] of the Chinese negation words (jieba)."""
    skip = [range(m.start(), m.end()) for m in _NOT_NEG_ZH_RE.finditer(clause)]
    out = []
    for word, start, end in zh_words(clause):
        if word in _NOT_NEG_ZH or any(start in r for r in skip):
            continue
        if word in _NEG_ZH_WORDS or (word[0] in _NEG_ZH_HEADS and _CJK_CHAR.match(word[0])):
            if sum(ch in "不没无未非" for ch in word) == 2 and word not in _NEG_ZH_WORDS:
                continue  # 不能不, 不得不, 不会不: a double negation says it must
            # a word that only ends in 不X (放不下, 加载不了) is a denial after the verb
            # (_NEG_AFTER); inside a word of _NEG_ZH_WORDS (用不着, 犯不着) the cue is its 不,
            # which a phrasing that starts at 用 does not swallow
            head = next((i for i, ch in enumerate(word) if ch in "不没无未非"), 0)
            if word[0] in _NEG_ZH_HEADS:
                out.append((start, start + 1, word in _OMIT_ZH))
            else:
                out.append((start + head, end, word in _OMIT_ZH))
    return out


_WHY_BEFORE = re.compile(r"(?<![a-z])why\s(?:(?:do|does|would|should)\s)?$")


def negation_cues(clause: str) -> list:
    """[(start, end, reaches_whole_clause)] of the negation cues in a normalised clause."""
    # "why not wrap finer?", "why don't we keep them": a question that weighs the option
    cues = [
        (m.start(), m.end(), False)
        for m in _NEG_EN.finditer(clause)
        if not _WHY_BEFORE.search(clause, 0, m.start())
    ]
    # "neither A nor B broadcasts": one denial, not two that cancel out
    neither = re.search(r"(?<![a-z0-9])neither(?![a-z0-9])", clause)
    if neither:
        cues = [c for c in cues if not (c[0] > neither.start() and clause[c[0] : c[1]] == "nor")]
    quantifiers = {m.start() for m in _NEG_QUANTIFIER_EN.finditer(clause)} | {
        m.start() for m in _NEG_QUANTIFIER_ZH.finditer(clause)
    }
    cues = [(s, e, s in quantifiers) for s, e, _ in cues]
    cues += [(s, e, whole or s in quantifiers) for s, e, whole in _zh_negations(clause)]
    return sorted(cues)


_COMPARATOR = re.compile(r"instead of|rather than")
_CONDITION_NEXT = re.compile(r"\s(?:when|if|unless|for|in case)(?![a-z])|\s?(?:当|如果)")
_CAUSATIVE = re.compile(r"\s?(?:会|能|)\s?(?:让|使|令|叫)|\s?(?:let|make|allow|have|cause)s?\s")


# A Chinese negation denies the verb after the adverbs and the prepositional phrase in front of
# it: "不会在前向之后继续持有" (does not keep, after forward), "不在前向后释放", "没有把优化器放在另
# 一份拷贝上", "不会像整个模型那么大". Those words do not count towards its reach; another verb in
# between still ends it ("梯度不分片会多占显存" does not deny 多占显存).
_ZH_ADVERBS = (
    r"(?:\s?(?:会|能|要|该|应该|需要|用|再|还|就|都|也|是|有|一直|继续|马上|立刻|立即|直接|再次|"
    r"重新|必|总|总是|一定|真的|完全|根本|曾|法)\s?)*"  # 法: the rest of 没法 / 无法
)
_ZH_PREPOSITION = re.compile(
    r"(?:在|从|于|等到|直到|到|像|跟|和|与|比)[^,，]{1,10}?"
    r"(?:之后|以后|之前|以前|后|前|时|的时候|时候|期间|里|中|内|上|那么|这么|那样|一样|似的)"
    # 换 as a coverb: '没法换布局加载', '不能换 world size 加载' (load with another layout)
    r"|(?:把|将|被|给|对|换个|换)\s?(?:[\u4e00-\u9fff]{1,4}|[a-z0-9 ]{1,20}?)"
    r"(?=\s?[\u4e00-\u9fff]|\s?[a-z]+$)"
)


def _zh_scope(between: str) -> str:
    """What is left between a Chinese negation and a phrasing once the adverbs and one
    prepositional phrase in front of the verb are taken out."""
    rest = re.sub("^" + _ZH_ADVERBS, "", between)
    m = _ZH_PREPOSITION.match(rest)
    if m:
        rest = re.sub("^" + _ZH_ADVERBS, "", rest[m.end() :])
    return rest


def _reaches(clause: str, cue_end: int, start: int) -> bool:
    between = clause[cue_end:start]
    if "重新" in between:
        return False  # "没法重新切分" denies re-sharding, not the sharding a phrasing names
    if _CAUSATIVE.match(
        between
    ):  # "不会让每个 rank 保留 ...", "does not let each rank keep ...": all of it
        return True
    words = len(re.findall(r"[a-z0-9']+", between))
    if words <= _NEG_REACH_WORDS and len(_CJK_CHAR.findall(between)) <= _NEG_REACH_CJK:
        return True
    if not _CJK_CHAR.search(clause[max(0, cue_end - 1) : cue_end + 1]):
        return False
    rest = _zh_scope(between)
    return (
        len(re.findall(r"[a-z0-9']+", rest)) <= _NEG_REACH_WORDS
        and len(_CJK_CHAR.findall(rest)) <= _NEG_REACH_CJK
    )


@dataclass
class Mention:
    name: str
    start: int
    end: int
    comparand: bool
    agent: bool = False


def subject_mentions(clause: str, subjects: dict) -> list:
    """Every mention of a subject in the clause, longest phrasing first where they overlap."""
    found = []
    for name, phrasings in subjects.items():
        for p in phrasings:
            for m in compile_phrase(p).finditer(clause):
                before = clause[: m.start()]
                # a mention in a relative clause ("LOCAL_RANK is what you pass to set_device") is
                # not the subject of the statement: it is read like a thing compared with
                found.append(
                    Mention(
                        name,
                        m.start(),
                        m.end(),
                        bool(_COMPARAND.search(before) or _RELATIVE.search(before)),
                        bool(_AGENT.search(before)),
                    )
                )
    found.sort(key=lambda m: (m.start, -(m.end - m.start)))
    kept, last_end = [], -1
    for m in found:
        if m.start >= last_end:
            kept.append(m)
            last_end = m.end
    return kept


def resolve_subject(mentions: list, start: int, end: int, inherited):
    """(subject name or None, offset after which a negation counts, named in this clause?).
    The agent of a passive ('freed by FULL_SHARD', '被前者释放') is the subject wherever it
    stands."""
    agents = [m for m in mentions if m.agent and not m.comparand]
    if agents:
        return agents[0].name, min(agents[0].end, start), True
    before = [m for m in mentions if m.end <= start and not m.comparand]
    if before:
        return before[-1].name, before[-1].end, True
    inside = [m for m in mentions if m.start < end and m.end > start and not m.comparand]
    if inside:  # the phrasing names its subject itself ("DCP stores the metadata"); a denial
        # right before it denies it ("不用自己手动传 rank"), "without DCP's metadata" is a
        # condition (_polarity)
        return inside[0].name, -1 - start, True
    after = [m for m in mentions if m.start >= end and not m.comparand]
    if after:
        return after[0].name, 0, True
    return inherited, 0, False


# --- reading an answer ----------------------------------------------------------------------------


@dataclass
class Reading:
    supported: dict = field(default_factory=dict)  # claim id -> the learner's clause that states it
    misconceptions: list = field(
        default_factory=list
    )  # [(id, {en, zh} what is true instead, learner's clause)]
    unread: list = field(
        default_factory=list
    )  # learner's sentences about the topic that nothing read
    neutral: list = field(default_factory=list)  # ids of known neutral remarks made
    clauses: int = 0
    verb_clauses: int = 0
    stated_sentences: int = 0
    topical: int = 0  # clauses that talk about the question's topic
    words: int = 0
    trace: list = field(default_factory=list)  # one line per match, for authors


def _phrasings(says: dict) -> list:
    return [p for lang in ("en", "zh") for p in says.get(lang, [])]


# A negation before "and" belongs to the statement before it: "the other ranks never join and it
# deadlocks" does not deny the deadlock.
_AND = re.compile(r"\sand\s|并且|并|\u2192")
# Denials that follow the verb: Chinese potential complements (加载不了 cannot load, 放不下) and
# English 'X is disabled'.
_NEG_AFTER = re.compile(
    r"\s?(?:不了|不下|不动|不到|不起|不出|不成|不上|不进|不回)"
    # a negative object right after the verb: "FSDP frees nothing until ...", "it saves none"
    r"|\s(?:nothing|none)(?![a-z0-9])"
    r"|\s(?:is|are|gets|get|becomes|become|was|were) (?:disabled|turned off|impossible|lost|"
    r"broken|gone|blocked|not possible|skipped|avoided|eliminated)(?![a-z0-9])"
    # done without: "第二次收集省掉了", "这次 all-gather 被省去"
    r"|\s?(?:就|也|都|)\s?(?:被|)\s?(?:省掉|省去|免去|去掉|跳过)"
)


# a condition between a negation and the statement: the negation denies the verdict before it
_CONDITION_BETWEEN = re.compile(r"\s(?:when|if|whenever|once|in case)\s|当|如果|要是")
# a denial that states a condition, then a denial of what follows without it: "without X you
# can't Y", "没有 X 就没法 Y"
_WITHOUT = re.compile(r"(?<![a-z0-9])(?:without|with no)(?![a-z0-9])|没有(?!把|在|被|将)")
_THEN_NOT = re.compile(r"(?:就|也|便|都|还)\s?$")


def _without_then_not(clause: str, cue: int, end: int) -> bool:
    if not _WITHOUT.match(clause, cue):
        return False
    chinese = bool(_CJK_CHAR.match(clause, cue))
    return any(
        c >= end and (not chinese or _THEN_NOT.search(clause[max(end, c - 3) : c]))
        for c, _, _ in negation_cues(clause)
    )


def _polarity(clause: str, match: re.Match, anchor: int) -> bool:
    """True when the statement is affirmed, False when denied (odd number of cues). A negative
    anchor (-1 - start): the subject is named inside the phrasing, which starts at `start`; a
    denial right before it counts, unless it is "without" (a condition)."""
    if anchor < 0:
        start = -1 - anchor
        anchor = start
        for c, c_end, _ in negation_cues(clause):
            between = clause[c_end:start]
            if (
                c < start
                and not _WITHOUT.match(clause, c)
                and len(re.findall(r"[a-z0-9']+", between)) <= 1
                and len(_CJK_CHAR.findall(between)) <= 1
            ):
                anchor = c
    literal = [
        match.span(g) for g in match.re.groupindex if g.startswith("lit") and match.span(g)[0] >= 0
    ]
    cues = []
    for c, c_end, whole in negation_cues(clause):
        if (
            c < anchor
            and clause.startswith("neither", c)
            and "nor" in clause[c : match.start()].split()
        ):
            # "neither classic FSDP nor fully_shard broadcasts": it stands before the subjects
            cues.append(c)
            continue
        if not anchor <= c < match.end() or any(a <= c < b for a, b in literal):
            continue
        if c == match.start() and _WITHOUT.match(clause, c):
            continue  # the phrasing's own 'without' ('没有 DCP 的元数据 ... 加载'): its words

        # the words it denies: the next literal of the phrasing (a cue in a gap) or the phrasing
        target = min((a for a, _ in literal if a >= c_end), default=match.end())
        if _AND.search(clause, c, target) or not (whole or _reaches(clause, c_end, target)):
            continue
        more = _MORE_THAN.search(clause, c_end, match.end())
        if more and not any(a <= more.start() < b for a, b in literal):
            # "no rank ever holds more than about one block": denied 'more than X' is 'at most X'
            continue
        if _COMPARATOR.fullmatch(clause, c, c_end) and any(a < c for a, _ in literal):
            # "costs 4P instead of 4P/N of memory": 'instead of' inside the phrasing takes its own
            # object
            continue
        if _CONDITION_NEXT.match(clause, c_end) or _CONDITION_BETWEEN.search(clause, c_end, target):
            # "not when the gradient doesn't fit", "skip it when the full grad won't fit": it
            # denies the verdict, not what the condition says
            continue
        cues.append(c)
    whole_clause = _DENIES_CLAUSE.match(clause)
    if whole_clause and whole_clause.end() <= anchor and not any(c < anchor for c in cues):
        # "It's not that DDP averages the weights", "Nor do you start the processes", "不是 DDP
        # 平均了权重": a denial before the subject denies the whole clause
        cues.append(whole_clause.start())
    not_until = _NOT_UNTIL.search(clause, 0, match.start())
    if (
        not_until
        and not_until.start() >= max(anchor, 0)
        and not _AND.search(clause, not_until.end(), match.start())
    ):
        cues.append(not_until.start())
    # "都不会让梯度处于未分片状态": a denial of 未分片 (unsharded) says it is sharded; the
    # literal 分片 read inside it is denied again by its 未
    if cues:
        cues += [a for a, _ in literal if _UN_BEFORE.search(clause, max(0, a - 2), a)]
    after = _NEG_AFTER.match(clause, match.end())
    before_subject = [
        w
        for w in _WITHOUT.finditer(clause, 0, anchor)
        if w.end() <= anchor
        and w.start() < match.start()  # not the phrasing's own 'without' ('没有 DCP ... 加载')
        and len(re.findall(r"[a-z0-9']+", clause[w.end() : anchor])) <= 3
        and len(_CJK_CHAR.findall(clause[w.end() : anchor])) <= 6
    ]
    if before_subject and cues and cues[-1] >= anchor:
        # "没有 DCP 的元数据就没法换 world size 加载": the subject is what "without" takes away,
        # and the denial after it says it is needed
        cues.pop()
    elif cues and _without_then_not(clause, cues[0], match.end()):
        # "without DCP's metadata you can't load it on another world size", "没有 DCP 的元数据就
        # 没法换 world size 加载": what the first denial takes away, the second says is needed
        cues.pop(0)
    # a verb that undoes its object denies it: "DDP overwrites each rank's own init" says the own
    # init is not kept, so "nothing overwrites each rank's own init" (没有任何东西覆盖) says it is
    undone = any(
        _reaches(clause, u.end(), match.start()) and not _AND.search(clause, u.end(), match.start())
        for u in _UNDO.finditer(clause, anchor, match.start())
    )
    return (len(cues) + bool(after) + undone) % 2 == 0


_MORE_THAN = re.compile(
    r"(?<![a-z])(?:(?:more|bigger|larger|higher) than|exceed\w*|go(?:es)? (?:over|beyond))(?![a-z])"
    r"|超过|超出|多于|高于"
)

# "直到反向才释放", "留到 backward 用完才释放", "一直到反向算完再释放": what happens only once the
# time is reached does not happen before it (it is kept until then). Read when the time stands
# before the phrasing; a phrasing that names the time itself ("反向时再 all-gather") takes it.
_NOT_UNTIL = re.compile(r"(?:直到|等到|留到|一直到)[^,，]{1,14}?(?:才|再)\s?(?:得以|会|能|)\s?$")

# the unsharded form of the word a phrasing names: '未分片' is 'not sharded'
_UN_BEFORE = re.compile(r"未\s?$")


# a denial of the whole clause, before its subject
_DENIES_CLAUSE = re.compile(
    r"^\s?(?:(?:and|but|so)\s)?"
    r"(?:(?:it'?s|it is|this is|that'?s|that is)\s(?:not|n't)\s(?:that|because)|"
    r"not that|not because|nor\s(?:do|does|did|is|are|can|will|would|has|have|must|should)|"
    r"(?:而|但|也)?(?:并不是|并非|不是说|不是因为|不是))(?![a-z0-9])\s?"
)

_UNDO = re.compile(
    r"(?<![a-z])(?:overwr\w*|overrid\w*|replac\w*|clobber\w*|erase\w*|discard\w*|wipe\w*)"
    r"(?![a-z])|覆盖|覆写|替换|抹掉|冲掉|丢掉"
)


# An infinitive of purpose ("to save ... and load on another world size, you need ...") states
# nothing about whether the thing works.
_PURPOSE = re.compile(r"(?:^|(?<![a-z0-9]))(?:to|in order to)\s$|^(?:to|in order to|为了)\s")


# a thing named as the role another plays ("the shards play the role of the master weights",
# "分片参数自己就起了 master weights 的作用") says what that other thing is, not that it has one
_ROLE_BEFORE = re.compile(
    r"(?<![a-z])(?:play\w* (?:the |a |)(?:role|part) of|serv\w* as|act\w* as|doubl\w* as|"
    r"function\w* as|work\w* as) (?:the |a |an |their |its |)$|(?:充当|当作|起到?了?|扮演)\s?$"
)
_ROLE_AFTER = re.compile(r"\s?(?:的|)\s?(?:作用|角色)")

# what nothing checks is neither asserted nor denied: "Nothing checks that the shards come from the
# same init", "没有任何检查会发现分片来自不同 init", "FSDP doesn't verify that ...". The
# complement of a denied verb of checking states nothing; the clause is read.
_UNCHECKED = re.compile(
    r"(?<![a-z])(?:nothing|no one|nobody|none of \w+|no \w+|(?:does|do|did|will|would|can)\s?"
    r"(?:not|n't)|never|won't|can't)\s(?:\w+\s){0,2}?(?:checks?|detects?|notices?|verif\w+|"
    r"catch\w*|warns?|complains?|flags?|validat\w+|ensur\w+|guarantee\w*)(?![a-z])"
    r"|(?:没有任何|没有|没人|并没有|不会|没什么|从不|不)\s?[\u4e00-\u9fffa-z ]{0,6}?"
    r"(?:发现|检查|检测|察觉|注意到|提醒|校验|验证|保证|确保)"
)


_CONDITION_BEFORE = re.compile(
    r"(?:要用|要在|想|为了|如果|若|要是|以后要|(?<![a-z0-9])(?:if|when) you (?:want|"
    r"need) to)\s?\S{0,2}$"
)
# a modal inside the phrasing makes it a requirement, not a state: "then one rank must hold the
# entire model" (what a full state dict needs) does not say that a rank holds it
_MODAL = re.compile(r"(?<![a-z])(?:must|would|has to|have to|will have to)(?![a-z])|必须")
# ... and so does a requirement right before it: "it needs one rank to have room for the entire
# model", "还要一个 rank 能装下整个模型"
_REQUIREMENT_BEFORE = re.compile(
    r"(?<![a-z])(?:needs?|requires?|must|has to|have to)\s(?:one |a |each |every |the |some |)$"
    r"|(?:需要|要|得|必须)\s?$"
)
_CONDITION_AFTER = re.compile(
    r"\s?(?:还|就|也|)\s?(?:需要|要|得|必须|离不开)|\s(?:needs?|requires?|you need|you must|must|"
    r"only works with)(?![a-z0-9])"
)


def _unless(clause: str, match: re.Match, mentions: list) -> bool:
    """A statement denied until its subject is named after 'unless' is affirmed of that subject:
    "the shards aren't loadable into another world size unless they were saved with DCP"."""
    after = [m for m in mentions if m.start >= match.end() and not m.comparand]
    if not after or any(m.end <= match.start() and not m.comparand for m in mentions):
        return False
    return bool(re.search(r"(?<![a-z])unless(?![a-z])|除非", clause[match.end() : after[0].start]))


def _splits_negated_word(clause: str, m: re.Match) -> bool:
    """A Chinese phrasing that starts with a negation character and ends inside a word: '不同'
    ("different") in 不同步 ("not in sync", jieba: 不 / 同步)."""
    text = m.group(0)
    if not text or text[0] not in _NEG_ZH_HEADS or not _CJK_CHAR.match(text[-1]):
        return False
    return any(start < m.end() < end for _, start, end in zh_words(clause))


def _find(clause: str, phrasings: list):
    """The leftmost, then longest, match of any phrasing: it takes in the most of the statement
    (so '省掉 ... reduce scatter' wins over 'k 1 ... reduce scatter' and 省掉 is read as a word
    of the claim, not as a negation of it)."""
    best = None
    for p in phrasings:
        m = next(
            (x for x in compile_phrase(p).finditer(clause) if not _splits_negated_word(clause, x)),
            None,
        )
        if m and (best is None or (m.start(), -m.end()) < (best.start(), -best.end())):
            best = m
    return best


def _topic_phrasings(secret: dict) -> list:
    out = _phrasings(secret.get("topic", {}))
    for s in secret.get("subjects", {}).values():
        out += _phrasings(s)
    return out


# the course's own vocabulary: a statement that uses it is about distributed training, whatever the
# question's `topic` lists ("另外每个 rank 只需要存 1/N 的激活" under a question about wrapping), so
# leaving it unread leaves something unchecked; "I learned this yesterday" uses none of it
COURSE_TERMS = [
    "rank*",
    "gpu*",
    "shard*",
    "all gather*",
    "reduce scatter*",
    "all reduce*",
    "broadcast*",
    "memory",
    "activation*",
    "gradient*",
    "grad*",
    "param*",
    "weight*",
    "optimi*",
    "node*",
    "batch*",
    "forward",
    "backward",
    "fsdp",
    "ddp",
    "communicat*",
    "collective*",
    "checkpoint*",
    "nvlink",
    "显存",
    "内存",
    "激活",
    "梯度",
    "参数",
    "权重",
    "优化器",
    "分片",
    "节点",
    "前向",
    "反向",
    "通信",
    "广播",
    "同步",
    "检查点",
]


def is_topical(clause: str, secret: dict) -> bool:
    """Does the clause talk about the question's topic (its `topic` words or a subject) or use the
    course's vocabulary (COURSE_TERMS)?"""
    return any(compile_phrase(p).search(clause) for p in _topic_phrasings(secret) + COURSE_TERMS)


def _noun_phrase(matched: str) -> bool:
    """English words with no verb among them, ending on a noun ('latency', 'complete gradient',
    'full grad'): a form that is only a noun phrase names a thing; denying it ("a rank can't hold
    one complete gradient") denies what is done with it, not the claim it stands for."""
    words = matched.strip().split()
    if not words or not all(re.fullmatch(r"[a-z]+", w) for w in words) or len(words) > 3:
        return False
    if len(words) == 1:
        return _bare_noun(words[0])
    last = en_lemmas(words[-1])
    # every word a noun or an adjective ('complete' is both): 'reduce memory' is a verb phrase
    nominal = all(not en_lemmas(w) or {"NOUN", "ADJ", "PROPN"} & set(en_lemmas(w)) for w in words)
    return nominal and ("NOUN" in last or not last) and not carries_verb(" ".join(words))


def _bare_noun(matched: str) -> bool:
    """One English word that is a noun and no verb (lemminflect): 'latency', 'overhead'."""
    if not re.fullmatch(r"[a-z]+", matched.strip()):
        return False
    lemmas = en_lemmas(matched.strip())
    return "NOUN" in lemmas and "VERB" not in lemmas


_PERSONAL = re.compile(r"^(?:you|your|yourself|we|us|the user|i|你|你自己|我们|自己|用户)$")
# words before a phrasing that leave the clause without an agent of its own
_NO_AGENT = re.compile(
    r"^(?:and|also|then|so|but|or|just|still|only|even|already|always|usually|simply|really|"
    r"you|your|we|也|还|就|并|并且|而且|另外|然后|同时|再|都|只|会|要|得|可以|需要|必须|自己|你|我们)$"
)


def _personal(phrasings) -> bool:
    """Is this subject the person addressed ('you', '你')?"""
    return any(_PERSONAL.match(p) for p in phrasings)


def _own_agent(before: str) -> bool:
    """Do the words before a phrasing name an agent other than the person addressed ("torchrun
    writes", "it doesn't create", "torchrun 在每个节点上")?"""
    words = re.findall(r"[a-z0-9']+|[\u4e00-\u9fff]+", before)
    zh = [w for w, _, _ in zh_words(before) if _CJK_CHAR.search(w)]
    tokens = [w for w in words if not _CJK_CHAR.search(w)] + zh
    return any(
        not _NO_AGENT.match(t) and not re.fullmatch(r"don'?t|do|not|n't|no", t) for t in tokens
    )


def _unchecked(clause: str, m: re.Match) -> bool:
    u = _UNCHECKED.search(clause, 0, m.start() + 1)
    return bool(u) and u.end() <= m.start() and not _AND.search(clause, u.end(), m.start())


def _read_clause(
    norm: str,
    secret: dict,
    subjects: dict,
    owners: set,
    inherited,
    trace: list,
    stated=None,
    inherited_here=False,
) -> tuple:
    """([(kind, key, message)], accounted?) for one clause. kind: 'supports' (key = claim id),
    'wrong' (key = (id, form index, which); message = what is true instead), 'neutral'."""
    events, accounted = [], False
    mentions = subject_mentions(norm, subjects)
    for claim in secret["claims"]:
        found = [
            (f_index, form, m)
            for f_index, form in enumerate(claim["forms"])
            for m in [_find(norm, _phrasings(form["says"]))]
            if m
        ]
        for f_index, form, m in found:
            if any(
                o is not m
                and o.start() < m.end()
                and m.start() < o.end()
                and (o.start(), -o.end()) < (m.start(), -m.end())
                for _, _, o in found
            ):
                # another form of this claim reads these words first (or reads more of them)
                continue
            if names_api(norm, m.start(), m.end()):
                # "In FSDP2 that's the reshard_after_forward=True/False switch": a name
                accounted = True
                trace.append(
                    f"[{norm}] {claim['id']}#{f_index + 1} {m.group(0)!r} names an API: read, "
                    "states nothing"
                )
                continue
            if _unchecked(norm, m):
                accounted = True
                trace.append(
                    f"[{norm}] {claim['id']}#{f_index + 1} {m.group(0)!r} what nothing checks: "
                    "read, states nothing"
                )
                continue
            if _ROLE_BEFORE.search(norm[: m.start()]) or _ROLE_AFTER.match(norm, m.end()):
                accounted = True
                trace.append(
                    f"[{norm}] {claim['id']}#{f_index + 1} {m.group(0)!r} named as a role: read, "
                    "states nothing"
                )
                continue
            if form.get("negated") and (
                _PURPOSE.search(norm[: m.start()])
                or _CONDITION_BEFORE.search(norm[: m.start()])
                or _CONDITION_AFTER.match(norm, m.end())
                or _MODAL.search(m.group(0))
                or _REQUIREMENT_BEFORE.search(norm[: m.start()])
            ):
                accounted = True
                # "to load on another world size, you need ...", "换 world size 加载还需要元数据":
                # a purpose or a condition, not a statement that it works
                continue
            subject, anchor, named = resolve_subject(mentions, m.start(), m.end(), inherited)
            if not named and _personal(subjects.get(subject, ())) and _own_agent(norm[: m.start()]):
                # "You don't pass ranks yourself: torchrun writes RANK ...", "... it doesn't create
                # the process group for you": the clause names its own agent (a name, 'it'); the
                # person addressed before is not carried over to it
                subject = None
            want, rival = form.get("subject"), form.get("rival")
            if want and (subject is None or subject not in (want, rival)):
                continue  # a statement about something else (or about nobody named)
            if not want and named and subject in owners and subject != rival:
                # a form about the topic at large does not read a clause about a subject with
                # claims of its own
                continue
            affirmed = _polarity(norm, m, anchor) ^ _unless(norm, m, mentions)
            swapped = subject is not None and subject == rival
            # each of denial, a form true only when denied, and the rival subject flips it
            true = affirmed ^ bool(form.get("negated")) ^ swapped
            if (
                not true
                and not want
                and not named
                and inherited_here
                and subject is not None
                and subject != rival
            ):
                # a form about the topic at large, denied of a subject of the question that this
                # sentence named before ("用 DCP 就没这些问题：…，不用把整个模型收集到
                # 一个 rank 上"): it says what that subject does not need, not that the topic's
                # claim is false
                trace.append(
                    f"[{norm}] {claim['id']}#{f_index + 1} {m.group(0)!r} denied of {subject}, "
                    "named before in the sentence: read, not credited"
                )
                accounted = True
                continue
            if (
                true
                and swapped
                and form.get("own_subject")
                and not any(mm.comparand and mm.name == want for mm in mentions)
            ):  # "unlike DDP, FSDP does not ..." names both
                # "FSDP does not broadcast" is true, but says nothing of what DDP does
                trace.append(
                    f"[{norm}] {claim['id']}#{f_index + 1} {m.group(0)!r} denied of the rival: "
                    "read, not credited"
                )
                accounted = True
                continue
            if not true and not affirmed and not want and _noun_phrase(m.group(0)):
                # a form that is a bare noun ('latency', 'overhead') names a topic; denying the
                # noun ("not dominated by latency") does not deny the claim it stands for
                trace.append(
                    f"[{norm}] {claim['id']}#{f_index + 1} {m.group(0)!r} a bare noun denied: "
                    "read, states nothing"
                )
                accounted = True
                continue
            outcome = (
                "supports"
                if true
                else "ignored (one way)"
                if form.get("one_way")
                else "MISCONCEPTION"
            )
            trace.append(
                f"[{norm}] {claim['id']}#{f_index + 1} {m.group(0)!r} "
                f"subject={subject} {'affirmed' if affirmed else 'denied'} -> {outcome}"
            )
            accounted = True
            if not true and form.get("one_way"):
                continue  # a condition, not a claim: denying it says nothing false
            if true:
                events.append(("supports", claim["id"], None))
                if stated is not None:  # what it states of whom, for an elliptic clause after it
                    stated.append((claim, form, f_index, subject))
            elif swapped and "swapped" in form:
                events.append(("wrong", (claim["id"], f_index, "swapped"), form["swapped"]))
            else:
                events.append(("wrong", (claim["id"], f_index, "wrong"), form["wrong"]))
    for mis in secret.get("misconceptions", []):
        m = _find(norm, _phrasings(mis["says"]))
        if not m:
            continue
        if names_api(norm, m.start(), m.end()):
            trace.append(f"[{norm}] misconception {mis['id']} {m.group(0)!r} names an API: read")
            accounted = True
            continue
        if _unchecked(norm, m):
            trace.append(f"[{norm}] misconception {mis['id']} {m.group(0)!r} what nothing checks")
            accounted = True
            continue
        subject, anchor, _ = resolve_subject(mentions, m.start(), m.end(), inherited)
        if mis.get("subject") and subject != mis["subject"]:
            continue
        if subject is not None and subject in mis.get("true_of", ()):
            # "under DDP the different seeds are harmless" is true: the entry is false only of
            # the other subjects
            trace.append(f"[{norm}] misconception {mis['id']} {m.group(0)!r} true of {subject}")
            accounted = True
            continue
        affirmed = _polarity(norm, m, anchor)
        trace.append(
            f"[{norm}] misconception {mis['id']} {m.group(0)!r} subject={subject} "
            f"{'affirmed' if affirmed else 'denied'}"
        )
        accounted = True
        if affirmed:
            events.append(("wrong", (mis["id"], -1, "wrong"), mis["wrong"]))
    for remark in secret.get("neutral", []):
        m = _find(norm, _phrasings(remark["says"]))
        if m:
            trace.append(f"[{norm}] neutral remark {remark['id']} {m.group(0)!r}")
            events.append(("neutral", remark["id"], None))
            accounted = True
    return events, accounted


_REMEDY = re.compile(
    r"(?:and |also |so |then |)(?:the |to |)(?:fix|fixes|solution|solutions|remedy|workaround|"
    r"you can fix|to avoid)(?![a-z])|修法|解决|修复|办法|改法|正确做法"
)
_COUNTERFACTUAL = re.compile(
    r"(?:if (?:you |we |one |)(?:do not|don't|dont|didn't|never|skip)|if not|without|with no|"
    r"otherwise|else|if there is no|when there is no)(?![a-z])|如果不|若不|要是不|不按|不设|不用|"
    r"没有设|否则|不然|"
    # 'not wrapped' as the alternative: 不包的话, 不做 wrap 的话, 不 wrap
    r"不(?:按\s?block\s?|分块|单独)?(?:包(?![括含])|做\s?wrap|wrap)"
)
_BOTH = re.compile(
    r"(?<![a-z0-9])(?:both|neither|either of them|the two)(?![a-z0-9])|两者|二者|两种|两个策略|"
    r"它们都"
)


# a sentence that announces what the answer is about, not a fact: "the difference is ...",
# "what differs is ...", "it's a memory-versus-communication choice", "区别在于 ...", "本质上是 ..."
_FRAME = re.compile(
    # a hedge before it changes nothing: "I believe it's about ...", "我理解区别在于 ..."
    r"^(?:(?:i think|i believe|i guess|basically|in short|我理解|我觉得|我认为|先说结论|一句话|"
    r"简单来说)"
    r"\s?[,:：]?\s?)?"
    r"(?:the (?:main |key |real |whole |)(?:difference|point|question|idea|crux) "
    r"(?:is|lies|comes)|"
    r"(?:the two|they|both) (?:only |)differ (?:only |)(?:in|by)|"
    r"(?:差别|区别|不同之处|不同点)(?:只|)在|"
    r"what (?:differs|matters|changes) is|it'?\s?s (?:all |)(?:about|a [a-z ]{0,30}(?:choice|"
    r"trade ?off|trade|deal|exchange))|it is (?:all |)(?:about|a [a-z ]{0,30}(?:choice|trade ?off|"
    r"trade|deal|exchange))|think of|(?:区别|差别|不同|关键|核心|重点)(?:就|)(?:在于|是)|(?:本质上|"
    r"其实|说白了|简单说)(?:就|)是"
    # what the answer depends on: "it depends on the batch", "看每张卡上的 batch 大不大"
    r"|(?:it |that |this |)(?:all |)depends on|取决于"
    r"|(?:这|)(?:主要|)(?:要|得|就|)看(?!到|见|出|起来)"
    # "这题其实就是看 ...", "选择依据就是 ..."
    r"|(?:这题|这道题|这个问题|选择依据|选择标准)(?:其实|)(?:就|)(?:是|在于)"
    # "关键在广播", "关键就差在一次广播"
    r"|(?:关键|核心|重点|区别|差别)(?:就|)差?在(?!于))"
)
_ELLIPSIS = re.compile(
    r"^(?:(?:but |while |whereas |and |)(.+?) (?:does not|doesn'?\s?t|do not|don'?\s?t|"
    r"does nothing of the sort|never does)|(.+?)\s?(?:则|就|)(?:不会|不|没有|并不|不是这样))$"
)


# a short sentence that names the trade and nothing else: "It's a memory-vs-communication knob",
# "no_sync is a memory-for-communication swap", "本质上是拿显存换通信"
_RESOURCE = (
    r"(?:memory|communication|compute|computation|speed|time|bandwidth|traffic|"
    r"显存|内存|通信|计算|时间|速度|带宽)"
)
_TRADE_FRAME = re.compile(
    _RESOURCE + r"\s?(?:vs|versus|for|against|换取|换来|换|对)\s?" + _RESOURCE + r"(?![a-z])"
)


# a short sentence that announces how many things follow: "torchrun does two jobs", "torchrun 主要干
# 两件事", "Some side remarks:"
_COUNT_FRAME = re.compile(
    r"(?<![a-z])(?:does|do|has|have|plays|serves) (?:two|three|2|3) (?:jobs|things|roles|parts)"
    r"(?![a-z])|(?:干|做|负责|有|管)(?:两|三|2|3)\s?件事"
)


# a short verdict on a choice, no fact about it: "Therefore the block is a sensible compromise",
# "只对部分 block 做检查点是一种折中方案"
_COMPROMISE = re.compile(
    r"(?:is|are|as) (?:a|an|the) (?:[a-z]+ ){0,2}(?:compromise|middle ground|sweet spot|"
    r"happy medium)(?: between [^,]{0,60})?$|"
    r"是(?:一个|一种|个|)[\w\s]{0,6}(?:折中|折衷)(?:方案|办法|选择|)$"
)


def _framing(sentence: str, subjects: dict) -> bool:
    norm = normalise(sentence)
    if (_TRADE_FRAME.search(norm) or _COUNT_FRAME.search(norm)) and word_count(norm) <= 12:
        return True
    if _COMPROMISE.search(norm) and word_count(norm) <= (30 if _CJK_CHAR.search(norm) else 16):
        return True
    rest = _FRAME.match(norm)
    return (
        bool(rest) and not subject_mentions(norm, subjects) and word_count(norm[rest.end() :]) <= 20
    )


def _ellipsis(clause: str, subjects: dict) -> bool:
    m = _ELLIPSIS.match(clause)
    if not m:
        return False
    named = subject_mentions(clause, subjects)
    head = (m.group(1) or m.group(2) or "").strip()
    # the subject may be two of them: "ZeRO-1 和 ZeRO-2 都没有", "DDP and FSDP1 do not"
    rest = head
    for mention in named:
        rest = rest.replace(clause[mention.start : mention.end], " ")
    listed = re.fullmatch(
        r"[\s,、\d]*(?:(?:and|or|和|与|及|以及|或)[\s,、\d]*)*(?:都|both|)\s*", rest
    )
    return bool(named) and named[0].start <= 8 and (word_count(head) <= 4 or bool(listed))


# Sentences that state nothing of the topic, read and credited with nothing (a misconception in one
# is still false):
# a meta remark about the answer itself: "汇报一下 BN 同步的问题", "Firstly, it is important to
# understand what no_sync changes", "首先要明确 no_sync 改变了什么", "This question shows a
# difference in how ...", "Think about what each mesh dimension has to send", "I think there are
# several reasons but the main one is the memory peak"
_META = re.compile(
    r"^(?:(?:so|ok|okay|first|firstly|好|那|先|首先)\s?[,，]?\s?)?(?:"
    r"(?:这里|下面|我来|来|)(?:汇报|说|讲|总结|整理|解释|介绍|展开说)一下|"
    r"(?:it is|it's|its) (?:important|worth|useful|helpful) to (?:understand|note|see|know|"
    r"recall|look at)|"
    r"(?:要|需要|得|必须)?(?:先|)(?:明确|说明|理解|搞清楚|弄清楚)(?=.{0,40}(?:什么|哪|怎么|为什么))|"
    r"this (?:question|one) (?:shows|is about|asks|tests|comes down to)|"
    r"(?:let'?\s?s |)think about (?:what|how|why|which)|"
    r"(?:i think |i believe |)there (?:are|is) (?:several|many|a few|some|two|three|2|3) "
    r"(?:reasons|things|parts|differences|sides)|"
    r"here'?\s?s (?:what|how|why|the gist|my (?:take|understanding|answer)))"
)
# a heading that restates the question before answering it: "Problem: a job on 8 GPUs needs 8
# copies of the script, each knowing who it is", "Problem：为什么还 OOM"
_PROBLEM = re.compile(
    r"^(?:the |)(?:problem|question|context|setup|scenario|background|问题|背景|场景|题目)"
    r"\s?\d*\s?[:：]"
)
# an analogy and what it says, to the end of its paragraph: "Analogy: borrowing a book from the
# library. FULL_SHARD returns the book after reading it ...", "打个比方，no_sync 就像攒快递"
_ANALOGY = re.compile(
    r"^(?:an |)(?:analogy|metaphor)(?![a-z])|^(?:think of it|imagine)(?![a-z])|"
    r"^(?:打个比方|比方说|打比方|类比一下|类比|好比)"
)
# a worked example in numbers: "Numbers: 7B in bf16 = 14 GB", "for a 7B model on 8 GPUs that's
# 28 GB per GPU instead of 3.5 GB", "举个例子，两台 8 卡机，7B 模型 bf16 参数 14GB", "In the
# lesson's 2-rank run that was 3.08 MiB vs 1.54 MiB"
_EXAMPLE = re.compile(
    r"^(?:for example|for instance|e g|example|numbers|举个例子|举例|比如|例如)(?![a-z])"
)
_AMOUNT = re.compile(r"\d(?:\.\d+)?\s?(?:gb|gib|mb|mib|tb|kb)(?![a-z])")
# a definition of symbols states nothing of the subjects: "Let P = #params, N = ranks", "设 P =
# 参数量，N = rank 数"
_SYMBOL = r"[a-z][a-z0-9_]{0,3}\s?=\s?[^=,，、;；]{1,24}?"
_DEFINITION = re.compile(
    r"^(?:let|where|with|notation|设|令|记)\s?[:：]?\s?"
    + _SYMBOL
    + r"(?:\s?[,，、;；]\s?(?:and\s|和|)\s?"
    + _SYMBOL
    + r")*\s?[。.]?\s?$"
)


def _non_claims(parts: list) -> set:
    """The sentences (indices) that state nothing of the topic: questions, meta remarks, a
    restated problem, an analogy to the end of its paragraph, a worked example in numbers."""
    out, analogy, block = set(), None, False
    for s, (sentence, end, paragraph) in enumerate(parts):
        norm = normalise(sentence)
        # an analogy announced as a heading ("打个比方，参数就像图书馆的书：") runs on over the
        # lines after it, to a blank line
        if (
            analogy is not None
            and paragraph != analogy
            and not (block and paragraph == analogy + 1)
        ):
            analogy, block = None, False
        elif analogy is not None and paragraph != analogy:
            analogy = paragraph
        if _ANALOGY.match(norm):
            analogy, block = paragraph, bool(re.search(r"[:：]\s*$", sentence))
        if (
            analogy is not None
            or "?" in end
            or "？" in end
            or (_META.match(norm) and word_count(norm) <= 16)
            or _PROBLEM.match(norm)
            or _EXAMPLE.match(norm)
            or _AMOUNT.search(norm)
            or _DEFINITION.match(norm)
        ):
            out.add(s)
    return out


# a belief the learner reports of others: "people sometimes think ...", "a common mistake is to
# think ...", "有人以为 ...", "很多人误以为 ..."
_REPORTED = re.compile(
    r"(?<![a-z])(?:people|some|many|beginners|newcomers|others|folks|one) (?:sometimes |often |"
    r"usually |tend to |might |may |)"
    r"(?:think|thinks|believe|believes|assume|assumes|expect|expects)"
    r"(?![a-z])|(?:common|frequent|typical) (?:mistake|misconception|misunderstanding|confusion)"
    r"|(?:有人|很多人|不少人|许多人|常有人|新手|大家)(?:常|会|容易|经常|总|)(?:误以为|以为|认为|觉得)"
    r"|常见的?(?:误解|误区|错误)"
)
_IF_CLAUSE = re.compile(r"^(?:if|如果|要是|假如|若)(?![a-z])")
# a condition and nothing else: "when activations are not most of the memory", "if the per-rank
# batch is not small", "每卡 batch 不小的话", "激活不占大头时"; a longer English one, or a Chinese
# one with 就/才/时 inside, may hold its own consequence ("if one of them crashes torchrun does
# nothing about it", "当 batch 很大时才需要同步")
_CONDITION_ONLY = re.compile(
    r"^(?:and |but |so |)(?:if|when|whenever|unless|only if)\s(?:[a-z0-9_']+\s){1,6}[a-z0-9_']+$"
    r"|^(?:但|而|)(?:如果|要是|假如|若|当|只要|一旦)[^就才则时会]*$"
    r"|(?:的话|的时候|(?<![同有及实暂此这那随准按平当临])时)$"
)
_ROOT = re.compile(
    r"^(?:(?:because|since|as|but|and|so|因为|但|而|)\s?)(?:the\s)?(?:root|根单元|根模块|根)(?![a-z])"
)

# the words before ", which ..." that the relative clause may be about ("gives each process RANK")
_RELATIVE_TAIL = 3
# a description of the name before it: "its global index", "the index on this node", "即全局编号"
_APPOSITIVE = re.compile(r"^(?:its|their|the|i e|e g|即|也就是|就是)\s")

_CF_CLAUSE = re.compile(
    r"^(?:without (?:it|this|that|them|syncing|sync|synchroni[sz]ing)|otherwise|if not|else|不然|"
    r"否则|要不然)\s?"
)


def read_answer(text: str, secret: dict) -> Reading:
    subjects = {name: _phrasings(s) for name, s in secret.get("subjects", {}).items()}
    owners = {f["subject"] for c in secret["claims"] for f in c["forms"] if f.get("subject")}
    reading = Reading(words=word_count(text))
    seen_wrong = set()
    sentence_text = sentences(text)
    all_clauses = clauses(text)
    # a sentence is a statement when one of its clauses carries a verb and it is not a keyword
    # list ('rank, local_rank, world_size', '释放、参数、显存')
    lists = {s for s, sent in enumerate(sentence_text) if keyword_list(sent)}
    stated = {
        c.sentence for c in all_clauses if carries_verb(c.norm, c.opener not in (",", "，", "、"))
    } - lists
    reading.stated_sentences = len(stated)

    def apply(events, quote):
        for kind, key, message in events:
            if kind == "supports":
                reading.supported.setdefault(key, quote)
            elif kind == "neutral":
                if key not in reading.neutral:
                    reading.neutral.append(key)
            elif key not in seen_wrong:
                seen_wrong.add(key)
                reading.misconceptions.append((key[0], message, quote))

    inherited, prev_inherited, unread, read_sentences = None, None, [], set()
    aside_unread = []  # sentences about the topic read only as a question, analogy or example
    inherited_sentence = None  # the sentence that named the subject carried over
    last_stated = []  # (claim, form, form index, subject) the last clause that stated one stated
    # a sentence of remedies ("Fixes: a broadcast before wrapping", "修法就是 ...") says what to do,
    # not what the subjects named before it do
    remedies = {s for s, sent in enumerate(sentence_text) if _REMEDY.match(normalise(sent))}
    # a sentence about the alternative ("If you don't wrap per block, nothing is freed until ...",
    # "不按 block 包，算完之前一个参数都不会被释放") denies what the alternative does not do: what
    # it states is credited, what it denies is no misconception
    otherwise = {
        s for s, sent in enumerate(sentence_text) if _COUNTERFACTUAL.match(normalise(sent))
    }
    headings = {s for s, sent in enumerate(sentence_text) if re.search(r"[:：]\s*$", sent)}
    non_claims = _non_claims(_sentence_parts(text))
    frames = {s for s, sent in enumerate(sentence_text) if _framing(sent, subjects)}
    for i, c in enumerate(all_clauses):
        reading.clauses += 1
        verb = c.sentence in stated
        reading.verb_clauses += verb
        if not verb:
            reason = "a keyword list" if c.sentence in lists else "no verb in its sentence"
            reading.trace.append(f"[{c.norm}] {reason}: not read")
            named = [m for m in subject_mentions(c.norm, subjects) if not m.comparand]
            if named:
                inherited, inherited_sentence = named[-1].name, c.sentence
            continue
        # a side remark in brackets, or a clause about both ("两者都...", "both keep ...",
        # "neither"), takes no subject from before it
        # a clause about the root unit ("the root stays gathered from forward to backward",
        # "根单元从前向一直留到反向") is about the exception to what the subject before does
        clause_inherited = (
            None
            if c.aside
            or c.sentence in remedies
            or _BOTH.search(c.norm)
            or _ROOT.match(c.norm)
            # "The main difference is when the gathered parameters are freed": a frame names
            # what differs, of no subject
            or c.sentence in frames
            else inherited
        )
        # "..., without it every rank normalises with its own statistics": the clause is about the
        # alternative; its 'without' denies nothing of what follows (like a sentence about the
        # alternative)
        cf = _CF_CLAUSE.match(c.norm)
        norm = c.norm[cf.end() :] if cf else c.norm
        stated_here = []
        if _REPORTED.search(norm):
            # "people sometimes think SHARD_GRAD_OP doesn't shard params at all": what others
            # believe, not what the learner says: read, neither credited nor false
            reading.trace.append(f"[{c.norm}] what others believe: read, credits nothing")
            events, accounted = [], True
        else:
            events, accounted = _read_clause(
                norm,
                secret,
                subjects,
                owners,
                clause_inherited,
                reading.trace,
                stated_here,
                inherited_here=inherited_sentence == c.sentence,
            )
        prev = all_clauses[i - 1] if i else None
        # a clause of the same sentence after this one: what a condition here leads to
        consequence_follows = i + 1 < len(all_clauses) and all_clauses[i + 1].sentence == c.sentence
        relative = c.opener in ("which", "who")
        # "LOCAL_RANK, its global index over the whole job, ...", "RANK (the index on this
        # node)": a noun phrase right after a name, between commas or in brackets, says what
        # that name is, like a relative clause
        appositive = (
            not relative
            and not accounted
            and (c.opener in (",", "，", "(", "（") or c.aside)
            and _APPOSITIVE.match(norm)
            # its own relative clause aside ('its index inside the node that you use to ...')
            and not carries_verb(re.split(r"\s(?:that|which|who)\s", norm)[0], False)
        )
        if (relative or appositive) and prev is not None and prev.sentence == c.sentence:
            # ", which is its index on the local node": a relative clause says it of the noun
            # right before it ("RANK"); read the two together, keep what needs both
            tail = " ".join(prev.norm.split()[-_RELATIVE_TAIL:])
            copula = "" if relative else ("是" if _CJK_CHAR.search(norm) else "is")
            joined, _ = _read_clause(
                f"{tail} {copula} {norm}", secret, subjects, owners, clause_inherited, reading.trace
            )
            alone, _ = _read_clause(tail, secret, subjects, owners, clause_inherited, [])
            extra = [e for e in joined if e not in alone and e not in events]
            events += extra
            accounted = accounted or bool(extra)
        if not accounted and (
            _framing(sentence_text[c.sentence], subjects) or _ellipsis(c.norm, subjects)
        ):
            # "The difference is what happens after forward", "本质上是拿显存换通信": a frame for
            # the statements around it; "..., SHARD_GRAD_OP does not": the statement before it,
            # denied of the other subject. Read (it leaves nothing unchecked), credited with
            # nothing.
            reading.trace.append(f"[{c.norm}] a frame or an elliptic denial: read, credits nothing")
            accounted = True
            named = [m.name for m in subject_mentions(c.norm, subjects) if not m.comparand]
            if named and _ellipsis(c.norm, subjects) and prev is not None:
                # "..., SHARD_GRAD_OP does not" denies the statement before it of its rival: fine;
                # denied of the very subject it was stated of ("这份主副本只有 ZeRO-3 才有，
                # ZeRO-1 和 ZeRO-2 都没有") it says that subject does not do what it does
                for claim, form, f_index, subject in last_stated:
                    if form.get("subject") and subject == form["subject"] == named[0]:
                        reading.trace.append(
                            f"[{c.norm}] elliptic denial of {claim['id']} of its own subject "
                            f"{subject} -> MISCONCEPTION"
                        )
                        events.append(("wrong", (claim["id"], f_index, "wrong"), form["wrong"]))
        if not accounted and prev is not None and prev.sentence == c.sentence and c.after_comma:
            # a statement split by a comma ("FULL_SHARD 在前向之后，会释放参数"): read the two
            # together
            # an enumeration joined by 、 is one statement ("两者平时都是参数、梯度、优化器状态
            # 全分片"): read from the clause before its first item
            start = i - 1
            while (
                start > 0
                and c.opener == "、"
                and all_clauses[start].opener == "、"
                and (all_clauses[start - 1].sentence == c.sentence)
            ):
                start -= 1
            before_items = " ".join(x.norm for x in all_clauses[start:i])
            joined = f"{before_items} {c.norm}"
            events, _ = _read_clause(
                joined, secret, subjects, owners, prev_inherited, reading.trace
            )
            # what the two clauses state together is credited; a misconception is never built out of
            # two clauses (a '...' gap across the comma reads words that do not belong together)
            events = [e for e in events if e[0] != "wrong"]
            # only what needs both halves reads this clause: a phrasing the clause before states on
            # its own ("..., and MASTER_ADDR for the rendezvous, and it also copies the model") is
            # no evidence for what this clause says
            alone, _ = _read_clause(before_items, secret, subjects, owners, prev_inherited, [])
            events = [e for e in events if e not in alone]
            accounted = bool(events)
            apply(events, f"{prev.text}, {c.text}")
        elif not accounted and c.resumes is not None:
            # the statement a bracket interrupted ("most of the traffic (all-gathers,
            # reduce-scatters) stays inside the node"): read its two halves together, misconceptions
            # aside as above
            before = all_clauses[c.resumes]
            events, _ = _read_clause(
                f"{before.norm} {c.norm}", secret, subjects, owners, clause_inherited, reading.trace
            )
            events = [e for e in events if e[0] != "wrong"]
            accounted = bool(events)
            apply(events, f"{before.text} … {c.text}")
        elif _CONDITION_ONLY.search(c.norm) and consequence_follows:
            # "When activations are not most of the memory, checkpointing does not help much",
            # "每卡 batch 不小的话，一般不用管": a condition supposes what it says, and the clause
            # after it says what follows: read, nothing in it is false on its own
            apply([e for e in events if e[0] != "wrong"], c.text)
        elif c.sentence in otherwise or cf or c.sentence in remedies:
            # a sentence of remedies says what to do ("or sync_module_states=True in classic
            # FSDP", "换个 world size 也能加载" after "正确做法是用 DCP"), not what the subjects do
            # by default: what it states is credited, a form read the other way round is no
            # misconception; a misconception entry is false whatever the sentence is about
            apply([e for e in events if e[0] != "wrong" or e[1][1] == -1], c.text)
        elif _IF_CLAUSE.match(c.norm) and consequence_follows:
            # "if only rank 0 calls it, it hangs": a condition supposes what a misconception entry
            # says, and the clause after it says what follows; only a form is read
            apply([e for e in events if e[0] != "wrong" or e[1][1] != -1], c.text)
        else:
            apply(events, c.text)
        topical = is_topical(c.norm, secret)
        reading.topical += topical
        topical_verb = topical and carries_verb(c.norm, c.opener not in (",", "，", "、"))
        if accounted:
            read_sentences.add(c.sentence)
        elif c.sentence in non_claims:
            # a question, a meta remark, a restated problem, an analogy or a worked example in
            # numbers states nothing the question asks: read, credited with nothing
            reading.trace.append(f"[{c.norm}] a question, remark, analogy or example: read")
            if topical_verb and c.sentence not in aside_unread:
                aside_unread.append(c.sentence)
        elif c.sentence in otherwise or cf or c.sentence in headings:
            # what the alternative would do ("Without an auto-wrap policy the root unit is the
            # whole model", "不用 no_sync() 时，每个 micro-batch 都会 reduce-scatter") describes the
            # thing the question contrasts with, and a heading ("按 block 包的原因：") states
            # nothing: read, credited with nothing (a misconception entry in it is still false)
            reading.trace.append(f"[{c.norm}] about the alternative, or a heading: read")
            read_sentences.add(c.sentence)
        elif topical and carries_verb(c.norm, c.opener not in (",", "，", "、")):
            reading.trace.append(f"[{c.norm}] about the topic, but nothing the question knows")
            if c.sentence not in unread:
                unread.append(c.sentence)
        if stated_here:
            last_stated = stated_here
        named = [m for m in subject_mentions(c.norm, subjects) if not m.comparand]
        prev_inherited = clause_inherited
        if named:
            inherited, inherited_sentence = named[-1].name, c.sentence
    # a sentence is read when one of its clauses was: its other clauses elaborate on what it says
    # (a false one among them is still a misconception); a sentence about the topic of which no
    # clause could be read is unread
    # an analogy or a worked example may be where a key idea is said, in words no rule reads: while
    # a key idea is missing, such a sentence about the topic is unread (the answer is unsure, not
    # wrong)
    ideas = secret.get("key_ideas") or [{"claims": [c["id"]]} for c in secret["claims"]]
    if all(any(c in reading.supported for c in k["claims"]) for k in ideas):
        read_sentences |= set(aside_unread)
    else:
        unread += [s for s in aside_unread if s not in unread]
    reading.unread = [sentence_text[s] for s in sorted(unread) if s not in read_sentences]
    for s in reading.unread:
        reading.trace.append(
            f"[{s}] UNREAD: about the topic, and no clause of it matches what the question knows"
        )
    return reading
