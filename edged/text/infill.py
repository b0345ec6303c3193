"""Fill-in-the-middle prompts: the token ids llama-server builds for /infill
(format_prompt_infill, tools/server/server-common.cpp of llama.cpp 0.3.36), from the FIM tokens
the vocabulary declares or llama.cpp finds by text (Tokenizer.fim).

    [FIM_REP]myproject\\n                        only when the vocabulary has FIM_REP
    [FIM_SEP]{filename}\\n{text}  ...           each input_extra chunk (without FIM_SEP:
                                               "\\n\\n--- snippet ---\\n\\n" then the text)
    [FIM_SEP]filename\\n                         only when it has FIM_SEP
    [BOS] [FIM_PRE]{prefix}{prompt} [FIM_SUF]{suffix} [FIM_MID]

(spm_infill puts the suffix part first.) The extra context goes before the BOS, as llama-server
puts it. The prefix keeps its last 3/4 of n_batch tokens, the suffix its first n_batch/4 - 2 -
len(prompt); the extra context its last n_ctx - n_batch - 2 * n_predict tokens. Texts are
tokenized without special tokens and without parsing control-token text; `prompt` (what the
user typed of the middle) with parsing, as llama-server does. Fragments given as lists mix texts
and token ids (llama-server's tokenize_mixed).
"""
from __future__ import annotations

import dataclasses

from ..errors import RequestError

# llama-server's defaults for what bounds the parts: its n_batch and n_predict
N_BATCH = 2048
N_PREDICT = -1
SNIPPET = "\n\n--- snippet ---\n\n"     # k_chunk_prefix_str


@dataclasses.dataclass(frozen=True)
class Infill:
    """What to fill in: the text before (`prefix`) and after (`suffix`) the gap, each a string
    or a tuple of strings and token ids; `extra`: ((filename, text), ...) of other files;
    `prompt`: the start of the middle, already typed."""
    prefix: str | tuple = ""
    suffix: str | tuple = ""
    extra: tuple = ()
    prompt: str = ""


def missing(tok):
    """What the vocabulary lacks for fill-in-the-middle (empty when it has all it needs)."""
    return [f"{what} token" for what, key in (("prefix", "pre"), ("suffix", "suf"), ("middle", "mid"))
            if tok.fim[key] is None]


def _mixed(tok, part):
    if isinstance(part, str):
        return tok.encode(part, add_special=False)
    out = []
    for x in part:
        if isinstance(x, str):
            out += tok.encode(x, add_special=False)
        else:
            if not 0 <= int(x) < tok.n_vocab:
                raise RequestError(f"token id {x} out of range (vocabulary of {tok.n_vocab})")
            out.append(int(x))
    return out


def prompt_ids(tok, infill, n_ctx, n_batch=N_BATCH, n_predict=N_PREDICT, spm_infill=False):
    """The token ids of `infill` (an Infill) as llama-server's /infill lays them out; RequestError
    naming the missing FIM tokens when the vocabulary has none of its kind."""
    lacks = missing(tok)
    if lacks:
        raise RequestError(f"fill-in-the-middle is not supported by this model: its vocabulary "
                           f"has no {', '.join(lacks)} (tokenizer.ggml.fim_pre/suf/mid_token_id, "
                           "or a token llama.cpp recognises by its text)")
    fim = tok.fim
    enc = lambda text: tok.encode(text, add_special=False)      # noqa: E731
    prefix, suffix = _mixed(tok, infill.prefix), _mixed(tok, infill.suffix)
    typed = tok.encode(infill.prompt, add_special=False, parse_special=True)
    extra = []
    if fim["rep"] is not None:
        extra += [fim["rep"]] + enc("myproject\n")
    for filename, text in infill.extra:
        if fim["sep"] is not None:
            extra += [fim["sep"]] + enc((filename if filename is not None else "tmp") + "\n")
        else:
            extra += enc(SNIPPET)
        extra += enc(text)
    if fim["sep"] is not None:
        extra += [fim["sep"]] + enc("filename\n")
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(typed))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra))
    pre = [fim["pre"]] + prefix[len(prefix) - n_prefix:] + typed
    suf = [fim["suf"]] + suffix[:n_suffix]
    first, last = (suf, pre) if spm_infill else (pre, suf)
    if tok.add_bos and tok.bos_id is not None:
        first = [tok.bos_id] + first
    return extra[len(extra) - n_extra:] + first + last + [fim["mid"]]
