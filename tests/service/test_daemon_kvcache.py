"""The daemon's cache_type_k / cache_type_v: every model it loads gets that KV cache, and
/v1/models, `edged ps` and /metrics report it (types and bytes per slot)."""
import asyncio
import json
import os
import shutil

import pytest

from conftest import ROOT
from daemon_support import make_daemon
from edged.service.wire import ApiRequest

pytest.importorskip("edged._core")

KVQ = os.path.join(ROOT, "tests", "data", "goldens", "synthetic-kv-q8_0.gguf")  # head_dim 32


def test_daemon_serves_with_a_quantized_cache_and_reports_it(tmp_path):
    from edged.engine.model import Model
    sizes = {}
    for ck, cv in (("f16", "f16"), ("q8_0", "q4_0")):
        where = tmp_path / ck
        where.mkdir()
        d = make_daemon(where, default_model="kvq", cache_type_k=ck, cache_type_v=cv)
        shutil.copy(KVQ, where / "models" / "kvq.gguf")
        d.start_threads()

        async def main():
            body = {"prompt": "hello there", "max_tokens": 5, "temperature": 0}
            r = await d.api.handle(ApiRequest("POST", "/v1/completions", json.dumps(body).encode()))
            assert r.status == 200 and r.body["usage"]["completion_tokens"] >= 1
            listing = (await d.api.handle(ApiRequest("GET", "/v1/models", b""))).body
            text = (await d.api.handle(ApiRequest("GET", "/metrics", b""))).body
            await d.registry.close_all()
            return listing["data"][0]["kv_cache"], listing["data"][0]["memory"], text

        try:
            kv, memory, text = asyncio.run(main())
        finally:
            d.decoder.stop()
        with Model.load(KVQ, n_threads=1, cache_type_k=ck, cache_type_v=cv) as m:
            assert kv == {"type_k": ck, "type_v": cv, "bytes_per_slot": m.plan(128).kv_cache}
        assert (f'edged_model_kv_cache_bytes{{model="kvq",type_k="{ck}",type_v="{cv}"}} '
                f'{float(kv["bytes_per_slot"])}') in text
        sizes[ck] = (kv["bytes_per_slot"], memory)
    # the quantized slot is smaller, and the model's memory (what the budget counts) by as much
    saved = sizes["f16"][0] - sizes["q8_0"][0]
    assert saved > 0 and sizes["f16"][1] - sizes["q8_0"][1] == saved
