"""Architecture knowledge: a table per architecture plus one validation pass at load.

`validate(metadata, tensors, n_vocab_tokenizer)` turns a GGUF file's metadata and tensor table
into a `Spec` (hyperparameters + the tensor of every weight role), or raises
UnsupportedModelError naming the key, tensor, shape or type that is wrong. Nothing here reads
tensor data: the backends get a validated Spec and trust it.

An architecture whose layers the forward pass already computes is a table entry (`ARCHS`). One
with a new kind of layer also needs its feature flag below, its hyperparameters (`HParams`, read
in `hparams()`) and tensors (`LayerTensors`, found in `validate()`) under the same names in the
compiled pass's lists (ED_HPARAMS and ED_LAYER_TENSORS in cython_kernels/forward/forward.h: the
load fails naming a field that is on one side only), and the computation in forward.h and
reference.py; docs/development.md ("Adding an architecture") lists the files and tests.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import MetadataValueError, UnsupportedModelError
from ..format.gguf import GGMLType, Key, TYPE_INFO, check_number
from ..format.quants import SUPPORTED
from . import gemma3n, gemma4, granitehybrid

# Weight types the engine runs: the format layer's table of block layouts (edged.format.quants;
# the compiled kernels' list, core.supported_types(), is checked against it by the tests).
# Anything else fails the load by name.
SUPPORTED_TYPES = frozenset(SUPPORTED)
# Norm weights, biases and rope factors are read as float vectors.
VECTOR_TYPES = frozenset({GGMLType.F32, GGMLType.F16, GGMLType.BF16})

ROPE_NORM, ROPE_NEOX = 0, 2  # llama.cpp's rope modes: adjacent pairs vs. halves
# llama.cpp's LLAMA_MAX_LAYERS. A larger block_count is refused before anything is sized by
# it (a crafted 2**40 would otherwise build per-layer tables until memory runs out).
MAX_LAYERS = 512
MAX_EXPERTS = 512  # llama.cpp's LLAMA_MAX_EXPERTS; the compiled router's limit too


@dataclass(frozen=True)
class Arch:
    """What distinguishes one architecture's forward pass from plain llama."""
    name: str
    rope_type: int
    qkv_bias: bool = False        # optional attn_{q,k,v}.bias (qwen2)
    qk_norm: bool = False         # per-head RMSNorm of q and k before RoPE (qwen3, gemma3)
    fused_qkv: bool = False       # one attn_qkv matrix (phi3); separate q/k/v also accepted
    fused_gate_up: bool = False   # ffn_up holds [gate; up], 2*n_ff rows (phi3)
    sandwich_norm: bool = False   # post_attention_norm / post_ffw_norm (gemma3)
    embd_scale: bool = False      # embeddings * sqrt(n_embd) (gemma3)
    act: str = "silu"             # gate activation: "silu" or "gelu" (tanh approximation)
    swa_pattern: int = 0          # with a sliding window: every n-th layer is global (gemma3: 6)
    rope_factors: bool = False    # rope_factors_long/short (phi3 LongRoPE)
    rope_n_rot_must_equal_head: bool = False  # llama.cpp refuses n_rot != head_dim for llama
    scale_q: bool = False         # llama.cpp scales q by attn_scale before attention, not q.k
    softcap: bool = False         # tanh soft-capping of q.k (default 50) and logits (30) (gemma2)
    swa_rope_global: bool = False  # local layers keep the global RoPE base/scale by default
    multipliers: bool = False     # embedding/residual/attention/logit scales (granite)
    no_rope_step: int = 0         # every n-th layer skips RoPE (smollm3: 4)
    moe: bool = False             # routed experts: ffn_gate_inp + *_exps (qwen3moe)
    moe_norm_w: bool = False      # renormalise the top-k router weights (qwen3moe)
    shared_expert: bool = False   # one always-on expert *_shexp with a sigmoid gate (qwen2moe)
    # gpt-oss: softmax over the top-k router logits (llama.cpp's SOFTMAX_WEIGHT gating) instead
    # of top-k over the softmax; biases on the router, the experts and attn_output; a learned
    # sink logit per head (attn_sinks); the FFN's input norm is stored as post_attention_norm
    moe_softmax_topk: bool = False
    moe_bias: bool = False
    out_bias: bool = False
    attn_sinks: bool = False
    ffn_norm_tensor: str = "ffn_norm"
    # lfm2: the layers whose head_count_kv entry is 0 are gated short convolutions
    # (shortconv.in_proj -> B, C, x; C * conv(B * x) over the last shortconv.l_cache inputs ->
    # shortconv.out_proj) instead of attention; the output norm is stored as token_embd_norm
    shortconv: bool = False
    output_norm_tensor: str = "output_norm"
    # gemma3n: AltUp streams, LAuReL, per-layer inputs, activation sparsity and K/V shared by
    # the last layers (edged/engine/gemma3n.py); v is RMS-normed without a weight, q.k unscaled
    altup: bool = False
    # granitehybrid: the layers whose head_count_kv entry is 0 are Mamba-2 layers
    # (edged/engine/granitehybrid.py)
    mamba2: bool = False
    # qwen35: the layers attention.recurrent_layers marks (default: all but every
    # full_attention_interval-th) are Gated DeltaNet linear attention (ssm.* keys, one
    # recurrent state per sequence); the others are gated attention: attn_q gives each head's
    # query and a gate (q | gate per head), the output is multiplied by sigmoid(gate)
    deltanet: bool = False
    # gemma4: head size, KV heads, rotary dims and FFN width per layer, shared KV layers,
    # per-layer embeddings (edged/engine/gemma4.py reads its keys and tensors)
    per_layer_dims: bool = False


ARCHS = {
    "llama": Arch("llama", ROPE_NORM, qkv_bias=True, rope_n_rot_must_equal_head=True),
    "qwen2": Arch("qwen2", ROPE_NEOX, qkv_bias=True),
    "qwen3": Arch("qwen3", ROPE_NEOX, qk_norm=True),
    "phi3": Arch("phi3", ROPE_NEOX, fused_qkv=True, fused_gate_up=True, rope_factors=True,
                 scale_q=True),
    "gemma3": Arch("gemma3", ROPE_NEOX, qk_norm=True, sandwich_norm=True, embd_scale=True,
                   act="gelu", swa_pattern=6, scale_q=True),
    "gemma2": Arch("gemma2", ROPE_NEOX, sandwich_norm=True, embd_scale=True, act="gelu",
                   swa_pattern=2, scale_q=True, softcap=True, swa_rope_global=True),
    "granite": Arch("granite", ROPE_NORM, qkv_bias=True, multipliers=True,
                    rope_n_rot_must_equal_head=True),
    "smollm3": Arch("smollm3", ROPE_NORM, no_rope_step=4, rope_n_rot_must_equal_head=True),
    "qwen3moe": Arch("qwen3moe", ROPE_NEOX, qk_norm=True, moe=True, moe_norm_w=True),
    "qwen2moe": Arch("qwen2moe", ROPE_NEOX, qkv_bias=True, moe=True, shared_expert=True),
    "gpt-oss": Arch("gpt-oss", ROPE_NEOX, qkv_bias=True, act="swiglu_oai", swa_pattern=2,
                    swa_rope_global=True, moe=True, moe_softmax_topk=True, moe_bias=True,
                    out_bias=True, attn_sinks=True, ffn_norm_tensor="post_attention_norm"),
    "lfm2": Arch("lfm2", ROPE_NEOX, qk_norm=True, shortconv=True,
                 output_norm_tensor="token_embd_norm"),
    "gemma3n": Arch("gemma3n", ROPE_NEOX, qk_norm=True, sandwich_norm=True, embd_scale=True,
                    act="gelu", swa_pattern=5, scale_q=True, altup=True),
    "granitehybrid": Arch("granitehybrid", ROPE_NORM, qkv_bias=True, multipliers=True,
                          rope_n_rot_must_equal_head=True, mamba2=True),
    # interleaved M-RoPE: for text every section rotates by the token's position (checked),
    # which is NeoX RoPE over rope.dimension_count dims
    "qwen35": Arch("qwen35", ROPE_NEOX, qk_norm=True, deltanet=True,
                   ffn_norm_tensor="post_attention_norm"),
    # qwen35 with routed experts (softmax, the top k renormalised) and a gated shared expert
    "qwen35moe": Arch("qwen35moe", ROPE_NEOX, qk_norm=True, deltanet=True, moe=True,
                      moe_norm_w=True, shared_expert=True, ffn_norm_tensor="post_attention_norm"),
    "gemma4": Arch("gemma4", ROPE_NEOX, qk_norm=True, sandwich_norm=True, embd_scale=True,
                   act="gelu", per_layer_dims=True),
}
# llama.cpp's YaRN defaults (ggml_rope_yarn_corr_dims); it reads no beta keys for these archs
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0
# llama.cpp clamps the sum of the top-k router weights to the smallest normal F16
EXPERT_WEIGHTS_SUM_MIN = 6.103515625e-5
# gpt-oss's clamped SwiGLU (llama.cpp's LLM_FFN_SWIGLU_OAI_MOE): min(gate, limit) *
# sigmoid(alpha * min(gate, limit)) * (clamp(up, -limit, limit) + 1)
SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT = 1.702, 7.0


# The compiled forward pass copies the hyperparameters by name: each HParams field is a row of
# ED_HPARAMS (cython_kernels/forward/forward.h) unless marked with this (per-layer tables it
# gets per layer, values only the Python side reads); ForwardModel.setup fails on any other.
NOT_COMPILED = {"compiled": False}


@dataclass(frozen=True)
class HParams:
    """Hyperparameters with llama.cpp's short names."""
    n_vocab: int
    n_ctx_train: int = field(metadata=NOT_COMPILED)
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int                 # n_embd_head_k (attention.key_length)
    head_dim_v: int = field(metadata=NOT_COMPILED)  # n_embd_head_v (attention.value_length)
    n_rot: int                    # rope.dimension_count
    rope_freq_base: float
    rope_freq_scale: float        # 1 / rope.scaling.factor (linear scaling)
    rope_freq_base_swa: float     # local layers' RoPE base (gemma3)
    rope_freq_scale_swa: float    # local layers' RoPE scale (1 for gemma3; gemma2: the global one)
    rope_ext_factor: float        # YaRN extrapolation mix (1 with rope.scaling.type yarn, else 0)
    yarn_beta_fast: float
    yarn_beta_slow: float
    rope_attn_factor: float       # multiplies cos/sin: rope.scaling.attn_factor, and with YaRN
                                  # llama.cpp's mscale, cancelled as llama-context.cpp does
    n_ctx_orig: int               # rope.scaling.original_context_length (phi3 long/short factors)
    rms_eps: float
    n_swa: int                    # sliding window (0: none)
    swa_layers: tuple = field(metadata=NOT_COMPILED)  # per layer: True when it uses the sliding window
    attn_scale: float             # multiplies q.k
    embd_scale: float             # multiplies the input embeddings
    final_logit_softcap: float    # 0: off
    attn_softcap: float = 0.0     # q.k soft-capping (gemma2), 0: off
    residual_scale: float = 1.0   # multiplies each block's attention and FFN output (granite)
    logit_mul: float = 1.0        # multiplies the logits: 1 / logit_scale (granite)
    rope_layers: tuple = field(default=(), metadata=NOT_COMPILED)  # per layer: True when it applies RoPE
    n_expert: int = 0             # routed experts (0: dense FFN)
    n_expert_used: int = 0        # experts per token (top-k)
    n_ff_exp: int = 0             # rows of one expert's gate/up
    expert_weights_norm: bool = False  # renormalise the k router weights to sum 1
    n_ff_shexp: int = 0           # rows of the shared expert's gate/up (0: none)
    expert_softmax_topk: bool = False  # top k of the router logits, softmax over those k
    # the architecture's forward variant (Arch) as the compiled pass reads it
    rope_neox: bool = False       # RoPE rotates halves (ROPE_NEOX), not adjacent pairs
    act_gelu: bool = False        # the gate's activation is GELU (tanh form), not SiLU
    act_oai: bool = False         # gpt-oss's clamped SwiGLU
    scale_q: bool = False         # attn_scale multiplies q before attention, not q.k
    # gated short convolutions (lfm2): the kernel's taps (shortconv.l_cache: the current input
    # and l_cache - 1 before it) and how many layers are convolutions (conv_layers: which)
    n_shortconv_l_cache: int = 0
    n_conv_layers: int = 0
    conv_layers: tuple = field(default=(), metadata=NOT_COMPILED)
    # per layer: the layer whose K/V cache it attends to (itself, but for gemma3n's last layers)
    kv_layers: tuple = field(default=(), metadata=NOT_COMPILED)
    # per layer: True on a Mamba-2 layer (granitehybrid)
    ssm_layers: tuple = field(default=(), metadata=NOT_COMPILED)
    # Gated DeltaNet layers (qwen35; llama.cpp's ssm_* names): the causal convolution's taps
    # (ssm.conv_kernel) over q|k|v, the key/value head size S (ssm.state_size), the key heads
    # (ssm.group_count) and value heads (ssm.time_step_rank); each value head keeps an S x S
    # state. recr_layers: which layers; attn_gated_q: attention's q carries a sigmoid gate
    ssm_d_conv: int = 0
    ssm_d_state: int = 0
    ssm_n_group: int = 0
    ssm_dt_rank: int = 0
    # the width of the values a recurrent layer's state holds per key entry: DeltaNet S * H_v,
    # Mamba-2 ssm.inner_size (granitehybrid: heads of d_inner / ssm_dt_rank, state d_state)
    ssm_d_inner: int = 0
    n_recr_layers: int = 0
    recr_layers: tuple = field(default=(), metadata=NOT_COMPILED)
    attn_gated_q: bool = False
    # per layer (gemma4): head size, KV heads, rotary dims, FFN width; () when every layer has
    # the model's (head_dim, n_head_kv, n_rot, n_ff are then the largest, for scratch sizes)
    head_dim_layers: tuple = field(default=(), metadata=NOT_COMPILED)
    n_head_kv_layers: tuple = field(default=(), metadata=NOT_COMPILED)
    n_rot_layers: tuple = field(default=(), metadata=NOT_COMPILED)
    n_ff_layers: tuple = field(default=(), metadata=NOT_COMPILED)
    n_embd_per_layer: int = 0     # per-layer embeddings' width (gemma4 E2B/E4B; 0: none)
    v_norm: bool = False          # V is RMS-normed without a weight (gemma4, gemma3n)
    n_altup: int = 0              # AltUp streams (gemma3n; 0: none)

    def layer_dims(self, il):
        """(head_dim, n_head_kv, n_rot, n_ff) of layer il."""
        if self.head_dim_layers:
            return (self.head_dim_layers[il], self.n_head_kv_layers[il], self.n_rot_layers[il],
                    self.n_ff_layers[il])
        return self.head_dim, self.n_head_kv, self.n_rot, self.n_ff

    def kv_dims(self):
        """Values of one position's K (and V) row per layer; 0 for a layer without attention
        (kv_slots) or one that attends over an earlier layer's cache (gemma4's shared KV
        layers)."""
        src = self.kv_layers or range(self.n_layer)
        return tuple(0 if slot is None or src[il] != il else
                     self.layer_dims(il)[0] * self.layer_dims(il)[1]
                     for il, slot in enumerate(self.kv_slots))

    @property
    def ssm_conv_dim(self):
        """Channels of a recurrent layer's convolution: DeltaNet q | k | v, Mamba-2 x | B | C."""
        return self.ssm_d_inner + 2 * self.ssm_n_group * self.ssm_d_state

    @property
    def kv_slots(self):
        """Per layer: its block of rows in the K/V cache, None for a layer without attention
        (lfm2's convolutions, Mamba-2 and DeltaNet layers keep other state), numbered in layer
        order as the compiled pass numbers them (forward.pxi, ForwardModel.setup)."""
        no_kv = [any(t and t[il] for t in (self.conv_layers, self.ssm_layers, self.recr_layers))
                 for il in range(self.n_layer)]
        slots = iter(range(self.n_layer))
        return tuple(None if no else next(slots) for no in no_kv)

    @property
    def n_kv_layers(self):
        """Layers holding K/V rows: the attention layers."""
        return sum(s is not None for s in self.kv_slots)

    def recurrent_state_floats(self):
        """float32 values of one sequence's recurrent state: per recurrent layer the last
        ssm_d_conv - 1 convolution inputs and per head a (ssm_d_inner / ssm_dt_rank) x
        ssm_d_state matrix (DeltaNet: S x S per value head)."""
        return self.n_recr_layers * ((self.ssm_d_conv - 1) * self.ssm_conv_dim
                                     + self.ssm_d_inner * self.ssm_d_state)

    @property
    def n_embd_q(self):
        return self.n_head * self.head_dim

    @property
    def n_embd_k_gqa(self):
        return self.n_head_kv * self.head_dim

    @property
    def n_embd_v_gqa(self):
        return self.n_head_kv * self.head_dim_v


@dataclass(frozen=True)
class LayerTensors:
    """Tensor names of one block; None where the architecture or file has none."""
    attn_norm: str
    attn_q: str | None
    attn_k: str | None
    attn_v: str | None
    attn_qkv: str | None
    attn_q_bias: str | None
    attn_k_bias: str | None
    attn_v_bias: str | None
    attn_q_norm: str | None
    attn_k_norm: str | None
    attn_output: str | None       # None in a convolution layer (lfm2)
    post_attention_norm: str | None
    ffn_norm: str
    ffn_gate: str | None
    ffn_up: str | None            # None in a MoE layer
    ffn_down: str | None
    post_ffw_norm: str | None
    ffn_gate_inp: str | None = None   # router (n_embd, n_expert)
    ffn_gate_exps: str | None = None  # (n_embd, n_ff_exp, n_expert): expert e's rows e*n_ff_exp..
    ffn_up_exps: str | None = None
    ffn_down_exps: str | None = None  # (n_ff_exp, n_embd, n_expert)
    ffn_gate_inp_shexp: str | None = None  # (n_embd,): the shared expert's sigmoid gate
    ffn_gate_shexp: str | None = None      # (n_embd, n_ff_shexp)
    ffn_up_shexp: str | None = None
    ffn_down_shexp: str | None = None      # (n_ff_shexp, n_embd)
    attn_sinks: str | None = None          # (n_head,): one extra softmax logit per head (gpt-oss)
    attn_output_bias: str | None = None    # (n_embd,)
    ffn_gate_inp_bias: str | None = None   # (n_expert,)
    ffn_gate_exps_bias: str | None = None  # (n_ff_exp, n_expert): expert e's bias is row e
    ffn_up_exps_bias: str | None = None    # (n_ff_exp, n_expert)
    ffn_down_exps_bias: str | None = None  # (n_embd, n_expert)
    # a gated short convolution layer (lfm2): in_proj (n_embd, 3 n_embd) -> B | C | x, the
    # depthwise kernel (l_cache, n_embd): tap l_cache - 1 is the current input's, out_proj
    shortconv_in_proj: str | None = None
    shortconv_conv: str | None = None
    shortconv_out_proj: str | None = None
    # a Gated DeltaNet layer (qwen35) instead of attention: attn_qkv (n_embd, conv_dim) -> q|k|v
    # before the convolution, attn_gate (n_embd, value dim) the output norm's gate z, the
    # depthwise kernel (ssm_d_conv taps per channel, the current input's last), per value
    # head ssm_dt (bias of alpha), ssm_a (-exp(A_log)), ssm_beta / ssm_alpha (n_embd, H_v),
    # ssm_norm (S) the gated RMSNorm's weight, ssm_out (value dim, n_embd)
    attn_gate: str | None = None
    ssm_conv1d: str | None = None
    ssm_dt: str | None = None
    ssm_a: str | None = None
    ssm_beta: str | None = None
    ssm_alpha: str | None = None
    ssm_norm: str | None = None
    ssm_out: str | None = None
    # a Mamba-2 layer (granitehybrid; engine/granitehybrid.py) also has ssm_conv1d, ssm_dt (the
    # dt bias), ssm_a, ssm_norm ((d_inner / n_group, n_group)) and ssm_out (d_inner, n_embd):
    # ssm_in (n_embd, d_in_proj) -> z | xBC | dt, the convolution's bias, ssm_d (1, n_head)
    ssm_in: str | None = None
    ssm_conv1d_b: str | None = None
    ssm_d: str | None = None
    # gemma4: per-layer embeddings' gate (n_embd, P), projection (P, n_embd) and its norm;
    # a scalar multiplying the layer's output
    per_layer_inp_gate: str | None = None
    per_layer_proj: str | None = None
    per_layer_post_norm: str | None = None
    layer_output_scale: str | None = None
    # gemma4 mixture of experts (edged/engine/gemma4.py): every expert's gate|up fused (n_embd,
    # 2 n_ff_exp, n_expert), each expert's output scale (n_expert), the router input's scale
    # (n_embd), the experts' input norm, the dense FFN's and the experts' output norms
    ffn_gate_up_exps: str | None = None
    ffn_down_exps_scale: str | None = None
    ffn_gate_inp_scale: str | None = None
    pre_ffw_norm_2: str | None = None
    post_ffw_norm_1: str | None = None
    post_ffw_norm_2: str | None = None
    # gemma3n: the compiled pass's names for gemma3n.LayerTensors' AltUp and LAuReL tensors
    # (CPUBackend fills them; arch.validate leaves them None), its per-layer input tensors
    # taking the three per_layer_* roles above
    altup_router: str | None = None
    altup_router_norm: str | None = None
    altup_predict_coef: str | None = None
    altup_correct_coef: str | None = None
    altup_correct_scale: str | None = None
    laurel_l: str | None = None
    laurel_r: str | None = None
    laurel_post_norm: str | None = None


@dataclass(frozen=True)
class Spec:
    arch: Arch
    hp: HParams
    token_embd: str
    output_norm: str
    output: str                   # == token_embd when the embeddings are tied
    rope_freqs: str | None        # per-dimension frequency factors (n_rot/2), if any
    rope_long: str | None         # phi3 LongRoPE factors for contexts > n_ctx_orig
    rope_short: str | None        # ... and for contexts <= n_ctx_orig
    layers: tuple                 # LayerTensors per block
    tensors: dict = field(repr=False)  # name -> TensorInfo of every tensor the model uses
    gemma3n: gemma3n.Tensors | None = None  # AltUp / LAuReL / per-layer inputs (gemma3n)
    granitehybrid: granitehybrid.Params | None = None  # Mamba-2 layers' shape (granitehybrid)
    per_layer_inputs: gemma4.PerLayerInputs | None = None  # gemma4's per-layer embeddings

    @property
    def tied_embeddings(self):
        return self.output == self.token_embd

    def active_weight_bytes(self):
        """Bytes of weights one token reads: one embedding row (all of them when they are also
        the output matrix), k of n_expert experts, and every other weight."""
        hp, total = self.hp, 0
        for name, t in self.tensors.items():
            if name == self.token_embd and not self.tied_embeddings or (
                    self.gemma3n and name == self.gemma3n.per_layer_token_embd) or (
                    self.per_layer_inputs and name == self.per_layer_inputs.token_embd):
                total += t.nbytes // hp.n_vocab
            elif name.endswith(("_exps.weight", "_exps.bias")):
                total += t.nbytes * hp.n_expert_used // hp.n_expert
            else:
                total += t.nbytes
        return total

    def rope_factors(self, n_ctx):
        """Name of the per-dimension RoPE frequency factors for a context of n_ctx, or None."""
        if self.rope_freqs:
            return self.rope_freqs
        if n_ctx > self.hp.n_ctx_orig and self.rope_long:
            return self.rope_long
        return self.rope_short


def _refuse(msg):
    raise UnsupportedModelError(msg)


@dataclass(frozen=True)
class Bound:
    """What one hyperparameter key may hold (format.gguf.check_number: ints lo..hi, default
    INT32_MAX; floats finite in float32, >= lo, > 0 when positive)."""
    kind: type
    lo: int = 0
    hi: int | None = None
    positive: bool = False


_POS_INT, _POS, _NONNEG = Bound(int, lo=1), Bound(float, positive=True), Bound(float)
# Every key the decoder and encoder tables read, with its kind and range: a value of another
# type, NaN, or 2^63 where a C int goes is refused at load naming the key and the value
# (MetadataValueError). Relations between keys are checked where they are used.
HPARAM_KEYS = {
    Key.CONTEXT_LENGTH: _POS_INT, Key.EMBEDDING_LENGTH: _POS_INT,
    Key.BLOCK_COUNT: Bound(int, lo=1, hi=MAX_LAYERS), Key.HEAD_COUNT: _POS_INT,
    Key.HEAD_COUNT_KV: _POS_INT, Key.FEED_FORWARD_LENGTH: _POS_INT, Key.KEY_LENGTH: _POS_INT,
    Key.VALUE_LENGTH: _POS_INT, Key.ROPE_DIMENSION_COUNT: _POS_INT, Key.VOCAB_SIZE: _POS_INT,
    Key.SLIDING_WINDOW: Bound(int), Key.SLIDING_WINDOW_PATTERN: Bound(int),
    Key.ROPE_SCALING_ORIG_CTX_LEN: _POS_INT,
    Key.EXPERT_COUNT: _POS_INT, Key.EXPERT_USED_COUNT: _POS_INT,
    Key.EXPERT_FEED_FORWARD_LENGTH: _POS_INT, Key.EXPERT_SHARED_FEED_FORWARD_LENGTH: Bound(int),
    Key.TOKEN_TYPE_COUNT: Bound(int),
    Key.ROPE_FREQ_BASE: _POS, Key.ROPE_FREQ_BASE_SWA: _POS, Key.ROPE_SCALING_FACTOR: _NONNEG,
    Key.ROPE_SCALE_LINEAR: _NONNEG, Key.ROPE_SCALING_ATTN_FACTOR: _NONNEG,
    Key.LAYERNORM_RMS_EPS: _POS, Key.LAYERNORM_EPS: _POS,
    Key.FINAL_LOGIT_SOFTCAPPING: _NONNEG, Key.ATTN_LOGIT_SOFTCAPPING: _NONNEG,
    Key.EMBEDDING_SCALE: _NONNEG, Key.RESIDUAL_SCALE: _NONNEG, Key.ATTENTION_SCALE: _NONNEG,
    Key.LOGIT_SCALE: _POS,
    Key.ROPE_SCALING_TYPE: Bound(str), Key.CAUSAL: Bound(bool),
    Key.ROPE_SCALING_FINETUNED: Bound(bool), Key.NEXTN_PREDICT_LAYERS: Bound(int),
    Key.SHORTCONV_L_CACHE: Bound(int, lo=2),
    Key.SSM_CONV_KERNEL: Bound(int, lo=1, hi=64), Key.SSM_INNER_SIZE: _POS_INT,
    Key.SSM_STATE_SIZE: Bound(int, lo=1, hi=1024), Key.SSM_TIME_STEP_RANK: _POS_INT,
    Key.SSM_GROUP_COUNT: _POS_INT, Key.FULL_ATTENTION_INTERVAL: _POS_INT,
}


class _Meta:
    """Typed, range-checked reads of the keys in HPARAM_KEYS, with the key name in every error."""

    def __init__(self, metadata, arch):
        self.md, self.arch = metadata, arch

    def name(self, key):
        return Key.arch(key, self.arch)

    def get(self, key, default=None, required=False):
        bound = HPARAM_KEYS[key]
        name = self.name(key)
        if name not in self.md:
            if required:
                _refuse(f"missing required key {name!r} for architecture {self.arch!r}")
            return default
        v = self.md[name]
        if bound.kind in (str, bool):
            if not isinstance(v, bound.kind):
                raise MetadataValueError(f"{name} must be a {bound.kind.__name__}, got {v!r}")
            return v
        if bound.kind is int and isinstance(v, np.ndarray) and v.dtype.kind in "iu" and v.ndim == 1:
            vals = {int(x) for x in v}                 # a per-layer array: one value for all
            if len(vals) != 1:
                _refuse(f"{name} differs per layer ({sorted(vals)[:8]}); not supported")
            v = vals.pop()
        return check_number(name, v, bound.kind, bound.lo, bound.hi, bound.positive)


def _swa_layers(m, n_layer):
    """`attention.sliding_window_pattern` as a per-layer bool array (the form newer converters
    write), or None when it is absent or a period (an integer)."""
    v = m.md.get(m.name(Key.SLIDING_WINDOW_PATTERN))
    if not (isinstance(v, (list, tuple, np.ndarray)) and len(v) and
            all(isinstance(x, (bool, np.bool_)) for x in v)):
        return None
    if len(v) != n_layer:
        _refuse(f"{m.name(Key.SLIDING_WINDOW_PATTERN)} has {len(v)} entries for {n_layer} layers")
    return tuple(bool(x) for x in v)


def _conv_layers(m, n_layer, n_head):
    """lfm2's `attention.head_count_kv`: one entry per layer, 0 on a convolution layer, the
    attention layers' KV head count elsewhere (one value). Returns (n_head_kv, conv per layer)."""
    name = m.name(Key.HEAD_COUNT_KV)
    v = m.md.get(name)
    if v is None:
        _refuse(f"missing required key {name!r} for architecture {m.arch!r} (per layer: 0 marks "
                "a convolution layer)")
    arr = np.asarray(v) if isinstance(v, (list, tuple, np.ndarray)) else None
    if arr is None or arr.dtype.kind not in "iu" or arr.ndim != 1:
        raise MetadataValueError(f"{name} must be an array of integers (one per layer), got {v!r}")
    v = arr
    if len(v) != n_layer:
        _refuse(f"{name} has {len(v)} entries for {n_layer} layers")
    conv = tuple(int(x) == 0 for x in v)
    kv = {check_number(name, int(x), int, 0, n_head) for x in v if int(x) != 0}
    if len(kv) > 1:
        _refuse(f"{name} differs between attention layers ({sorted(kv)}); not supported")
    return (kv.pop() if kv else n_head), conv


def _int_array(m, key, n, what):
    """An array key of n integers (bools allowed) as a tuple of ints; None when absent."""
    name = m.name(key)
    v = m.md.get(name)
    if v is None:
        return None
    arr = np.asarray(v) if isinstance(v, (list, tuple, np.ndarray)) else None
    if arr is None or arr.dtype.kind not in "iub" or arr.ndim != 1 or len(arr) != n:
        raise MetadataValueError(f"{name} must be an array of {n} {what}, got {v!r}")
    return tuple(int(x) for x in arr)


def _deltanet(m, n_layer, n_embd, n_rot):
    """qwen35's Gated DeltaNet keys as llama.cpp reads them: HParams' ssm fields and which
    layers are recurrent. Refusals name the key."""
    f = {k: m.get(key, required=True) for k, key in (
        ("ssm_d_conv", Key.SSM_CONV_KERNEL), ("ssm_d_state", Key.SSM_STATE_SIZE),
        ("ssm_n_group", Key.SSM_GROUP_COUNT), ("ssm_dt_rank", Key.SSM_TIME_STEP_RANK))}
    d_inner = m.get(Key.SSM_INNER_SIZE, required=True)
    if d_inner != f["ssm_d_state"] * f["ssm_dt_rank"]:
        _refuse(f"{m.name(Key.SSM_INNER_SIZE)} = {d_inner} is not {m.name(Key.SSM_STATE_SIZE)} "
                f"x {m.name(Key.SSM_TIME_STEP_RANK)} = {f['ssm_d_state'] * f['ssm_dt_rank']}")
    if f["ssm_dt_rank"] % f["ssm_n_group"]:
        _refuse(f"{m.name(Key.SSM_TIME_STEP_RANK)} = {f['ssm_dt_rank']} is not a multiple of "
                f"{m.name(Key.SSM_GROUP_COUNT)} = {f['ssm_n_group']}")
    f["ssm_d_inner"] = d_inner
    # interleaved M-RoPE (ggml's imrope): for text tokens, sections t, h and w carry the
    # position and e carries 0; a pair in e (or past the sections) would not rotate at all
    sec = _int_array(m, Key.ROPE_DIMENSION_SECTIONS, 4, "integers (t, h, w, e)")
    if sec is None:
        _refuse(f"missing required key {m.name(Key.ROPE_DIMENSION_SECTIONS)!r} for architecture "
                f"{m.arch!r}")
    total = sum(sec)
    if min(sec) < 0 or total <= 0 or total > n_rot // 2:
        raise MetadataValueError(f"{m.name(Key.ROPE_DIMENSION_SECTIONS)} = {list(sec)}: must be "
                                 f"non-negative with a sum in 1..{n_rot // 2} (rope pairs)")
    for i in range(n_rot // 2):
        j = i % total
        if not any(j % 3 == r and j < 3 * sec[r] for r in range(3)):
            _refuse(f"{m.name(Key.ROPE_DIMENSION_SECTIONS)} = {list(sec)}: rope pair {i} takes "
                    "the e section's position; not supported for text")
    recr = _int_array(m, Key.ATTENTION_RECURRENT_LAYERS, n_layer, "0/1 flags (one per layer)")
    if recr is None:
        every = m.get(Key.FULL_ATTENTION_INTERVAL, default=4)
        recr = tuple(int((i + 1) % every != 0) for i in range(n_layer))
    recr = tuple(bool(x) for x in recr)
    return dict(f, n_recr_layers=sum(recr), recr_layers=recr)


def hparams(metadata, arch_name, n_vocab):
    a = ARCHS[arch_name]
    if a.per_layer_dims:
        return HParams(**gemma4.hparam_fields(metadata, n_vocab))
    m = _Meta(metadata, arch_name)
    n_embd = m.get(Key.EMBEDDING_LENGTH, required=True)
    n_layer = m.get(Key.BLOCK_COUNT, required=True)
    n_head = m.get(Key.HEAD_COUNT, required=True)
    if m.get(Key.NEXTN_PREDICT_LAYERS, default=0):
        # llama.cpp leaves the last N blocks (multi-token prediction) out of the forward pass
        _refuse(f"{m.name(Key.NEXTN_PREDICT_LAYERS)} = {m.get(Key.NEXTN_PREDICT_LAYERS)}: "
                "multi-token-prediction blocks are not supported")
    # a MoE file's dense feed_forward_length is not used (llama.cpp: optional there)
    n_ff = m.get(Key.FEED_FORWARD_LENGTH, required=not a.moe, default=None)
    if n_ff is None:
        n_ff = m.get(Key.EXPERT_FEED_FORWARD_LENGTH, default=0)
    conv_layers = ssm_layers = (False,) * n_layer
    if a.shortconv:
        n_head_kv, conv_layers = _conv_layers(m, n_layer, n_head)
    elif a.mamba2:
        n_head_kv, ssm_layers = _conv_layers(m, n_layer, n_head)
    else:
        n_head_kv = m.get(Key.HEAD_COUNT_KV, default=n_head)
    if n_ff <= 0:
        _refuse(f"{arch_name}: no feed_forward_length or expert_feed_forward_length")
    if n_head % n_head_kv:
        _refuse(f"{arch_name}: head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
    head_dim = m.get(Key.KEY_LENGTH, default=n_embd // n_head)
    head_dim_v = m.get(Key.VALUE_LENGTH, default=n_embd // n_head)
    if head_dim <= 0 or head_dim_v != head_dim:       # the defaults are 0 when n_embd < n_head
        _refuse(f"{arch_name}: key_length {head_dim} / value_length {head_dim_v} not supported "
                "(must be equal and positive)")
    if head_dim % 2:
        _refuse(f"{arch_name}: key_length {head_dim} is odd")
    n_rot = m.get(Key.ROPE_DIMENSION_COUNT, default=head_dim)
    if n_rot > head_dim or n_rot % 2:
        _refuse(f"{arch_name}.rope.dimension_count {n_rot} invalid for head dim {head_dim}")
    if a.rope_n_rot_must_equal_head and n_rot != head_dim:
        _refuse(f"{arch_name}.rope.dimension_count {n_rot} != head dim {head_dim}")

    scaling = m.get(Key.ROPE_SCALING_TYPE, default="linear" if not a.rope_factors else "none")
    if scaling not in ("none", "linear", "longrope", "yarn"):
        _refuse(f"{m.name(Key.ROPE_SCALING_TYPE)} = {scaling!r} is not supported (none, "
                "linear, yarn, and longrope for phi3)")
    if scaling == "longrope" and not a.rope_factors:
        _refuse(f"{m.name(Key.ROPE_SCALING_TYPE)} = 'longrope' is not supported for {arch_name}")
    factor = m.get(Key.ROPE_SCALING_FACTOR)
    if factor is None:
        factor = m.get(Key.ROPE_SCALE_LINEAR, default=0.0)
    freq_scale = 1.0 if factor == 0.0 or scaling == "none" else 1.0 / factor
    n_ctx_train = m.get(Key.CONTEXT_LENGTH, required=True)   # llama.cpp requires it too
    attn_factor = m.get(Key.ROPE_SCALING_ATTN_FACTOR, default=1.0)
    ext_factor = 0.0
    if scaling == "yarn":
        # llama-context.cpp: mscale = 1 + 0.1 ln(factor), divided by the same term that ggml's
        # rope multiplies in again, in float32 as there
        ext_factor = 1.0
        f32 = np.float32
        fac = f32(1.0) / f32(freq_scale)
        msc = f32(1.0) if fac <= 1.0 else f32(0.1) * np.log(fac) + f32(1.0)
        msc = f32(msc * (f32(1.0) / (f32(1.0) + f32(0.1) * np.log(fac))))
        attn_factor = float(f32(msc * f32(attn_factor)))

    n_swa = m.get(Key.SLIDING_WINDOW, required=a.name in ("gpt-oss", "gemma3n"),
                  default=4096 if a.name == "gemma2" else 0)
    per_layer = _swa_layers(m, n_layer)
    if a.shortconv and n_swa > 0:     # llama.cpp: every attention layer slides
        swa = tuple(not c for c in conv_layers)
    elif a.swa_pattern and n_swa > 0 and per_layer is not None:
        swa = per_layer
    elif a.swa_pattern and n_swa > 0:
        pattern = m.get(Key.SLIDING_WINDOW_PATTERN, default=a.swa_pattern)
        swa = tuple(pattern == 0 or (il % pattern < pattern - 1) for il in range(n_layer))
    else:
        n_swa = 0  # phi3: llama.cpp ignores the window; others have none
        swa = (False,) * n_layer
    rope_base = m.get(Key.ROPE_FREQ_BASE, default=10000.0)
    rope_base_swa = m.get(Key.ROPE_FREQ_BASE_SWA,
                          default=rope_base if a.swa_rope_global else 10000.0)
    rms_eps = m.get(Key.LAYERNORM_RMS_EPS, required=True)
    attn_scale = 1.0 / math.sqrt(head_dim)
    # gemma 27B models scale by n_embd / n_head (llama.cpp, gemma_pytorch)
    if (arch_name, n_layer) in (("gemma3", 62), ("gemma2", 46)):
        attn_scale = 1.0 / math.sqrt(n_embd // n_head)
    if a.altup:
        attn_scale = 1.0       # q and k are RMS-normed (llama.cpp's f_attention_scale)
    embd_scale = math.sqrt(n_embd) if a.embd_scale else 1.0
    residual_scale = logit_mul = 1.0
    if a.multipliers:  # granite: each key optional but logit_scale (llama.cpp requires it)
        embd_scale = m.get(Key.EMBEDDING_SCALE, default=0.0) or 1.0
        residual_scale = m.get(Key.RESIDUAL_SCALE, default=0.0) or 1.0
        attn_scale = m.get(Key.ATTENTION_SCALE, default=0.0) or attn_scale
        logit_scale = m.get(Key.LOGIT_SCALE, required=True)
        logit_mul = float(np.float32(1.0) / np.float32(logit_scale))
    rope_layers = tuple(not a.no_rope_step or (il + 1) % a.no_rope_step != 0
                        for il in range(n_layer))
    if a.multipliers and not m.get(Key.ROPE_SCALING_FINETUNED, default=True):
        rope_layers = (False,) * n_layer     # granite: llama.cpp's switch for RoPE, default on
    if a.shortconv and m.get(Key.CAUSAL, default=True) is False:
        _refuse(f"{m.name(Key.CAUSAL)} = false (a bidirectional LFM2 embedding model) is not "
                "supported")
    l_cache = m.get(Key.SHORTCONV_L_CACHE, required=True) if a.shortconv else 0
    ssm = _deltanet(m, n_layer, n_embd, n_rot) if a.deltanet else \
        granitehybrid.hparams(granitehybrid.params(metadata, n_embd, ssm_layers)) if a.mamba2 \
        else dict(n_recr_layers=0, recr_layers=())
    n_expert = n_used = n_ff_exp = n_ff_shexp = 0
    # granitehybrid: experts when expert_count > 0, feed_forward_length wide, the top k
    # renormalised, and a shared expert without a gate when its width is given (llama.cpp's
    # granite MoE FFN)
    granite_moe = a.mamba2 and m.get(Key.EXPERT_COUNT, default=0) > 0
    if a.moe or granite_moe:
        n_expert = m.get(Key.EXPERT_COUNT, required=True)
        n_used = m.get(Key.EXPERT_USED_COUNT, required=True)
        n_ff_exp = n_ff if granite_moe else m.get(Key.EXPERT_FEED_FORWARD_LENGTH, required=True)
        if not 0 < n_used <= n_expert <= MAX_EXPERTS or n_ff_exp <= 0:
            _refuse(f"{arch_name}: expert_used_count {n_used} / expert_count {n_expert} / "
                    f"expert_feed_forward_length {n_ff_exp} invalid")
    return HParams(
        n_vocab=n_vocab, n_ctx_train=n_ctx_train, n_embd=n_embd, n_ff=n_ff, n_layer=n_layer,
        n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, head_dim_v=head_dim_v, n_rot=n_rot,
        rope_freq_base=rope_base, rope_freq_scale=freq_scale,
        rope_freq_base_swa=rope_base_swa,
        rope_freq_scale_swa=freq_scale if a.swa_rope_global else 1.0,
        rope_ext_factor=ext_factor, yarn_beta_fast=YARN_BETA_FAST, yarn_beta_slow=YARN_BETA_SLOW,
        rope_attn_factor=attn_factor,
        n_ctx_orig=m.get(Key.ROPE_SCALING_ORIG_CTX_LEN, default=n_ctx_train),
        rms_eps=rms_eps,
        n_swa=n_swa, swa_layers=swa, attn_scale=attn_scale, embd_scale=embd_scale,
        final_logit_softcap=gemma3n.FINAL_LOGIT_SOFTCAP if a.altup else
        m.get(Key.FINAL_LOGIT_SOFTCAPPING, default=30.0 if a.softcap else 0.0),
        attn_softcap=m.get(Key.ATTN_LOGIT_SOFTCAPPING, default=50.0) if a.softcap else 0.0,
        residual_scale=residual_scale, logit_mul=logit_mul, rope_layers=rope_layers,
        n_expert=n_expert, n_expert_used=n_used, n_ff_exp=n_ff_exp,
        expert_weights_norm=a.moe_norm_w or granite_moe, expert_softmax_topk=a.moe_softmax_topk,
        rope_neox=a.rope_type == ROPE_NEOX, act_gelu=a.act == "gelu", act_oai=a.act == "swiglu_oai",
        scale_q=a.scale_q,
        n_ff_shexp=m.get(Key.EXPERT_SHARED_FEED_FORWARD_LENGTH, default=0) or n_ff
        if a.shared_expert else m.get(Key.EXPERT_SHARED_FEED_FORWARD_LENGTH, default=0)
        if granite_moe else 0,
        n_shortconv_l_cache=l_cache, n_conv_layers=sum(conv_layers), conv_layers=conv_layers,
        kv_layers=gemma3n.kv_layers(n_layer, swa) if a.altup else tuple(range(n_layer)),
        ssm_layers=ssm_layers,
        **ssm, attn_gated_q=a.deltanet,
        # gemma3n: V RMS-normed, AltUp streams and per-layer inputs (edged/engine/gemma3n.py)
        **(dict(v_norm=True, n_altup=gemma3n.N_ALTUP, n_embd_per_layer=gemma3n.N_EMBD_ALTUP)
           if a.altup else {}),
    )


class _Tensors:
    """Looks tensors up, checks their shape and type, and remembers what was used."""

    def __init__(self, tensors, log=None):
        self.all, self.used, self.log = tensors, {}, log

    def get(self, name, shape, required=True, vector=False):
        t = self.all.get(name)
        if t is None:
            if required:
                _refuse(f"missing tensor {name!r}")
            return None
        if tuple(int(x) for x in t.shape) != tuple(shape):
            _refuse(f"tensor {name!r} has shape {tuple(int(x) for x in t.shape)}, "
                    f"expected {tuple(shape)} from the hyperparameters")
        allowed = VECTOR_TYPES if vector else SUPPORTED_TYPES
        if t.type not in allowed:
            tname = getattr(t.type, "name", t.type)
            _refuse(f"tensor {name!r} has type {tname}, which edged does not support"
                    + (" for a norm/bias vector" if vector and t.type in SUPPORTED_TYPES else ""))
        if shape and not vector:
            bs = TYPE_INFO[t.type].block_size
            if shape[0] % bs:
                _refuse(f"tensor {name!r}: row length {shape[0]} is not a multiple of the "
                        f"{getattr(t.type, 'name', t.type)} block size {bs}")
        self.used[name] = t
        if self.log:
            self.log(t)
        return name


def _deltanet_tensors(T, p, hp):
    """A Gated DeltaNet layer's tensors (qwen35), shapes as llama.cpp creates them."""
    E, S, Hv = hp.n_embd, hp.ssm_d_state, hp.ssm_dt_rank
    return dict(
        attn_qkv=T.get(p + "attn_qkv.weight", (E, hp.ssm_conv_dim)),
        attn_gate=T.get(p + "attn_gate.weight", (E, S * Hv)),
        ssm_conv1d=T.get(p + "ssm_conv1d.weight", (hp.ssm_d_conv, hp.ssm_conv_dim), vector=True),
        ssm_dt=T.get(p + "ssm_dt.bias", (Hv,), vector=True),
        ssm_a=T.get(p + "ssm_a", (Hv,), vector=True),
        ssm_beta=T.get(p + "ssm_beta.weight", (E, Hv)),
        ssm_alpha=T.get(p + "ssm_alpha.weight", (E, Hv)),
        ssm_norm=T.get(p + "ssm_norm.weight", (S,), vector=True),
        ssm_out=T.get(p + "ssm_out.weight", (S * Hv, E)))


def validate(metadata, tensors, n_vocab_tokenizer=None, log=None):
    """One validation pass: architecture, hyperparameters, every tensor's presence/shape/type.

    metadata: dict of GGUF key -> value; tensors: dict name -> TensorInfo (type, shape);
    n_vocab_tokenizer: the tokenizer's size (must equal the embedding rows);
    log: optional callable(TensorInfo) for each tensor as it is validated (--verbose).
    """
    arch_name = metadata.get(Key.ARCHITECTURE)
    if arch_name is None:
        _refuse(f"missing key {Key.ARCHITECTURE!r}")
    if arch_name not in ARCHS:
        _refuse(f"unknown architecture {arch_name!r} (supported: {', '.join(sorted(ARCHS))})")
    a = ARCHS[arch_name]
    embd = tensors.get("token_embd.weight")
    if embd is None:
        _refuse("missing tensor 'token_embd.weight'")
    if len(embd.shape) != 2:
        _refuse(f"tensor 'token_embd.weight' has shape {tuple(embd.shape)}, expected 2 dimensions")
    n_vocab = int(embd.shape[1])
    if n_vocab_tokenizer is not None and n_vocab_tokenizer != n_vocab:
        _refuse(f"tokenizer has {n_vocab_tokenizer} tokens but token_embd.weight has "
                f"{n_vocab} rows")
    hp = hparams(metadata, arch_name, n_vocab)
    if int(embd.shape[0]) != hp.n_embd:
        _refuse(f"tensor 'token_embd.weight' has shape {tuple(int(x) for x in embd.shape)}, "
                f"expected ({hp.n_embd}, {n_vocab}) from {Key.arch(Key.EMBEDDING_LENGTH, arch_name)}")
    if _Meta(metadata, arch_name).get(Key.VOCAB_SIZE, default=n_vocab) != n_vocab:
        vocab_key = Key.arch(Key.VOCAB_SIZE, arch_name)
        _refuse(f"{vocab_key} = {metadata[vocab_key]} contradicts token_embd.weight rows {n_vocab}")

    T = _Tensors(tensors, log)
    prm = granitehybrid.params(metadata, hp.n_embd, hp.ssm_layers) if a.mamba2 else None
    E, V = hp.n_embd, n_vocab
    token_embd = T.get("token_embd.weight", (E, V))
    output_norm = T.get(a.output_norm_tensor + ".weight", (E,), vector=True)
    output = T.get("output.weight", (E, V), required=False) or token_embd

    if a.per_layer_dims:
        rope_freqs, layers, ple = gemma4.tensors(T.get, hp, LayerTensors)
        return Spec(arch=a, hp=hp, token_embd=token_embd, output_norm=output_norm, output=output,
                    rope_freqs=rope_freqs, rope_long=None, rope_short=None, layers=layers,
                    tensors=dict(T.used), per_layer_inputs=ple)
    R = (hp.n_rot // 2,)
    rope_freqs = T.get("rope_freqs.weight", R, required=False, vector=True)
    rope_long = rope_short = None
    if a.rope_factors and rope_freqs is None:
        # like llama.cpp: a session longer than n_ctx_orig uses the long factors
        rope_long = T.get("rope_factors_long.weight", R, required=False, vector=True)
        rope_short = T.get("rope_factors_short.weight", R, required=False, vector=True)

    Q, K, Vv, D = hp.n_embd_q, hp.n_embd_k_gqa, hp.n_embd_v_gqa, hp.head_dim
    layers = []
    for i in range(hp.n_layer):
        p = f"blk.{i}."
        has = lambda n: (p + n) in tensors  # noqa: E731
        conv = hp.conv_layers[i] if hp.conv_layers else False
        ssm = hp.ssm_layers[i] if hp.ssm_layers else False
        recr = _deltanet_tensors(T, p, hp) if a.deltanet and hp.recr_layers[i] else {}
        mamba2 = granitehybrid.tensors(T.get, p, hp, prm) if ssm else {}
        qkv = q = k = v = None
        if conv or ssm:
            pass
        elif recr:
            qkv = recr.pop("attn_qkv")    # q | k | v of the DeltaNet, before its convolution
        elif a.fused_qkv and has("attn_qkv.weight"):
            qkv = T.get(p + "attn_qkv.weight", (E, Q + K + Vv))
        else:
            q = T.get(p + "attn_q.weight", (E, 2 * Q if hp.attn_gated_q else Q))
            k = T.get(p + "attn_k.weight", (E, K))
            v = T.get(p + "attn_v.weight", (E, Vv))
        bias = (None, None, None)
        if a.qkv_bias and q is not None:
            bias = (T.get(p + "attn_q.bias", (Q,), required=arch_name == "qwen2", vector=True),
                    T.get(p + "attn_k.bias", (K,), required=arch_name == "qwen2", vector=True),
                    T.get(p + "attn_v.bias", (Vv,), required=arch_name == "qwen2", vector=True))
        qn = kn = None
        if a.qk_norm and not conv and not recr:
            qn = T.get(p + "attn_q_norm.weight", (D,), vector=True)
            kn = T.get(p + "attn_k_norm.weight", (D,), vector=True)
        down = ginp = gexp = uexp = dexp = None
        shexp = (None,) * 4
        moe_bias = (None,) * 4
        if hp.n_expert:
            X, Fe = hp.n_expert, hp.n_ff_exp
            gate = up = None
            ginp = T.get(p + "ffn_gate_inp.weight", (E, X))
            gexp = T.get(p + "ffn_gate_exps.weight", (E, Fe, X))
            uexp = T.get(p + "ffn_up_exps.weight", (E, Fe, X))
            dexp = T.get(p + "ffn_down_exps.weight", (Fe, E, X))
            if a.moe_bias:
                moe_bias = (T.get(p + "ffn_gate_inp.bias", (X,), vector=True),
                            T.get(p + "ffn_gate_exps.bias", (Fe, X), vector=True),
                            T.get(p + "ffn_up_exps.bias", (Fe, X), vector=True),
                            T.get(p + "ffn_down_exps.bias", (E, X), vector=True))
            if hp.n_ff_shexp:     # gated but for granitehybrid's
                Fs = hp.n_ff_shexp
                shexp = (T.get(p + "ffn_gate_inp_shexp.weight", (E,)) if a.shared_expert else None,
                         T.get(p + "ffn_gate_shexp.weight", (E, Fs)),
                         T.get(p + "ffn_up_shexp.weight", (E, Fs)),
                         T.get(p + "ffn_down_shexp.weight", (Fs, E)))
        elif a.fused_gate_up:
            gate, up = None, T.get(p + "ffn_up.weight", (E, 2 * hp.n_ff))
        else:
            gate = T.get(p + "ffn_gate.weight", (E, hp.n_ff))
            up = T.get(p + "ffn_up.weight", (E, hp.n_ff))
        if not hp.n_expert:
            down = T.get(p + "ffn_down.weight", (hp.n_ff, E))
        layers.append(LayerTensors(
            attn_norm=T.get(p + "attn_norm.weight", (E,), vector=True),
            attn_q=q, attn_k=k, attn_v=v, attn_qkv=qkv,
            attn_q_bias=bias[0], attn_k_bias=bias[1], attn_v_bias=bias[2],
            attn_q_norm=qn, attn_k_norm=kn,
            attn_output=None if conv or ssm or recr else T.get(p + "attn_output.weight", (Q, E)),
            shortconv_in_proj=T.get(p + "shortconv.in_proj.weight", (E, 3 * E)) if conv else None,
            shortconv_conv=T.get(p + "shortconv.conv.weight", (hp.n_shortconv_l_cache, E),
                                 vector=True) if conv else None,
            shortconv_out_proj=T.get(p + "shortconv.out_proj.weight", (E, E)) if conv else None,
            post_attention_norm=T.get(p + "post_attention_norm.weight", (E,), vector=True)
            if a.sandwich_norm else None,
            ffn_norm=T.get(p + a.ffn_norm_tensor + ".weight", (E,), vector=True),
            ffn_gate=gate, ffn_up=up, ffn_down=down,
            post_ffw_norm=T.get(p + "post_ffw_norm.weight", (E,), vector=True)
            if a.sandwich_norm else None,
            ffn_gate_inp=ginp, ffn_gate_exps=gexp, ffn_up_exps=uexp, ffn_down_exps=dexp,
            ffn_gate_inp_shexp=shexp[0], ffn_gate_shexp=shexp[1], ffn_up_shexp=shexp[2],
            ffn_down_shexp=shexp[3],
            attn_sinks=T.get(p + "attn_sinks.weight", (hp.n_head,), vector=True)
            if a.attn_sinks else None,
            attn_output_bias=T.get(p + "attn_output.bias", (E,), vector=True)
            if a.out_bias else None,
            ffn_gate_inp_bias=moe_bias[0], ffn_gate_exps_bias=moe_bias[1],
            ffn_up_exps_bias=moe_bias[2], ffn_down_exps_bias=moe_bias[3],
            **recr, **mamba2,
        ))
    extra = [n for n in tensors if n.startswith(f"blk.{hp.n_layer}.")]
    if extra:
        _refuse(f"tensor {extra[0]!r} belongs to a block beyond {Key.arch(Key.BLOCK_COUNT, arch_name)}"
                f" = {hp.n_layer}")
    g3n = gemma3n.tensors(T.get, hp, gemma3n.params(metadata, hp.n_layer)) if a.altup else None
    return Spec(arch=a, hp=hp, token_embd=token_embd, output_norm=output_norm, output=output,
                rope_freqs=rope_freqs, rope_long=rope_long, rope_short=rope_short,
                layers=tuple(layers), tensors=dict(T.used), gemma3n=g3n, granitehybrid=prm)
