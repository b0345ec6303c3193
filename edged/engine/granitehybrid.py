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
tensors of the recurrent layers with arch.validate's checked lookup. The computation is in
reference_granite.py (the compiled backend refuses the architecture by name).
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


@dataclass(frozen=True)
class LayerTensors:
    """A Mamba-2 layer's tensors (GGUF shapes)."""
    ssm_in: str                      # (n_embd, d_in_proj)
    ssm_conv1d: str                  # (d_conv, n_conv_ch)
    ssm_conv1d_b: str | None         # (n_conv_ch,)
    ssm_dt_b: str                    # (n_head,)
    ssm_a: str                       # (1, n_head): -exp(A_log), as the converter writes it
    ssm_d: str                       # (1, n_head)
    ssm_norm: str                    # (d_inner / n_group, n_group)
    ssm_out: str                     # (d_inner, n_embd)


@dataclass(frozen=True)
class Tensors:
    params: Params
    layers: tuple                    # LayerTensors, or None on an attention layer


def _refuse(msg):
    raise UnsupportedModelError(msg)


def _key(md, key, lo=1):
    name = Key.arch(key, ARCH)
    if name not in md:
        _refuse(f"missing required key {name!r} for architecture {ARCH!r} (Mamba-2 layers)")
    return check_number(name, md[name], int, lo)


def params(md, n_embd, ssm_layers):
    experts = Key.arch(Key.EXPERT_COUNT, ARCH)
    if md.get(experts):
        _refuse(f"{experts} = {md[experts]}: the MoE variant of {ARCH} is not supported yet "
                "(dense FFN only)")
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


def tensors(get, hp, prm):
    """The Mamba-2 layers' tensors through arch.validate's get(name, shape, required, vector)."""
    E, H, G = hp.n_embd, prm.n_head, prm.n_group
    layers = []
    for il, ssm in enumerate(prm.ssm_layers):
        if not ssm:
            layers.append(None)
            continue
        p = f"blk.{il}."
        layers.append(LayerTensors(
            ssm_in=get(p + "ssm_in.weight", (E, prm.d_in_proj)),
            ssm_conv1d=get(p + "ssm_conv1d.weight", (prm.d_conv, prm.n_conv_ch), vector=True),
            ssm_conv1d_b=get(p + "ssm_conv1d.bias", (prm.n_conv_ch,), required=False,
                             vector=True),
            ssm_dt_b=get(p + "ssm_dt.bias", (H,), vector=True),
            ssm_a=get(p + "ssm_a", (1, H), vector=True),
            ssm_d=get(p + "ssm_d", (1, H), vector=True),
            ssm_norm=get(p + "ssm_norm.weight", (prm.d_inner // G, G), vector=True),
            ssm_out=get(p + "ssm_out.weight", (prm.d_inner, E)),
        ))
    return Tensors(params=prm, layers=tuple(layers))
