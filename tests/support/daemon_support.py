"""Helpers for tests/test_daemon_*.py and tests/test_hardening_*.py: a real `edged serve`
subprocess on a socket in a temp dir, a Daemon in this process for handler tests, a real sd_notify datagram socket, signed model directories,
a tiny stdlib HTTP client, and the concurrent aiohttp client and SSE parsing the tests share."""
import asyncio
import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import ROOT, testdata

TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
ONCE = "Once upon a time"     # stories260K's greedy continuation is ", there was a little girl named Lily"
_KEY = {}


def signing_key(tmp_path_factory):
    """(private key, trusted-keys dir) generated once per session."""
    if not _KEY:
        from edged.trust.sign import generate_key, public_pem
        key = generate_key(2048)
        d = tmp_path_factory.mktemp("trusted")
        os.chmod(d, 0o755)
        (d / "test.pem").write_bytes(public_pem(key))
        _KEY["key"], _KEY["dir"] = key, str(d)
    return _KEY["key"], _KEY["dir"]


def add_chat_template(src, dst, template=TEMPLATE, skip=(), add=None):
    """Copy a GGUF file adding tokenizer.chat_template (the test models have none); keys
    starting with one of `skip` are left out, `add(writer)` adds more."""
    import gguf
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for name, field in r.fields.items():
        if name.startswith(("GGUF.", *skip)) or name == "general.architecture":
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, field.contents(), vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(name, field.contents(), vtype)
    if add:
        add(w)
    w.add_key_value("tokenizer.chat_template", template, gguf.GGUFValueType.STRING)
    for t in r.tensors:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in r.tensors:
        w.write_tensor_data(t.data)
    w.close()


def make_daemon(tmp_path, **over):
    """A Daemon in this process over tmp_path/models (unsigned models allowed, small limits),
    prepared without a socket: tests call its handlers (d.api.handle) directly."""
    from edged.service import config
    from edged.service.daemon import Daemon
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    values = {"models_dir": str(models), "require_signature": False, "trusted_keys": str(tmp_path / "none"),
              "ctx_size": 128, "max_body_bytes": 4096}
    values.update(over)
    d = Daemon(config.load(None, values))
    d.prepare(None)
    return d


def model_dir(tmp_path, key, models):
    """A model directory with models {NAME: source file}, each copied with a chat template
    and signed (appended signature) by `key`."""
    from edged.trust.sign import sign_file
    d = tmp_path / "models"
    d.mkdir(exist_ok=True)
    os.chmod(d, 0o755)
    for name, src in models.items():
        dst = d / f"{name}.gguf"
        add_chat_template(src, str(dst))
        os.chmod(dst, 0o644)
        if key is not None:
            sign_file(str(dst), key)
    return str(d)


def signed_shared_models(tmp_path_factory, name, models):
    """(temp dir `name`, models dir, trusted-keys dir): models {NAME: file in
    ../shared/testdata/models} copied as they are (their own chat templates) and signed by the
    session's test key."""
    from edged.trust.sign import sign_file
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp(name)
    d = tmp / "models"
    d.mkdir()
    for model, src in models.items():
        shutil.copyfile(testdata("models", src), d / f"{model}.gguf")
        sign_file(str(d / f"{model}.gguf"), key)
    return tmp, str(d), trusted


def alpha_beta_models(tmp_path_factory, name):
    """(models dir, trusted-keys dir) in a new temp dir `name`: alpha = stories260K and beta = the
    synthetic llama Q8_0 model, each with a chat template and signed by the session's test key."""
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp(name)
    return model_dir(tmp, key, {"alpha": stories(), "beta": synthetic("llama", "Q8_0")}), trusted


def smol_models(tmp_path_factory, name):
    """(temp dir `name`, its models dir, trusted-keys dir): the real SmolLM2-135M-Instruct,
    signed, as model "smol"."""
    from edged.trust.sign import sign_file
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp(name)
    models = tmp / "models"
    models.mkdir()
    dst = models / "smol.gguf"
    shutil.copyfile(testdata("models", "SmolLM2-135M-Instruct.Q4_1.gguf"), dst)
    sign_file(str(dst), key)
    return tmp, str(models), trusted


SMOL_CONFIG = {"n_parallel": 2, "ctx_size": 1024, "max_queue": 16, "threads": 2}


def smol_server(tmp_path_factory, name, args=(), **extra):
    """A Server serving smol_models() with "smol" the default model (SMOL_CONFIG, and `extra`
    config keys; `args` after `edged serve`)."""
    tmp, models, trusted = smol_models(tmp_path_factory, name)
    return Server(tmp, models, trusted, default_model="smol", extra={**SMOL_CONFIG, **extra}, args=args)


def empty_models_dir(tmp_path):
    """tmp_path/models, created empty, for tests that put their own (often hostile) files in it."""
    d = tmp_path / "models"
    d.mkdir()
    return d


def needs_engine():
    """Skip when the engine's text layer or kernels have not been merged into this branch yet."""
    import importlib.util
    for mod in ("edged.engine.model", "edged.text.tokenizer", "edged.text.chat", "edged.format.quants"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} not available on this branch yet (engine/text/kernels not merged)")


def stories():
    needs_engine()
    return testdata("models", "stories260K.gguf")


def synthetic(arch="llama", qtype="Q8_0"):
    return testdata("models", f"synthetic-{arch}-{qtype}.gguf")


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=60):
        super().__init__("edged", timeout=timeout)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def engine_env():
    """The compiled CPU backend when it is built, else the NumPy reference backend."""
    try:
        import edged.engine.cpu  # noqa: F401
    except ImportError:
        return {"EDGED_BACKEND": "reference"}
    return {}


_CAN = {}


def can_generate():
    """True when this checkout can load and run the test model (text layer and a backend)."""
    if "v" not in _CAN:
        try:
            from edged.engine.model import Model
            Model.load(stories(), backend=engine_env().get("EDGED_BACKEND")).close()
            _CAN["v"] = True
        except (Exception, pytest.skip.Exception):  # noqa: BLE001 - any missing piece: no
            _CAN["v"] = False
    return _CAN["v"]


def request(sock_path, method, path, body=None, timeout=120, raw=None):
    """(status, headers, parsed JSON or text)."""
    c = UnixHTTPConnection(sock_path, timeout)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        c.request(method, path, body=data, headers=headers)
        r = c.getresponse()
        text = r.read().decode()
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = text
        return r.status, dict(r.getheaders()), parsed
    finally:
        c.close()


def open_stream(sock_path, body, path="/v1/completions"):
    """POST `body` (a streaming request) and return (connection, response) with only the status
    and headers read: for tests that read part of a stream, then drop or drain it."""
    c = UnixHTTPConnection(sock_path)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    return c, c.getresponse()


def sse_events(text):
    """The JSON events of a complete SSE body, which must end with `data: [DONE]`."""
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    events = [line[6:] for line in text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def aiohttp_session(sock_path, timeout=600):
    """An aiohttp session over the daemon's Unix socket, with no limit on open connections."""
    aiohttp = pytest.importorskip("aiohttp")
    return aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock_path, limit=0),
                                 timeout=aiohttp.ClientTimeout(total=timeout))


def gather(sock_path, one, items, timeout=600):
    """Run the coroutine `one(session, item)` for every item at once over one aiohttp session;
    returns their results in the order of `items`."""
    pytest.importorskip("aiohttp")

    async def main():
        async with aiohttp_session(sock_path, timeout) as s:
            return await asyncio.gather(*(one(s, item) for item in items))

    return asyncio.run(main())


def streamed(sock_path, bodies, path="/v1/completions"):
    """(SSE events, usage) of each request, all sent at once, each streamed with its usage."""
    async def one(session, body):
        async with session.post("http://edged" + path,
                                json=dict(body, stream=True, stream_options={"include_usage": True})) as r:
            text = await r.text()
            assert r.status == 200, text
        events = sse_events(text)
        return events, next((e["usage"] for e in events if e.get("usage")), {})

    return gather(sock_path, one, bodies, timeout=600)


class Notify:
    """A real AF_UNIX datagram socket given to the daemon as NOTIFY_SOCKET."""

    def __init__(self, path):
        self.path = str(path)
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.messages = []

    def wait_for(self, line, timeout=120):
        deadline = time.monotonic() + timeout
        while True:
            for m in self.messages:
                if line in m.split("\n"):
                    return m
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {line!r} from the daemon within {timeout}s; got {self.messages}")
            self.sock.settimeout(left)
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except socket.timeout:
                pass

    def close(self):
        self.sock.close()


class Server:
    """`python -m edged serve --config FILE [ARGS]` with its stderr captured to a file."""

    def __init__(self, tmp_path, models_dir, trusted, default_model=None, extra=None, argv_prefix=(),
                 env=None, wait=True, journal=False, args=()):
        self.tmp = tmp_path
        self.socket = str(tmp_path / "run" / "edged.sock")
        cfg = {"socket": self.socket, "models_dir": models_dir, "trusted_keys": trusted,
               "socket_group": "", "sandbox": "off", "log_level": "info", "ctx_size": 256,
               "threads": 1}
        if default_model:
            cfg["default_model"] = default_model
        cfg.update(extra or {})
        self.socket = cfg["socket"]
        self.config = tmp_path / "edged.toml"
        self.config.write_text(to_toml(cfg))
        self.notify = Notify(tmp_path / "notify.sock")
        self.log_path = tmp_path / f"edged-{time.monotonic_ns()}.log"
        e = dict(os.environ, PYTHONPATH=ROOT, NOTIFY_SOCKET=self.notify.path, EDGED_BACKEND=os.environ.get(
            "EDGED_BACKEND", ""), OPENBLAS_NUM_THREADS="1")
        e.pop("JOURNAL_STREAM", None)
        e.update(env or {})
        if not e["EDGED_BACKEND"]:
            e.pop("EDGED_BACKEND")
        self.log = open(self.log_path, "w")
        if journal:
            st = os.fstat(self.log.fileno())
            e["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        self.proc = subprocess.Popen(list(argv_prefix) + [sys.executable, "-m", "edged", "serve", "--config",
                                                          str(self.config), *args],
                                     env=e, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout=120):
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.notify.wait_for("READY=1", 0.5)
                return
            except AssertionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"daemon not ready (exit {self.proc.returncode}); log:\n"
                                         f"{self.logtext()}") from None

    def logtext(self):
        if not self.log.closed:           # after stop() too, for `assert srv.stop() == 0, srv.logtext()`
            self.log.flush()
        return self.log_path.read_text()

    def request(self, method, path, body=None, **kw):
        return request(self.socket, method, path, body, **kw)

    def assert_serving(self, path="/v1/models"):
        """The daemon still answers GET `path` with 200."""
        status, _, body = self.request("GET", path)
        assert status == 200, (path, status, body)

    def reload(self, timeout=60):
        """SIGHUP, then wait for the READY=1 that ends the reload (self.notify.messages then holds
        only what the daemon said since the signal)."""
        self.notify.messages.clear()
        self.proc.send_signal(signal.SIGHUP)
        self.notify.wait_for("READY=1", timeout)

    def stop(self, sig=15, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.notify.close()
        self.log.close()
        return self.proc.returncode


@contextlib.contextmanager
def running(*args, **kw):
    """Server(*args, **kw) for a with-block; when the block passes, the daemon must then stop
    with exit status 0 (when it fails, the daemon is stopped and the failure reported)."""
    srv = Server(*args, **kw)
    try:
        yield srv
    except BaseException:
        srv.stop()
        raise
    code = srv.stop()
    assert code == 0, srv.logtext()


KEY = "edged-test-key-0123456789abcdef"      # an API key for the TCP listener's tests


def keys_file(tmp_path, text=KEY + "\n", mode=0o600):
    """An api_keys_file in tmp_path (the daemon wants it owned by root: tests run as root)."""
    p = tmp_path / "api-keys"
    p.write_text(text)
    os.chmod(p, mode)
    return str(p)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def listening_port(srv, timeout=60):
    """The port of the daemon's `listen` socket, from its start-up log line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(r"also listening on TCP \('127\.0\.0\.1', (\d+)\) \(config key 'listen'", srv.logtext())
        if m:
            return int(m.group(1))
        assert srv.proc.poll() is None, srv.logtext()
        time.sleep(0.05)
    raise AssertionError("no 'listening on TCP' line:\n" + srv.logtext())


def socket_activated(tmp_path, models_dir, trusted, port, **kw):
    """(Server, Unix socket path): the daemon under real systemd-socket-activate, which listens
    on a Unix socket and on 127.0.0.1:`port` as edged.socket + edged-tcp.socket do. Returns once
    they listen; the daemon itself starts at the first connection (then srv.wait_ready())."""
    path = str(tmp_path / "edged.sock")
    srv = Server(tmp_path, models_dir, trusted, argv_prefix=[
        "systemd-socket-activate", "-l", path, "-l", f"127.0.0.1:{port}", "-E", "NOTIFY_SOCKET", "-E", "PYTHONPATH"],
        wait=False, **kw)
    deadline = time.monotonic() + 10
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return srv, path


def to_toml(d):
    def value(v):       # a dict is an inline table; JSON's scalars and lists are TOML's
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"
        return json.dumps(v)
    return "".join(f"{k} = {value(v)}\n" for k, v in d.items())


needs_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")


def uds_httpx(sock_path, timeout=300):
    """An httpx client (the transport the openai SDK and LangChain take) on the daemon's socket."""
    httpx = pytest.importorskip("httpx")
    return httpx.Client(transport=httpx.HTTPTransport(uds=sock_path), base_url="http://edged",
                        timeout=timeout)


def openai_client(sock_path):
    """The openai SDK talking to the daemon over its Unix socket."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url="http://edged/v1", api_key="unused", max_retries=0,
                         http_client=uds_httpx(sock_path))


@contextlib.contextmanager
def smol_daemon(tmp_path_factory, label, **extra):
    """A daemon serving smol_models() with "smol" the default model and config `extra`; must
    stop with status 0."""
    tmp, models, trusted = smol_models(tmp_path_factory, label)
    with running(tmp, models, trusted, default_model="smol", extra=extra) as srv:
        yield srv


# A passage and four endings: the requests family daemon tests send (lfm2, qwen35, gemma3n)
PASSAGE = ("the little bird sat on the old wall and looked at the garden where the children "
           "played every morning before school, and the sun was warm")
ENDINGS = [" and then", " but the cat", " so they ran", " when it rained"]


def complete_texts(sock_path, bodies):
    """(texts of its choices, usage) of each request, all sent at once, each streamed."""
    out = []
    for events, usage in streamed(sock_path, bodies):
        texts = {}
        for e in events:
            for c in e.get("choices", []):
                texts[c["index"]] = texts.get(c["index"], "") + c["text"]
        out.append(([texts[i] for i in sorted(texts)], usage))
    return out


def check_cold_hit_streams_forks(srv):
    """A model whose sessions keep more than K/V rows per layer (lfm2's convolution cache,
    qwen35's recurrent state, gemma3n's shared K/V layers) through the daemon (n_parallel 4):
    the same greedy request gives the same text on a cold start, after a prefix-cache hit
    (its prefix from another request's session), with three other streams in the same steps,
    and as each of n=2 choices (forked sessions)."""
    bodies = [{"prompt": PASSAGE + e, "max_tokens": 24, "temperature": 0} for e in ENDINGS]
    a = bodies[0]
    (cold, u0), = complete_texts(srv.socket, [a])       # nothing cached yet
    assert u0.get("prompt_tokens_details", {}).get("cached_tokens", 0) == 0, u0
    (other, u1), = complete_texts(srv.socket, [bodies[1]])  # the passage from a's session
    assert u1["prompt_tokens_details"]["cached_tokens"] > 20, u1
    (hit, u2), = complete_texts(srv.socket, [a])        # a's prefix from b's session
    assert u2["prompt_tokens_details"]["cached_tokens"] > 20, u2
    assert hit == cold
    together = complete_texts(srv.socket, bodies)       # four streams in the same steps
    assert together[0][0] == cold and together[1][0] == other
    (two, _), = complete_texts(srv.socket, [dict(a, n=2)])  # two forks of one prefilled prompt
    assert two == cold * 2
    assert len(cold[0]) > 10


def chat16(sock, messages):
    st, _, r = request(sock, "POST", "/v1/chat/completions",
                       {"messages": messages, "max_tokens": 16, "temperature": 0})
    assert st == 200, r
    return r["choices"][0]["message"]["content"], r["usage"]


def check_conversation_sent_again(srv, tmp_path_factory, name, path):
    """Turn 2 repeats turn 1 and its answer: the daemon serving `path` reuses the session (its
    rows, and any state restored from a checkpoint) and answers what a daemon that never saw
    turn 1 answers."""
    turn1 = [{"role": "user", "content": PASSAGE}]
    answer, u1 = chat16(srv.socket, turn1)
    turn2 = turn1 + [{"role": "assistant", "content": answer},
                     {"role": "user", "content": "and what did the bird do then"}]
    warm, u2 = chat16(srv.socket, turn2)
    assert u2["prompt_tokens_details"]["cached_tokens"] >= u1["prompt_tokens"], (u1, u2)
    fresh = family_server(tmp_path_factory, name + "-cold", path, chat=True)
    try:
        cold, u3 = chat16(fresh.socket, turn2)
    finally:
        assert fresh.stop() == 0, fresh.logtext()
    assert u3.get("prompt_tokens_details", {}).get("cached_tokens", 0) == 0, u3
    assert warm == cold and len(warm) > 5


def check_prefix_survives_restart(tmp_path_factory, name, path, check=None):
    """SIGTERM spills the idle session serving `path` to cache_dir; a new daemon restores it
    for the same conversation, evaluates only the last prompt token and answers what the first
    daemon answered. check(srv): further checks on the second daemon."""
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp(name + "-restart")
    add_chat_template(path, str(tmp / "m.gguf"))
    models = model_dir(tmp, key, {name: str(tmp / "m.gguf")})
    cache = tmp / "cache"
    conv = [{"role": "user", "content": PASSAGE + ", " + PASSAGE}]   # > SPILL_MIN_TOKENS

    def serve():
        return Server(tmp_path_factory.mktemp("daemon"), models, trusted, default_model=name,
                      extra={"cache_dir": str(cache)})
    srv = serve()
    try:
        first, _ = chat16(srv.socket, conv)
    finally:
        assert srv.stop() == 0, srv.logtext()
    assert [f for f in os.listdir(cache) if f.endswith(".edkv")]
    srv = serve()
    try:
        again, u2 = chat16(srv.socket, conv)
        n = u2["prompt_tokens"]
        assert u2["prompt_tokens_details"]["cached_tokens"] == n - 1, u2
        assert re.search(rf"prompt_tokens={n} cached_tokens={n - 1} prompt_eval=1 ", srv.logtext())
        assert "restored" in srv.logtext()
        if check:
            check(srv)
    finally:
        assert srv.stop() == 0, srv.logtext()
    assert again == first and len(first) > 5


def family_server(tmp_path_factory, name, path, chat=False, env=None):
    """A daemon serving one model file as `name` (4 parallel sessions, pinned); chat: with
    the test chat template added; env: its extra environment (EDGED_BACKEND)."""
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp(name)
    if chat:
        add_chat_template(path, str(tmp / (name + "-chat.gguf")))
        path = str(tmp / (name + "-chat.gguf"))
    d = model_dir(tmp, key, {name: path})
    return Server(tmp_path_factory.mktemp("daemon"), d, trusted, default_model=name,
                  extra={"n_parallel": 4, "max_queue": 8, "pin_default_model": True}, env=env)


def forced_call(sock_path, client, body, model, marker):
    """A forced tool call answered whole, streamed and through the openai SDK: (the call, its
    arguments) of the whole reply, after checking that it ends the choice with "tool_calls",
    that the stream carries the same call and no content with `marker` (the call's opening
    text), and that the SDK reads the same arguments."""
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "tool_calls", ch
    (call,) = ch["message"]["tool_calls"]
    args = json.loads(call["function"]["arguments"])
    events = sse_events(client.post("/v1/chat/completions", json={**body, "stream": True}).text)
    got = [tc for e in events if e["choices"] for tc in e["choices"][0]["delta"].get("tool_calls") or ()]
    assert [c["function"] for c in got] == [call["function"]]
    assert marker not in "".join(e["choices"][0]["delta"].get("content") or ""
                                 for e in events if e["choices"])
    r2 = openai_client(sock_path).chat.completions.create(model=model, **body)
    assert json.loads(r2.choices[0].message.tool_calls[0].function.arguments) == args
    return call, args


def streamed_chat(sock_path, content, max_tokens=12):
    """A greedy chat request streamed as SSE: (its text, the last choice's finish_reason)."""
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    c, r = open_stream(sock_path, body, path="/v1/chat/completions")
    assert r.status == 200
    events = sse_events(r.read().decode())
    c.close()
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    return text, events[-1]["choices"][0]["finish_reason"]
