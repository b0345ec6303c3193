"""A reranker's classification head: llama.cpp's pooling type RANK (`<arch>.pooling_type` 4).

As llama.cpp builds it (src/llama-graph.cpp, llm_graph_context::build_pooling, 0.3.36):
- the row pooled is the first token's ([CLS]) final hidden state for an encoder, the last
  token's for a causal decoder (llm_graph_input_cls::set_input: RANK and causal_attn -> last);
- optional `cls.weight` (n_embd, n_embd) + `cls.bias`, then tanh (`bert`);
- optional `cls.output.weight` (n_embd, n_cls_out) + `cls.output.bias`: n_cls_out is the
  length of `<arch>.classifier.output_labels` (1 when absent). A BERT cross-encoder as the
  converter writes it (BertForSequenceClassification) has only `cls.output` (its pooler is
  dropped); a Qwen3-Reranker has a `cls.output` of two rows, the lm_head rows of "yes" and
  "no", and llama.cpp takes their softmax (`qwen3`);
- llama-server's relevance score is the head's first value, raw (a logit for a BERT
  cross-encoder, P(yes) for Qwen3): server-context.cpp send_rerank, `embd[0]`.

Architectures whose llama.cpp graph loads no head tensors (`nomic-bert`, `llama`, ...) cannot
rank: a file of theirs that asks for it is refused at load.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedModelError
from ..format.gguf import Key
from ..format.quants import dequantize

# architecture -> (tensors its llama.cpp graph loads for the head, softmax of the output)
HEADS = {
    "bert": (("cls", "cls.output"), False),
    "qwen3": (("cls.output",), True),
}


@dataclass(frozen=True)
class RankHead:
    dense: np.ndarray | None       # (n_embd, n_embd) float32, `cls.weight` as rows
    dense_b: np.ndarray | None     # (n_embd,)
    out: np.ndarray | None         # (n_cls_out, n_embd) float32, `cls.output.weight` as rows
    out_b: np.ndarray | None       # (n_cls_out,)
    softmax: bool
    labels: tuple                  # `<arch>.classifier.output_labels` ("yes", "no" for Qwen3)
    last_token: bool               # a causal decoder pools its last token, an encoder [CLS]

    def scores(self, x):
        """Pooled rows (n, n_embd) float32 -> the head's outputs (n, n_cls_out) float32
        (n_embd wide without `cls.output`); column 0 is llama-server's relevance score."""
        x = np.asarray(x, np.float32)
        if self.dense is not None:
            x = x @ self.dense.T
            if self.dense_b is not None:
                x = x + self.dense_b
            x = np.tanh(x)
        if self.out is not None:
            x = x @ self.out.T
            if self.out_b is not None:
                x = x + self.out_b
        if self.softmax:
            e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
            x = e / e.sum(-1, keepdims=True)
        return np.ascontiguousarray(x, np.float32)

    def pooled_row(self, hidden):
        """The row of one sequence's (n, n_embd) hidden states that the head reads."""
        return hidden[-1] if self.last_token else hidden[0]


def load(f, arch, n_embd, causal):
    """The head of GGUF file `f` (a GGUFFile) for architecture `arch`: a RankHead, or None
    when the file has none of its tensors. UnsupportedModelError when the file's pooling type
    is rank but the architecture or the file has no head, or a tensor's shape is wrong."""
    md = f.metadata
    pooling = md.get(Key.arch(Key.POOLING_TYPE, arch))
    wants = pooling is not None and not isinstance(pooling, bool) and pooling == 4
    names, softmax = HEADS.get(arch, ((), False))
    present = [n for n in names if n + ".weight" in f.tensors]
    if not present:
        if wants:
            raise UnsupportedModelError(
                f"{Key.arch(Key.POOLING_TYPE, arch)} = 4 (rank) but the file has no "
                f"classification head ({' / '.join(n + '.weight' for n in names) or 'none'}"
                f"{'' if names else ': llama.cpp ranks with bert and qwen3 heads only'})")
        return None
    labels = md.get(Key.arch(Key.CLASSIFIER_OUTPUT_LABELS, arch))
    if labels is not None and (not isinstance(labels, list) or not labels
                               or not all(isinstance(x, str) for x in labels)):
        raise UnsupportedModelError(f"{Key.arch(Key.CLASSIFIER_OUTPUT_LABELS, arch)} must be "
                                    "a non-empty array of strings")
    n_out = len(labels) if labels else 1

    def tensor(name, shape):
        t = f.tensors.get(name)
        if t is None:
            return None
        got = tuple(int(x) for x in t.shape)
        if got != shape:
            raise UnsupportedModelError(f"tensor {name!r} has shape {got}, expected {shape} "
                                        f"(n_embd {n_embd}, {n_out} output label(s))")
        v = np.asarray(dequantize(np.asarray(f.tensor_bytes(name)).reshape(-1), t.type, got),
                       np.float32)
        return np.ascontiguousarray(v.reshape(tuple(reversed(got))))

    has_dense = "cls" in present
    return RankHead(dense=tensor("cls.weight", (n_embd, n_embd)) if has_dense else None,
                    dense_b=tensor("cls.bias", (n_embd,)) if has_dense else None,
                    out=tensor("cls.output.weight", (n_embd, n_out)),
                    out_b=tensor("cls.output.bias", (n_out,)),
                    softmax=softmax, labels=tuple(labels or ()), last_token=causal)
