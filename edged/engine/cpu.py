"""The compiled CPU backend (default): binds the validated Spec and the mapped weights to the C
forward pass in edged._core (cython_kernels/forward/forward.pxi). Weights are passed as zero-copy views
of the read-only mapping (or, for the matrices the kernel path reads in another layout, of one
repacked arena: engine/repack.py); norm/bias vectors are converted once to float32. Each session gets
one 64-byte aligned arena (KV cache in F16 or the chosen kvcache type, activations, quantized
activations, logits).
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from .arch import LayerTensors, VECTOR_TYPES
from . import gemma4, repack
from .backend import Backend, BufferPlan
from .kvcache import DEFAULT as DEFAULT_CACHE
from .recurrent import N_CHECKPOINTS, RecurrentState
from .reference import rms_norm
from .threads import address_ranges, memory_policy, pin_workers, place_memory, read_topology
from ..errors import UnsupportedModelError
from ..format.gguf import GGMLType, TYPE_INFO
from ..format.quants import dequantize
from ..text.sampling import Sampler, SamplingParams

try:
    from .. import _core
except ImportError as e:  # the service must not fall back silently to the reference path
    _core = None
    _IMPORT_ERROR = e

# a layer's tensor roles: LayerTensors's fields, the C layer's by name (forward.h ED_LAYER_TENSORS)
_ROLES = tuple(f.name for f in dataclasses.fields(LayerTensors))
# gemma3n: the roles of gemma3n.LayerTensors' fields (gemma3n.h)
_G3N_ROLES = {"per_layer_inp_gate": "inp_gate", "per_layer_proj": "proj",
              "per_layer_post_norm": "post_norm",
              **{r: r for r in ("altup_router", "altup_router_norm", "altup_predict_coef",
                                "altup_correct_coef", "altup_correct_scale", "laurel_l",
                                "laurel_r", "laurel_post_norm")}}


def _require_core():
    if _core is None:
        raise UnsupportedModelError(
            f"the compiled core edged._core is not built ({_IMPORT_ERROR}); run `python setup.py "
            "build_ext --inplace` or select EDGED_BACKEND=reference explicitly")
    return _core


class _Buffers:
    def __init__(self, state):
        self.state = state
        self.inp = state.input_rows()  # (n_batch, n_embd) float32 view into the arena
        live = state.recurrent_state()  # the recurrent layers' state in the arena
        self.recurrent = RecurrentState(live) if live.size else None


class CPUBackend(Backend):
    name = "cpu"

    @property
    def kernel_path(self):
        return _core.kernel_path()  # generic, avx2, avx512 or neon ($EDGED_KERNELS), as `edged info`

    @property
    def kernel_variant(self):
        return _core.kernel_variant()

    @property
    def gemm_min_cols(self):
        """Tokens from which a matrix product uses packed panels on this path (the scheduler
        sizes prompt chunks around it)."""
        return _core.gemm_min_cols()

    @classmethod
    def expert_repack_bytes(cls, spec):
        """The expert tensors the path's kernels read repacked (x86: every R4 type whose experts'
        rows are whole groups), when Model lets every expert be resident."""
        return repack.expert_bytes(_require_core(), spec, repack.mode_from_env())

    def __init__(self, spec, weights, n_threads=1, numa="none", cache=DEFAULT_CACHE,
                 resident_experts=False):
        super().__init__(spec, weights, n_threads, numa, cache, resident_experts)
        cache.check(spec.hp.head_dim_layers or spec.hp.head_dim)
        core = _require_core()
        core.check_fields(spec.hp, _ROLES)  # the C model takes both by name: a mismatch fails the load
        self._dequantize = dequantize
        supported = set(core.supported_types())
        hp = spec.hp

        def matrix(name):
            if name is None:
                return None
            t = spec.tensors[name]
            if int(t.type) not in supported:
                raise UnsupportedModelError(f"tensor {name!r}: type {t.type.name} has no kernel")
            shape = tuple(int(x) for x in t.shape)
            info = TYPE_INFO[t.type]
            row_bytes = shape[0] // info.block_size * info.type_size
            return (np.asarray(weights[name]).reshape(-1), int(t.type), shape, row_bytes)

        self._vectors = {}

        def vector(name):
            if name is None:
                return None
            t = spec.tensors[name]
            shape = tuple(int(x) for x in t.shape)
            v = np.ascontiguousarray(
                dequantize(np.asarray(weights[name]), t.type, shape), dtype=np.float32).reshape(-1)
            self._vectors[name] = v
            return (v.view(np.uint8), int(GGMLType.F32), shape, 4 * shape[0])

        def tensor(role, name):
            return (vector(name) if role.endswith(("norm", "norm_1", "norm_2", "bias", "sinks",
                                                   "conv", "scale"))
                    or role in ("ssm_conv1d", "ssm_conv1d_b", "ssm_dt", "ssm_a", "ssm_d")
                    else matrix(name))

        g3n = spec.gemma3n
        layers = []
        conv_slots = iter(range(1, hp.n_conv_layers + 1))
        recr_slots = iter(range(1, hp.n_recr_layers + 1))
        for il, L in enumerate(spec.layers):
            d = {"swa": int(hp.swa_layers[il]), "rope": int(hp.rope_layers[il]),
                 "conv": next(conv_slots) if hp.conv_layers and hp.conv_layers[il] else 0,
                 "recr": next(recr_slots) if hp.recr_layers and hp.recr_layers[il] else 0}
            if hp.head_dim_layers:  # gemma4: the layer's own sizes, KV source, rope factors
                d.update(zip(("head_dim", "n_head_kv", "n_rot", "n_ff"), hp.layer_dims(il)),
                         kv_src=hp.kv_layers[il], rope_ff=int(not hp.swa_layers[il]))
            for role in _ROLES:
                d[role] = tensor(role, getattr(L, role))
            if g3n:  # AltUp, LAuReL, per-layer inputs, the FFN gate's cut, shared KV layers
                G = g3n.layers[il]
                d.update({role: tensor(role, getattr(G, f)) for role, f in _G3N_ROLES.items()},
                         sparsity=g3n.params.sparsity[il], kv_src=hp.kv_layers[il])
            layers.append(d)
        self._factors_ctx = {}
        g = {"token_embd": matrix(spec.token_embd), "output_norm": vector(spec.output_norm),
             "output": matrix(spec.output), "rope_factors": None}
        ple = spec.per_layer_inputs
        if g3n:  # the same three tensors under gemma3n's names, and AltUp's projections
            ple = gemma4.PerLayerInputs(token_embd=g3n.per_layer_token_embd,
                                        model_proj=g3n.per_layer_model_proj,
                                        proj_norm=g3n.per_layer_proj_norm)
            g.update(altup_proj=matrix(g3n.altup_proj),
                     altup_unembd_proj=matrix(g3n.altup_unembd_proj))
        self._ple_bytes = None
        if ple:  # gemma4, gemma3n: the per-layer inputs' projection and norm; their rows below
            g.update(per_layer_model_proj=matrix(ple.model_proj),
                     per_layer_proj_norm=vector(ple.proj_norm))
            self._ple_type = int(spec.tensors[ple.token_embd].type)
            self._ple_bytes = np.asarray(weights[ple.token_embd]).reshape(-1)
        # the matrices the path's kernels read in another layout: copied once, mapping released
        self.repacked = repack.apply(core, spec, layers, g, repack.mode_from_env(),
                                     experts=resident_experts)
        self._layers, self._globals = layers, g
        self._models = {}  # rope-factor choice -> ForwardModel (phi3 long/short by n_ctx)
        self._embd_type = int(spec.tensors[spec.token_embd].type)
        self._embd_bytes = np.asarray(weights[spec.token_embd]).reshape(-1)  # (n_vocab * row_bytes,)
        self.pool = core.Pool(self.n_threads)  # one task at a time: Model.decode holds the lock
        self.n_threads = self.pool.n_threads
        topo = read_topology()
        self.pinned_cpus = pin_workers(self.pool, numa, topo)  # inside sched_getaffinity's set
        # memory on the nodes the policy names: the weights now, each session's arena in alloc()
        self.memory_policy = memory_policy(topo, numa, (self.pinned_cpus or [None])[0])
        self.memory_placed = place_memory(
            self.memory_policy,
            address_ranges([np.asarray(w) for w in weights.values()] + self.repacked.arrays),
            "weights")

    def _model_for(self, n_ctx):
        name = self.spec.rope_factors(n_ctx)
        fm = self._models.get(name)
        if fm is None:
            fm = _core.ForwardModel()
            g = dict(self._globals)
            if name:
                t = self.spec.tensors[name]
                g["rope_factors"] = np.ascontiguousarray(self._dequantize(
                    np.asarray(self.weights[name]), t.type, tuple(int(x) for x in t.shape)),
                    dtype=np.float32).reshape(-1)
            fm.setup(self.spec.hp, self._layers, g)  # the hyperparameters by name (HParams)
            self._models[name] = fm
        return fm

    @classmethod
    def plan_for(cls, spec, n_ctx, n_batch, cache=DEFAULT_CACHE, n_threads=4):
        hp = spec.hp
        E, F, Qd, KVd = hp.n_embd, hp.n_ff, hp.n_embd_q, hp.n_embd_k_gqa
        kv = cache.nbytes(hp, n_ctx)
        F = max(F, hp.n_ff_exp, hp.n_ff_shexp)
        widest = max(E, Qd, F)
        Vd = hp.ssm_d_inner   # a recurrent layer's output
        widest = max(widest, Vd)
        # q (| gate) | k | v, a convolution's B|C|x, or a recurrent row (DeltaNet: q|k|v, z,
        # beta, alpha, the convolution's output; Mamba-2 fits); the gates of gated attention
        qkv = max((2 if hp.attn_gated_q else 1) * Qd + 2 * KVd, 3 * E if hp.n_conv_layers else 0,
                  2 * hp.ssm_conv_dim + Vd + 2 * hp.ssm_dt_rank if hp.n_recr_layers else 0)
        qkv += Qd if hp.attn_gated_q else 0
        per_tok = 4 * (E + max(E, Qd, Vd) + E + qkv + 2 * F) + 4 * widest + 16
        if hp.n_expert:  # router probabilities, choices, gathered inputs, expert outputs
            per_tok += 4 * (hp.n_expert + 4 * hp.n_expert_used + E + hp.n_expert_used * E)
        logits = 4 * min(n_batch, 32) * hp.n_vocab  # ED_MAX_LOGIT_ROWS rows
        per_tok += 40  # the row's position, context, cache and state pointers (a batch of sessions)
        per_tok += 8 * hp.n_layer * hp.n_embd_per_layer  # gemma4's per-layer inputs, projected
        if hp.n_altup:  # gemma3n's streams, LAuReL row, router outputs and coefficients
            per_tok += 4 * (hp.n_altup * E + E + hp.n_altup * (hp.n_altup + 1))
        # attention scratch per thread: every key's score for a block of 32 query rows
        # (ed_attn_ws_floats), the queries, the lane rows of the V sums
        att = 4 * (32 * (n_ctx + 32 + hp.head_dim) + 4 * hp.head_dim + 80 * hp.head_dim + 64)
        scratch = n_batch * per_tok + logits + n_threads * att + 64 * 18
        return BufferPlan(kv, scratch)

    def plan(self, n_ctx, n_batch):
        kv = self.cache.nbytes(self.spec.hp, n_ctx)
        total = self._model_for(n_ctx).arena_bytes(n_ctx, n_batch, self.n_threads,
                                                   int(self.cache.k), int(self.cache.v))
        # kv counts a recurrent state's checkpoints, which live outside the arena
        return BufferPlan(kv, total + N_CHECKPOINTS * 4 * self.spec.hp.recurrent_state_floats() - kv)

    def alloc(self, n_ctx, n_batch):
        state = _core.ForwardState(self._model_for(n_ctx), self.pool, n_ctx, n_batch,
                                   int(self.cache.k), int(self.cache.v))
        if self.memory_policy is not None:
            place_memory(self.memory_policy, [(state.address, state.address + state.nbytes)],
                         "session arena")
        return _Buffers(state)

    def free(self, buf):
        pass  # the arena goes with the ForwardState object

    def max_logit_rows(self, buf):
        return buf.state.max_logit_rows

    def copy_in(self, buf, tokens, pos, rows=None):
        toks = np.asarray(tokens, dtype=np.int64)
        inp = buf.inp[:len(toks)]  # (n, n_embd) float32: the embedding lookup, compiled
        _core.dequantize_rows(inp, self._embd_bytes, self._embd_type, toks)
        if self.spec.hp.embd_scale != 1.0:
            inp *= np.float32(self.spec.hp.embd_scale)
        if self._ple_bytes is not None:  # (n, n_layer * P): scaled and combined in the pass
            _core.dequantize_rows(buf.state.ple_rows()[:len(toks)], self._ple_bytes,
                                  self._ple_type, toks)
        if rows is not None:
            inp[rows[0]] = rows[1]

    def set_noncausal(self, buf, lo, hi):
        buf.state.set_noncausal(lo, hi)

    def forward(self, buf, n_tokens, pos, all_logits, all_rows=False):
        buf.state.forward(n_tokens, pos, all_logits, all_rows)

    def copy_out(self, buf, n_rows):
        return np.array(buf.state.logits(n_rows))

    def hidden_rows(self, buf, n_rows):
        # the compiled pass leaves every row's residual stream in the input rows (all_rows)
        x = buf.inp[:n_rows].astype(np.float64)
        return rms_norm(x, self._vectors[self.spec.output_norm],
                        self.spec.hp.rms_eps).astype(np.float32)

    def decode_rows(self, bufs, tokens, positions, out_rows=None):
        """All rows in one compiled pass: the matrix products are shared (one read of the
        weights for every session), attention runs per row against its own cache. The
        scratch of the session with the longest context is lent to the batch."""
        n = len(bufs)
        n_out = n if out_rows is None else len(out_rows)
        lead = max(bufs, key=lambda b: (b.state.n_ctx, b.state.n_batch))
        if (n == 1 or lead.state.n_batch < n or lead.state.max_logit_rows < n_out
                or max(positions) >= lead.state.n_ctx
                or any(b.state.model is not lead.state.model for b in bufs)):
            return super().decode_rows(bufs, tokens, positions, out_rows)
        self.copy_in(lead, tokens, 0)
        lead.state.forward_rows([b.state for b in bufs], list(positions), out_rows)
        if n_out == 0:  # prompt chunks whose logits nobody wants (no zero-row view)
            return np.empty((0, self.spec.hp.n_vocab), np.float32)
        return np.array(lead.state.logits(n_out))

    @property
    def code_files(self):
        return (_core.__file__,)

    def kv_cache(self, buf):
        return buf.state.kv_cache()

    def kv_layers(self, buf):
        return buf.state.kv_layers()

    def conv_cache(self, buf):
        return buf.state.conv_cache()

    def copy_kv(self, dst, src, n):
        for d, s in zip(dst.state.kv_layers(), src.state.kv_layers()):
            d[0][:n], d[1][:n] = s[0][:n], s[1][:n]  # (n_ctx, row bytes): the first n positions
        dst.state.conv_cache()[:, :n] = src.state.conv_cache()[:, :n]
        if src.recurrent:
            dst.recurrent.copy_from(src.recurrent)

    def recurrent(self, buf):
        return buf.recurrent

    def profile(self, n_prompt=512):
        """Time per op kind for one prompt batch and for one token after it (ms)."""
        n_prompt = max(1, n_prompt)
        buf = self.alloc(n_prompt + 8, n_prompt)
        rng = np.random.default_rng(0)
        out = {}
        for label, n, pos in ((f"prompt batch of {n_prompt}", n_prompt, 0),
                              (f"one token at position {n_prompt}", 1, n_prompt)):
            toks = rng.integers(0, self.spec.hp.n_vocab, n).tolist()
            buf.state.set_profile(True)
            t0 = time.perf_counter()
            self.copy_in(buf, toks, pos)
            self.forward(buf, n, pos, False)
            logits = self.copy_out(buf, 1)
            wall = (time.perf_counter() - t0) * 1000
            buf.state.set_profile(False)
            ops = {}
            for k, v in buf.state.profile().items():
                if k.startswith("matmul type "):
                    k = "matmul " + GGMLType(int(k.rsplit(" ", 1)[1])).name
                ops[k] = v
            sampler = Sampler(self.spec.hp.n_vocab, SamplingParams(temperature=0.8, top_k=40,
                                                                   top_p=0.95, min_p=0.05, seed=0))
            t1 = time.perf_counter()
            sampler.sample(logits[0])
            ops["sampling"] = (time.perf_counter() - t1) * 1000
            ops["python + embedding lookup"] = max(0.0, wall - sum(v for k, v in ops.items()
                                                                   if k != "sampling"))
            out[label] = ops
        return out

    def close(self):
        self._models.clear()
        self.pool = None
