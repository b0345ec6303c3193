"""Images through the daemon (issue 45): a model paired with its mmproj (mmproj-NAME.gguf beside
it, signed) answers the openai SDK's image message and the ollama client's `images`; hostile
images get a clear 4xx in under a second and the daemon's memory does not grow; a model without
mmproj, an http URL, an oversized body and an unsigned mmproj are refused with the reason.

The tests that run a model on an image need the engine half of issue 45 (edged.engine.vision,
Session.add_image and its small gemma3 mmproj in tests/data/goldens); without it they skip
saying so. The refusals run either way."""
import base64
import importlib.util
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from conftest import ROOT, testdata
from daemon_support import add_chat_template, openai_client, running, signing_key
from image_files import encoded, gif_frames, png

MMPROJ = os.path.join(ROOT, "tests", "data", "goldens", "vision-gemma3.mmproj.gguf")
TEXT_VLM = "synthetic-gemma3-f32.gguf"       # the text model of that mmproj's width (n_embd 256)


def vision_missing():
    """Why a model cannot run on an image on this branch, or None."""
    if importlib.util.find_spec("edged.engine.vision") is None:
        return "edged.engine.vision (the engine half of issue 45) is not merged"
    from edged.engine.model import Session
    if not hasattr(Session, "add_image"):
        return "Session.add_image (the engine half of issue 45) is not merged"
    if not os.path.exists(MMPROJ):
        return "tests/data/goldens/vision-gemma3.mmproj.gguf (the engine half of issue 45) is not merged"
    return None


def needs_vision():
    why = vision_missing()
    if why:
        pytest.skip(why)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from edged.trust.sign import sign_file
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("images")
    models = tmp / "models"
    models.mkdir()
    os.chmod(models, 0o755)
    for name, src in (("vlm", TEXT_VLM), ("text", "synthetic-llama-Q8_0.gguf"), ("bad", TEXT_VLM)):
        add_chat_template(testdata("models", src), str(models / f"{name}.gguf"))
        sign_file(str(models / f"{name}.gguf"), key)
    if os.path.exists(MMPROJ):
        shutil.copyfile(MMPROJ, models / "mmproj-vlm.gguf")
        sign_file(str(models / "mmproj-vlm.gguf"), key)
        shutil.copyfile(MMPROJ, models / "proj-unsigned.gguf")
    else:                       # refused for its missing signature before anything reads it
        (models / "proj-unsigned.gguf").write_bytes(b"GGUF" + bytes(60))
    for f in models.iterdir():
        os.chmod(f, 0o644)
    cam = tmp / "cam"
    cam.mkdir()
    (cam / "ok.png").write_bytes(encoded("PNG", size=(40, 30))[0])
    (tmp / "secret.png").write_bytes(encoded("PNG")[0])
    extra = {"sandbox": "enforce", "image_dirs": [str(cam)], "max_body_bytes": 8 << 20,
             "image_max_bytes": 2 << 20, "max_loaded_models": 3, "auto_load": True, "swap_interval": 0,
             "mmproj": {"bad": "proj-unsigned.gguf"}, "ctx_size": 256}
    with running(tmp, str(models), trusted, default_model="text", extra=extra) as s:
        s.cam, s.tmp, s.models = cam, tmp, models
        yield s


@pytest.fixture(scope="module")
def http(srv):
    with httpx.Client(transport=httpx.HTTPTransport(uds=srv.socket), base_url="http://edged",
                      timeout=120) as c:
        yield c


def data_url(data, mime="image/png"):
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def chat(model, *parts, text="What is in the picture?"):
    content = [{"type": "text", "text": text}] + [
        {"type": "image_url", "image_url": {"url": p}} for p in parts]
    return {"model": model, "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "user", "content": content}]}


PICTURE = encoded("PNG", size=(60, 45))[0]


# --- refusals that need no engine -----------------------------------------------------------

def test_an_image_to_a_model_without_mmproj_is_a_400_naming_it(http):
    url = data_url(PICTURE)
    b64 = base64.b64encode(PICTURE).decode()
    for path, body, where in [
            ("/v1/chat/completions", chat("text", url), "messages[0].content[1].image_url.url"),
            ("/api/chat", {"model": "text", "stream": False, "messages": [
                {"role": "user", "content": "what is it?", "images": [b64]}]}, "messages[0].images[0]"),
            ("/api/generate", {"model": "text", "stream": False, "prompt": "what?", "images": [b64]}, "images[0]"),
            ("/v1/messages", {"model": "text", "max_tokens": 2, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}]}]},
             "messages[0].content[0].source.data"),
            ("/v1/responses", {"model": "text", "input": [{"role": "user", "content": [
                {"type": "input_image", "image_url": url}]}]}, "input[0].content[0].image_url")]:
        r = http.post(path, json=body)
        assert r.status_code == 400, (path, r.text)
        assert f"'{where}': model 'text' takes no images: no mmproj is paired with it" in r.text, (path, r.text)


def test_no_network_fetch_and_no_file_outside_image_dirs(http, srv):
    r = http.post("/v1/chat/completions", json=chat("text", "https://example.com/cat.png"))
    assert r.status_code == 400 and "edged does not fetch https URLs" in r.text, r.text
    r = http.post("/v1/messages", json={"model": "text", "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}]}]})
    assert r.status_code == 400 and "only base64 image sources" in r.text, r.text


def test_a_50_mb_data_url_is_refused_in_under_a_second(srv):
    """The daemon answers from the Content-Length, before the body is read (a raw socket: an
    HTTP client would first send all 50 MB)."""
    body = json.dumps(chat("vlm", "data:image/png;base64," + "A" * (50 << 20))).encode()
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(srv.socket)
        t0 = time.monotonic()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: edged\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body[:1 << 16])
        reply = s.recv(65536)
        assert time.monotonic() - t0 < 1.0
    assert reply.startswith(b"HTTP/1.1 413") and b"max_body_bytes" in reply, reply


def test_an_unsigned_mmproj_is_refused(http):
    t0 = time.monotonic()
    r = http.post("/v1/chat/completions", json=chat("bad", data_url(PICTURE)))
    assert time.monotonic() - t0 < 1.0
    assert r.status_code == 403 and "proj-unsigned.gguf" in r.text, r.text


def test_mmproj_files_are_not_models(http):
    names = {m["id"] for m in http.get("/v1/models").json()["data"]}
    assert {"vlm", "text", "bad"} <= names and not any(n.startswith("mmproj-") for n in names), names


# --- a model on images (engine half needed) ------------------------------------------------

def test_openai_sdk_image_message_and_the_follow_up_reuses_the_image_prefix(srv):
    needs_vision()
    client = openai_client(srv.socket)
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "What is in the picture?"},
        {"type": "image_url", "image_url": {"url": data_url(PICTURE)}}]}]
    one = client.chat.completions.create(model="vlm", messages=messages, max_tokens=2, temperature=0)
    assert one.choices[0].message.content is not None
    again = client.chat.completions.create(model="vlm", messages=messages, max_tokens=2, temperature=0)
    assert again.choices[0].message.content == one.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens >= one.usage.prompt_tokens - 1
    text_only = client.chat.completions.create(model="vlm", max_tokens=1, messages=[
        {"role": "user", "content": "What is in the picture?"}])
    # the image is 16 rows (the small gemma3 mmproj) between the tokens of its two markers
    assert one.usage.prompt_tokens - text_only.usage.prompt_tokens >= 16 + 2


def test_a_responses_follow_up_keeps_the_image_of_the_stored_turn(srv):
    """previous_response_id continues a conversation with its images: the follow-up's prompt
    holds the earlier image (its 16 rows, a prefix-cache hit) and adds only the new turn."""
    needs_vision()
    client = openai_client(srv.socket)
    first = client.responses.create(model="vlm", max_output_tokens=2, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "What is in the picture?"},
                                     {"type": "input_image", "image_url": data_url(PICTURE)}]}])
    follow = client.responses.create(model="vlm", max_output_tokens=2, temperature=0,
                                     previous_response_id=first.id, input="And its colour?")
    alone = client.responses.create(model="vlm", max_output_tokens=2, temperature=0, store=False, input=[
        {"role": "user", "content": "What is in the picture?"}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And its colour?"}])
    assert follow.usage.input_tokens - alone.usage.input_tokens >= 16 + 2
    assert follow.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1


def test_two_images_in_one_message(srv, http):
    needs_vision()
    r = http.post("/v1/chat/completions", json={"model": "vlm", "max_tokens": 1, "messages": [
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(PICTURE)}},
            {"type": "text", "text": "and"},
            {"type": "image_url", "image_url": {"url": f"file://{srv.cam}/ok.png"}}]}]})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] >= 2 * (16 + 2)


def test_ollama_client_images(srv):
    needs_vision()
    ollama = pytest.importorskip("ollama")
    client = ollama.Client(host="http://edged", transport=httpx.HTTPTransport(uds=srv.socket), timeout=120)
    r = client.chat(model="vlm", messages=[{"role": "user", "content": "what is it?", "images": [PICTURE]}],
                    options={"num_predict": 2, "temperature": 0})
    assert r.message.role == "assistant" and r.prompt_eval_count >= 16
    g = client.generate(model="vlm", prompt="what is it?", images=[PICTURE], options={"num_predict": 2})
    assert g.done and g.prompt_eval_count >= 16
    assert "vision" in client.show("vlm").capabilities          # Open WebUI looks for it
    assert "vision" not in client.show("text").capabilities


def rss(pid):
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) * 1024


def test_hostile_images_through_the_daemon(http, srv):
    needs_vision()
    assert http.post("/v1/chat/completions", json=chat("vlm", data_url(PICTURE))).status_code == 200
    before = rss(srv.proc.pid)
    jpeg = encoded("JPEG", size=(64, 64))[0]
    for data, status, needle in [
            (png(100_000, 100_000), 400, "100000x100000 pixels, more than image_max_pixels"),
            (jpeg[:len(jpeg) // 2], 400, "cannot be decoded"),
            (b"not an image at all", 400, "not an image edged decodes"),
            (gif_frames(100_000), 400, "the GIF has more than 10000 frames")]:
        t0 = time.monotonic()
        r = http.post("/v1/chat/completions", json=chat("vlm", data_url(data)))
        assert time.monotonic() - t0 < 1.0
        assert r.status_code == status, r.text
        if needle:
            assert "messages[0].content[1].image_url.url" in r.text and needle in r.text, r.text
    r = http.post("/v1/chat/completions", json=chat("vlm", f"file://{srv.tmp}/secret.png"))
    assert r.status_code == 400 and "is not under image_dirs" in r.text, r.text
    r = http.post("/v1/chat/completions", json=chat("vlm", data_url(bytes(3 << 20))))
    assert r.status_code == 400 and "larger than image_max_bytes" in r.text, r.text
    assert rss(srv.proc.pid) - before < 48 << 20
    srv.assert_serving()


def test_an_images_ids_take_no_repeat_penalty():
    """Ollama's default repeat_penalty over a prompt holding an image: its pseudo ids (past the
    vocabulary) stay out of the penalty window instead of failing the sampler."""
    from edged.text.sampling import Sampler, SamplingParams
    s = Sampler(8, SamplingParams(temperature=0, repeat_penalty=1.5))
    s.accept_many([3, 5, 490424815, 490424816, 3])
    assert sorted(s.history) == [3, 3, 5]
    assert s.sample(np.arange(8, dtype=np.float32)) == 7


def edged(*argv):
    return subprocess.run([sys.executable, "-m", "edged", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))


def test_generate_image_needs_an_mmproj(srv, tmp_path):
    r = edged("generate", "-m", str(srv.models / "text.gguf"), "-p", "what?", "-n", "1",
              "--image", str(srv.cam / "ok.png"))
    assert r.returncode == 2 and "--image needs the model's image projector: --mmproj FILE" in r.stderr, r.stderr


def test_generate_with_images_and_info_of_the_mmproj(srv):
    needs_vision()
    r = edged("generate", "-m", str(srv.models / "vlm.gguf"), "-p", "<__media__> and <__media__>?", "-n", "2",
              "--image", str(srv.cam / "ok.png"), "--image", str(srv.cam / "ok.png"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["n_prompt"] >= 2 * 16
    r = edged("generate", "-m", str(srv.models / "vlm.gguf"), "-p", "what?", "-n", "2", "--chat",
              "--image", str(srv.cam / "ok.png"), "--mmproj", str(srv.models / "mmproj-vlm.gguf"), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["n_prompt"] >= 16, r.stderr
    r = edged("info", "-m", str(srv.models / "mmproj-vlm.gguf"))
    assert r.returncode == 0 and "projector:    gemma3, images 112x112 pixels -> 16 tokens" in r.stdout, r.stderr


def test_chat_image_command(srv, tmp_path):
    import argparse
    from edged.commands.chat import Session
    out = io.StringIO()
    args = argparse.Namespace(socket=srv.socket, model="text", system=None, max_tokens=2, temp=0, seed=None)
    s = Session(args, out)
    s.handle(f"/image {tmp_path}/missing.png")
    assert "error: /image " in out.getvalue() and "No such file" in out.getvalue()
    s.handle(f"/image {srv.cam}/ok.png")
    assert f"Added image {srv.cam}/ok.png" in out.getvalue()
    s.handle("What is it?")         # the text model takes none: refused, nothing kept
    assert "takes no images" in out.getvalue() and s.messages == []
    s.handle("/clear")
    assert s.images == []
    s.handle(f"/image {srv.cam}/ok.png")
    if vision_missing():
        return
    s.model = "vlm"
    s.handle("What is it?")
    assert [m["role"] for m in s.messages] == ["user", "assistant"] and s.images == []
    assert s.messages[0]["content"][0]["type"] == "image_url"


def test_control_token_text_next_to_an_image_stays_text(srv):
    """As for text chats: "</s>" written in a message with an image is tokenized as plain text
    (no forged end of turn) unless content_special_tokens lists the model."""
    needs_vision()
    from edged.engine.model import Model
    from edged.engine.vision import Projector
    from edged.service.images import MARKER
    from edged.service.loader import LoadedModel
    path = str(srv.models / "vlm.gguf")
    m = Model.load(path, n_threads=1)
    try:
        with Projector.load(MMPROJ, n_threads=1) as proj:
            emb = proj.encode(np.zeros((20, 30, 3), np.uint8))
            eos = m.tokenizer.encode("</s>", add_special=False, parse_special=True)
            assert len(eos) == 1
            for specials in (False, True):
                lm = LoadedModel("vlm", path, m, None, 0, {}, 256, content_specials=specials)
                lm.projector = proj
                ids = lm.encode_chat_images([{"role": "user", "content": MARKER + "x</s>y"}], [emb])
                assert (eos[0] in ids) == specials, (specials, ids)
                assert set(emb.token_ids(m.hp.n_vocab)) <= set(ids)
    finally:
        m.close()
