# The compiled forward pass (included from core.pyx). C in forward.h / ed_types.h; this file
# binds a validated model (arch.Spec + mapped weights) to the C structs and runs one batch per
# call with the GIL released: no Python per layer or per op.
from libc.stdint cimport uint8_t, uint16_t, int32_t, int64_t, uintptr_t
from libc.stdlib cimport calloc, free

cdef extern from "stdlib.h" nogil:
    int posix_memalign(void **memptr, size_t alignment, size_t size)
from libc.string cimport memcpy, memset

cdef extern from "forward.h" nogil:
    enum: ED_NTYPES       # the type tables' size (ed_types.h)
    ctypedef struct ed_tensor:
        const uint8_t *data
        int type
        int64_t ne0, ne1
        size_t row_bytes
        int layout
    ctypedef struct ed_layer:
        # the tensors are set by name (ED_LAYER_ROLES)
        ed_tensor attn_sinks
        int swa
        int rope
        int conv
        int recr
        int head_dim, n_head_kv, n_rot, n_ff, kv_src, rope_ff
        int kv
        float sparsity
    ctypedef struct ed_layer_role:
        const char *name
        size_t offset
    const ed_layer_role ED_LAYER_ROLES[]
    ctypedef struct ed_model:
        # the hyperparameters are set by name (ED_HPARAM_LIST); declared here: those Cython reads
        int n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_rot, n_swa
        int n_expert, n_expert_used, n_conv_layers
        int n_recr_layers, ssm_d_conv, ssm_d_state, ssm_n_group, ssm_dt_rank, ssm_d_inner
        int n_embd_per_layer, n_ff, n_altup
        float attn_scale
        ed_tensor token_embd, output_norm, output
        ed_tensor per_layer_model_proj, per_layer_proj_norm
        ed_tensor altup_proj, altup_unembd_proj
        const float *rope_factors
        ed_layer *layers
    ctypedef struct ed_hparam:
        const char *name
        int is_float
        size_t offset
    const ed_hparam ED_HPARAM_LIST[]
    ctypedef struct ed_pool:
        int n_threads, n_active, adapt, n_dropped, probing, slow_worker
        int *claimed
        double late_share, late_ewma, last_share, last_lost
        long n_drops, n_probes, n_retakes, n_probe_skips
        double last_free, free_override
        int64_t slow_ns, spin_ns, idle_spin_ns
        long long n_waits, n_parks, park_ns, n_nudges
        long long wake_hist[16]
    ctypedef struct ed_state:
        const ed_model *m
        int n_ctx, n_batch, n_tokens, pos
        int type_k, type_v
        size_t k_row, v_row
        uint8_t *k_cache
        uint8_t *v_cache
        float *conv_cache
        float *rstate
        float *ple
        size_t *kv_off
        float *x
        float *xb
        float *qkv
        float *att
        size_t att_stride
        uint16_t *qh
        float *vacc
        float *logits
        int32_t *tokens
        int nc_lo, nc_hi
        int profile
        double prof_ns[7]
        double prof_mm[ED_NTYPES]
    ed_pool *ed_pool_create(int n_threads)
    void ed_pool_destroy(ed_pool *p)
    void ed_pool_set_adapt(ed_pool *p, int on)
    int ed_pool_active(const ed_pool *p)
    int ed_nudge(ed_pool *p)
    double ed_free_cpus(ed_pool *p, int64_t now)
    int64_t ed_clock_ns()
    int sched_getcpu()
    size_t ed_state_layout(ed_state *s, const ed_model *m, int n_ctx, int n_batch, int n_threads,
                           int type_k, int type_v, uint8_t *arena)
    int ed_kv_type_ok(int type)
    int ed_n_kv_layers(const ed_model *m)
    void ed_forward(ed_state *s, ed_pool *p, int n_tokens, int pos, int all_logits, int all_rows)
    void ed_forward_rows(ed_state *s, ed_pool *p, int n, ed_state **rows, const int *pos,
                         int n_out, const int *out)
    void ed_forward_init()
    int ED_MAX_LOGIT_ROWS
    int ED_MAX_EXPERT
    int ed_types_init(const char *want)
    const char *ED_PATH
    ctypedef struct ed_traits:
        int block, type_size, vec_type
        void *ref
    ed_traits ED_TRAITS[ED_NTYPES]

import os as _os


def select_kernels(str name=None):
    """Choose the dot-product path: None/"auto" (best this CPU has), "generic", "avx2", "avx512", "neon",
    or a family less a feature ("avx2-vnni", "avx512-vnni", "neon-dotprod": the table a CPU
    without it runs). Called at import with $EDGED_KERNELS; tests call it to run every path."""
    cdef bytes b = (name or "auto").encode()
    if ed_types_init(b) != 0:
        from edged.errors import ConfigError
        raise ConfigError(f"EDGED_KERNELS={name!r}: unknown or not supported on this CPU "
                          f"(generic, avx2, avx512, neon, auto, avx2-vnni, avx512-vnni, neon-dotprod; "
                          f"`edged info` lists this CPU's)")
    return ED_PATH.decode()

ed_forward_init()  # llama.cpp's tables the forward pass mirrors (ed_parity.h)

select_kernels(_os.environ.get("EDGED_KERNELS") or None)


def kernel_path():
    """The dot-product path chosen at start-up (generic, avx2, ...)."""
    return ED_PATH.decode()


def supported_types():
    return [t for t in range(ED_NTYPES) if ED_TRAITS[t].ref != NULL]


def hparam_names():
    """The hyperparameters the compiled forward pass reads (forward.h ED_HPARAMS), in order: each
    a field of edged.engine.arch.HParams by that name."""
    cdef const ed_hparam *f = ED_HPARAM_LIST
    out = []
    while f.name != NULL:
        out.append(f.name.decode())
        f += 1
    return out


def layer_roles():
    """A layer's tensor roles the compiled forward pass reads (forward.h ED_LAYER_TENSORS), in
    order: each a field of edged.engine.arch.LayerTensors by that name."""
    cdef const ed_layer_role *r = ED_LAYER_ROLES
    out = []
    while r.name != NULL:
        out.append(r.name.decode())
        r += 1
    return out


cdef dict _ROLE_OFFSET = {}
cdef const ed_layer_role *_r = ED_LAYER_ROLES
while _r.name != NULL:
    _ROLE_OFFSET[_r.name.decode()] = _r.offset
    _r += 1


cdef int _check_roles(roles, where) except -1:
    if roles != _ROLE_OFFSET.keys():
        raise TypeError(f"{where}tensor roles {sorted(set(roles) ^ _ROLE_OFFSET.keys())} are not in both "
                        "the layer and the compiled pass's list (forward.h ED_LAYER_TENSORS)")
    return 0


def check_fields(hp, roles):
    """What ForwardModel.setup checks, before anything is built: TypeError naming the field
    unless hp (HParams) has every field of ED_HPARAMS and no other one not marked
    {"compiled": False}, and `roles` are the layer roles of ED_LAYER_TENSORS."""
    cdef ed_model m
    _set_hparams(&m, hp)
    _check_roles(set(roles), "")


cdef int _set_hparams(ed_model *m, hp) except -1:
    # Every ED_HPARAMS field from the attribute of the same name; an HParams dataclass field that
    # the list lacks fails too, unless its metadata says {"compiled": False} (per-layer tables,
    # values only the Python side reads).
    import dataclasses
    cdef const ed_hparam *f = ED_HPARAM_LIST
    cdef char *base = <char *>m
    names = set()
    while f.name != NULL:
        name = f.name.decode()
        names.add(name)
        if not hasattr(hp, name):
            raise TypeError(f"hyperparameter {name!r}: the compiled forward pass reads it "
                            f"(forward.h ED_HPARAMS) but {type(hp).__name__} has no such field")
        v = getattr(hp, name)
        if f.is_float:
            (<float *>(base + f.offset))[0] = v
        else:
            (<int *>(base + f.offset))[0] = v
        f += 1
    if dataclasses.is_dataclass(hp):
        unread = [x.name for x in dataclasses.fields(hp)
                  if x.name not in names and x.metadata.get("compiled", True)]
        if unread:
            raise TypeError(f"hyperparameters {', '.join(unread)} of {type(hp).__name__}: not read by "
                            "the compiled forward pass; add them to ED_HPARAMS (forward.h), or mark "
                            "them field(metadata={'compiled': False})")
    return 0


cdef class Pool:
    """The persistent worker threads; the calling thread is worker 0 (ed_threads.h).

    adapt: drop workers that keep arriving late and take them back when the machine quiets
    (None: on unless $EDGED_ADAPT_THREADS is "0"). Results are the same either way."""
    cdef ed_pool *p

    def __cinit__(self, int n_threads, adapt=None):
        self.p = ed_pool_create(n_threads)
        if self.p == NULL:
            raise MemoryError("thread pool")
        if adapt is None:
            adapt = _os.environ.get("EDGED_ADAPT_THREADS", "1") != "0"
        ed_pool_set_adapt(self.p, 1 if adapt else 0)

    @property
    def n_threads(self):
        """Workers created (the caller included): the most a task runs on."""
        return self.p.n_threads

    @property
    def active_threads(self):
        """Threads the next task runs on (fewer than n_threads while workers are dropped)."""
        return ed_pool_active(self.p)

    @property
    def adaptive(self):
        return bool(self.p.adapt)

    @adaptive.setter
    def adaptive(self, on):
        """Off takes every dropped worker back."""
        ed_pool_set_adapt(self.p, 1 if on else 0)

    @property
    def late_share(self):
        """The share of a task's wall time spent waiting for late threads (or of its threads'
        CPU time lost while on it, whichever is larger) that drops a worker (and under which a
        probe keeps it); None: 1/n for n threads, where n - 1 threads become faster."""
        return self.p.late_share or None

    @late_share.setter
    def late_share(self, share):
        if share is not None and not 0.0 < share <= 1.0:
            raise ValueError(f"late_share {share}: expected 0 < share <= 1, or None")
        self.p.late_share = share or 0.0

    def stats(self):
        """The adaptive thread count's record, the chunks each worker took in the last task, and
        the waiting inside tasks since the pool started: waits, how many of them parked on the
        futex and for how long in all, and a histogram of how long a parked waiter took to run
        again after its release (wake_us_hist[b]: [2^(b-1), 2^b) microseconds; [0]: < 1 us)."""
        return {"n_threads": self.p.n_threads, "active": ed_pool_active(self.p),
                "last_task_threads": self.p.n_active, "drops": self.p.n_drops,
                "probes": self.p.n_probes, "retakes": self.p.n_retakes,
                "probe_skips": self.p.n_probe_skips,
                "free_cpus": self.p.last_free if self.p.last_free >= 0 else None,
                "late_share": self.p.last_share, "lost_share": self.p.last_lost,
                "claimed": [self.p.claimed[i] for i in range(self.p.n_threads)],
                "spin_us": self.p.spin_ns / 1000, "idle_spin_us": self.p.idle_spin_ns / 1000,
                "waits": self.p.n_waits, "parks": self.p.n_parks, "park_ms": self.p.park_ns / 1e6,
                "nudges": self.p.n_nudges,
                "wake_us_hist": [self.p.wake_hist[i] for i in range(16)]}

    def debug_nudge(self):
        """Tests: move the calling thread off its CPU as a waiter that finds another thread of
        the pool on its CPU does (ed_threads.h, ed_nudge); returns (CPU before, CPU after,
        moved). Its CPU affinity is the same afterwards."""
        cdef int before = sched_getcpu()
        cdef int moved = ed_nudge(self.p)
        return before, sched_getcpu(), bool(moved)

    def free_cpus(self):
        """CPUs of this process's set that were idle on average since the last call (or the
        last look of the adaptive count), from /proc/stat; None on the first call or when it
        cannot be read. A dropped worker is probed only when this is at least 0.5."""
        cdef double free = ed_free_cpus(self.p, ed_clock_ns())
        return free if free >= 0 else None

    def debug_free_cpus(self, free):
        """Tests: the adaptive count sees `free` idle CPUs at every look (None: /proc/stat)."""
        self.p.free_override = -1.0 if free is None else float(free)

    def debug_slow(self, int worker, double usec):
        """Tests: worker `worker` (0 = the caller) sleeps `usec` before each chunk it claims,
        so the others take most chunks; usec 0 ends it."""
        if not 0 <= worker < self.p.n_threads:
            raise ValueError(f"worker {worker}: the pool has {self.p.n_threads}")
        self.p.slow_worker = worker
        self.p.slow_ns = <int64_t>(usec * 1000)

    def __dealloc__(self):
        if self.p != NULL:
            ed_pool_destroy(self.p)
            self.p = NULL


# a layer dict's keys that are not tensor roles (ForwardModel.setup)
_LAYER_KEYS = frozenset({"swa", "rope", "conv", "recr", "head_dim", "n_head_kv", "n_rot", "n_ff",
                         "kv_src", "rope_ff", "sparsity"})


cdef class ForwardModel:
    """C view of a validated model. Holds references to every array it points into."""
    cdef ed_model m
    cdef ed_layer *layers
    cdef list keep

    def __cinit__(self):
        self.layers = NULL
        self.keep = []

    def __dealloc__(self):
        free(self.layers)

    cdef void _set(self, ed_tensor *t, tuple spec) except *:
        cdef const uint8_t[::1] view
        if spec is None:
            memset(t, 0, sizeof(ed_tensor))
            return
        arr, gtype, shape, row_bytes = spec[:4]
        view = arr
        self.keep.append(arr)
        t.data = &view[0]
        t.type = gtype
        t.ne0 = shape[0]
        t.ne1 = shape[1] if len(shape) > 1 else 1
        t.row_bytes = row_bytes
        t.layout = spec[4] if len(spec) > 4 else 0  # ED_LAYOUT_R4: repacked at load (engine/repack.py)

    def setup(self, hp, list layers, dict globals_):
        """hp: the model's hyperparameters (HParams: every ED_HPARAMS name read from it by name);
        layers: per layer a dict role -> (uint8 array, type, shape, row_bytes[, layout]) or None,
        plus 'swa', 'rope', 'conv' (1 + the layer's slot in the convolution cache, 0 for
        attention) and 'recr' (1 + its slot in the recurrent state: a DeltaNet layer); the other
        layers get the K/V cache's slots in order; optionally the layer's own sizes 'head_dim',
        'n_head_kv', 'n_rot', 'n_ff' (default: the model's), 'kv_src' (the layer whose KV cache
        it reads; default itself), 'rope_ff' (the rope factors apply; default 1) and
        'sparsity' (gemma3n's FFN gate cut; default 0: none);
        globals_: token_embd/output_norm/output/rope, gemma4's and gemma3n's
        per_layer_model_proj/per_layer_proj_norm, gemma3n's altup_proj/altup_unembd_proj."""
        cdef int i, n_kv = 0
        m = &self.m
        _set_hparams(m, hp)
        if m.head_dim > 1024 or m.n_rot > 1024:
            raise ValueError(f"head_dim {m.head_dim} > 1024 not supported by the compiled path")
        if m.n_expert > ED_MAX_EXPERT or m.n_expert_used > m.n_expert:
            raise ValueError(f"{m.n_expert_used} of {m.n_expert} experts: at most "
                             f"{ED_MAX_EXPERT} experts supported by the compiled path")
        self.layers = <ed_layer *>calloc(m.n_layer, sizeof(ed_layer))
        if self.layers == NULL:
            raise MemoryError()
        m.layers = self.layers
        for name in ("token_embd", "output_norm", "output"):
            g = globals_[name]
            if name == "token_embd":
                self._set(&m.token_embd, g)
            elif name == "output_norm":
                self._set(&m.output_norm, g)
            else:
                self._set(&m.output, g)
        self._set(&m.per_layer_model_proj, globals_.get("per_layer_model_proj"))
        self._set(&m.per_layer_proj_norm, globals_.get("per_layer_proj_norm"))
        self._set(&m.altup_proj, globals_.get("altup_proj"))  # gemma3n
        self._set(&m.altup_unembd_proj, globals_.get("altup_unembd_proj"))
        cdef const float[::1] rf
        if globals_.get("rope_factors") is not None:
            rf = globals_["rope_factors"]
            self.keep.append(globals_["rope_factors"])
            m.rope_factors = &rf[0]
        else:
            m.rope_factors = NULL
        for i, L in enumerate(layers):
            l = &self.layers[i]
            l.swa = L["swa"]
            l.rope = L.get("rope", 1)
            l.conv = L.get("conv", 0)
            if not 0 <= l.conv <= m.n_conv_layers:
                raise ValueError(f"layer {i}: convolution slot {l.conv - 1} of {m.n_conv_layers}")
            l.recr = L.get("recr", 0)
            if not 0 <= l.recr <= m.n_recr_layers:
                raise ValueError(f"layer {i}: recurrent slot {l.recr - 1} of {m.n_recr_layers}")
            if not l.conv and not l.recr:  # the K/V cache holds the attention layers only
                n_kv += 1
                l.kv = n_kv
            l.head_dim, l.n_head_kv = L.get("head_dim", m.head_dim), L.get("n_head_kv", m.n_head_kv)
            l.n_rot, l.n_ff = L.get("n_rot", m.n_rot), L.get("n_ff", m.n_ff)
            l.kv_src, l.rope_ff = L.get("kv_src", i), L.get("rope_ff", 1)
            l.sparsity = L.get("sparsity", 0.0)
            if not (0 < l.head_dim <= m.head_dim and 0 < l.n_head_kv <= m.n_head_kv
                    and m.n_head % l.n_head_kv == 0 and 0 <= l.n_rot <= min(l.head_dim, m.n_rot)
                    and 0 <= l.n_ff <= m.n_ff):
                raise ValueError(f"layer {i}: head_dim {l.head_dim}, n_head_kv {l.n_head_kv}, "
                                 f"n_rot {l.n_rot}, n_ff {l.n_ff} outside the model's largest")
            if not 0 <= l.kv_src <= i or (l.kv_src < i and (
                    not l.kv or not self.layers[l.kv_src].kv or self.layers[l.kv_src].kv_src != l.kv_src
                    or self.layers[l.kv_src].head_dim != l.head_dim)):
                raise ValueError(f"layer {i}: KV source layer {l.kv_src} is not an earlier "
                                 "attention layer with its own cache and the same head size")
            _check_roles(set(L) - _LAYER_KEYS, f"layer {i}: ")
            for role, spec in L.items():
                if role in _LAYER_KEYS or spec is None:
                    continue
                self._set(<ed_tensor *>(<char *>l + <size_t>_ROLE_OFFSET[role]), spec)
        if m.n_embd_per_layer and (m.per_layer_model_proj.data == NULL or m.per_layer_proj_norm.data == NULL):
            raise ValueError("n_embd_per_layer without per_layer_model_proj / per_layer_proj_norm")
        if m.n_altup and (m.n_altup > 8 or not m.n_embd_per_layer or m.altup_proj.data == NULL
                          or m.altup_unembd_proj.data == NULL):
            raise ValueError(f"n_altup {m.n_altup}: at most 8 streams (gemma3n.h), with per-layer "
                             "inputs, altup_proj and altup_unembd_proj")
        if len(layers) == m.n_layer and n_kv != ed_n_kv_layers(m):
            raise ValueError(f"{n_kv} attention layers, but {m.n_layer} layers less "
                             f"{m.n_conv_layers} convolution and {m.n_recr_layers} recurrent ones")

    cdef void _check_cache(self, int type_k, int type_v) except *:
        for name, t in (("cache_type_k", type_k), ("cache_type_v", type_v)):
            if not 0 <= t < ED_NTYPES or not ed_kv_type_ok(t):
                raise ValueError(f"{name}: ggml type {t} is not a KV cache type (f16, q8_0, q4_0)")
            for i in range(self.m.n_layer):
                if t != 1 and self.m.layers[i].head_dim % ED_TRAITS[t].block:
                    raise ValueError(f"{name}: head_dim {self.m.layers[i].head_dim} is not a "
                                     f"multiple of the type's block of {ED_TRAITS[t].block}")

    def arena_bytes(self, int n_ctx, int n_batch, int n_threads, int type_k=1, int type_v=1):
        """Bytes of one session's arena; type_k/type_v: ggml type ids of the KV cache (1: f16)."""
        self._check_cache(type_k, type_v)
        return ed_state_layout(NULL, &self.m, n_ctx, n_batch, n_threads, type_k, type_v, NULL)


cdef class ForwardState:
    """One session's arena (KV cache, activations, scratch): one 64-byte aligned block."""
    cdef ed_state s
    cdef uint8_t *arena
    cdef readonly size_t nbytes
    cdef readonly ForwardModel model
    cdef Pool pool

    def __cinit__(self, ForwardModel model, Pool pool, int n_ctx, int n_batch, int type_k=1,
                  int type_v=1):
        cdef void *mem = NULL
        memset(&self.s, 0, sizeof(ed_state))
        self.model, self.pool = model, pool
        model._check_cache(type_k, type_v)
        self.nbytes = ed_state_layout(NULL, &model.m, n_ctx, n_batch, pool.p.n_threads, type_k,
                                      type_v, NULL)
        if posix_memalign(&mem, 64, self.nbytes) != 0:
            raise MemoryError(f"session arena of {self.nbytes} bytes")
        self.arena = <uint8_t *>mem
        memset(self.arena, 0, self.nbytes)
        ed_state_layout(&self.s, &model.m, n_ctx, n_batch, pool.p.n_threads, type_k, type_v,
                        self.arena)

    def __dealloc__(self):
        free(self.arena)
        self.arena = NULL

    @property
    def n_ctx(self):
        return self.s.n_ctx

    @property
    def n_batch(self):
        return self.s.n_batch

    @property
    def address(self):
        return <uintptr_t>self.arena

    def input_rows(self):
        """float32 (n_batch, n_embd) view of the input rows (embeddings go here)."""
        return np.asarray(<float[:self.s.n_batch, :self.model.m.n_embd]> self.s.x)

    def logits(self, int rows):
        return np.asarray(<float[:rows, :self.model.m.n_vocab]> self.s.logits)

    @property
    def cache_types(self):
        """(type_k, type_v): ggml type ids of the KV cache."""
        return self.s.type_k, self.s.type_v

    def kv_layers(self):
        """[(k, v)] uint8 views (n_ctx, bytes of the layer's row) of each layer that stores
        K/V, in layer order (a layer without attention, or attending over an earlier one's
        cache, has none)."""
        m = &self.model.m
        cdef size_t nc = self.s.n_ctx, kr, vr
        out = []
        for il in range(m.n_layer):
            if not m.layers[il].kv or m.layers[il].kv_src != il:
                continue
            d = m.layers[il].n_head_kv * m.layers[il].head_dim
            kr = d // ED_TRAITS[self.s.type_k].block * ED_TRAITS[self.s.type_k].type_size
            vr = d // ED_TRAITS[self.s.type_v].block * ED_TRAITS[self.s.type_v].type_size
            out.append((np.asarray(<uint8_t[:nc * kr]> (self.s.k_cache + nc * self.s.kv_off[il])).reshape(nc, kr),
                        np.asarray(<uint8_t[:nc * vr]> (self.s.v_cache + nc * self.s.kv_off[m.n_layer + il])).reshape(nc, vr)))
        return out

    def ple_rows(self):
        """float32 (n_batch, n_layer * n_embd_per_layer) view: the per-layer token embedding
        rows of the staged tokens go here (gemma4), empty without per-layer inputs."""
        m = &self.model.m
        if m.n_embd_per_layer == 0:
            return np.zeros((self.s.n_batch, 0), np.float32)
        return np.asarray(<float[:self.s.n_batch, :m.n_layer * m.n_embd_per_layer]> self.s.ple)

    def kv_cache(self):
        """(k, v) uint8 views (attention layers, n_ctx, bytes of a row) of the cache: a row is
        one position's n_head_kv * head_dim values as f16 or as q8_0/q4_0 blocks (cache_types).
        Only for a model whose attention layers' rows are alike (else kv_layers())."""
        m = &self.model.m
        for il in range(m.n_layer):
            l = &m.layers[il]
            if l.kv and (l.kv_src != il or l.head_dim != m.head_dim or l.n_head_kv != m.n_head_kv):
                raise ValueError("the layers' K/V rows differ in size; kv_layers() views them")
        cdef size_t L = ed_n_kv_layers(m)
        if L == 0:
            return (np.zeros((0, self.s.n_ctx, self.s.k_row), np.uint8),
                    np.zeros((0, self.s.n_ctx, self.s.v_row), np.uint8))
        k = np.asarray(<uint8_t[:L * self.s.n_ctx * self.s.k_row]> self.s.k_cache)
        v = np.asarray(<uint8_t[:L * self.s.n_ctx * self.s.v_row]> self.s.v_cache)
        return (k.reshape(L, self.s.n_ctx, self.s.k_row), v.reshape(L, self.s.n_ctx, self.s.v_row))

    def conv_cache(self):
        """uint8 view (n_conv_layers, n_ctx, 4 * n_embd) of the convolution layers' inputs
        (float32 B * x per position; lfm2), laid out per position like kv_cache()'s rows."""
        m = &self.model.m
        if m.n_conv_layers == 0:
            return np.zeros((0, self.s.n_ctx, 4 * m.n_embd), np.uint8)
        c = np.asarray(<uint8_t[:m.n_conv_layers * self.s.n_ctx * 4 * m.n_embd]> <uint8_t *>self.s.conv_cache)
        return c.reshape(m.n_conv_layers, self.s.n_ctx, 4 * m.n_embd)

    def recurrent_state(self):
        """float32 view of the recurrent layers' live state (qwen35, granitehybrid;
        edged/engine/recurrent.py has the layout), empty without such layers."""
        m = &self.model.m
        cdef size_t n = m.n_recr_layers * ((m.ssm_d_conv - 1) * (m.ssm_d_inner + 2 * m.ssm_n_group * m.ssm_d_state)
                                           + m.ssm_d_inner * m.ssm_d_state)
        if n == 0:
            return np.zeros(0, np.float32)
        return np.asarray(<float[:n]> self.s.rstate)

    def set_profile(self, bint on):
        """Start (and zero) or stop per-op timing by thread 0."""
        self.s.profile = on
        if on:
            memset(self.s.prof_ns, 0, sizeof(self.s.prof_ns))
            memset(self.s.prof_mm, 0, sizeof(self.s.prof_mm))

    def profile(self):
        """{op kind: ms} since set_profile(True): matmul by weight type id, attention, ..."""
        names = ("matmul", "quantize", "attention", "norms+residual", "bias/qk-norm/rope/kv-store",
                 "activation", "output matmul")
        out = {names[i]: self.s.prof_ns[i] / 1e6 for i in range(7) if self.s.prof_ns[i]}
        for t in range(ED_NTYPES):
            if self.s.prof_mm[t]:
                out[f"matmul type {t}"] = self.s.prof_mm[t] / 1e6
        return out

    @property
    def max_logit_rows(self):
        return min(self.s.n_batch, ED_MAX_LOGIT_ROWS)

    def set_noncausal(self, int lo, int hi):
        """Rows at positions lo..hi of the next forward() see every key up to hi (an image's
        rows, decoded non-causally as llama.cpp does for gemma3); hi < lo: all causal."""
        self.s.nc_lo = lo
        self.s.nc_hi = hi

    def forward(self, int n_tokens, int pos, bint all_logits, bint all_rows=False):
        """Run the staged rows at positions pos.. . The last layer runs only for the rows whose
        logits are wanted (the last, or all with all_logits) unless all_rows keeps every row's
        final residual in input_rows() (hidden states)."""
        if all_logits and n_tokens > min(self.s.n_batch, ED_MAX_LOGIT_ROWS):
            raise ValueError(f"all logits of {n_tokens} rows: at most {ED_MAX_LOGIT_ROWS} per call")
        if n_tokens < 1 or n_tokens > self.s.n_batch:
            raise ValueError(f"n_tokens {n_tokens} not in [1, {self.s.n_batch}]")
        if pos < 0 or pos + n_tokens > self.s.n_ctx:
            raise ValueError(f"positions [{pos}, {pos + n_tokens}) outside the context {self.s.n_ctx}")
        with nogil:
            ed_forward(&self.s, self.pool.p, n_tokens, pos, all_logits, all_rows)

    def forward_rows(self, list states, positions, out_rows=None):
        """One step of several sessions in one pass: row t (staged in this state's input rows)
        is a token at positions[t] of states[t]'s KV cache: the next token of sessions that
        decode and the rows of prompt chunks, mixed. This state lends its scratch and receives
        the logits of the rows out_rows (ascending; default every row) in that order; states
        may include it."""
        cdef int n = len(states), t, n_out
        cdef ForwardState st
        if n < 1 or n > self.s.n_batch:
            raise ValueError(f"{n} rows: between 1 and {self.s.n_batch} (n_batch) per call")
        if len(positions) != n:
            raise ValueError(f"{len(positions)} positions for {n} rows")
        outs = list(range(n)) if out_rows is None else [int(r) for r in out_rows]
        n_out = len(outs)
        if n_out > min(self.s.n_batch, ED_MAX_LOGIT_ROWS):
            raise ValueError(f"logits of {n_out} rows: at most {min(self.s.n_batch, ED_MAX_LOGIT_ROWS)} per call")
        if any(not 0 <= r < n for r in outs) or outs != sorted(set(outs)):
            raise ValueError(f"out_rows {outs}: ascending rows of the batch of {n}")
        rows_a = np.empty(n, np.uintp)
        pos_a = np.asarray(positions, np.int32)
        out_a = np.asarray(outs if outs else [0], np.int32)
        seen = set()
        for t in range(n):
            st = states[t]
            if st.model is not self.model:
                raise ValueError(f"row {t}: a session of another model")
            if st.s.type_k != self.s.type_k or st.s.type_v != self.s.type_v:
                raise ValueError(f"row {t}: a session of other KV cache types")
            if pos_a[t] < 0 or pos_a[t] >= st.s.n_ctx or pos_a[t] >= self.s.n_ctx:
                raise ValueError(f"row {t}: position {pos_a[t]} outside the context "
                                 f"{min(st.s.n_ctx, self.s.n_ctx)}")
            key = (id(st), int(pos_a[t]))
            if key in seen:
                raise ValueError(f"row {t}: position {pos_a[t]} of one session twice in the batch")
            seen.add(key)
            rows_a[t] = <size_t>&st.s
        cdef size_t[::1] rv = rows_a
        cdef int[::1] pv = pos_a
        cdef int[::1] ov = out_a
        with nogil:
            ed_forward_rows(&self.s, self.pool.p, n, <ed_state **>&rv[0], &pv[0], n_out, &ov[0])
