"""Every session a model holds (the prompt cache, a prompt list's prompts, the copies n > 1
makes) is counted in its memory plan, and no request makes more (issue 41.6): before, each
prompt of a list left an idle KV cache behind, without a cap (RSS 269 -> 1,304 MB, still so
when idle, while /v1/models reported 236 MB)."""
import threading

import pytest

from conftest import testdata
from daemon_support import can_generate, model_dir, running, signing_key

SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
MiB = 1 << 20


def _status_kib(pid, field):
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field}")


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    if not can_generate():
        pytest.skip("this checkout cannot generate")
    key, trusted = signing_key(tmp_path_factory)
    return model_dir(tmp_path_factory.mktemp("sessions"), key, {"smol": testdata("models", SMOL)}), trusted


def test_prompt_lists_and_n_choices_stay_inside_the_memory_plan(tmp_path, smol):
    """Two clients at once send prompt lists of 6 and n = 3 requests, six rounds each: every
    request is answered in full, /v1/models reports the same plan within memory_budget
    throughout, and the daemon's peak RSS grows by less than one more session than the plan
    counts (a session of ctx_size 2048 is about 67 MB here; before, each round left six)."""
    from edged.engine.model import Model
    models, trusted = smol
    with Model.load(testdata("models", SMOL), n_ctx_plan=2048, n_threads=1) as m:
        weights = m.memory_plan.weights
    budget = 400 * MiB
    extra = {"ctx_size": 2048, "n_parallel": 2, "memory_budget": budget, "max_queue": 8}
    with running(tmp_path, models, trusted, default_model="smol", extra=extra) as srv:
        status, _, listing = srv.request("GET", "/v1/models")
        entry = next(m for m in listing["data"] if m["id"] == "smol")
        plan = entry["memory"]
        session = (plan - weights) // extra["n_parallel"]      # KV cache and scratch
        assert plan <= budget and session > 40 * MiB, entry
        assert srv.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})[0] == 200
        base = _status_kib(srv.proc.pid, "VmRSS") * 1024
        failures, plans = [], []

        def client(i):
            for r in range(6):
                if (i + r) % 2:
                    body = {"prompt": [f"Story {i}.{r}.{k}: once" for k in range(6)], "max_tokens": 3}
                    want = 6
                else:
                    body = {"prompt": f"Tell me about {i}.{r}", "max_tokens": 3, "n": 3, "temperature": 1.0,
                            "seed": r}
                    want = 3
                status, _, out = srv.request("POST", "/v1/completions", body)
                if status != 200 or len(out["choices"]) != want:
                    failures.append((status, out))
                plans.append(next(m for m in srv.request("GET", "/v1/models")[2]["data"]
                                  if m["id"] == "smol")["memory"])

        threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not failures, failures[:3]
        assert set(plans) == {plan}
        grown = _status_kib(srv.proc.pid, "VmHWM") * 1024 - base
        idle = _status_kib(srv.proc.pid, "VmRSS") * 1024 - base
        # the plan counts n_parallel sessions; one exists since the warm-up
        assert grown < (extra["n_parallel"] - 1) * session + session, (grown / MiB, session / MiB)
        assert idle < (extra["n_parallel"] - 1) * session + session // 2, (idle / MiB, session / MiB)
