"""`edged generate`: complete a prompt; text on stdout, llama.cpp-style timings on stderr."""
import json
import sys
import time

from .loadargs import add_load_args, add_speculation_args, load_model, load_speculation
from ..engine import statefile
from ..errors import StateFileError
from ..text.sampling import SamplingParams


def configure(p):
    p.description = ("Generate a continuation of a prompt. The generated text "
                     "(not the prompt) goes to stdout as it is produced; timings to stderr.")
    add_load_args(p)
    p.add_argument("-p", "--prompt", required=True, help="prompt text")
    p.add_argument("-n", "--n-predict", type=int, default=128, help="tokens to generate")
    p.add_argument("-c", "--ctx-size", type=int, default=0,
                   help="context size (default: prompt + n, at least 512, at most the model's)")
    p.add_argument("--temp", type=float, default=0.0, help="temperature (0: greedy)")
    p.add_argument("--top-k", type=int, default=40, help="keep the K most likely tokens (0: all; default 40)")
    p.add_argument("--top-p", type=float, default=0.95,
                   help="keep the most likely tokens up to this total probability (1: off; default 0.95)")
    p.add_argument("--min-p", type=float, default=0.05,
                   help="drop tokens less likely than P times the most likely one (0: off; default 0.05)")
    p.add_argument("--repeat-penalty", type=float, default=1.0,
                   help="divide the logits of recently seen tokens by this (1: off; default 1)")
    p.add_argument("--repeat-last-n", type=int, default=64,
                   help="how many recent tokens the penalties look at (default 64)")
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="subtract from the logits of tokens seen at all (default 0)")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="subtract this times the count of each seen token (default 0)")
    p.add_argument("--seed", type=int, default=None, help="RNG seed (same seed, same output)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt as a user message in the model's chat template")
    p.add_argument("--prompt-cache", metavar="FILE", default=None,
                   help="reuse the prompt's state from FILE when it holds a prefix of it, and save "
                        "the prompt's state there (llama.cpp's --prompt-cache); MAC'd with the key in "
                        "$EDGED_STATE_DIR (default ~/.local/state/edged)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (text, tokens, finish_reason, timings) at the end")
    p.add_argument("--image", action="append", default=[], metavar="FILE",
                   help="an image (PNG, JPEG, WebP, GIF) for the prompt, repeatable: each goes where "
                        "the prompt says <__media__>, else before it (with --chat: in the user message)")
    p.add_argument("--mmproj", metavar="FILE", default=None,
                   help="the model's image projector (llama.cpp's mmproj GGUF; default: "
                        "mmproj-NAME.gguf beside -m NAME.gguf), verified like -m")
    add_speculation_args(p)
    p.set_defaults(func=run)


def run(args):
    t_start = time.perf_counter()
    m = load_model(args)
    draft = proj = None
    try:
        tok = m.tokenizer
        if args.image:
            proj = load_projector(args, m)
            prompt, embeddings = image_prompt(m, proj, args.prompt, args.image, args.chat)
        elif args.chat:
            prompt = m.encode_chat([{"role": "user", "content": args.prompt}])
        else:
            prompt = tok.encode(args.prompt, add_special=True)
        n_ctx = args.ctx_size or min(m.n_ctx_train, max(512, len(prompt) + max(args.n_predict, 0)))
        spec, draft = load_speculation(args, m, n_ctx)
        if args.prompt_cache:
            s, key = _open_prompt_cache(m, args, prompt, n_ctx)
        else:
            s = m.session(n_ctx=n_ctx)
        for emb in embeddings if args.image else ():
            s.add_image(emb)
        stats = {}
        pieces, tokens, finish = [], [], None
        params = SamplingParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                                min_p=args.min_p, seed=args.seed, repeat_penalty=args.repeat_penalty,
                                penalty_last_n=args.repeat_last_n,
                                presence_penalty=args.presence_penalty,
                                frequency_penalty=args.frequency_penalty)
        for out in s.generate(prompt, params, max_tokens=args.n_predict, stop=args.stop,
                              stats=stats, speculative=spec):
            if out.token is not None and out.finish_reason != "stop":
                tokens.append(out.token)
            if out.text:
                pieces.append(out.text)
                if not args.json:
                    sys.stdout.write(out.text)
                    sys.stdout.flush()
            finish = out.finish_reason
        if not args.json:
            sys.stdout.write("\n")
            sys.stdout.flush()
        if args.prompt_cache and s.common_prefix(prompt) == len(prompt) \
                and stats.get("n_prompt_eval", 0) > 1:    # more than the last token was computed
            s.save(args.prompt_cache, key, n_tokens=len(prompt))
        timings = _timings(m, stats, t_start)
        if args.json:
            json.dump({"text": "".join(pieces), "tokens": tokens, "finish_reason": finish,
                       "n_prompt": stats.get("n_prompt", len(prompt)), "timings": timings},
                      sys.stdout)
            sys.stdout.write("\n")
        _print_timings(timings, m)
        s.close()
    finally:
        if draft is not None:
            draft.close()
        if proj is not None:
            proj.close()
        m.close()
    return 0


def load_projector(args, m):
    """The Projector of --mmproj (or mmproj-NAME.gguf beside -m), verified as -m is."""
    from ..errors import ConfigError
    from ..service.images import mmproj_beside
    path = args.mmproj or mmproj_beside(args.model)
    if path is None:
        raise ConfigError(f"--image needs the model's image projector: --mmproj FILE, or "
                          f"mmproj-NAME.gguf beside {args.model}")
    from ..engine.vision import Projector
    verified = None
    if args.trusted_keys is not None or args.require_signature:
        from ..trust import verify
        verified = verify.open_verified(path, args.trusted_keys, args.require_signature)
    proj = Projector.load(path, n_threads=args.threads, verified=verified)
    try:
        proj.check_model(m)
    except BaseException:
        proj.close()
        raise
    return proj


def image_prompt(m, proj, text, files, chat):
    """(prompt ids, ImageEmbeddings) of `text` with the image files (decoded here, with the
    daemon's limits) where it says MARKER, else before it."""
    from ..errors import RequestError
    from ..service import images
    embeddings = []
    for f in files:
        with open(f, "rb") as fh:
            data = images.ImageInput(fh.read(images.MAX_BYTES + 1), f)
        if len(data.data) > images.MAX_BYTES:
            raise RequestError(f"{f}: larger than {images.MAX_BYTES} bytes")
        embeddings.append(proj.encode(images.decode(data).rgb))
    if images.MARKER not in text:
        text = images.MARKER * len(files) + text
    if chat:
        text = m.chat_prompt([{"role": "user", "content": text}])
    return proj.prompt_ids(m, text, embeddings), embeddings


def _open_prompt_cache(m, args, prompt, n_ctx):
    """(session, key): a session holding the prompt-cache file's state when the file is there
    and valid (the context size it was made with, unless -c names another), else a new one. A
    refused file is named with its reason on stderr and recomputed."""
    key, s = statefile.load_key(), None
    try:
        h, _, _ = statefile.read_header(args.prompt_cache)
        statefile.check_model(h, m)         # before its context size is used
        if not args.ctx_size and h["n_ctx"] >= len(prompt) + max(args.n_predict, 0):
            n_ctx = h["n_ctx"]
        s = m.session(n_ctx=n_ctx)
        n = statefile.restore(s, args.prompt_cache, key)
        print(f"edged: prompt cache {args.prompt_cache}: {n} tokens restored, "
              f"{s.common_prefix(prompt)} of them a prefix of this prompt", file=sys.stderr)
        return s, key
    except FileNotFoundError:
        pass
    except (StateFileError, OSError) as e:
        print(f"edged: prompt cache {args.prompt_cache} refused ({e}): recomputing",
              file=sys.stderr)
    if s is not None:
        s.close()
    return m.session(n_ctx=n_ctx), key


def _timings(m, st, t_start):
    np_, pms = st.get("n_prompt_eval", 0), st.get("prompt_ms", 0.0)
    ng, gms = st.get("n_gen", 0), st.get("gen_ms", 0.0)
    return {"load_ms": round(m.load_ms, 2), "prompt_tokens": np_, "prompt_ms": round(pms, 2),
            "prompt_tps": round(np_ / pms * 1000, 2) if pms else 0.0,
            "gen_tokens": ng, "gen_ms": round(gms, 2),
            "gen_tps": round(ng / gms * 1000, 2) if gms else 0.0,
            "sample_ms": round(st.get("sample_ms", 0.0), 2),
            "drafted": st.get("n_drafted", 0), "accepted": st.get("n_accepted", 0),
            "total_ms": round((time.perf_counter() - t_start) * 1000, 2)}


def _print_timings(t, m):
    def line(name, ms, n, unit):
        per = ms / n if n else 0.0
        tps = n / ms * 1000 if ms else 0.0
        print(f"edged: {name:>16} = {ms:10.2f} ms / {n:5d} {unit} ({per:8.2f} ms per token, "
              f"{tps:8.2f} tokens per second)", file=sys.stderr)

    print(f"edged: {'load time':>16} = {t['load_ms']:10.2f} ms ({m.backend_name} backend, "
          f"{m.n_threads} threads)", file=sys.stderr)
    line("prompt eval time", t["prompt_ms"], t["prompt_tokens"], "tokens")
    line("eval time", t["gen_ms"], t["gen_tokens"], "runs  ")
    print(f"edged: {'sampling time':>16} = {t['sample_ms']:10.2f} ms", file=sys.stderr)
    if t["drafted"]:
        print(f"edged: {'drafted':>16} = {t['drafted']:10d} tokens, accepted {t['accepted']} "
              f"({100 * t['accepted'] / t['drafted']:.1f}%)", file=sys.stderr)
    print(f"edged: {'total time':>16} = {t['total_ms']:10.2f} ms", file=sys.stderr)
