"""`edged info`: what a model needs (architecture, hyperparameters, types, memory per context),
and what this machine offers (compiled path, threads)."""
import collections
import json
import math
import sys

from .loadargs import add_load_args


def configure(p):
    p.description = ("Validate a model as a load would (without allocating) and "
                     "print its architecture, hyperparameters, weight types and the memory a "
                     "context needs.")
    add_load_args(p, threads=False)
    for action in p._actions:  # without -m, `edged info` describes only the machine
        if action.dest == "model":
            action.required = False
    p.add_argument("-c", "--ctx-size", type=int, action="append", default=None,
                   help="context size(s) to plan memory for (default: 512, 4096, training)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    p.set_defaults(func=run)


def model_info(path, ctx_sizes=None, cache=None):
    """Dict of facts about a model file, validated like a load, without backend buffers;
    memory planned for a KV cache of the kvcache.CacheTypes `cache` (None: f16 K and V)."""
    # Imported here, not at the top: `edged info` without a model describes only the machine
    # and starts without the model-loading layers.
    from ..engine import arch as _arch
    from ..engine import encoder as _encoder
    from ..engine.backends import backend_class
    from ..engine.kvcache import DEFAULT as DEFAULT_CACHE
    from ..format.gguf import GGUFFile, Key
    from ..text.tokenizer import Tokenizer

    cache = DEFAULT_CACHE if cache is None else cache
    with GGUFFile.open(path) as f:
        if f.metadata.get(Key.ARCHITECTURE) == "clip":      # llama.cpp's mmproj: no tokenizer
            return projector_info(path)
        tok = Tokenizer.from_gguf_file(f)
        if f.metadata.get(Key.ARCHITECTURE) in _encoder.ENCODERS:
            spec = _encoder.validate(f.metadata, f.tensors, tok.n_vocab)
            used = [f.tensors[n] for n in spec.tensors.values() if n]
            return {"file": path, "architecture": spec.arch.name, "encoder": True,
                    "hparams": vars(spec.hp), "pooling": spec.hp.pooling,
                    "parameters": sum(t.n_elements for t in used),
                    "weights_bytes": sum(t.nbytes for t in used), "vocabulary": tok.n_vocab}
        spec = _arch.validate(f.metadata, f.tensors, tok.n_vocab)
        hp = spec.hp
        types = collections.Counter()
        type_bytes = collections.Counter()
        for t in spec.tensors.values():
            n = getattr(t.type, "name", str(t.type))
            types[n] += 1
            type_bytes[n] += t.nbytes
        weights = sum(t.nbytes for t in spec.tensors.values())
        cls = backend_class(None)
        ctxs = ctx_sizes or sorted({512, 4096, hp.n_ctx_train})
        cache.check(hp.head_dim_layers or hp.head_dim)
        mem = []
        for n in ctxs:
            bp = cls.plan_for(spec, n, min(512, n), cache)
            mem.append({"n_ctx": n, "weights": weights, "kv_cache": bp.kv_cache,
                        "cache_type_k": cache.names[0], "cache_type_v": cache.names[1],
                        "scratch": bp.scratch, "total": weights + bp.kv_cache + bp.scratch})
        params = sum(t.n_elements for t in spec.tensors.values())
        active = spec.active_weight_bytes()
        return {
            "file": path, "architecture": spec.arch.name,
            "hparams": {k: (list(v) if isinstance(v, tuple) else v)
                        for k, v in vars(hp).items() if k != "swa_layers"},
            "swa_layers": [i for i, s in enumerate(hp.swa_layers) if s],
            "recurrent_state_bytes": 4 * hp.recurrent_state_floats(),
            "tied_embeddings": spec.tied_embeddings, "parameters": params,
            "weight_types": {k: {"tensors": types[k], "bytes": type_bytes[k]} for k in types},
            "vocabulary": tok.n_vocab, "bos_id": tok.bos_id, "eos_id": tok.eos_id,
            "memory": mem, "weights_bytes": weights, "active_weights_bytes": active,
            **({"gemma3n": _gemma3n(spec)} if spec.gemma3n else {}),
        }


def _gemma3n(spec):
    g, hp = spec.gemma3n, spec.hp
    shared = [il for il, src in enumerate(hp.kv_layers) if src != il]
    return {"n_altup": g.params.n_altup, "n_embd_altup": g.params.n_embd_altup,
            "per_layer_token_embd_bytes": spec.tensors[g.per_layer_token_embd].nbytes,
            "shared_kv_layers": shared, "kv_sources": [hp.kv_layers[il] for il in shared]}


def projector_info(path):
    """Dict of facts about an mmproj file (an image projector), loaded as the daemon would."""
    from ..engine.vision import Projector
    with Projector.load(path, n_threads=1) as p:
        return {"file": path, "architecture": "clip", "projector": p.describe()}


def machine_info():
    try:
        from .. import _core    # optional: without the compiled core, info says so
    except ImportError:
        return {"compiled": False}
    from ..engine.threads import describe
    out = {"compiled": True}
    out.update(describe())
    for name in ("kernel_path", "kernel_variant", "cpu_features", "available_paths"):
        fn = getattr(_core, name, None)
        if fn is not None:
            try:
                out[name] = fn()
            except Exception as e:  # report, do not fail `info`
                out[name] = f"error: {e}"
    return out


def run(args):
    if not args.model:
        mi = machine_info()
        if args.json:
            json.dump({"machine": mi}, sys.stdout, indent=1, default=str)
            print()
            return 0
        if not mi.get("compiled"):
            print("compiled core: not built (python setup.py build_ext --inplace)")
            return 0
        print(f"kernel path:  {mi.get('kernel_path')} ({mi.get('kernel_variant')}; logits are "
              "reproducible bit for bit on the same path: docs/engine.md, \"Reproducibility\")")
        print(f"cpu features: {' '.join(mi.get('cpu_features') or []) or 'none'}")
        quota = mi.get("cpu_quota")
        print(f"threads:      {mi.get('default_threads')} by default (physical cores in the "
              f"allowed set {mi.get('allowed_cpus')}"
              + (f", at most the cgroup CPU quota {quota:g} rounded up)" if quota else ")"))
        nodes = mi.get("numa_nodes") or {}
        print("numa nodes:   " + ", ".join(f"node {n}: {len(c)} cpus" for n, c in nodes.items()))
        return 0
    from ..engine.kvcache import CacheTypes
    from ..engine.recurrent import N_CHECKPOINTS
    info = model_info(args.model, args.ctx_size, CacheTypes.parse(args.cache_type_k, args.cache_type_v))
    info["machine"] = machine_info()
    if args.json:
        json.dump(info, sys.stdout, indent=1, default=str)
        print()
        return 0
    mib = lambda n: f"{n / 2**20:.1f} MiB"  # noqa: E731
    if "projector" in info:
        d = info["projector"]
        print(f"mmproj:       {info['file']}")
        print(f"projector:    {d['projector_type']}, images {d['image_size']}x{d['image_size']} "
              f"pixels -> {d['tokens_per_image']} tokens of width {d['n_embd']} (a text model of "
              f"that n_embd), memory {mib(d['memory_bytes'])}")
        return 0
    hp = info["hparams"]
    print(f"model:        {info['file']}")
    if info.get("encoder"):
        print(f"architecture: {info['architecture']} encoder, embeddings only ({info['parameters'] / 1e6:.2f} M "
              f"parameters, vocabulary {info['vocabulary']}, {mib(info['weights_bytes'])}), pooling "
              f"{info['pooling']}")
        print(f"layers {hp['n_layer']}, n_embd {hp['n_embd']}, n_ff {hp['n_ff']}, heads {hp['n_head']}, "
              f"layer norm eps {hp['norm_eps']:g}, trained context {hp['n_ctx_train']}")
        return 0
    print(f"architecture: {info['architecture']}  ({info['parameters'] / 1e6:.2f} M parameters, "
          f"vocabulary {info['vocabulary']}, tied embeddings: {info['tied_embeddings']})")
    print(f"layers {hp['n_layer']}, n_embd {hp['n_embd']}, n_ff {hp['n_ff']}, heads "
          f"{hp['n_head']}/{hp['n_head_kv']} kv, head_dim {hp['head_dim']}, n_rot {hp['n_rot']}, "
          f"rope base {hp['rope_freq_base']:g} scale {hp['rope_freq_scale']:g}, "
          f"rms eps {hp['rms_eps']:g}, trained context {hp['n_ctx_train']}")
    if hp["n_swa"]:
        print(f"sliding window {hp['n_swa']} on layers {info['swa_layers']} "
              f"(local rope base {hp['rope_freq_base_swa']:g})")
    if hp["rope_ext_factor"]:
        factor = 1 / hp["rope_freq_scale"]
        mscale = hp["rope_attn_factor"] * (1 + 0.1 * math.log(factor))  # as the rope applies it
        print(f"rope scaling: YaRN, factor {factor:g} over an original context of "
              f"{hp['n_ctx_orig']} (cos/sin x {mscale:.4f})")
    if hp.get("n_conv_layers"):
        conv = [i for i, c in enumerate(hp["conv_layers"]) if c]
        print(f"short convolutions ({hp['n_shortconv_l_cache']} taps) on layers {conv}; their "
              f"cache of {4 * hp['n_embd']} bytes per position per layer counts with the KV cache")
    if "gemma3n" in info:
        g = info["gemma3n"]
        print(f"gemma3n: {g['n_altup']} AltUp streams; per-layer inputs {g['n_embd_altup']} wide "
              f"per layer (per_layer_token_embd {mib(g['per_layer_token_embd_bytes'])}: "
              f"a token reads one row of it); layers {g['shared_kv_layers']} attend to "
              f"layers {g['kv_sources']}'s K/V (the KV cache holds none for them)")
    if hp.get("head_dim_layers"):
        shared = [il for il, src in enumerate(hp["kv_layers"]) if src != il]
        print(f"per layer: head_dim {hp['head_dim_layers']}, kv heads {hp['n_head_kv_layers']}, "
              f"n_rot {hp['n_rot_layers']}, n_ff {hp['n_ff_layers']}; the KV cache holds each "
              f"layer's rows at its size" + (f", none for layers {shared} (they attend to layers "
              f"{[hp['kv_layers'][il] for il in shared]}'s)" if shared else ""))
    if hp.get("n_embd_per_layer") and "gemma3n" not in info:
        print(f"per-layer inputs {hp['n_embd_per_layer']} wide per layer (a token reads one row "
              "of per_layer_token_embd)")
    if hp.get("n_recr_layers"):
        recr = [i for i, r in enumerate(hp["recr_layers"]) if r]
        kind = (f"Mamba-2 on layers {recr} ({hp['ssm_dt_rank']} heads of "
                f"{hp['ssm_d_inner'] // hp['ssm_dt_rank']} x state {hp['ssm_d_state']}, "
                f"{hp['ssm_n_group']} groups" if hp["ssm_layers"] and any(hp["ssm_layers"]) else
                f"Gated DeltaNet on layers {recr} ({hp['ssm_dt_rank']} value heads of "
                f"{hp['ssm_d_state']}")
        print(f"{kind}, {hp['ssm_d_conv']}-tap convolution); their recurrent state "
              f"of {mib(info['recurrent_state_bytes'])} per sequence, with {N_CHECKPOINTS} "
              "checkpoints, counts with the KV cache")
    if not all(hp["rope_layers"]):
        print(f"layers without RoPE: {[i for i, r in enumerate(hp['rope_layers']) if not r]}")
    if hp["n_expert"]:
        print(f"experts: {hp['n_expert_used']} of {hp['n_expert']} per token "
              f"(expert FFN {hp['n_ff_exp']}); weights read per token "
              f"{mib(info['active_weights_bytes'])} of {mib(info['weights_bytes'])} "
              f"({100 * info['active_weights_bytes'] / info['weights_bytes']:.0f}%, "
              "expert weights mapped from the file, or repacked and all resident where the "
              "memory budget allows)")
    print("weight types: " + ", ".join(f"{k} x{v['tensors']} ({mib(v['bytes'])})"
                                       for k, v in info["weight_types"].items()))
    for r in info["memory"]:
        print(f"memory at n_ctx {r['n_ctx']:>6}: weights {mib(r['weights'])} + KV cache "
              f"({r['cache_type_k']}/{r['cache_type_v']}) {mib(r['kv_cache'])} + scratch {mib(r['scratch'])} = {mib(r['total'])}")
    mi = info["machine"]
    if not mi.get("compiled"):
        print("machine: compiled core not built (python setup.py build_ext --inplace)")
    else:
        print(f"machine: kernel path {mi.get('kernel_path')} (available: "
              f"{', '.join(mi.get('available_paths', []))}), CPU features "
              f"{' '.join(mi.get('cpu_features', []))}")
        print(f"threads: default {mi['default_threads']} (physical cores {mi['physical_cores']} "
              f"in allowed CPUs {mi['allowed_cpus']}), NUMA nodes {mi['numa_nodes']}")
    return 0
