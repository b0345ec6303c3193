"""Metrics for GET /metrics, on a prometheus_client registry of the daemon's own (never the
library's global one: two daemons in one test process count apart).

- The daemon's plain numbers (counters and gauges updated on its event loop and decode thread
  without locks) become metric families at each scrape (`render`).
- Latency histograms, by model and route (the HTTP path of the request, whatever its wire
  protocol): time to first token and request duration, both from the request's arrival (the
  queue included), and time per output token (the mean gap between a request's tokens after
  its first), observed once per generation when it ends (jobs.Generation.close).
- The process's own figures from prometheus_client's ProcessCollector (Linux /proc):
  process_resident_memory_bytes, process_open_fds, process_cpu_seconds_total, ...

Everything is written in the Prometheus text exposition format (version 0.0.4)."""
import collections
import time

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..text import grammar
from .prompt_store import metric_families

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# seconds; from a fast x86 box with a tiny model to a busy Pi with a 1.5B one
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2.5)
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class _Families:
    """The collector of the plain numbers: the families `render` built for this scrape."""

    def __init__(self):
        self.families = []

    def collect(self):
        return self.families


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=False)
        self._families = _Families()
        self.registry.register(self._families)
        ProcessCollector(registry=self.registry)        # reads /proc/self: allowed by the sandbox
        labels = ("model", "route")
        self.ttft = Histogram("edged_time_to_first_token_seconds",
                              "Seconds from a request's arrival (queue included) to its first token.",
                              labels, registry=self.registry, buckets=TTFT_BUCKETS)
        self.tpot = Histogram("edged_time_per_output_token_seconds",
                              "Mean seconds between a request's output tokens after its first.",
                              labels, registry=self.registry, buckets=TPOT_BUCKETS)
        self.duration = Histogram("edged_request_duration_seconds",
                                  "Seconds from a generation request's arrival (queue included) to "
                                  "its last token.", labels, registry=self.registry,
                                  buckets=DURATION_BUCKETS)
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
        self.prompt_cache = {}                         # the prompt cache on disk: prompt_store.py
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

    def generation(self, model, route, queued, ttft, n_gen, elapsed):
        """A generation ended: `queued` seconds in the queue, then `elapsed` seconds (its first
        token `ttft` seconds in, None when there was none) for `n_gen` tokens (of its longest
        choice: the choices of n > 1 decode side by side)."""
        self.duration.labels(model, route).observe(queued + elapsed)
        if ttft is not None:
            self.ttft.labels(model, route).observe(queued + ttft)
            if n_gen > 1:
                self.tpot.labels(model, route).observe((elapsed - ttft) / (n_gen - 1))

    def render(self, queue_depth, in_flight, loaded, slots):
        """The text of a scrape; `loaded`: {name: LoadedModel} of the models loaded (not draining)."""
        families = self._families.families = []

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
        metric("edged_model_bytes", "gauge",
               "Memory a loaded model takes: weights, and KV cache and scratch of its n_parallel slots.",
               [({"model": name}, lm.size) for name, lm in sorted(loaded.items())])
        kv_caches = {name: lm.kv_cache() for name, lm in loaded.items()}
        metric("edged_model_kv_cache_bytes", "gauge",
               "KV cache bytes of one generation slot, by model and K/V storage type.",
               [({"model": n, "type_k": kv["type_k"], "type_v": kv["type_v"]}, kv["bytes_per_slot"])
                for n, kv in sorted(kv_caches.items())])
        metric("edged_peer_refused_total", "counter", "Connections refused by the peer-credential check.",
               [({}, self.peer_refused)])
        metric("edged_connections_refused_total", "counter",
               "Connections closed right after accept, by reason (max_connections, "
               "max_connections_per_uid, accept_EMFILE, ...).",
               [({"reason": k}, v) for k, v in sorted(self.connections_refused.items())])
        metric("edged_connections_open", "gauge", "Open client connections.", [({}, self.connections_open)])
        metric("edged_grammar_compiles_abandoned_total", "counter",
               "Grammar compiles given up after grammar.COMPILE_SECONDS (their threads run on).",
               [({}, grammar.ABANDONED[0])])
        for family in metric_families(self.prompt_cache):
            metric(*family)
        metric("edged_uptime_seconds", "gauge", "Seconds since start.", [({}, time.time() - self.started)])
        return generate_latest(self.registry).decode()
