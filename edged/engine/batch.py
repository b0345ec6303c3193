"""The unit of the engine's step API: one sequence's share of a batch.

Model.decode(entries) evaluates a list of BatchEntry in one call, as llama.cpp's
`llama_decode(batch)` evaluates a batch of (token, position, sequence id, logits flag) rows:
prompt chunks of some sessions and single decode tokens of others, mixed. An entry names its
sequence by its Session (which owns the KV cache), the tokens, where they go, and which logits
the caller wants back.
"""
from __future__ import annotations

from dataclasses import dataclass

LOGITS = ("last", "all", None)


@dataclass(frozen=True)
class BatchEntry:
    """`tokens` at positions pos, pos+1, ... of `session`'s KV cache.

    pos: None appends at session.n_past; a smaller pos first forgets the cache from pos on
    (prefix reuse, rejected draft tokens); it cannot leave a hole (pos > n_past).
    logits: "last" -> float32 (1, n_vocab) of the last token, "all" -> (len(tokens), n_vocab),
    None -> nothing (a prompt chunk that is not the last one).
    """
    session: object                 # engine.model.Session
    tokens: tuple
    pos: int | None = None
    logits: str | None = "last"

    def __post_init__(self):
        object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))
