"""Recurrent state beside the KV cache: one live state per sequence plus a few checkpoints.

A recurrent layer (qwen35's Gated DeltaNet, granitehybrid's Mamba-2) folds every token into a
state of constant size (per layer: the convolution's last ssm_d_conv - 1 inputs and a matrix
per head: S x S per DeltaNet value head, head_dim x d_state per Mamba-2 head),
so unlike K/V rows (or lfm2's per-position convolution rows) it cannot be cut back to an
earlier position. A session keeps the live state (where the forward pass reads and writes it:
the reference backend's array, the compiled backend's arena) and copies of it at chunk
boundaries, as llama.cpp keeps a few per sequence. Rewinding to position n (prefix reuse,
Session.truncate, a rejected draft) restores the newest checkpoint at or before n and the
session replays the tokens between; a fork copies the live state and the checkpoints.

The layout, one block per recurrent layer in layer order, is the compiled pass's too
(cython_kernels/forward/deltanet.h, mamba2.h): conv (ssm_d_conv - 1, conv_dim) float32, oldest
input first, then ssm (ssm_dt_rank, ssm_d_inner / ssm_dt_rank, ssm_d_state) float32. DeltaNet:
ssm[h, j, i] is the state's S[i][j] (llama.cpp's transposed layout: row j is what key i's
weights read); Mamba-2: ssm[h, p, n] as llama.cpp's (d_state, head_dim, n_head) tensor.
"""
from __future__ import annotations

# checkpoints kept per sequence (the live state is one more copy); the memory plan counts them
N_CHECKPOINTS = 4


def state_bytes(hp):
    """Bytes of one sequence's recurrent state and its checkpoints (constant per sequence)."""
    return (1 + N_CHECKPOINTS) * 4 * hp.recurrent_state_floats()


def layer_views(live, hp, slot):
    """(conv, ssm) views of recurrent layer `slot` in a live state array."""
    C, S, H = hp.ssm_conv_dim, hp.ssm_d_state, hp.ssm_dt_rank
    nc, ns = (hp.ssm_d_conv - 1) * C, hp.ssm_d_inner * S
    base = slot * (nc + ns)
    return (live[base:base + nc].reshape(hp.ssm_d_conv - 1, C),
            live[base + nc:base + nc + ns].reshape(H, hp.ssm_d_inner // H, S))


class RecurrentState:
    """A sequence's live recurrent state (float32, updated in place by the forward pass) at
    position `pos`, and checkpoints [(pos, copy)] in ascending position."""

    def __init__(self, live):
        self.live = live
        self.live[:] = 0
        self.pos = 0
        self.checkpoints = []

    def checkpoint(self):
        """Keep a copy of the live state at its position (the newest N_CHECKPOINTS stay)."""
        if self.pos == 0 or (self.checkpoints and self.checkpoints[-1][0] >= self.pos):
            return
        self.checkpoints.append((self.pos, self.live.copy()))
        del self.checkpoints[:-N_CHECKPOINTS]

    def rewind(self, n):
        """Restore the newest checkpoint at or before position n (the empty state at 0) and
        forget the later ones. Returns the position restored: the caller replays its tokens
        from there to n."""
        self.checkpoints = [c for c in self.checkpoints if c[0] <= n]
        if self.checkpoints:
            self.pos, saved = self.checkpoints[-1]
            self.live[:] = saved
        else:
            self.pos = 0
            self.live[:] = 0
        return self.pos

    def copy_from(self, src):
        """This state becomes a copy of src's (a fork): the live state and the checkpoints."""
        self.live[:] = src.live
        self.pos = src.pos
        self.checkpoints = [(p, c.copy()) for p, c in src.checkpoints]
