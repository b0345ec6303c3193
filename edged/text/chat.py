"""Chat templates: the Jinja template in a model's GGUF metadata turns a conversation into a
prompt. A template is untrusted input, so it is rendered only in jinja2's immutable sandbox,
with any reach for Python internals refused outright (not rendered as an empty string), and
with limits on output size, work and time.
"""
import datetime
import json
import sys
import time

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import TemplateError, TemplateRaised
from ..format.gguf import Key

MAX_OUTPUT_CHARS = 1 << 20          # a prompt larger than 1 MiB of text is not a prompt
MAX_SEQUENCE_REPEAT = 1 << 20       # 'x' * n and [..] * n are capped at this many items
MAX_SECONDS = 2.0                   # wall-clock budget for one render
_TEMPLATE_FILE = "<template>"       # jinja2's filename for templates compiled from strings


class _Sandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, made strict: an unsafe attribute raises instead of rendering as
    an empty Undefined, and sequence repetition is bounded."""

    intercepted_binops = frozenset(["*", "**"])

    def unsafe_undefined(self, obj, attribute):
        raise TemplateError(f"chat template tried to access unsafe attribute {attribute!r} "
                            f"of a {type(obj).__name__} object")

    def call_binop(self, context, operator, left, right):
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and \
                        len(seq) * n > MAX_SEQUENCE_REPEAT:
                    raise TemplateError(f"chat template repeats a sequence {n} times "
                                        f"(limit {MAX_SEQUENCE_REPEAT} items)")
        if operator == "**" and isinstance(right, int) and abs(right) > 1024:
            raise TemplateError(f"chat template raises to the power {right} (limit 1024)")
        return super().call_binop(context, operator, left, right)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks the assistant's part of a training
    prompt (Hugging Face's assistant tracking); for inference the body is rendered as is."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message):
    raise TemplateRaised(f"chat template raised: {message}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # As Hugging Face's: no HTML escaping, unicode kept.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def _environment():
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, autoescape=False,
                   extensions=[jinja2.ext.loopcontrols, _GenerationTag])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _environment()


class _Deadline:
    """Trace template frames and abort a render that runs past its time budget, even inside a
    loop that produces no output."""

    def __init__(self, seconds):
        self.end = time.monotonic() + seconds
        self.seconds = seconds
        self.ticks = 0

    def _local(self, frame, event, arg):
        self.ticks += 1
        if not self.ticks & 255 and time.monotonic() > self.end:
            raise TemplateError(f"chat template took longer than {self.seconds:g} s to render")
        return self._local

    def __call__(self, frame, event, arg):
        if frame.f_code.co_filename == _TEMPLATE_FILE:
            return self._local
        return None


def compile_template(source):
    """Parse a template once; raises TemplateError on a syntax error."""
    if not isinstance(source, str):
        raise TemplateError(f"chat template must be a string, not {type(source).__name__}")
    try:
        return _ENV.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"chat template syntax error at line {e.lineno}: {e.message}") from None
    except RecursionError:          # "{{{{{{..." deeper than the parser's recursion
        raise TemplateError("chat template is nested too deeply to parse") from None
    except Exception as e:  # noqa: BLE001 - the compiler on untrusted input: never escape
        raise TemplateError(f"chat template cannot be compiled: {type(e).__name__}: {e}") from None


def render(template, messages, add_generation_prompt=True, tools=None,
           max_chars=MAX_OUTPUT_CHARS, max_seconds=MAX_SECONDS, **extra):
    """Render `template` (source string or compiled) for `messages` the way Hugging Face
    does: `messages`, `tools`, `add_generation_prompt`, plus any `extra` variables such as
    `bos_token` and `eos_token`. Raises TemplateError on any failure or escape attempt."""
    tpl = compile_template(template) if isinstance(template, str) else template
    _check_messages(messages)
    try:
        return _render(tpl, messages, add_generation_prompt, tools, max_chars, max_seconds, extra)
    except TemplateRaised:
        merged = _merge_system_into_user(messages)
        if merged is None:
            raise
    # Templates without a system role (Gemma's) get the system text at the start of the first
    # user turn, separated by a blank line, as those model families document.
    return _render(tpl, merged, add_generation_prompt, tools, max_chars, max_seconds, extra)


def _merge_system_into_user(messages):
    if messages[0].get("role") != "system" or len(messages) < 2 or messages[1].get("role") != "user":
        return None
    system, user = messages[0], messages[1]
    if not isinstance(system.get("content"), str) or not isinstance(user.get("content"), str):
        return None
    first = dict(user, content=system["content"] + "\n\n" + user["content"])
    return [first] + list(messages[2:])


def _render(tpl, messages, add_generation_prompt, tools, max_chars, max_seconds, extra):
    context = dict(extra)
    context.update(messages=messages, add_generation_prompt=add_generation_prompt)
    if tools is not None:
        context["tools"] = tools
    # Function-calling templates of the firefunction family read the tools as a JSON string.
    context.setdefault("functions", json.dumps(tools or [], ensure_ascii=False))
    context.setdefault("datetime", datetime.date.today().strftime("%B %d, %Y"))
    out, size = [], 0
    previous = sys.gettrace()
    sys.settrace(_Deadline(max_seconds))
    try:
        for chunk in tpl.generate(**context):
            size += len(chunk)
            if size > max_chars:
                raise TemplateError(f"chat template output exceeds {max_chars} characters")
            out.append(chunk)
    except TemplateError:
        raise
    except jinja2.exceptions.SecurityError as e:
        raise TemplateError(f"chat template refused by the sandbox: {e}") from None
    except RecursionError:
        raise TemplateError("chat template recursed too deeply") from None
    except Exception as e:  # undefined names, type errors, ... inside untrusted code
        raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
    finally:
        sys.settrace(previous)
    return "".join(out)


def _check_messages(messages):
    if not isinstance(messages, list) or not messages:
        raise TemplateError("messages must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise TemplateError(f"message {i} must be an object with a string 'role'")


def chat_template_from(f, name=None):
    """The chat template stored in a GGUF file (`tokenizer.chat_template`, or the named
    variant `tokenizer.chat_template.NAME`), or None if it has none."""
    key = Key.CHAT_TEMPLATE if name is None else Key.CHAT_TEMPLATE_N.format(name=name)
    value = f.get(key)
    if value is not None and not isinstance(value, str):
        raise TemplateError(f"{key} must be a string, not {type(value).__name__}")
    return value


def load_template_file(path):
    """An operator-configured template from a file (for models without one)."""
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    compile_template(source)
    return source


def template_for(f, name=None, template_file=None):
    """The template chat requests to this model use: the operator's file when one is
    configured, else the model's own (`name` picks `tokenizer.chat_template.NAME`). A model
    with neither cannot chat (plain completion still works): TemplateError saying so."""
    if template_file is not None:
        return load_template_file(template_file)
    source = chat_template_from(f, name)
    if source is None:
        key = Key.CHAT_TEMPLATE if name is None else Key.CHAT_TEMPLATE_N.format(name=name)
        raise TemplateError(f"{getattr(f, 'name', 'model')} has no chat template ({key}); use "
                            "plain completion, or configure a template file for this model")
    compile_template(source)
    return source
