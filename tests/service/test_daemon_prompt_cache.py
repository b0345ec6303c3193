"""The prompt cache on disk (service/prompt_store.py): a conversation's prefix survives a daemon
restart, a damaged file is refused with one log line and recomputed, a full disk costs only the
file, a kill -9 during a write leaves no file, and the daemon keeps serving throughout."""
import os
import re
import shutil
import signal
import time

import pytest

from conftest import ROOT
from daemon_support import Server, alpha_beta_models, openai_client
from small_fs import small_tmpfs

SYSTEM = ("You are a storyteller. " * 12).strip()       # > SPILL_MIN_TOKENS tokens


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return alpha_beta_models(tmp_path_factory, "pcache")


def chat(srv, messages):
    """The conversation sent by the openai SDK: (reply, usage as a dict)."""
    with openai_client(srv.socket) as client:
        r = client.chat.completions.create(model="alpha", messages=messages, max_tokens=6,
                                           temperature=0)
    return r.choices[0].message.content, r.usage.model_dump(exclude_none=True)


def cached(usage):
    return usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)


def metric(srv, name):
    _, _, text = srv.request("GET", "/metrics")
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def start(tmp_path, models, cache, env=None, **extra):
    return Server(tmp_path, *models, default_model="alpha", env=env,
                  extra={"cache_dir": str(cache), "ctx_size": 512, **extra})


@pytest.mark.parametrize("sandbox", ["off", "enforce"])   # enforce: Landlock grants cache_dir
def test_conversation_prefix_survives_a_restart_and_a_bad_file_is_recomputed(tmp_path, models, sandbox):
    cache = tmp_path / "cache"
    conv = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Tell me a story."}]
    srv = start(tmp_path, models, cache, sandbox=sandbox)
    try:
        first, usage = chat(srv, conv)
        assert cached(usage) == 0
    finally:
        assert srv.stop() == 0, srv.logtext()      # SIGTERM: the idle session is spilled
    files = [f for f in os.listdir(cache) if f.endswith(".edkv")]
    assert len(files) == 1 and (cache / "cache.key").stat().st_mode & 0o777 == 0o600

    srv = start(tmp_path, models, cache, sandbox=sandbox)
    try:
        again, usage = chat(srv, conv)             # the same conversation after the restart
        assert again == first
        n_prompt = usage["prompt_tokens"]
        assert cached(usage) == n_prompt - 1
        # the request's log line: only the last prompt token was evaluated (for its logits)
        assert re.search(rf"prompt_tokens={n_prompt} cached_tokens={n_prompt - 1} prompt_eval=1 ",
                         srv.logtext()), srv.logtext()
        assert metric(srv, "edged_prompt_cache_disk_hits_total") == 1
        assert metric(srv, "edged_prompt_cache_load_seconds_total") > 0
        assert "tokens of " in srv.logtext() and "restored" in srv.logtext()
        # the conversation goes on: its earlier turns come from memory now
        more, usage = chat(srv, conv + [{"role": "assistant", "content": again},
                                        {"role": "user", "content": "And then?"}])
        assert cached(usage) >= n_prompt - 8
    finally:
        assert srv.stop() == 0, srv.logtext()

    for f in os.listdir(cache):                     # damage every file in the middle
        if f.endswith(".edkv"):
            data = bytearray((cache / f).read_bytes())
            data[len(data) // 2] ^= 1
            (cache / f).write_bytes(bytes(data))
    srv = start(tmp_path, models, cache, sandbox=sandbox)
    try:
        recomputed, usage = chat(srv, conv)
        assert recomputed == first                  # nothing served from the bad file
        assert cached(usage) == 0
        assert re.search(r"prompt cache: \w+\.edkv refused \(HMAC does not verify", srv.logtext())
        assert metric(srv, 'edged_prompt_cache_files_total{event="refused"}') >= 1
        srv.assert_serving()
    finally:
        assert srv.stop() == 0, srv.logtext()


def test_a_full_cache_filesystem_costs_the_file_not_the_service(tmp_path, models):
    with small_tmpfs(tmp_path / "small") as cache:
        srv = start(tmp_path, models, cache, n_parallel=1)
        try:
            conv = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi."}]
            chat(srv, conv)
            # an unrelated prompt evicts the idle session: its ~300 KB do not fit 64 KB
            chat(srv, [{"role": "system", "content": "Be brief. " * 20}, {"role": "user", "content": "Yo"}])
            assert re.search(r"prompt cache: cannot write \w+\.edkv \(\d+ tokens\): No space left",
                             srv.logtext())
            assert metric(srv, 'edged_prompt_cache_files_total{event="write_failed"}') >= 1
            assert [f for f in os.listdir(cache) if f != "cache.key"] == []   # nothing partial
            srv.assert_serving()
            chat(srv, conv)
        finally:
            assert srv.stop() == 0, srv.logtext()


def test_cache_max_bytes_removes_the_least_recently_used(tmp_path, models):
    cache = tmp_path / "cache"
    srv = start(tmp_path, models, cache, cache_max_bytes=150_000)
    try:
        for topic in ("dragons", "ships", "bees"):
            chat(srv, [{"role": "system", "content": f"Tell stories about {topic}. " * 8},
                       {"role": "user", "content": "Go."}])
        files = [cache / f for f in os.listdir(cache) if f.endswith(".edkv")]
        assert len(files) == 1 and files[0].stat().st_size <= 150_000    # ~105 KB each
        assert metric(srv, 'edged_prompt_cache_files_total{event="evicted"}') == 1
        assert "over cache_max_bytes 150000" in srv.logtext()
    finally:
        assert srv.stop() == 0, srv.logtext()


def test_named_prefix_admin_routes_save_restore_erase(tmp_path, models):
    cache = tmp_path / "cache"
    system = [{"role": "system", "content": SYSTEM}]
    srv = start(tmp_path, models, cache)
    try:
        status, _, r = srv.request("POST", "/v1/prefixes/save",
                                   {"model": "alpha", "name": "story-v1", "messages": system})
        assert status == 200, r
        n = r["tokens"]
        assert n > 64 and (cache / "named-story-v1.edkv").stat().st_size == r["bytes"]
        status, _, r = srv.request("GET", "/v1/prefixes")
        assert r["data"] == [{"name": "story-v1", "tokens": n, "bytes": r["data"][0]["bytes"]}]
        for body, code in (({"name": "../x", "model": "alpha", "prompt": "a"}, 400),
                           ({"name": "nope", "model": "alpha"}, 404)):
            path = "/v1/prefixes/save" if "prompt" in body else "/v1/prefixes/restore"
            status, _, r = srv.request("POST", path, body)
            assert status == code, r
    finally:
        assert srv.stop() == 0, srv.logtext()
    srv = start(tmp_path, models, cache)
    try:
        status, _, r = srv.request("POST", "/v1/prefixes/restore", {"model": "alpha", "name": "story-v1"})
        assert status == 200 and r["tokens"] == n, r
        _, usage = chat(srv, system + [{"role": "user", "content": "Go on."}])
        assert cached(usage) >= n
        assert srv.request("POST", "/v1/prefixes/erase", {"name": "story-v1"})[0] == 200
        assert not (cache / "named-story-v1.edkv").exists()
        assert srv.request("POST", "/v1/prefixes/erase", {"name": "story-v1"})[0] == 404
    finally:
        assert srv.stop() == 0, srv.logtext()


def test_prefix_routes_are_admin_only(tmp_path):
    import asyncio
    from daemon_support import make_daemon
    from edged.service.wire import ApiRequest, Peer
    d = make_daemon(tmp_path, admin_uids=[4242], allow_uids=[1000], cache_dir=str(tmp_path / "c"))
    peer = Peer(1, 1000, 1000)
    for method, path in (("POST", "/v1/prefixes/save"), ("POST", "/v1/prefixes/erase"),
                         ("GET", "/v1/prefixes")):
        r = asyncio.run(d.api.handle(ApiRequest(method, path, b"{}", peer=peer)))
        assert r.status == 403, (path, r.body)
    r = asyncio.run(d.api.handle(ApiRequest("GET", "/v1/prefixes", peer=Peer(1, 4242, 4242))))
    assert r.status == 200 and r.body == {"object": "list", "data": []}


# A daemon that stops inside its spill at SIGTERM: os.fsync of a prompt-cache file's temporary
# (every byte written, not yet renamed) marks MARK and waits to be killed.
STALL = '''
import os, time
_fsync = os.fsync
def _stall(fd):
    if ".edkv." in os.readlink(f"/proc/self/fd/{fd}"):
        open(os.environ["EDGED_TEST_STALL_MARK"], "w").close()
        while True:
            time.sleep(1)
    _fsync(fd)
os.fsync = _stall
'''


def test_kill_9_during_a_spill_leaves_no_file_and_the_next_start_serves(tmp_path, models):
    cache, hook, mark = tmp_path / "cache", tmp_path / "hook", tmp_path / "writing"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(STALL)
    conv = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Tell me a story."}]
    srv = start(tmp_path, models, cache, env={"PYTHONPATH": f"{hook}:{ROOT}",
                                              "EDGED_TEST_STALL_MARK": str(mark)})
    try:
        first, _ = chat(srv, conv)
        srv.proc.send_signal(signal.SIGTERM)        # the drain spills the idle session ...
        deadline = time.monotonic() + 120
        while not mark.exists():
            assert srv.proc.poll() is None and time.monotonic() < deadline, srv.logtext()
            time.sleep(0.05)
    finally:
        assert srv.stop(signal.SIGKILL) == -signal.SIGKILL       # ... and is killed inside it
    left = os.listdir(cache)
    assert not [f for f in left if f.endswith(".edkv")]          # no file under its real name
    tmp = [f for f in left if f.startswith(".") and f.endswith(".tmp")]
    assert len(tmp) == 1

    srv = start(tmp_path, models, cache)
    try:
        assert f"prompt cache: removed {tmp[0]} (a temporary file left by an interrupted write)" \
            in srv.logtext()
        again, usage = chat(srv, conv)
        assert again == first and cached(usage) == 0
        assert sorted(os.listdir(cache)) == ["cache.key"]
    finally:
        assert srv.stop() == 0, srv.logtext()
    assert len([f for f in os.listdir(cache) if f.endswith(".edkv")]) == 1   # spilled this time


@pytest.fixture(scope="module")
def saved_cache(tmp_path_factory, models):
    """A cache_dir holding one conversation's file, and that conversation's first reply."""
    tmp = tmp_path_factory.mktemp("pcache-saved")
    srv = start(tmp, models, tmp / "cache")
    try:
        reply, _ = chat(srv, [{"role": "system", "content": SYSTEM},
                              {"role": "user", "content": "Tell me a story."}])
    finally:
        assert srv.stop() == 0, srv.logtext()
    return tmp / "cache", reply


def _other_key(cache):
    (cache / "cache.key").write_bytes(os.urandom(32))


def _truncate(cache):
    f = next(cache.glob("*.edkv"))
    f.write_bytes(f.read_bytes()[:-100])


def _key_mode(cache):
    (cache / "cache.key").chmod(0o644)


# (name, damage, environment, what the log says); another cache type, context size, model or
# build: tests/engine/test_engine_statefile.py (the test models' heads are too small for q8_0)
REFUSALS = [
    ("another key", _other_key, {}, r"prompt cache: \w+\.edkv refused \(HMAC does not verify "
                                    r"\(the file was altered, or written with another key\)\)"),
    ("truncated", _truncate, {}, r"prompt cache: \w+\.edkv refused \(file is \d+ bytes, its header "
                                 r"describes \d+ \(\d+ tokens\): truncated or padded\)"),
    ("another kernel path", None, {"EDGED_KERNELS": "generic"},
     r"prompt cache: \w+\.edkv refused \(the file's kernel_path '\w+' differs from this "
     r"session's 'generic'\)"),
    ("key readable by others", _key_mode, {},
     r"prompt cache on disk off: cache_dir \S+: prompt-cache key \S+/cache.key: mode 0644, "
     r"owner \d+: must be 0600"),
]


@pytest.mark.parametrize("name,damage,env,logged", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_each_refusal_is_logged_recomputed_and_the_daemon_keeps_serving(
        tmp_path, models, saved_cache, name, damage, env, logged):
    cache = tmp_path / "cache"
    shutil.copytree(saved_cache[0], cache)
    if damage:
        damage(cache)
    if env and os.environ.get("EDGED_KERNELS") == "generic":
        pytest.skip("the file was written on the generic path already")
    srv = start(tmp_path, models, cache, env=env)
    try:
        reply, usage = chat(srv, [{"role": "system", "content": SYSTEM},
                                  {"role": "user", "content": "Tell me a story."}])
        assert cached(usage) == 0                   # recomputed: nothing served from the file
        assert reply == saved_cache[1]
        assert re.search(logged, srv.logtext()), srv.logtext()
        assert not metric(srv, "edged_prompt_cache_disk_hits_total")
        srv.assert_serving()
        chat(srv, [{"role": "user", "content": "Another one."}])
    finally:
        assert srv.stop() == 0, srv.logtext()


def test_the_unit_makes_the_cache_its_one_data_directory():
    """Under ProtectSystem=strict the unit's writable paths are the ones it names: the socket's
    RuntimeDirectory, the cache's StateDirectory (0700, the daemon's $STATE_DIRECTORY,
    which an unset cache_dir means) and a private /tmp, nothing else."""
    settings = {}
    with open(os.path.join(ROOT, "systemd", "edged.service")) as f:
        for line in f:
            key, eq, value = line.strip().partition("=")
            if eq and not key.startswith("#"):
                settings.setdefault(key, []).append(value)
    assert settings["ProtectSystem"] == ["strict"] and settings["PrivateTmp"] == ["yes"]
    assert settings["StateDirectory"] == ["edged/cache"] and settings["StateDirectoryMode"] == ["0700"]
    writable = {"ReadWritePaths", "StateDirectory", "CacheDirectory", "LogsDirectory",
                "RuntimeDirectory", "ConfigurationDirectory"} & set(settings)
    assert writable == {"StateDirectory", "RuntimeDirectory"}
    example = open(os.path.join(ROOT, "systemd", "edged.toml.example")).read()
    assert '\n#cache_dir = ""\n' in example


def test_landlock_grants_the_cache_dir_and_nothing_else_to_write(tmp_path):
    """`edged serve --check-sandbox` with cache_dir unset under systemd ($STATE_DIRECTORY): the
    Landlock policy's writable directories are the socket's and the cache's; a write beside
    them is denied. (The daemon writing its cache under Landlock: test_conversation_...)"""
    import subprocess
    import sys
    from daemon_support import to_toml
    from edged.service import sandbox
    models, keys, run, state = (tmp_path / d for d in ("models", "keys", "run", "state"))
    for d in (models, keys, run, state):
        d.mkdir()
    cfg = tmp_path / "edged.toml"
    cfg.write_text(to_toml({"socket": str(run / "edged.sock"), "models_dir": str(models),
                            "trusted_keys": str(keys), "socket_group": "", "sandbox": "enforce"}))
    p = subprocess.run([sys.executable, "-m", "edged", "serve", "--config", str(cfg),
                        "--check-sandbox"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT, OPENBLAS_NUM_THREADS="1",
                                STATE_DIRECTORY=str(state)))
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"  read-write: {run}, {state}\n" in p.stdout
    assert os.listdir(state) == []              # the check makes no key
    if sandbox.landlock_abi():
        assert "probe: write outside allowed dirs: denied (EACCES)" in p.stdout
