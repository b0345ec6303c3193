"""The opt-in TCP listener: real systemd-socket-activate hands the daemon a Unix socket and a
127.0.0.1 TCP socket (as edged.socket + edged-tcp.socket do); on TCP every request needs a
Bearer key from api_keys_file, admin routes are refused, and Unix peers are still admitted by
their credentials. curl, the openai SDK and litellm over TCP. `edged serve --listen` binding TCP
itself, and the openai, anthropic and ollama clients against it by URL and key."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from daemon_support import (KEY, SMOL_CONFIG, Server, alpha_beta_models, free_port, keys_file, listening_port,
                            needs_curl, request, running, smol_models, socket_activated)
from edged.errors import ConfigError
from edged.service import apikeys, transport

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: api_keys_file must be owned by root")


def test_keys_file_rules(tmp_path):
    assert apikeys.load(keys_file(tmp_path, "# fleet key\n\n" + KEY + "\nsecond-key-abcdefghijkl\n")) == \
        (KEY.encode(), b"second-key-abcdefghijkl")
    for text, mode, needle in [(KEY, 0o644, "lets others"), (KEY, 0o620, "lets others"), ("short\n", 0o600, "line 1"),
                               ("# none\n", 0o600, "no keys"), ("has space in the key here\n", 0o600, "line 1")]:
        with pytest.raises(ConfigError, match=needle):
            apikeys.load(keys_file(tmp_path, text, mode))
    with pytest.raises(ConfigError, match="cannot open"):
        apikeys.load(str(tmp_path / "missing"))
    keys = (KEY.encode(),)
    assert apikeys.admitted("Bearer " + KEY, keys) and apikeys.admitted("bearer  " + KEY, keys)
    assert not apikeys.admitted("Bearer " + KEY[:-1], keys) and not apikeys.admitted(KEY, keys)
    assert not apikeys.admitted(None, keys) and not apikeys.admitted("Basic " + KEY, keys)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return alpha_beta_models(tmp_path_factory, "tcp")


@needs_curl
@pytest.mark.skipif(shutil.which("systemd-socket-activate") is None, reason="systemd-socket-activate missing")
def test_tcp_listener_needs_a_key_and_unix_peers_do_not(tmp_path, models):
    port = free_port()
    srv, path = socket_activated(tmp_path, *models, port, default_model="alpha",
                                 extra={"api_keys_file": keys_file(tmp_path)})
    url = f"http://127.0.0.1:{port}"
    try:
        def curl(route, *extra, body=None, unix=False):
            cmd = ["curl", "-sS", "--max-time", "120", "-w", "\n%{http_code}"] + list(extra)
            if body is not None:
                cmd += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
            cmd += (["--unix-socket", path, "http://edged" + route] if unix else [url + route])
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
            assert r.returncode == 0, r.stderr + srv.logtext()
            out, code = r.stdout.rsplit("\n", 1)
            return int(code), json.loads(out) if out.startswith("{") else out

        code, body = curl("/v1/models")                                   # no key
        assert code == 401 and body["error"]["code"] == "invalid_api_key", body
        srv.wait_ready(60)
        assert curl("/v1/models", "-H", "Authorization: Bearer wrong-key-0123456789")[0] == 401
        auth = ("-H", f"Authorization: Bearer {KEY}")
        code, body = curl("/v1/models", *auth)
        assert code == 200 and "alpha" in [m["id"] for m in body["data"]]
        code, body = curl("/v1/completions", *auth, body={"prompt": "Once upon a time", "max_tokens": 6,
                                                          "temperature": 0})
        assert code == 200 and body["choices"][0]["text"].startswith(", there was"), body
        code, body = curl("/v1/models/load", *auth, body={"model": "beta"})
        assert code == 403 and "not available over TCP" in body["error"]["message"]
        assert curl("/v1/models", unix=True)[0] == 200                    # Unix peer: credentials
        openai = pytest.importorskip("openai")
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        assert client.models.retrieve("alpha").id == "alpha"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="x" * 20, max_retries=0).models.list()
        assert "also listening on TCP ('127.0.0.1'" in srv.logtext()
        # litellm, as a program that only takes a URL and a key uses it
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")     # no download at import
        litellm = pytest.importorskip("litellm")
        r = litellm.completion(model="openai/alpha", api_base=url + "/v1", api_key=KEY, max_tokens=6,
                               temperature=0, messages=[{"role": "user", "content": "Once upon a time"}])
        assert r.choices[0].message.content and r.usage.completion_tokens <= 6
        with pytest.raises(litellm.AuthenticationError):
            litellm.completion(model="openai/alpha", api_base=url + "/v1", api_key="y" * 20, max_tokens=2,
                               messages=[{"role": "user", "content": "Hi"}], num_retries=0)
    finally:
        srv.stop()


@pytest.mark.skipif(shutil.which("systemd-socket-activate") is None, reason="systemd-socket-activate missing")
def test_tcp_listener_without_keys_refuses_to_start(tmp_path, models):
    port = free_port()
    srv, _ = socket_activated(tmp_path, *models, port, extra={"api_keys_file": str(tmp_path / "none")})
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            c.sendall(b"GET /health HTTP/1.0\r\n\r\n")
            c.settimeout(60)
            try:
                c.recv(100)
            except OSError:
                pass
        deadline = time.monotonic() + 60
        while srv.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "config key 'api_keys_file'" in srv.logtext() and "cannot open" in srv.logtext()
    finally:
        srv.stop()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_tcp_socket_unit_verifies(tmp_path):
    units = os.path.join(ROOT, "systemd")
    with open(os.path.join(units, "edged.service")) as f:
        text = f.read().replace("\nExecStart=/opt/edged/bin/edged ", f"\nExecStart={sys.executable} -m edged ")
    (tmp_path / "edged.service").write_text(text)
    for name in ("edged.socket", "edged-tcp.socket"):
        shutil.copy(os.path.join(units, name), tmp_path / name)
    p = subprocess.run(["systemd-analyze", "verify"] + [str(tmp_path / n) for n in
                                                        ("edged.service", "edged.socket", "edged-tcp.socket")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stderr.strip() == "", p.stderr
    with open(os.path.join(units, "edged-tcp.socket")) as f:
        unit = f.read()
    assert "ListenStream=127.0.0.1:" in unit and "Service=edged.service" in unit


def test_tcp_connections_count_against_the_caps_once_authenticated(monkeypatch):
    """The TCP sockets share the Unix socket's accept loop. A TCP connection waits in the
    pre-auth pool (a full pool closes its oldest idle connection for the newcomer) and counts
    against max_connections and its address's max_connections_per_uid only from its first
    request with a valid key (issue 41.7)."""
    import asyncio
    from types import SimpleNamespace
    from edged.service.metrics import Metrics

    monkeypatch.setattr(transport, "PREAUTH_MAX", 3)
    cfg = SimpleNamespace(max_connections=8, max_connections_per_uid=1, header_timeout=30.0,
                          keepalive_timeout=30.0, uids=lambda key: ())
    d = SimpleNamespace(stopping=False, metrics=Metrics(), cfg=cfg)
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    tcp.setblocking(False)
    unix_l = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)    # nobody connects to it
    unix_l.bind("")                                                # an abstract address of its own
    unix_l.listen(1)
    unix_l.setblocking(False)

    async def run():
        loop = asyncio.get_running_loop()
        lst = transport.Listener(d, unix_l, asyncio.Protocol, tcp=[tcp])
        lst.start()
        port = tcp.getsockname()[1]
        clients = []
        for _ in range(4):                  # one more than the pool holds
            clients.append(socket.create_connection(("127.0.0.1", port)))
            await asyncio.sleep(0.2)
        clients[0].settimeout(5)
        oldest = await loop.run_in_executor(None, clients[0].recv, 100)
        conns = {(c.peer, c.who, c.authed) for c in lst.conns.values()}
        pooled = sorted(lst.preauth)
        first, second = (lst.preauth[fd] for fd in pooled[:2])
        verdicts = lst.authenticated(first), lst.authenticated(second)
        state = len(lst.preauth), dict(lst.per_uid)
        lst.stop()
        for c in clients:
            c.close()
        return oldest, conns, verdicts, state

    try:
        oldest, conns, verdicts, state = asyncio.run(run())
    finally:
        for s in (tcp, unix_l):
            s.close()
    assert oldest == b""                                # closed for the newcomer, no 503
    assert conns == {(None, "tcp:127.0.0.1", False)}
    assert d.metrics.connections_refused["preauth_replaced"] == 1
    assert verdicts == (True, False)                    # the second is over the address's cap
    assert state == (2, {"tcp:127.0.0.1": 1})
    assert d.metrics.connections_refused["max_connections_per_uid"] == 1


@pytest.mark.skipif(shutil.which("systemd-socket-activate") is None, reason="systemd-socket-activate missing")
def test_unauthenticated_tcp_peers_crowd_out_no_one_and_are_logged_in_summaries(tmp_path, models):
    """Issue 41.7 and 41.8: 190 idle unauthenticated connections from three loopback addresses
    made keyed clients from the same address (max_connections_per_uid) and root on the Unix
    socket (max_connections = 100) get 503; now they only fill the pre-auth pool. 300 requests
    with a bad key wrote 300 log lines; now a summary line per interval."""
    import http.client
    port = free_port()
    srv, path = socket_activated(tmp_path, *models, port, default_model="alpha",
                                 extra={"api_keys_file": keys_file(tmp_path), "max_connections": 100})

    def get(route, key=None):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            c.request("GET", route, headers={"Authorization": f"Bearer {key}"} if key else {})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    idle = []
    try:
        assert get("/health")[0] == 401             # starts the daemon
        srv.wait_ready(60)
        before = srv.logtext().count("\n")
        statuses = {get("/v1/models", "bad-key-0123456789abcdef")[0] for _ in range(300)}
        assert statuses == {401}
        lines = srv.logtext().splitlines()[before:]
        assert len(lines) <= 3 and not [line for line in lines if " 401 " in line], lines
        assert "refused 1 TCP request(s) without a valid API key since the last report: 1 from 127.0.0.1" \
            in srv.logtext()
        for src in ("127.0.0.1", "127.0.0.2", "127.0.0.3"):
            for _ in range(65):
                s = socket.socket()
                s.bind((src, 0))
                s.connect(("127.0.0.1", port))
                idle.append(s)
        def replaced():         # root on the Unix socket is answered meanwhile
            text = request(path, "GET", "/metrics")[2]
            return sum(float(line.split()[-1]) for line in text.splitlines()
                       if line.startswith('edged_connections_refused_total{reason="preauth_replaced"}'))

        deadline = time.monotonic() + 60                # until the daemon has taken all of them in
        while replaced() < len(idle) - transport.PREAUTH_MAX and time.monotonic() < deadline:
            time.sleep(0.05)
        status, body = get("/v1/models", KEY)
        assert status == 200, (status, body, srv.logtext()[-2000:])
        assert request(path, "GET", "/v1/models")[0] == 200       # root on the Unix socket
    finally:
        for s in idle:
            s.close()
        srv.stop()


def test_listen_binds_tcp_itself_with_the_same_key_policy(tmp_path, models):
    """`edged serve --listen 127.0.0.1:0` (issue 43.5): no systemd, the sandbox on; the openai
    SDK with the key works, without it 401, an admin route 403, the Unix socket as before."""
    openai = pytest.importorskip("openai")
    with running(tmp_path, *models, default_model="alpha", args=["--listen", "127.0.0.1:0"],
                 extra={"api_keys_file": keys_file(tmp_path), "sandbox": "enforce"}) as srv:
        url = f"http://127.0.0.1:{listening_port(srv)}"
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        r = client.chat.completions.create(model="alpha", messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=4, temperature=0)
        assert r.choices[0].message.content and r.usage.completion_tokens <= 4
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="not-the-key-0123456789", max_retries=0).models.list()
        import httpx
        r = httpx.get(url + "/v1/models", timeout=60)                      # no key at all
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = httpx.post(url + "/v1/models/load", json={"model": "beta"}, timeout=60,
                       headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 403, r.text
        assert srv.request("GET", "/v1/models")[0] == 200                  # Unix peer: credentials
        assert "sandbox: enforce (Landlock" in srv.logtext()


@pytest.fixture(scope="module")
def smol_listen(tmp_path_factory):
    """(Server, URL): `edged serve --listen 127.0.0.1:0` serving SmolLM2-135M, sandbox on."""
    tmp, models, trusted = smol_models(tmp_path_factory, "tcp-listen-clients")
    with running(tmp, models, trusted, default_model="smol", args=["--listen", "127.0.0.1:0"],
                 extra={**SMOL_CONFIG, "api_keys_file": keys_file(tmp), "sandbox": "enforce"}) as srv:
        yield srv, f"http://127.0.0.1:{listening_port(srv)}"


HI = [{"role": "user", "content": "Hi"}]


def test_clients_over_listen_with_an_api_key(smol_listen):
    """Issue 43's "Done when" over TCP: against `edged serve --listen` serving SmolLM2-135M, the
    openai SDK (chat, stream, Responses), the anthropic SDK (create, stream, count_tokens; its key
    goes as x-api-key) and the ollama client (a Bearer header) pass with the key, and each is
    refused in its own way without it."""
    openai = pytest.importorskip("openai")
    anthropic = pytest.importorskip("anthropic")
    ollama = pytest.importorskip("ollama")
    srv, url = smol_listen
    oa = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    r = oa.chat.completions.create(model="smol", messages=HI, max_tokens=4, temperature=0)
    assert r.choices[0].message.content and r.usage.completion_tokens <= 4
    chunks = list(oa.chat.completions.create(model="smol", messages=HI, max_tokens=4, temperature=0,
                                             stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
    resp = oa.responses.create(model="smol", input="Hi", max_output_tokens=16, temperature=0)
    assert resp.status in ("completed", "incomplete") and resp.output_text
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="z" * 24, max_retries=0).chat.completions.create(
            model="smol", messages=HI, max_tokens=1)

    an = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=120)
    m = an.messages.create(model="smol", max_tokens=4, messages=HI, extra_body={"temperature": 0})
    assert m.content[0].text and m.usage.output_tokens <= 4
    with an.messages.stream(model="smol", max_tokens=4, messages=HI, extra_body={"temperature": 0}) as stream:
        assert "".join(stream.text_stream) == m.content[0].text
    assert an.messages.count_tokens(model="smol", messages=HI).input_tokens > 1
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=url, api_key="z" * 24, max_retries=0).messages.create(
            model="smol", max_tokens=1, messages=HI)

    ol = ollama.Client(host=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    reply = ol.chat(model="smol", messages=HI, options={"num_predict": 4, "temperature": 0})
    assert reply.message.content == m.content[0].text and reply.eval_count <= 4
    assert [x.model for x in ol.list().models] == ["smol:latest"]
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=url).list()
    assert e.value.status_code == 401
    assert "sandbox: enforce (Landlock" in srv.logtext()


def test_listen_without_a_key_file_refuses_to_start(tmp_path, models):
    """No api_keys_file: the daemon exits 2 with an error naming both keys, before it binds
    anything (neither the TCP port nor the Unix socket)."""
    port = free_port()
    srv = Server(tmp_path, *models, args=["--listen", f"127.0.0.1:{port}"],
                 extra={"api_keys_file": str(tmp_path / "none")}, wait=False)
    try:
        assert srv.proc.wait(60) == 2, srv.logtext()
        text = srv.logtext()
        assert "config key 'listen' needs API keys: config key 'api_keys_file'" in text, text
        assert "cannot open" in text and not os.path.exists(srv.socket)
    finally:
        srv.stop()


def test_listen_values_are_checked(monkeypatch):
    from edged.commands.serve import env_overrides
    from edged.service import config
    assert env_overrides({"EDGED_LISTEN": "127.0.0.1:8091, [::1]:8091"}) == \
        {"listen": ["127.0.0.1:8091", "[::1]:8091"]}
    assert config.split_host_port("[::1]:8091") == ("::1", 8091)
    for bad, needle in [("8091", "is not \"HOST:PORT\""), ("::1:8091", "in brackets"),
                        ("127.0.0.1:65536", "is not"), ("localhost:http", "is not")]:
        with pytest.raises(ConfigError, match=f"config key 'listen': .*{needle}"):
            config.load(None, {"listen": [bad]})
    with pytest.raises(ConfigError, match="cannot listen on 127.0.0.1:"):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen(1)
            transport.bind_tcp("127.0.0.1:%d" % taken.getsockname()[1])
