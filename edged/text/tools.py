"""Tool calls: how each model family writes them, found from its chat template (as llama.cpp's
chat parsers do), parsed out of the reply into OpenAI's `tool_calls`, and, for `tool_choice`
"required" or a named function, a grammar that makes the model write a well-formed call.

Families (the marker that identifies each in a template, and the call format):
- hermes   `<tool_call>`: Qwen 2.5 / Qwen 3, Hermes 2 Pro / 3, Granite 4:
           `<tool_call>\\n{"name": N, "arguments": {...}}\\n</tool_call>`, one block per call
- qwen3coder  `<tool_call>` with `<function=` and `<parameter=`: Qwen3-Coder, Qwen3.5 (and
           Nemotron Nano 3), XML-style, one block per call:
           `<tool_call>\\n<function=N>\\n<parameter=A>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`;
           a VALUE is raw text, typed by the tool's JSON schema (a string parameter keeps the
           text; numbers, booleans, null, objects and arrays are parsed as JSON)
- llama3   `<|python_tag|>` or a Llama 3 header template that takes tools: a JSON object
           `{"name": N, "parameters": {...}}`, optionally after `<|python_tag|>`
- mistral  `[TOOL_CALLS]`: `[TOOL_CALLS][{"name": N, "arguments": {...}}, ...]` (Nemo) or
           `[TOOL_CALLS]N[ARGS]{...}` per call (Small 3.2, Devstral, Ministral 3)
- phi4     `<|tool_call|>`: Phi-4-mini, Granite 3.x: `<|tool_call|>[{"name": N, "arguments": {...}}]`
           (Phi closes with `<|/tool_call|>`)
- gemma4   `'<|tool_call>call:'` (Gemma 4): `<|tool_call>call:N{key:<|"|>text<|"|>,n:5}<tool_call|>`
           per call, in Gemma 4's own value syntax; edged/text/gemma4.py parses it
- harmony  `<|channel|>` (gpt-oss): `<|channel|>commentary to=functions.N <|constrain|>json<|message|>{...}`;
           edged/text/harmony.py parses it along with the reasoning
- generic  any other template: the tools are described in a system message and the model
           answers `{"tool_calls": [{"name": N, "arguments": {...}}]}` (llama-server's generic
           format); a reply that is not such JSON is plain content.

This module is text only: no sampling, no HTTP. Parsing is forgiving (a malformed call stays
content, never an error): the grammar is what guarantees well-formed calls.
"""
import json
import re
import secrets

from . import gemma4, harmony
from .grammar import JSON_LAYOUT, llama_like

FAMILIES = ("hermes", "qwen3coder", "llama3", "mistral", "phi4", "gemma4", "harmony", "generic")

_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_PYTHON_TAG = "<|python_tag|>"
_MISTRAL = "[TOOL_CALLS]"
_MISTRAL_ARGS = "[ARGS]"
_MISTRAL_ID = "[CALL_ID]"
_PHI_OPEN, _PHI_CLOSE = "<|tool_call|>", "<|/tool_call|>"
_XML_FUNCTION, _XML_FUNCTION_CLOSE = "<function=", "</function>"
_XML_PARAM, _XML_PARAM_CLOSE = "<parameter=", "</parameter>"


def family_of(template):
    """The tool-call family of a chat template's source (generic when it has no marker)."""
    t = template or ""
    if harmony.is_harmony(t):
        return "harmony"
    if gemma4.is_gemma4(t):
        return "gemma4"
    # llama.cpp's test, including its exclusion of templates without newlines between tags
    if _HERMES_OPEN in t and _XML_FUNCTION in t and _XML_PARAM in t and \
            "'<tool_call><function=' ~ tool_call.name ~ '>'" not in t:
        return "qwen3coder"
    if _HERMES_OPEN in t:
        return "hermes"
    if _MISTRAL in t:
        return "mistral"
    if _PHI_OPEN in t:
        return "phi4"
    if _PYTHON_TAG in t or ("<|start_header_id|>" in t and "tools" in t):
        return "llama3"
    return "generic"


def template_takes_tools(template):
    return "tools" in (template or "")


def mistral_args_style(template):
    """Mistral's newer `name[ARGS]{...}` format (else the JSON list of Nemo)."""
    return _MISTRAL_ARGS in (template or "")


# --- the conversation going back in --------------------------------------------------------

def messages_for_template(messages):
    """OpenAI messages as chat templates expect them: an assistant's tool_calls keep OpenAI's
    shape but with `arguments` as an object (templates iterate or `tojson` it; OpenAI sends a
    JSON string)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            fixed = []
            for c in calls:
                fn = dict(c.get("function") or {})
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        fn["arguments"] = json.loads(args) if args.strip() else {}
                    except (ValueError, RecursionError):
                        pass            # not JSON (or deeper than Python parses): the string as sent
                fixed.append(dict(c, function=fn))
            m = dict(m, tool_calls=fixed)
        out.append(m)
    return out


def generic_system_prompt(tools, required=False):
    """For a template that ignores `tools`: what the model needs to know to call one."""
    lines = ["You can call these functions (JSON schema of their arguments):"]
    for t in tools:
        fn = t["function"]
        lines.append(json.dumps({"name": fn["name"], "description": fn.get("description", ""),
                                 "parameters": fn.get("parameters") or {}}, ensure_ascii=False))
    lines.append('To call functions, answer only with JSON: {"tool_calls": [{"name": NAME, '
                 '"arguments": {...}}]}' + ("." if required else "; otherwise answer normally."))
    return "\n".join(lines)


# --- parsing the reply ---------------------------------------------------------------------

def new_call_id(family=None):
    """A fresh tool-call id; Mistral's templates accept only 9 letters and digits."""
    if family == "mistral":
        return "".join(secrets.choice(_ALNUM) for _ in range(9))
    return "call_" + secrets.token_hex(12)


_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def make_call(name, args, call_id=None, family=None):
    """One OpenAI tool call; args: a JSON string as the model wrote it, or a value to encode."""
    if not isinstance(name, str) or not name:
        raise ValueError("a call without a name")
    if args is None:
        args = {}
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    return {"id": call_id if isinstance(call_id, str) and call_id else new_call_id(family),
            "type": "function", "function": {"name": name, "arguments": args}}


def _json_values(text):
    """The JSON values written one after another in `text` (separated by whitespace, commas
    or semicolons)."""
    dec, i, out = json.JSONDecoder(), 0, []
    while True:
        while i < len(text) and text[i] in " \t\r\n;,":
            i += 1
        if i >= len(text):
            return out
        v, i = dec.raw_decode(text, i)
        out.append(v)


def _from_objects(values, args_keys=("arguments", "parameters"), family=None):
    calls = []
    for v in values:
        for obj in (v if isinstance(v, list) else [v]):
            if not isinstance(obj, dict):
                raise ValueError("a call is not an object")
            if isinstance(obj.get("function"), dict):       # {"type": "function", "function": {...}}
                obj = obj["function"]
            args = next((obj[k] for k in args_keys if k in obj), None)
            calls.append(make_call(obj.get("name"), args, obj.get("id"), family))
    return calls


def _hermes(text):
    start = text.find(_HERMES_OPEN)
    if start < 0:
        return text, []
    calls, i = [], start
    while i >= 0:
        j = text.find(_HERMES_CLOSE, i)
        body = text[i + len(_HERMES_OPEN):j if j >= 0 else len(text)]
        calls += _from_objects(_json_values(body))
        if j < 0:
            break
        i = text.find(_HERMES_OPEN, j)
    return text[:start], calls


_LLAMA_START = re.compile(r'\{\s*"(?:type|name)"\s*:')


def _llama3(text):
    tag = text.find(_PYTHON_TAG)
    if tag >= 0:
        return text[:tag], _from_objects(_json_values(text[tag + len(_PYTHON_TAG):]))
    m = _LLAMA_START.search(text)
    if m is None:
        return text, []
    return text[:m.start()], _from_objects(_json_values(text[m.start():]))


def _mistral(text):
    start = text.find(_MISTRAL)
    if start < 0:
        return text, []
    calls = []
    for part in text[start:].split(_MISTRAL)[1:]:
        part = part.strip()
        if not part:
            continue
        if part.startswith("["):                            # Nemo: a JSON list
            calls += _from_objects(_json_values(part), family="mistral")
            continue
        k = part.find(_MISTRAL_ARGS)                        # name[CALL_ID]id[ARGS]{...}
        if k < 0:
            raise ValueError("[TOOL_CALLS] without [ARGS]")
        head, call_id = part[:k], None
        if _MISTRAL_ID in head:
            head, call_id = head.split(_MISTRAL_ID, 1)
        values = _json_values(part[k + len(_MISTRAL_ARGS):])
        calls.append(make_call(head.strip(), values[0] if values else {}, call_id, "mistral"))
        for extra in values[1:]:
            calls += _from_objects([extra], family="mistral")
    return text[:start], calls


def _phi4(text):
    start = text.find(_PHI_OPEN)
    if start < 0:
        return text, []
    body = text[start:].replace(_PHI_OPEN, " ").replace(_PHI_CLOSE, " ")
    return text[:start], _from_objects(_json_values(body))


def _generic(text):
    s = text.strip()
    if not s.startswith("{"):
        return text, []
    v = json.loads(s)
    if not isinstance(v, dict):
        return text, []
    if "tool_calls" in v:
        return "", _from_objects([v["tool_calls"]])
    if "tool_call" in v:
        return "", _from_objects([v["tool_call"]])
    if "name" in v and ("arguments" in v or "parameters" in v):
        return "", _from_objects([v])
    if isinstance(v.get("response"), str):
        return v["response"], []
    return text, []


def _schema_types(schema):
    """The JSON types a parameter's schema allows (empty: not known)."""
    if not isinstance(schema, dict):
        return set()
    t = schema.get("type")
    types = {t} if isinstance(t, str) else set(t) if isinstance(t, list) else set()
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or ():
            types |= _schema_types(sub)
    if "enum" in schema and not types:
        types = {"string" if isinstance(v, str) else "other" for v in schema["enum"]}
    if "const" in schema and not types:
        types = {"string" if isinstance(schema["const"], str) else "other"}
    return types


def _xml_value(raw, schema):
    """A `<parameter=...>` value typed by its schema, as llama.cpp's Qwen3-Coder parser: only
    a string parameter keeps the text; other types are parsed as JSON, a string among other
    types is the fallback when the text is not JSON of them."""
    types = _schema_types(schema)
    if types == {"string"}:
        return raw
    try:
        v = json.loads(raw)
    except ValueError:
        if types and "string" not in types:
            raise ValueError(f"parameter value {raw[:40]!r} is not JSON of {sorted(types)}")
        return raw
    if "string" in types and isinstance(v, str):
        return raw                      # "\"quoted\"" stays the text the model wrote
    return v


def _xml_elements(text, opener, closer):
    """(name, body) of each `<opener NAME>body<closer>` in text, e.g. `<function=N>...</function>`."""
    i = 0
    while True:
        i = text.find(opener, i)
        if i < 0:
            return
        j, end = text.find(">", i), text.find(closer, i)
        if j < 0 or end < 0 or j > end:
            raise ValueError(f"an unclosed {opener}...>")
        yield text[i + len(opener):j].strip(), text[j + 1:end]
        i = end + len(closer)


def _qwen3coder(text, tools=None):
    """`<tool_call>\\n<function=N>\\n<parameter=A>\\nV\\n</parameter>\\n</function>\\n</tool_call>`
    blocks; Qwen3-Coder sometimes leaves out the first `<tool_call>` (llama.cpp accepts that)."""
    start = text.find(_HERMES_OPEN)
    fn = text.find(_XML_FUNCTION)
    if fn >= 0 and (start < 0 or fn < start):
        start = fn
    if start < 0:
        return text, []
    props = {}
    for t in tools or ():
        f = t.get("function") or {}
        props[f.get("name")] = ((f.get("parameters") or {}).get("properties") or {})
    calls = []
    for name, body in _xml_elements(text[start:], _XML_FUNCTION, _XML_FUNCTION_CLOSE):
        args = {}
        for arg, raw in _xml_elements(body, _XML_PARAM, _XML_PARAM_CLOSE):
            arg = arg.strip("\"'")
            raw = raw[1:] if raw.startswith("\n") else raw
            raw = raw[:-1] if raw.endswith("\n") else raw
            args[arg] = _xml_value(raw, props.get(name, {}).get(arg))
        calls.append(make_call(name, args))
    return text[:start], calls


def _gemma4(text):
    content, pairs = gemma4.parse_calls(text)
    return content, [make_call(name, args) for name, args in pairs]


def _harmony(text):
    _, content, pairs = harmony.parse(text, reasoning=False)
    return content, [make_call(name, args) for name, args in pairs]


_PARSERS = {"hermes": _hermes, "llama3": _llama3, "mistral": _mistral, "phi4": _phi4,
            "gemma4": _gemma4, "harmony": _harmony, "generic": _generic}


def parse(family, text, tools=None):
    """(content, calls) of a complete reply: the text before the first call (stripped of
    trailing white space when calls follow) and OpenAI-shaped tool_calls. A reply whose calls
    do not parse is all content. tools: the request's tools (the qwen3coder family types
    argument values by their schemas)."""
    try:
        content, calls = _qwen3coder(text, tools) if family == "qwen3coder" else \
            _PARSERS[family](text)
    except (ValueError, TypeError, KeyError, RecursionError):   # JSON nested ~1,000 deep
        return text, []
    if calls:
        content = content.rstrip()
    return content, calls


def markers(family):
    """Strings whose appearance in the reply starts the tool-call part (streaming holds text
    back from there on); the generic family's whole reply is JSON, so it starts with `{`."""
    return {"hermes": (_HERMES_OPEN,), "qwen3coder": (_HERMES_OPEN, _XML_FUNCTION),
            "llama3": (_PYTHON_TAG, '{"name"', '{"type"'), "mistral": (_MISTRAL,), "phi4": (_PHI_OPEN,),
            "gemma4": (gemma4.CALL_OPEN,), "harmony": (harmony.CHANNEL,), "generic": ()}[family]


class StreamSplitter:
    """Streams the content of a reply while holding back its tool calls: push(text) returns the
    text that is surely content; finish() returns (the rest of the content, calls)."""

    def __init__(self, family, tools=None):
        self.family, self.tools = family, tools
        self.markers = markers(family)
        self.text = ""
        self.sent = 0               # characters of self.text given out as content
        self.in_call = False

    def push(self, delta):
        self.text += delta
        if self.in_call:
            return ""
        if self.family == "generic":
            if self.text.lstrip().startswith("{"):
                self.in_call = True
                return ""
            if not self.text.strip():
                return ""           # only white space so far: could still open a JSON reply
            out, self.sent = self.text[self.sent:], len(self.text)
            return out
        hits = [i for i in (self.text.find(m, self.sent) for m in self.markers) if i >= 0]
        if hits:
            self.in_call = True
            end = min(hits)
        else:                       # hold back what could be the start of a marker
            end = len(self.text)
            for m in self.markers:
                for n in range(min(len(m) - 1, len(self.text) - self.sent), 0, -1):
                    if self.text.endswith(m[:n]):
                        end = min(end, len(self.text) - n)
                        break
        out, self.sent = self.text[self.sent:end], end
        return out

    def finish(self):
        content, calls = parse(self.family, self.text, self.tools)
        if not calls:
            return self.text[self.sent:], []
        return content[self.sent:] if len(content) > self.sent else "", calls


# --- constraining the reply ----------------------------------------------------------------

def _call_schema(tools, args_key="arguments"):
    """JSON schema of one call object {"name": N, args_key: {...}} of any of `tools`."""
    alts = []
    for t in tools:
        fn = t["function"]
        params = fn.get("parameters") or {"type": "object"}
        alts.append({"type": "object", "properties": {"name": {"const": fn["name"]},
                                                      args_key: params},
                     "required": ["name", args_key], "additionalProperties": False})
    return alts[0] if len(alts) == 1 else {"anyOf": alts}


def _json(schema):
    """`%json {...}` for llguidance's Lark: the schema read as llama.cpp reads it
    (grammar.llama_like), laid out as JSON_LAYOUT says."""
    return "%json " + json.dumps(dict(llama_like(schema), **{"x-guidance": JSON_LAYOUT}))


def _lit(s):
    return json.dumps(s)


def call_grammar(family, tools, parallel=True, args_style=False, token=None):
    """A Lark grammar (llguidance's dialect, %json for the JSON parts) for a reply that is
    nothing but tool calls of `tools` (one, or one or more when `parallel`). `token(text)`
    gives `<[id]>` for a marker that is one special token of the vocabulary (else None: the
    marker is written as text); args_style: Mistral's `name[ARGS]{...}` format."""
    token = token or (lambda s: None)

    def mark(s):
        return token(s) or _lit(s)

    many = "+" if parallel else ""
    if family == "qwen3coder":
        return _xml_call_grammar(tools, parallel, mark)
    if family == "gemma4":
        return gemma4.call_grammar(tools, parallel, mark)
    if family == "hermes":
        body = f'{mark(_HERMES_OPEN)} "\\n" {_json(_call_schema(tools))} "\\n" {mark(_HERMES_CLOSE)}'
        return f"start: call ({_lit(chr(10))} call)*\ncall: {body}\n" if parallel else f"start: {body}\n"
    if family == "llama3":
        return f"start: {_json(_call_schema(tools, 'parameters'))}\n"
    if family == "harmony":  # one call per message; a reply with calls ends after the first
        alts = " | ".join(f'{mark(harmony.CHANNEL)} {_lit("commentary to=functions." + t["function"]["name"] + " ")} '
                          f'{mark(harmony.CONSTRAIN)} "json" {mark(harmony.MESSAGE)} '
                          f'{_json(t["function"].get("parameters") or {"type": "object"})}'
                          for t in tools)
        return f"start: {alts}\n"
    if family == "mistral" and args_style:
        alts = " | ".join(f'{_lit(t["function"]["name"])} {mark(_MISTRAL_ARGS)} '
                          f'{_json(t["function"].get("parameters") or {"type": "object"})}'
                          for t in tools)
        return f"start: call{many}\ncall: {mark(_MISTRAL)} ({alts})\n"
    items = {"type": "array", "items": _call_schema(tools), "minItems": 1}
    if not parallel:
        items["maxItems"] = 1
    if family == "mistral":
        return f"start: {mark(_MISTRAL)} {_json(items)}\n"
    if family == "phi4":
        return f"start: {mark(_PHI_OPEN)} {_json(items)} {mark(_PHI_CLOSE)}?\n"
    schema = {"type": "object", "properties": {"tool_calls": items}, "required": ["tool_calls"],
              "additionalProperties": False}
    return f"start: {_json(schema)}\n"


def _xml_call_grammar(tools, parallel, mark):
    """Qwen3-Coder's XML calls: each parameter of the schema in order (the required ones
    always, the others optional); a string value is any text up to the closing tag (a lazy
    rule, at most maxLength characters), any other value JSON of its schema."""
    rules, alts = [], []
    for n, t in enumerate(tools):
        fn = t["function"]
        params = fn.get("parameters") or {}
        required = set(params.get("required") or ())
        parts = []
        for m, (arg, schema) in enumerate((params.get("properties") or {}).items()):
            if _schema_types(schema) == {"string"}:
                value = f"s{n}_{m}"
                most = schema.get("maxLength")
                rep = f"{{0,{int(most)}}}" if isinstance(most, int) and most >= 0 else "*"
                rules.append(f"{value}[lazy]: /(.|\\n){rep}/ {_lit(chr(10) + _XML_PARAM_CLOSE)}")
            else:
                value = f"{_json(schema if isinstance(schema, dict) else {})} " \
                        f"{_lit(chr(10) + _XML_PARAM_CLOSE)}"
            p = f'({_lit(_XML_PARAM + arg + ">" + chr(10))} {value} "\\n")'
            parts.append(p if arg in required else p + "?")
        rules.append(f"f{n}: {_lit(_XML_FUNCTION + fn['name'] + '>' + chr(10))} {' '.join(parts)} "
                     f"{_lit(_XML_FUNCTION_CLOSE + chr(10))}")
        alts.append(f"f{n}")
    call = f'{mark(_HERMES_OPEN)} "\\n" ({" | ".join(alts)}) {mark("</tool_call>")}'
    start = f'start: call ("\\n" call)*' if parallel else "start: call"
    return "\n".join([start, f"call: {call}"] + rules) + "\n"
