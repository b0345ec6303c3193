"""Chat templates: the Jinja template in a model's GGUF metadata turns a conversation into a
prompt. A template is untrusted input, so it is rendered only in jinja2's immutable sandbox,
with any reach for Python internals refused outright (not rendered as an empty string), and
with limits on output size, work and time:

- every filter, global and string method that can make a large string or run long from a
  small argument (center, format, `%`, wordwrap, replace, indent, join, batch, slice, lipsum,
  tojson's indent, ljust/rjust/zfill/expandtabs, str.format, `*` on sequences, `**`) has its
  arguments checked against MAX_OUTPUT_CHARS / MAX_SEQUENCE_REPEAT *before* the call;
- output is counted as it is produced and a tracer stops a render past MAX_SECONDS;
- in the daemon, rendering happens in a fresh child process with an address-space and CPU
  limit (edged/service/renderer.py, installed with `use_renderer`), which holds whatever the
  checks above miss. Library callers render in-process.
"""
import datetime
import json
import re
import sys
import time

import jinja2
import jinja2.ext
import jinja2.filters
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import TemplateError, TemplateRaised
from ..format.gguf import Key

MAX_OUTPUT_CHARS = 1 << 20          # a prompt larger than 1 MiB of text is not a prompt
MAX_SEQUENCE_REPEAT = 1 << 20       # 'x' * n and [..] * n are capped at this many items
MAX_SECONDS = 2.0                   # wall-clock budget for one render
MAX_LIPSUM_WORDS = 10_000           # lipsum(n, max=...) may ask for at most n * max words
MAX_GROUPS = 10_000                 # batch(n) / slice(n): no template needs more groups
MAX_JSON_INDENT = 64
_TEMPLATE_FILE = "<template>"       # jinja2's filename for templates compiled from strings


def _refuse(what, n, limit=MAX_OUTPUT_CHARS):
    raise TemplateError(f"chat template asks for {what} of {n} (limit {limit})")


def _bound(n, what, limit=MAX_OUTPUT_CHARS):
    """An integer argument that sizes the output (a width, a count) must be within `limit`."""
    if isinstance(n, int) and not isinstance(n, bool) and n > limit:
        _refuse(what, n, limit)


def _bound_len(n, what):
    if n > MAX_OUTPUT_CHARS:
        _refuse(what, n)


_PRINTF_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\d*)(?:\.(\d*))?")
_FORMAT_SPEC = re.compile(r"\{[^{}]*?:([^{}]*)\}")


def _check_format(fmt, args, kwargs):
    """printf- and str.format-style strings: every width and precision, written in the string
    or passed as an argument (`%*s`, `{:{}}`), must be within MAX_OUTPUT_CHARS."""
    if not isinstance(fmt, str):
        return
    for m in _PRINTF_SPEC.finditer(fmt):
        for digits in m.groups():
            if digits:
                _bound(int(digits), "a format width or precision")
    for m in _FORMAT_SPEC.finditer(fmt):
        for digits in re.findall(r"\d+", m.group(1)):
            _bound(int(digits), "a format width or precision")
    values = list(args) + list(kwargs.values())
    for v in list(values):
        if isinstance(v, (tuple, list)):
            values.extend(v)
        elif isinstance(v, dict):
            values.extend(v.values())
    for v in values:
        _bound(v, "a format argument")


def _joined_length(items, sep_len):
    """The length of sep.join(items) without building it; `items` must be a list."""
    total = sep_len * max(len(items) - 1, 0)
    for x in items:
        total += len(x) if isinstance(x, str) else len(str(x)) if isinstance(x, (int, float)) else 0
        if total > MAX_OUTPUT_CHARS:
            _refuse("a joined string", f"over {total} characters")
    return total


def _check_str_method(s, name, args, kwargs):
    """Checks before a template calls a str method; returns the (possibly materialised) args."""
    if name in ("center", "ljust", "rjust", "zfill") and args:
        _bound(args[0], f"str.{name} width")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int):
            _bound_len(len(s) + s.count("\t") * max(size, 0), "str.expandtabs output")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        _check_replace(s, args[0], args[1], args[2] if len(args) > 2 else -1)
    elif name == "join" and args:
        items = list(args[0])[: MAX_OUTPUT_CHARS + 1]
        _joined_length(items, len(s))
        args = (items,) + tuple(args[1:])
    elif name in ("format", "format_map"):
        _check_format(s, args, kwargs)
    return args


def _check_replace(s, old, new, count):
    hits = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    _bound_len(len(s) + hits * max(len(new) - len(old), 0), "a replaced string")


def _guard(original, check):
    """`original` (a jinja2 filter or global) with `check(*args, **kwargs)` run first; the
    check never sees the context/environment jinja2 passes to some filters."""
    skip = 1 if hasattr(original, "jinja_pass_arg") else 0

    def guarded(*args, **kwargs):
        check(*args[skip:], **kwargs)
        return original(*args, **kwargs)
    if skip:
        guarded.jinja_pass_arg = original.jinja_pass_arg
    return guarded


def _check_center(value, width=80):
    _bound(width, "a centred width")


def _check_format_filter(value, *args, **kwargs):
    _check_format(value, args, kwargs)


def _check_wordwrap(s, width=79, break_long_words=True, wrapstring=None, break_on_hyphens=True):
    sep = len(wrapstring) if isinstance(wrapstring, str) else 2     # newline_sequence: \n or \r\n
    _bound_len(len(str(s)) * (1 + sep), "a wrapped string")


def _check_replace_filter(s, old, new, count=None):
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
        _check_replace(s, old, new, -1 if count is None else count)


def _check_indent(s, width=4, first=False, blank=False):
    pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    _bound(pad, "an indent width")
    _bound_len(len(str(s)) + (str(s).count("\n") + 1) * max(pad, 0), "an indented string")


def _check_batch(value, linecount, fill_with=None):
    _bound(linecount, "a batch size", MAX_GROUPS)


def _check_slice(value, slices, fill_with=None):
    _bound(slices, "a slice count", MAX_GROUPS)


def _check_lipsum(n=5, html=True, min=20, max=100):
    if isinstance(n, int) and isinstance(max, int) and n * max > MAX_LIPSUM_WORDS:
        _refuse("lipsum words (n * max)", n * max, MAX_LIPSUM_WORDS)


def _join(eval_ctx, value, d="", attribute=None):
    """jinja2's join over a materialised, size-checked list (a generator is consumed once)."""
    items = list(value)[: MAX_OUTPUT_CHARS + 1] if not isinstance(value, str) else value
    if not isinstance(items, str):
        if attribute is None:
            _joined_length(items, len(str(d)))
        if len(items) > MAX_OUTPUT_CHARS:
            _refuse("a join of items", len(items))
    return jinja2.filters.do_join(eval_ctx, items, d, attribute)


_join.jinja_pass_arg = jinja2.filters.do_join.jinja_pass_arg


class _Sandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, made strict: an unsafe attribute raises instead of rendering as
    an empty Undefined, and sequence repetition is bounded."""

    intercepted_binops = frozenset(["*", "**", "%"])

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
        if operator == "%" and isinstance(left, str):
            _check_format(left, right if isinstance(right, tuple) else (right,), {})
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value):
        """String methods reached from a template get their arguments checked first."""
        name, owner = getattr(value, "__name__", None), getattr(value, "__self__", None)
        if not isinstance(owner, str) or name not in _GUARDED_STR_METHODS:
            return super().wrap_str_format(value)
        inner = super().wrap_str_format(value) or value

        def guarded(*args, **kwargs):
            return inner(*_check_str_method(owner, name, args, kwargs), **kwargs)
        return guarded


_GUARDED_STR_METHODS = frozenset(["center", "ljust", "rjust", "zfill", "expandtabs", "replace", "join",
                                  "format", "format_map"])


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
    _bound(len(indent) if isinstance(indent, str) else indent, "a JSON indent", MAX_JSON_INDENT)
    if separators is not None and sum(len(str(x)) for x in separators) > MAX_JSON_INDENT:
        _refuse("JSON separators of length", sum(len(str(x)) for x in separators), MAX_JSON_INDENT)
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def _environment():
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, autoescape=False,
                   extensions=[jinja2.ext.loopcontrols, _GenerationTag])
    env.filters["tojson"] = _tojson
    for name, check in (("center", _check_center), ("format", _check_format_filter),
                        ("wordwrap", _check_wordwrap), ("replace", _check_replace_filter),
                        ("indent", _check_indent), ("batch", _check_batch), ("slice", _check_slice)):
        env.filters[name] = _guard(env.filters[name], check)
    env.filters["join"] = _join
    env.globals["lipsum"] = _guard(jinja2.utils.generate_lorem_ipsum, _check_lipsum)
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


_RENDERER = None         # the daemon's bounded render process (edged/service/renderer.py)


def use_renderer(renderer):
    """Route every render() and compile check of a template source through `renderer(op,
    source, **request)` (a separate bounded process), or back in-process with None."""
    global _RENDERER
    _RENDERER = renderer


def check_template(source):
    """Compile `source` to find syntax errors, where rendering would happen (the render process
    when one is installed): raises TemplateError."""
    if _RENDERER is not None and isinstance(source, str):
        _RENDERER("compile", source)
    else:
        compile_template(source)


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
    `bos_token` and `eos_token`. Raises TemplateError on any failure or escape attempt.
    A source string goes to the render process when one is installed (`use_renderer`)."""
    if _RENDERER is not None and isinstance(template, str):
        _check_messages(messages)
        return _RENDERER("render", template, messages=messages,
                         add_generation_prompt=add_generation_prompt, tools=tools,
                         max_chars=max_chars, max_seconds=max_seconds, extra=extra)
    return render_here(template, messages, add_generation_prompt, tools, max_chars, max_seconds, **extra)


def render_here(template, messages, add_generation_prompt=True, tools=None,
                max_chars=MAX_OUTPUT_CHARS, max_seconds=MAX_SECONDS, **extra):
    """render() in this process (what the render process itself runs)."""
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
    except MemoryError:         # the render process's address-space limit (or the machine's)
        raise TemplateError("chat template needed more memory than a render may use") from None
    except Exception as e:  # undefined names, type errors, ... inside untrusted code
        raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
    finally:
        sys.settrace(previous)
    return "".join(out)


def map_strings(value, fn):
    """`value` (messages, tools, template variables: dicts and lists at any depth) with every
    string in it replaced by fn(string); dict keys are kept. Iterative: a request nested as deep
    as its JSON parser allows does not overflow the stack here."""
    if isinstance(value, str):
        return fn(value)
    if not isinstance(value, (list, dict)):
        return value
    root = [value]
    todo = [(root, 0)]                 # (container, key) whose value still has to be mapped
    while todo:
        parent, key = todo.pop()
        v = parent[key]
        if isinstance(v, str):
            parent[key] = fn(v)
        elif isinstance(v, list):
            parent[key] = copy = list(v)
            todo.extend((copy, i) for i in range(len(copy)))
        elif isinstance(v, dict):
            parent[key] = copy = dict(v)
            todo.extend((copy, k) for k in copy)
    return root[0]


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
    check_template(source)
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
    check_template(source)
    return source
