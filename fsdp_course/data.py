"""Text data the model really learns, made offline and deterministic per seed.

The default corpus is generated from a tiny grammar ("the quick fox sees a lazy dog ."), so a
character-level model's loss falls visibly within a few dozen steps. ``--data FILE`` trains on
any UTF-8 text file instead.

Batches are a function of (seed, step) only: the global batch of a step is the same whatever the
world size, and rank ``r`` takes rows ``r*B:(r+1)*B``. So a single-process reference that asks
for ``B * world_size`` rows sees exactly the union of what the ranks saw, and resuming at step
``s`` continues with the very batches an uninterrupted run would have used.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from fsdp_course.dist import CourseError

ADJECTIVES = ["quick", "lazy", "red", "small", "old", "bright", "quiet", "happy"]
NOUNS = ["fox", "dog", "cat", "bird", "gpu", "rank", "shard", "model"]
VERBS = ["sees", "likes", "sends", "gathers", "follows", "helps"]


def grammar_text(num_sentences: int = 4000, seed: int = 0) -> str:
    """Sentences like 'the quick fox sees a lazy dog .' from a fixed random stream."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(num_sentences):
        subject = f"{rng.choice(['the', 'a'])} {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"
        obj = f"{rng.choice(['the', 'a'])} {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"
        sentences.append(f"{subject} {rng.choice(VERBS)} {obj} .")
    return " ".join(sentences) + "\n"


@dataclass
class TextData:
    tokens: torch.Tensor  # int64 ids, one per character
    vocab: str  # the characters, sorted; id i is vocab[i]
    seed: int = 0

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def batch(
        self,
        step: int,
        rank: int,
        world_size: int,
        batch_size: int,
        seq_len: int,
        device: torch.device | str = "cpu",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets for this rank at this step: ``batch_size`` rows each."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(
            len(self.tokens) - seq_len - 1, (world_size * batch_size,), generator=generator
        )
        mine = starts[rank * batch_size : (rank + 1) * batch_size]
        rows = torch.stack([self.tokens[s : s + seq_len + 1] for s in mine.tolist()])
        return rows[:, :-1].to(device), rows[:, 1:].to(device)

    def decode(self, ids) -> str:
        return "".join(self.vocab[i] for i in ids)


def load_data(path: str | None = None, seed: int = 0, min_chars: int = 1000) -> TextData:
    """The grammar corpus, or the text file at ``path`` (character vocabulary built from it)."""
    if path:
        file = Path(path)
        if not file.is_file():
            raise CourseError(f"--data {path}: no such file")
        text = file.read_text(encoding="utf-8", errors="replace")
        if len(text) < min_chars:
            raise CourseError(f"--data {path}: {len(text)} characters; need at least {min_chars}")
    else:
        text = grammar_text(seed=seed)
    vocab = "".join(sorted(set(text)))
    index = {ch: i for i, ch in enumerate(vocab)}
    tokens = torch.tensor([index[ch] for ch in text], dtype=torch.long)
    return TextData(tokens=tokens, vocab=vocab, seed=seed)
