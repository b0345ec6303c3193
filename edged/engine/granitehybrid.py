"""Granite 4 hybrid (`granitehybrid`): its Mamba-2 layers, read as llama.cpp reads them.

llama.cpp 0.3.36 (src/models/granite-hybrid.cpp) marks a layer recurrent when its entry of
`attention.head_count_kv` is 0; the other layers are granite attention layers (with granite's
embedding / residual / attention / logit multipliers, RoPE unless `rope.scaling.finetuned` is
false). A Mamba-2 layer needs the five `ssm.*` keys (all required, as there): conv_kernel
(d_conv), inner_size (d_inner, which llama.cpp requires to be 2 * n_embd), state_size
(d_state), time_step_rank (the SSM head count) and group_count (B/C groups; also the groups
of the gated RMS norm). Its tensors: ssm_in (n_embd -> z | xBC | dt), ssm_conv1d (+ optional
bias), ssm_dt.bias, ssm_a, ssm_d (one value per head), ssm_norm, ssm_out.

`params(metadata, n_embd, ssm_layers)` checks the keys; `tensors(get, hp, params)` finds the
tensors of a Mamba-2 layer with arch.validate's checked lookup, under the LayerTensors roles
the compiled pass reads (ssm_dt is the dt bias). The layers run in the compiled pass
(cython_kernels/forward/mamba2.h) with one recurrent state per sequence (engine/recurrent.py:
the conv inputs, then per head a head_dim x d_state matrix); reference_granite.py is the slow
twin. hparams() maps the keys onto HParams' ssm_* fields, shared with qwen35's DeltaNet.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnsupportedModelError
from ..format.gguf import Key, check_number

ARCH = "granitehybrid"


@dataclass(frozen=True)
class Params:
    d_conv: int                      # ssm.conv_kernel: taps of the causal convolution
    d_inner: int                     # ssm.inner_size: x and z width (2 * n_embd)
    d_state: int                     # ssm.state_size: N
    n_head: int                      # ssm.time_step_rank: SSM heads, one dt / A / D each
    n_group: int                     # ssm.group_count: B/C groups, norm groups
    ssm_layers: tuple                # per layer: True on a Mamba-2 layer

    @property
    def head_dim(self):
        return self.d_inner // self.n_head

    @property
    def n_conv_ch(self):             # channels the convolution runs over: x | B | C
        return self.d_inner + 2 * self.n_group * self.d_state

    @property
    def d_in_proj(self):             # ssm_in's output: z | xBC | dt
        return self.d_inner + self.n_conv_ch + self.n_head


def _refuse(msg):
    raise UnsupportedModelError(msg)


def _key(md, key, lo=1):
    name = Key.arch(key, ARCH)
    if name not in md:
        _refuse(f"missing required key {name!r} for architecture {ARCH!r} (Mamba-2 layers)")
    return check_number(name, md[name], int, lo)


def params(md, n_embd, ssm_layers):
    d_conv = _key(md, Key.SSM_CONV_KERNEL)
    d_inner = _key(md, Key.SSM_INNER_SIZE)
    d_state = _key(md, Key.SSM_STATE_SIZE)
    n_head = _key(md, Key.SSM_TIME_STEP_RANK)
    n_group = _key(md, Key.SSM_GROUP_COUNT)
    inner = Key.arch(Key.SSM_INNER_SIZE, ARCH)
    if d_inner != 2 * n_embd:     # llama.cpp asserts an expansion factor of 2
        _refuse(f"{inner} = {d_inner} is not 2 * embedding_length ({2 * n_embd}); llama.cpp "
                "runs only that expansion")
    if d_inner % n_head or n_head % n_group or d_inner % n_group:
        _refuse(f"{inner} = {d_inner}, {Key.arch(Key.SSM_TIME_STEP_RANK, ARCH)} = {n_head} and "
                f"{Key.arch(Key.SSM_GROUP_COUNT, ARCH)} = {n_group} do not divide evenly "
                "(heads into the inner size, groups into the heads)")
    return Params(d_conv=d_conv, d_inner=d_inner, d_state=d_state, n_head=n_head,
                  n_group=n_group, ssm_layers=tuple(ssm_layers))


def hparams(prm):
    """HParams' recurrent fields for the Mamba-2 layers (the names llama.cpp's hparams use)."""
    return dict(ssm_d_conv=prm.d_conv, ssm_d_inner=prm.d_inner, ssm_d_state=prm.d_state,
                ssm_dt_rank=prm.n_head, ssm_n_group=prm.n_group,
                n_recr_layers=sum(prm.ssm_layers), recr_layers=prm.ssm_layers)


def tensors(get, p, hp, prm):
    """Mamba-2 layer p's tensors ("blk.N.") through arch.validate's get(name, shape, required,
    vector), by their LayerTensors role."""
    E, H, G = hp.n_embd, prm.n_head, prm.n_group
    return dict(
        ssm_in=get(p + "ssm_in.weight", (E, prm.d_in_proj)),                    # z | xBC | dt
        ssm_conv1d=get(p + "ssm_conv1d.weight", (prm.d_conv, prm.n_conv_ch), vector=True),
        ssm_conv1d_b=get(p + "ssm_conv1d.bias", (prm.n_conv_ch,), required=False, vector=True),
        ssm_dt=get(p + "ssm_dt.bias", (H,), vector=True),
        ssm_a=get(p + "ssm_a", (1, H), vector=True),        # -exp(A_log), as the converter writes it
        ssm_d=get(p + "ssm_d", (1, H), vector=True),
        ssm_norm=get(p + "ssm_norm.weight", (prm.d_inner // G, G), vector=True),
        ssm_out=get(p + "ssm_out.weight", (prm.d_inner, E)))
