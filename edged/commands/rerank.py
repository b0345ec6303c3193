"""`edged rerank -m FILE -q QUERY DOC [DOC ...]`: relevance scores of documents for a query under
a reranker (a BERT cross-encoder or a Qwen3-Reranker-style decoder), highest first, as
llama-server's /rerank scores them."""
import json
import sys

from .embed import texts_with_file
from .loadargs import add_load_args, load_model


def configure(p):
    p.description = ("Score each DOC against QUERY with the reranker in FILE (its "
                     "classification head; pooling type rank) and print them, highest first.")
    add_load_args(p)
    p.add_argument("-q", "--query", required=True, help="the query")
    p.add_argument("documents", nargs="*", metavar="DOC", help="a document to score")
    p.add_argument("-f", "--file", metavar="PATH",
                   help="also score each line of a file (- for stdin)")
    p.add_argument("--top-n", type=int, default=None, metavar="N", help="print the N best only")
    p.add_argument("--json", action="store_true",
                   help="print llama-server's shape: {\"results\": [{\"index\", \"relevance_score\"}]}")
    p.set_defaults(func=run)


def run(args):
    docs = texts_with_file(args.documents, args.file)
    if not docs:
        print("edged rerank: give at least one DOC or -f FILE", file=sys.stderr)
        return 2
    with load_model(args) as m:
        scores = m.rerank(args.query, docs)
    order = sorted(range(len(docs)), key=lambda i: -float(scores[i]))[:args.top_n]
    if args.json:
        print(json.dumps({"model": args.model, "object": "list", "results": [
            {"index": i, "relevance_score": float(scores[i])} for i in order]}))
        return 0
    for i in order:
        print(f"{scores[i]:9.4f}  [{i}] {docs[i]}")
    return 0
