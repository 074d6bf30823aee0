"""The language libraries the open-answer reader stands on, loaded lazily and quietly.

- Chinese word segmentation: jieba (its dictionary ships in the package). Negation is read per
  word: 差不多 ("about the same") and 不同 ("different") are words of their own, not 不 + ...;
  不会 / 没有 / 无法 are negation words.
- English lemmas: lemminflect (its lemma tables ship in the package), to tell a verb form from
  a plural: "shards" is a noun, "frees" / "kept" / "resharded" are verbs.

`import quizzes` imports neither: jieba takes about a second to build its prefix dictionary (and
prints "Building prefix dict..." unless told not to), so it is built on the first Chinese answer.
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache

_JIEBA = None


def _jieba():
    global _JIEBA
    if _JIEBA is None:
        import jieba

        jieba.setLogLevel(logging.ERROR)  # no "Building prefix dict ..." on stderr
        jieba.initialize()
        _JIEBA = jieba
    return _JIEBA


@lru_cache(maxsize=8192)
def zh_words(text: str) -> tuple:
    """((word, start, end), ...) over the whole text; ASCII runs come back as jieba cuts them
    (letters, spaces and digits), so only the Chinese words matter to callers."""
    if not re.search("[\u3400-\u9fff]", text):
        return ()
    return tuple(_jieba().tokenize(text))


@lru_cache(maxsize=8192)
def en_lemmas(word: str) -> dict:
    """{part of speech: (lemma, ...)} from lemminflect's tables ({} for a word it does not know)."""
    from lemminflect import getAllLemmas

    return getAllLemmas(word)
