"""Flags shared by several commands: loading a model (generate, bench, info) and reaching the
daemon's socket (chat, models, ps, load, unload)."""
import os
import re

from ..errors import ConfigError

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
DEFAULT_SOCKET = "/run/edged/edged.sock"


def parse_size(text):
    """'512M', '2G', '1.5G', '123456' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.I)
    if not m:
        raise ConfigError(f"--max-memory {text!r}: expected a size like 512M or 2G")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def add_load_args(p, threads=True):
    p.add_argument("-m", "--model", required=True, metavar="FILE", help="GGUF model file")
    if threads:
        p.add_argument("-t", "--threads", type=int, default=None,
                       help="worker threads (default: physical cores allowed to this process)")
        p.add_argument("--numa", choices=["none", "isolate", "distribute", "numactl"],
                       default="none", help="NUMA policy, as llama.cpp's --numa")
    p.add_argument("--no-mmap", action="store_true", help="read the weights into memory "
                   "instead of mapping the file")
    p.add_argument("--mlock", action="store_true", help="lock weights and buffers in RAM")
    p.add_argument("--max-memory", type=parse_size, default=None, metavar="SIZE",
                   help="memory budget (default: available memory), e.g. 2G")
    p.add_argument("--trusted-keys", metavar="DIR", default=None,
                   help="directory of trusted public keys; the model must verify against one")
    p.add_argument("--require-signature", action="store_true",
                   help="refuse unsigned models")
    p.add_argument("--verbose", action="store_true",
                   help="log each tensor and the memory plan while loading")
    add_cache_args(p)


def add_cache_args(p):
    """llama.cpp's -ctk/-ctv: the KV cache's storage types (engine/kvcache.py)."""
    from ..engine.kvcache import CACHE_TYPES
    names = ", ".join(CACHE_TYPES)
    p.add_argument("-ctk", "--cache-type-k", metavar="TYPE", default=None,
                   help=f"KV cache type for K: {names} (default f16; q8_0 is 0.53x the memory)")
    p.add_argument("-ctv", "--cache-type-v", metavar="TYPE", default=None,
                   help=f"KV cache type for V: {names} (default f16; q4_0 is 0.28x the memory)")


def load_model(args, n_ctx_plan=None, path=None, max_memory=None):
    """The model of -m (or `path`: a draft model, within `max_memory`), its signature checked
    first when --trusted-keys or --require-signature ask for it (the trust layer opens it; the
    engine maps that descriptor)."""
    # Imported here: `edged info` shares these flags but must start without the engine.
    from ..engine.model import Model
    path = path or args.model
    verified = None
    if args.trusted_keys is not None or args.require_signature:
        from ..trust import verify
        verified = verify.open_verified(path, args.trusted_keys, args.require_signature)
    return Model.load(path, n_threads=getattr(args, "threads", None),
                      numa=getattr(args, "numa", "none"), mmap=not args.no_mmap,
                      mlock=args.mlock, verified=verified, max_memory=max_memory or args.max_memory,
                      verbose=args.verbose, n_ctx_plan=n_ctx_plan,
                      cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v)


def add_speculation_args(p):
    """--lookup | --draft FILE, --draft-max, --draft-fixed, --lookup-ngram (engine/speculative.py)."""
    from ..engine.speculative import DRAFT_MAX, NGRAM_MAX, NGRAM_MIN
    g = p.add_mutually_exclusive_group()
    g.add_argument("--lookup", action="store_true",
                   help="speculative decoding with prompt lookup (n-gram drafts from the prompt "
                        "and the text so far); the output is the same, only faster where it copies")
    g.add_argument("--draft", metavar="FILE", default=None,
                   help="speculative decoding with this draft model (same vocabulary; signed and "
                        "verified like -m, loaded within what -m leaves of the memory budget)")
    p.add_argument("--draft-max", type=int, default=DRAFT_MAX, metavar="K",
                   help=f"most tokens drafted per step (default {DRAFT_MAX})")
    p.add_argument("--draft-fixed", action="store_true",
                   help="draft --draft-max tokens every step (default: fewer after a rejected "
                        "draft, more after accepted ones)")
    p.add_argument("--lookup-ngram", default=f"{NGRAM_MIN}:{NGRAM_MAX}", metavar="MIN:MAX",
                   help=f"n-gram sizes prompt lookup matches, longest first (default {NGRAM_MIN}:{NGRAM_MAX})")


def load_speculation(args, m, n_ctx):
    """The Speculation the flags ask for (None: off) and the draft model to close (or None)."""
    from ..engine.speculative import Speculation
    if not getattr(args, "lookup", False) and not getattr(args, "draft", None):
        return None, None
    lo, _, hi = str(args.lookup_ngram).partition(":")
    try:
        ngram = (int(lo), int(hi or lo))
    except ValueError:
        raise ConfigError(f"--lookup-ngram {args.lookup_ngram!r}: expected MIN:MAX, e.g. 1:3") from None
    if args.lookup:
        return Speculation("lookup", args.draft_max, *ngram, adapt=not args.draft_fixed), None
    left = m.budget - m.plan(n_ctx).total       # what the target leaves of the budget
    if left <= 0:
        raise ConfigError(f"--draft {args.draft}: {m.path} leaves nothing of the memory budget")
    d = load_model(args, n_ctx_plan=n_ctx, path=args.draft, max_memory=left)
    try:
        return Speculation("draft", args.draft_max, *ngram, draft_model=d, adapt=not args.draft_fixed), d
    except BaseException:
        d.close()
        raise


def add_socket_arg(p):
    p.add_argument("--socket", metavar="PATH", default=os.environ.get("EDGED_SOCKET", DEFAULT_SOCKET),
                   help=f"the daemon's socket (default $EDGED_SOCKET or {DEFAULT_SOCKET})")
