"""Counters and gauges for GET /metrics. The daemon keeps plain numbers (updated on its event
loop and decode thread without locks); each scrape turns them into metric families that
prometheus-client writes in the Prometheus text exposition format (version 0.0.4)."""
import collections
import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Scrape:
    """A collector of one scrape's families (registered in a registry of its own)."""

    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


class Metrics:
    def __init__(self):
        self.started = time.time()
        self.requests = collections.Counter()          # (route, status) -> n
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.generation_seconds = 0.0                  # wall time spent decoding (sum over requests)
        self.last_tokens_per_second = 0.0
        self.loads = collections.Counter()             # outcome -> n
        self.load_seconds = {"verify": 0.0, "map": 0.0, "warmup": 0.0, "total": 0.0}
        self.swap_count = 0
        self.swap_seconds = 0.0
        self.last_swap_seconds = 0.0
        self.peer_refused = 0
        self.connections_refused = collections.Counter()   # reason -> n (closed right after accept)
        self.connections_open = 0
        self.batch_steps = 0                           # batched decode passes (decode thread)
        self.batch_rows = 0                            # tokens decoded in them
        self.draft_tokens = 0                          # speculative decoding: tokens drafted
        self.draft_accepted = 0                        # ... and accepted

    def drafted(self, n, accepted):
        self.draft_tokens += n
        self.draft_accepted += accepted

    def request(self, route, status):
        self.requests[(route, int(status))] += 1

    def tokens(self, n_prompt, n_gen, seconds):
        self.prompt_tokens += n_prompt
        self.generated_tokens += n_gen
        self.generation_seconds += seconds
        if seconds > 0 and n_gen:
            self.last_tokens_per_second = n_gen / seconds

    def render(self, queue_depth, in_flight, loaded, slots, kv_caches=None):
        """kv_caches: {model: LoadedModel.kv_cache()} of the loaded models."""
        families = []

        def metric(name, kind, help_, samples):
            labels = list(dict.fromkeys(k for lab, _ in samples for k in lab))
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, help_, labels=labels)
            for lab, value in samples:
                family.add_metric([str(lab[k]) for k in labels], value)
            families.append(family)

        metric("edged_requests_total", "counter", "HTTP requests by route and status.",
               [({"route": r, "status": s}, n) for (r, s), n in sorted(self.requests.items())])
        metric("edged_prompt_tokens_total", "counter", "Prompt tokens processed.", [({}, self.prompt_tokens)])
        metric("edged_generated_tokens_total", "counter", "Tokens generated.", [({}, self.generated_tokens)])
        metric("edged_generation_seconds_total", "counter", "Seconds spent generating (sum over requests).",
               [({}, self.generation_seconds)])
        metric("edged_tokens_per_second", "gauge", "Generation speed of the last finished request.",
               [({}, self.last_tokens_per_second)])
        metric("edged_queue_depth", "gauge", "Requests waiting for a generation slot.", [({}, queue_depth)])
        metric("edged_requests_in_flight", "gauge", "Requests holding a generation slot.", [({}, in_flight)])
        metric("edged_slots", "gauge", "Generation slots (n_parallel).", [({}, slots)])
        metric("edged_batched_decode_steps_total", "counter",
               "Forward passes that decoded several streams together (continuous batching).",
               [({}, self.batch_steps)])
        metric("edged_batched_decode_tokens_total", "counter", "Tokens decoded in those passes.",
               [({}, self.batch_rows)])
        metric("edged_draft_tokens_total", "counter", "Tokens drafted by speculative decoding.",
               [({}, self.draft_tokens)])
        metric("edged_draft_accepted_tokens_total", "counter", "Drafted tokens that were accepted.",
               [({}, self.draft_accepted)])
        metric("edged_model_loads_total", "counter", "Model loads by outcome.",
               [({"outcome": k}, v) for k, v in sorted(self.loads.items())])
        metric("edged_model_load_seconds_total", "counter",
               "Seconds spent loading models, by phase (verify = signature check, map = mapping and "
               "validation, warmup).",
               [({"phase": k}, v) for k, v in self.load_seconds.items()])
        metric("edged_model_swaps_total", "counter", "Model swaps (an unload to make room for a load).",
               [({}, self.swap_count)])
        metric("edged_model_swap_seconds_total", "counter", "Seconds from swap start to the new model ready.",
               [({}, self.swap_seconds)])
        metric("edged_model_last_swap_seconds", "gauge", "Duration of the last swap.", [({}, self.last_swap_seconds)])
        metric("edged_model_loaded", "gauge", "1 for each loaded model.",
               [({"model": name}, 1) for name in loaded])
        metric("edged_model_kv_cache_bytes", "gauge",
               "KV cache bytes of one generation slot, by model and K/V storage type.",
               [({"model": n, "type_k": kv["type_k"], "type_v": kv["type_v"]}, kv["bytes_per_slot"])
                for n, kv in sorted((kv_caches or {}).items())])
        metric("edged_peer_refused_total", "counter", "Connections refused by the peer-credential check.",
               [({}, self.peer_refused)])
        metric("edged_connections_refused_total", "counter",
               "Connections closed right after accept, by reason (max_connections, "
               "max_connections_per_uid, accept_EMFILE, ...).",
               [({"reason": k}, v) for k, v in sorted(self.connections_refused.items())])
        metric("edged_connections_open", "gauge", "Open client connections.", [({}, self.connections_open)])
        metric("edged_uptime_seconds", "gauge", "Seconds since start.", [({}, time.time() - self.started)])
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Scrape(families))
        return generate_latest(registry).decode()
