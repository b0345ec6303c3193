"""Chat templates: real templates render, documented formats come out exactly, and untrusted
templates cannot reach Python internals or run away."""
import os

import pytest

from conftest import testdata_files
from edged.text.chat import chat_template_from, load_template_file, render
from edged.errors import TemplateError
from edged.format.gguf import GGUFFile
from edged.service.renderer import RenderWorker
from edged.text import chat

TEMPLATES = testdata_files("templates", ".jinja")
CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "What is 2+2?"},
]


def template(name):
    for path in TEMPLATES:
        if os.path.basename(path) == name:
            return open(path, encoding="utf-8").read()
    pytest.skip(f"shared template missing: {name}")


@pytest.mark.skipif(not TEMPLATES, reason="shared test data missing: ../shared/testdata/templates")
@pytest.mark.parametrize("path", TEMPLATES, ids=os.path.basename)
def test_every_real_template_renders_a_conversation(path):
    out = render(open(path, encoding="utf-8").read(), CONVERSATION, add_generation_prompt=True,
                 bos_token="<s>", eos_token="</s>")
    for m in CONVERSATION:
        assert m["content"] in out, m["role"]
    # the conversation comes out in order
    assert out.index("Hello!") < out.index("Hi! How can I help?") < out.index("What is 2+2?")


@pytest.mark.skipif(not TEMPLATES, reason="shared test data missing: ../shared/testdata/templates")
def test_every_real_template_renders_the_same_in_the_render_process():
    """The daemon renders in a bounded child process (edged/service/renderer.py): same text."""
    worker = RenderWorker("off")
    worker.start()
    try:
        for path in TEMPLATES:
            source = open(path, encoding="utf-8").read()
            kw = dict(add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
            assert render(source, CONVERSATION, **kw) == chat.render_here(source, CONVERSATION, **kw), path
    finally:
        worker.close()


# Expected prompts written from each family's documented prompt format.
LLAMA3 = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
          "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
          "You are a helpful assistant.<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\nHi! How can I help?<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n")
CHATML = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
          "<|im_start|>user\nHello!<|im_end|>\n"
          "<|im_start|>assistant\nHi! How can I help?<|im_end|>\n"
          "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
          "<|im_start|>assistant\n")
PHI35 = ("<|system|>\nYou are a helpful assistant.<|end|>\n<|user|>\nHello!<|end|>\n"
         "<|assistant|>\nHi! How can I help?<|end|>\n<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n")
# Gemma has no system role: its documentation puts system text at the start of the first user turn.
GEMMA2 = ("<bos><start_of_turn>user\nYou are a helpful assistant.\n\nHello!<end_of_turn>\n"
          "<start_of_turn>model\nHi! How can I help?<end_of_turn>\n"
          "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n")
# Mistral (v3 tekken / Nemo): the system prompt goes before the last user message.
MISTRAL = ("<s>[INST]Hello![/INST]Hi! How can I help?</s>"
           "[INST]You are a helpful assistant.\n\nWhat is 2+2?[/INST]")


@pytest.mark.parametrize("name,bos,eos,expected", [
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>", LLAMA3),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>", LLAMA3),
    ("meta-llama-Llama-3.3-70B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>", LLAMA3),
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "", "<|im_end|>", CHATML),
    ("Qwen-Qwen3-0.6B.jinja", "", "<|im_end|>", CHATML),
    ("microsoft-Phi-3.5-mini-instruct.jinja", "<s>", "<|endoftext|>", PHI35),
    ("google-gemma-2-2b-it.jinja", "<bos>", "<eos>", GEMMA2),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>", "</s>", MISTRAL),
])
def test_documented_prompt_formats(name, bos, eos, expected):
    out = render(template(name), CONVERSATION, add_generation_prompt=True, bos_token=bos,
                 eos_token=eos, date_string="26 Jul 2024")
    assert out == expected


def test_qwen3_thinking_switch():
    out = render(template("Qwen-Qwen3-0.6B.jinja"), CONVERSATION, enable_thinking=False)
    assert out == CHATML + "<think>\n\n</think>\n\n"


def test_without_generation_prompt():
    out = render(template("Qwen-Qwen2.5-7B-Instruct.jinja"), CONVERSATION, add_generation_prompt=False)
    assert out == CHATML[: -len("<|im_start|>assistant\n")]


# --- the sandbox ------------------------------------------------------------------------------

ESCAPES = {
    "class-walk": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "globals": "{{ raise_exception.__globals__ }}",
    "cycler-os": "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "self-globals": "{{ self.__init__.__globals__['__builtins__'] }}",
    "messages-class": "{% for m in messages %}{{ m.__class__.__base__ }}{% endfor %}",
    "getattr-filter": "{{ messages|attr('__class__') }}",
    "format-string": "{{ '{0.__class__}'.format(messages) }}",
    # llama-cpp-python CVE-2024-34359
    "cve-2024-34359": ("{% for x in ().__class__.__base__.__subclasses__() %}"
                       "{% if 'warning' in x.__name__ %}"
                       "{{ x()._module.__builtins__['__import__']('os').popen('touch {marker}') }}"
                       "{% endif %}{% endfor %}"),
    "mutate-list": "{% set _ = messages.append({'role': 'user', 'content': 'x'}) %}{{ messages|length }}",
}


@pytest.mark.parametrize("name", ESCAPES)
def test_escape_attempts_fail_and_run_nothing(name, tmp_path):
    marker = tmp_path / "pwned"
    source = ESCAPES[name].replace("{marker}", str(marker))
    with pytest.raises(TemplateError):
        render(source, CONVERSATION)
    assert not marker.exists()
    assert len(CONVERSATION) == 4


def test_output_size_limit():
    with pytest.raises(TemplateError, match="exceeds 1000 characters"):
        render("{% for i in range(100000) %}yyyyyyyyyy{% endfor %}", CONVERSATION, max_chars=1000)


def test_repetition_limit():
    with pytest.raises(TemplateError, match="repeats a sequence"):
        render("{{ 'x' * 100000000 }}", CONVERSATION)


def test_time_limit_inside_silent_loops():
    src = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    with pytest.raises(TemplateError, match="longer than 0.3 s"):
        render(src, CONVERSATION, max_seconds=0.3)


def test_raise_exception_syntax_and_undefined_errors():
    with pytest.raises(TemplateError, match="raised: nope"):
        render("{{ raise_exception('nope') }}", CONVERSATION)
    with pytest.raises(TemplateError, match="syntax error at line 1"):
        render("{% if %}", CONVERSATION)
    with pytest.raises(TemplateError, match="UndefinedError"):
        render("{{ 'a' + nothing }}", CONVERSATION)
    with pytest.raises(TemplateError, match="non-empty list"):
        render("{{ messages }}", [])


# --- templates from GGUF metadata and files ---------------------------------------------------

def test_template_from_gguf_and_named_variant(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_chat_template("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")
    w.add_string("tokenizer.chat_template.tool_use", "TOOLS{{ messages|length }}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFFile.open(path) as f:
        assert render(chat_template_from(f), CONVERSATION[:2]) == \
            "[system]You are a helpful assistant.[user]Hello!"
        assert render(chat_template_from(f, "tool_use"), CONVERSATION) == "TOOLS4"
        assert chat_template_from(f, "missing") is None


def test_operator_template_file(tmp_path):
    p = tmp_path / "t.jinja"
    p.write_text("{% for m in messages %}{{ m.content }}|{% endfor %}")
    assert render(load_template_file(p), CONVERSATION[1:2]) == "Hello!|"
    p.write_text("{% for %}")
    with pytest.raises(TemplateError):
        load_template_file(p)


def test_model_without_template_gets_a_clear_error_or_the_operator_file(tmp_path):
    from edged.text.chat import template_for
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "plain.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    op = tmp_path / "op.jinja"
    op.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    with GGUFFile.open(path) as f:
        with pytest.raises(TemplateError, match=r"no chat template \(tokenizer.chat_template\)"):
            template_for(f)
        with pytest.raises(TemplateError, match="tokenizer.chat_template.tool_use"):
            template_for(f, "tool_use")
        assert render(template_for(f, template_file=op), CONVERSATION[1:2]) == "<user>Hello!"
