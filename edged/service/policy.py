"""Which models a request may cause to be loaded, and how often.

`/v1/models/load` and `/unload` are admin routes; a completion, tokenize or detokenize request
that names a model that is not loaded would load it too (and unload another to make room).
Without a policy any allowed peer could keep the device swapping. The rule:

- a model that is loaded (and not draining) may always be used;
- an admin peer (admin_uids/admin_gids) may cause any load, as through the admin route;
- anyone else may cause the default model to be loaded, any model when `auto_load = true`,
  or a model whose `auto_load_allow` entry names the peer's uid or one of its groups;
  otherwise 403 `model_not_loaded`;
- a load that needs another model unloaded (a swap) caused by a non-admin request is refused
  with 429 `swap_rate_limited` (Retry-After) when the previous such swap was less than
  `swap_interval` seconds ago.
"""
import math
import time

from ..errors import ModelNotLoaded, SwapRateLimited


class LoadPolicy:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.last_swap = None           # when a request last caused a swap (clock seconds)

    @staticmethod
    def is_admin(cfg, peer):
        if peer is None:                # in-process callers (tests, tools) are not peers
            return True
        if peer.uid in cfg.uids("admin_uids"):
            return True
        gids = cfg.gids("admin_gids")
        return peer.gid in gids or any(g in gids for g in peer.groups)

    @staticmethod
    def may_load(cfg, peer, name):
        if cfg.auto_load or name == cfg.default_model:
            return True
        allowed_uids, allowed_gids = cfg.auto_load_ids(name)
        return peer.uid in allowed_uids or peer.gid in allowed_gids or \
            any(g in allowed_gids for g in peer.groups)

    def check(self, cfg, registry, peer, name):
        """Raise ModelNotLoaded / SwapRateLimited when `peer` may not make `name` load now."""
        lm = registry.models.get(name)
        if lm is not None and not lm.draining or self.is_admin(cfg, peer):
            return
        if not self.may_load(cfg, peer, name):
            raise ModelNotLoaded(
                f"model {name!r} is not loaded, and uid {peer.uid} may not cause it to be loaded "
                "(config keys auto_load and auto_load_allow; an admin can load it with "
                "POST /v1/models/load)")
        live = sum(1 for m in registry.models.values() if not m.draining)
        if live < cfg.max_loaded_models:
            return                      # room without unloading anything: not a swap
        now = self.clock()
        if self.last_swap is not None and now - self.last_swap < cfg.swap_interval:
            wait = cfg.swap_interval - (now - self.last_swap)
            raise SwapRateLimited(f"loading model {name!r} would swap models again {now - self.last_swap:.1f}s "
                                  f"after the last swap a request caused; swap_interval is "
                                  f"{cfg.swap_interval:g}s", retry_after=max(1, math.ceil(wait)))
        self.last_swap = now
