"""GET /metrics as Prometheus scrapes it (issue 43.8): a real daemon with its sandbox on, a
streamed and a non-streamed request, then the text parsed by prometheus_client's own parser:
the latency histograms counted them under the right model and route, the process metrics
(ProcessCollector, read through the sandbox) are there, and the sample Grafana dashboard asks
only for metrics the daemon exports. The queue depth gauge, with requests held waiting for a
slot, through the handler without a socket."""
import asyncio
import json
import os
import re

import pytest

from conftest import ROOT
from daemon_support import ONCE, alpha_beta_models, make_daemon, running
from edged.service.wire import ApiRequest

parser = pytest.importorskip("prometheus_client.parser")
HISTOGRAMS = ("edged_time_to_first_token_seconds", "edged_time_per_output_token_seconds",
              "edged_request_duration_seconds")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return alpha_beta_models(tmp_path_factory, "metrics")


def scrape(srv):
    status, headers, text = srv.request("GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return {f.name: f for f in parser.text_string_to_metric_families(text)}, text


def count(families, name, **labels):
    """The _count sample of histogram `name` with `labels` (0 when absent)."""
    return sum(s.value for s in families[name].samples
               if s.name == name + "_count" and all(s.labels.get(k) == v for k, v in labels.items()))


def test_histograms_count_streamed_and_plain_requests_by_model_and_route(tmp_path, models):
    with running(tmp_path, *models, default_model="alpha", extra={"sandbox": "enforce"}) as srv:
        before, _ = scrape(srv)
        chat = {"model": "alpha", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6,
                "temperature": 0}
        assert srv.request("POST", "/v1/chat/completions", chat)[0] == 200
        status, _, body = srv.request("POST", "/v1/completions", {"model": "alpha", "prompt": ONCE, "stream": True,
                                                                  "max_tokens": 6, "temperature": 0})
        assert status == 200 and body.endswith("data: [DONE]\n\n")
        status, _, body = srv.request("POST", "/api/chat", {"model": "alpha", "stream": False, "options": {
            "num_predict": 3}, "messages": [{"role": "user", "content": "Hi"}]})
        assert status == 200, body
        after, text = scrape(srv)
        assert count(after, "edged_request_duration_seconds", model="alpha", route="/api/chat") == \
            count(before, "edged_request_duration_seconds", model="alpha", route="/api/chat") + 1
        for name in HISTOGRAMS:
            assert after[name].type == "histogram"
            for route in ("/v1/chat/completions", "/v1/completions"):
                assert count(after, name, model="alpha", route=route) == \
                    count(before, name, model="alpha", route=route) + 1, (name, route, text)
        ttft = {s.labels["route"]: s.value for s in after["edged_time_to_first_token_seconds"].samples
                if s.name.endswith("_sum")}
        dur = {s.labels["route"]: s.value for s in after["edged_request_duration_seconds"].samples
               if s.name.endswith("_sum")}
        assert all(0 < ttft[r] <= dur[r] for r in ttft)
        value = {s.name: s for f in after.values() for s in f.samples}
        assert value["process_resident_memory_bytes"].value > 10 << 20         # read under the sandbox
        assert value["process_open_fds"].value >= 3 and value["process_cpu_seconds_total"].value > 0
        assert [s.value for s in after["edged_model_bytes"].samples if s.labels == {"model": "alpha"}][0] > 0
        assert value["edged_queue_depth"].value == 0
        # the names operators already scrape are still there
        for name in ("edged_requests", "edged_generated_tokens", "edged_model_loaded", "edged_uptime_seconds"):
            assert name in after, name
        assert "sandbox: enforce (Landlock" in srv.logtext()


def test_grafana_dashboard_asks_for_exported_metrics(tmp_path, models):
    with open(os.path.join(ROOT, "packaging", "grafana", "edged.json")) as f:
        dash = json.load(f)
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    assert all(w in titles for w in ("first token", "tokens/s", "queue", "rss")), titles
    with running(tmp_path, *models, default_model="alpha") as srv:
        srv.request("POST", "/v1/completions", {"prompt": ONCE, "max_tokens": 2})
        families, text = scrape(srv)
    exported = {s.name for f in families.values() for s in f.samples}
    asked = {m for e in exprs for m in re.findall(r"\b((?:edged|process)_[a-z_]+)", e)}
    assert asked and asked <= exported, asked - exported
    assert any("histogram_quantile(0.95" in e for e in exprs) and any("histogram_quantile(0.5" in e for e in exprs)


def test_queue_depth_counts_requests_waiting_for_a_slot(tmp_path):
    """Every slot taken and two more requests waiting: the scrape says 2 queued, n in flight;
    once the waiters give up, 0 queued again."""
    d = make_daemon(tmp_path, n_parallel=2, max_queue=4)

    async def gauges():
        reply = await d.api.handle(ApiRequest("GET", "/metrics", b"", None))
        return {s.name: s.value for f in parser.text_string_to_metric_families(reply.body) for s in f.samples}

    async def scenario():
        for _ in range(2):
            await d.slots.acquire(timeout=10)
        waiters = [asyncio.create_task(d.slots.acquire(timeout=60)) for _ in range(2)]
        while d.slots.waiting < 2:
            await asyncio.sleep(0)
        during = await gauges()
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        return during, await gauges()

    during, after = asyncio.run(scenario())
    assert during["edged_queue_depth"] == 2 and during["edged_requests_in_flight"] == 2 and during["edged_slots"] == 2
    assert after["edged_queue_depth"] == 0
