"""Reranking: POST /v1/rerank, /rerank (and llama-server's /reranking, /v1/reranking; Cohere's
/v2/rerank).

The body as llama-server, Jina and Cohere take it: `query`, `documents` (strings, or Jina's and
Cohere's {"text": ...} objects), `top_n`, `return_documents`, `model`; or Hugging Face TEI's
`texts` (+ `return_text`, `raw_scores`), which llama-server also answers, as a bare list. Each document is
paired with the query (Model.rerank_ids: the model's rerank template, or [CLS] query [SEP]
document [SEP]) and scored by the model's classification head on the decode thread, like an
embedding (Api._embed, jobs.embed): queued for a slot, under request_timeout, stopped when the
client goes away. The reply is llama-server's (format_response_rerank): results sorted by
relevance_score, highest first, each with the document's `index`; the score is the head's raw
first output (a cross-encoder's logit, a Qwen3-Reranker's P(yes)).

Bounds: at most MAX_DOCUMENTS documents and MAX_TOKENS tokens over all pairs per request, each
pair within ctx_size; past them a 400 that names the limit.
"""
import secrets
from typing import Annotated, Union

import numpy as np
from pydantic import Field

from ..errors import RequestError
from .openai_schema import _Strict, validated
from .wire import Reply, json_body

MAX_DOCUMENTS = 1000        # Cohere's limit per request
MAX_TOKENS = 65536          # over all query-document pairs of one request


class RerankDocument(_Strict):
    text: str


class RerankRequest(_Strict):
    model: str | None = None
    query: str
    documents: list[Union[str, RerankDocument]] | None = None
    texts: list[str] | None = None                  # Hugging Face TEI
    top_n: Annotated[int, Field(ge=1)] | None = None
    return_documents: bool = False
    return_text: bool = False                       # TEI
    raw_scores: bool | None = None                  # TEI: false -> sigmoid (default: raw, as llama-server)


def routes(api):
    """(method, path) -> handler of the rerank routes, for Api's table."""
    handler = Rerank(api).rerank
    return {("POST", path): handler
            for path in ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking", "/v2/rerank")}


def validate(body):
    """(RerankRequest, document texts); RequestError naming the field."""
    r = validated(RerankRequest, body)
    if (r.documents is None) == (r.texts is None):
        raise RequestError("give 'documents' (or TEI's 'texts'): a non-empty list of strings",
                           param="documents")
    field = "documents" if r.texts is None else "texts"
    docs = [d if isinstance(d, str) else d.text for d in getattr(r, field)]
    if not docs:
        raise RequestError(f"'{field}' must be a non-empty list of strings", param=field)
    if len(docs) > MAX_DOCUMENTS:
        raise RequestError(f"'{field}' has {len(docs)} documents, more than the limit of "
                           f"{MAX_DOCUMENTS} per request", param=field)
    return r, docs


def check_tokens(seqs):
    n = sum(len(s) for s in seqs)
    if n > MAX_TOKENS:
        raise RequestError(f"the {len(seqs)} query-document pairs take {n} tokens, more than "
                           f"the limit of {MAX_TOKENS} tokens per rerank request", param="documents")


def reply(r, docs, name, scores, n_tokens):
    """llama-server's reply (Jina's and Cohere's shape), or TEI's bare list for `texts`."""
    tei = r.texts is not None
    key = "score" if tei else "relevance_score"
    values = scores[:, 0].astype(float)
    if r.raw_scores is False:
        values = 1 / (1 + np.exp(-values))
    order = sorted(range(len(docs)), key=lambda i: -values[i])[:r.top_n]
    results = []
    for i in order:
        item = {"index": i, key: float(values[i])}
        if tei and r.return_text:
            item["text"] = docs[i]
        elif not tei and r.return_documents:
            item["document"] = {"text": docs[i]}
        results.append(item)
    if tei:
        return Reply(200, results)
    return Reply(200, {"id": "rerank-" + secrets.token_hex(12), "model": name, "object": "list",
                       "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
                       "results": results})


class Rerank:
    def __init__(self, api):
        self.api = api

    async def rerank(self, req):
        r, docs = validate(json_body(req, self.api.state.cfg.max_body_bytes))
        return await self.api._embed(req, r.model, [(r.query, d) for d in docs], "rank",
                                     lambda name, scores, n: reply(r, docs, name, scores, n),
                                     check=check_tokens)
