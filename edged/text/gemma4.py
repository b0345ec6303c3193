"""Gemma 4's chat conventions, as llama.cpp's common chat code handles them (common/parsers/
gemma4.cpp, the gemma4 mapper in common/chat-peg-parser.cpp).

- Found by the template's `'<|tool_call>call:'`.
- Calls: `<|tool_call>call:NAME{key:VALUE,...}<tool_call|>`, one block per call, where a VALUE
  is `<|"|>text<|"|>` (a string, quoted by a token of its own), a number, true/false/null, a
  `{key:VALUE,...}` dict with bare keys, or a `[VALUE,...]` list. After its calls the model
  ends the turn with `<|tool_response>` (an end-of-generation token).
- Results go back as the assistant turn's `tool_responses` ({"name", "response"}) rather than
  as `tool` messages. The official template does that conversion itself (it says
  `{#- OpenAI Chat Completions:`); for older ones llama.cpp merges assistant(tool_calls) + the
  tool messages after it + the next plain assistant answer into one assistant message, and so
  does `messages_for_template` here.
- Reasoning: `<|channel>thought ... <channel|>` (text/reasoning.py, GEMMA4_TAGS).

Text only: no sampling, no HTTP. Parsing raises ValueError on a malformed call (text/tools.py
then keeps the reply as content).
"""
import json

CALL_MARKER = "'<|tool_call>call:'"     # what identifies the family in a template
OFFICIAL = "{#- OpenAI Chat Completions:"
CALL_OPEN, CALL_CLOSE = "<|tool_call>", "<tool_call|>"
QUOTE = '<|"|>'
_CALL = CALL_OPEN + "call:"
_WS = " \t\r\n"


def is_gemma4(template):
    return CALL_MARKER in (template or "")


# --- the conversation going back in --------------------------------------------------------

def _has_content(m):
    c = m.get("content")
    return isinstance(c, (str, list)) and len(c) > 0


def _response(tool_msg):
    """A tool message's content as the template's `response`: JSON when it parses, else the text."""
    c = tool_msg.get("content")
    if isinstance(c, str):
        try:
            return json.loads(c)
        except (ValueError, RecursionError):
            return c
    return c


def messages_for_template(messages, template):
    """`messages` (OpenAI shape, arguments already objects) as an older Gemma 4 template needs
    them: each assistant message with tool_calls absorbs the tool messages after it (as
    `tool_responses`, named after the call at the same index, else by tool_call_id) and the
    plain assistant answer that follows them. The official template gets them unchanged."""
    if OFFICIAL in (template or ""):
        return messages
    out, i = [], 0
    while i < len(messages):
        m = messages[i]
        if m.get("role") != "assistant" or not m.get("tool_calls"):
            out.append(m)
            i += 1
            continue
        calls, responses = list(m["tool_calls"]), []
        merged = {"role": "assistant", "tool_calls": calls}
        if isinstance(m.get("reasoning_content"), str):
            merged["reasoning_content"] = m["reasoning_content"]
        i += 1
        while i < len(messages) and messages[i].get("role") == "tool":
            k = len(responses)
            name = ((calls[k].get("function") or {}).get("name") or "") if k < len(calls) else ""
            responses.append({"name": name or messages[i].get("tool_call_id") or "",
                              "response": _response(messages[i])})
            i += 1
        if i < len(messages) and messages[i].get("role") == "assistant" and \
                not messages[i].get("tool_calls") and _has_content(messages[i]):
            merged["content"] = messages[i]["content"]
            i += 1
        if responses:
            merged["tool_responses"] = responses
        out.append(merged)
    return out


TURN_END, MODEL_TURN = "<turn|>\n", "<|turn>model\n"


def generation_prompt(prompt):
    """A rendered prompt with the model's turn opened where the template left it closed: after
    a turn that holds both tool results and text the template writes no `<|turn>model`, which
    confuses the model (llama.cpp adds it the same way)."""
    return prompt + MODEL_TURN if prompt.endswith(TURN_END) else prompt


# --- parsing the reply ---------------------------------------------------------------------

def _skip_ws(s, i):
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _number(s, i):
    j = i
    while j < len(s) and s[j] in "+-0123456789.eE":
        j += 1
    try:
        return json.loads(s[i:j]), j
    except ValueError:
        raise ValueError(f"not a value at {s[i:i + 20]!r}") from None


def value(s, i=0, depth=0):
    """The Python value of the Gemma 4 VALUE starting at s[i] and the index after it."""
    if depth > 100:
        raise ValueError("values nested too deeply")
    if s.startswith(QUOTE, i):
        j = s.find(QUOTE, i + len(QUOTE))
        if j < 0:
            raise ValueError("an unclosed string")
        return s[i + len(QUOTE):j], j + len(QUOTE)
    if s.startswith("{", i):
        return _dict(s, i, depth)
    if s.startswith("[", i):
        out = []

        def item(i):
            v, i = value(s, i, depth + 1)
            out.append(v)
            return i
        return out, _items(s, i, "]", item)
    for word, v in (("true", True), ("false", False), ("null", None)):
        if s.startswith(word, i):
            return v, i + len(word)
    return _number(s, i)


def _items(s, i, close, item):
    """The items of a `[...]` or `{...}` opening at s[i], each read by item(index) -> index
    after it; returns the index after `close`."""
    i = _skip_ws(s, i + 1)
    if s.startswith(close, i):
        return i + 1
    while True:
        i = _skip_ws(s, item(i))
        if s.startswith(close, i):
            return i + 1
        if not s.startswith(",", i):
            raise ValueError(f"expected ',' or {close!r} at {s[i:i + 20]!r}")
        i = _skip_ws(s, i + 1)


def _dict(s, i, depth=0):
    """`{key:VALUE,...}` at s[i] -> (dict, index after it). Keys are bare text up to ':'
    (a key the model quoted with <|"|> loses the quotes)."""
    out = {}

    def item(i):
        j = i
        while j < len(s) and s[j] not in ":}":
            j += 1
        if j >= len(s) or s[j] != ":" or j == i:
            raise ValueError(f"expected 'key:' at {s[i:i + 20]!r}")
        key = s[i:j]
        if key.startswith(QUOTE) and key.endswith(QUOTE) and len(key) >= 2 * len(QUOTE):
            key = key[len(QUOTE):-len(QUOTE)]
        out[key], i = value(s, _skip_ws(s, j + 1), depth + 1)
        return i
    return out, _items(s, i, "}", item)


def parse_calls(text):
    """(content before the first call, [(name, arguments dict)]) of a complete reply."""
    start = text.find(_CALL)
    if start < 0:
        return text, []
    pairs, i = [], start
    while True:
        i += len(_CALL)
        j = text.find("{", i)
        if j < 0:
            raise ValueError("a call without arguments")
        name = text[i:j].strip()
        if not name:
            raise ValueError("a call without a name")
        args, i = _dict(text, j)
        pairs.append((name, args))
        if text.startswith(CALL_CLOSE, i):
            i += len(CALL_CLOSE)
        i = _skip_ws(text, i)
        if not text.startswith(_CALL, i):
            return text[:start], pairs


# --- constraining the reply ----------------------------------------------------------------

def call_grammar(tools, parallel, mark):
    """Lark (llguidance) for a reply of calls to `tools`: `<|tool_call>call:NAME{...}<tool_call|>`,
    one or (parallel) more. The names are fixed, and the argument keys where the tool's schema
    lists properties; the values are any well-formed Gemma 4 values (llama.cpp's grammar does
    not follow the schema either). `mark(text)` gives the token or literal of a marker."""
    q = mark(QUOTE)
    alts, rules = [], []
    for n, t in enumerate(tools):
        fn = t["function"]
        props = list(((fn.get("parameters") or {}).get("properties") or {}))
        key = "(" + " | ".join(json.dumps(k) for k in props) + ")" if props else "KEY"
        rules += [f'd{n}: "{{" WS? (k{n} ("," WS? k{n})* WS?)? "}}"', f'k{n}: {key} ":" WS? value']
        alts.append(f"{json.dumps(fn['name'])} d{n}")
    rules = [
        f"start: call{'+' if parallel else ''}",
        f"call: {mark(CALL_OPEN)} \"call:\" ({' | '.join(alts)}) {mark(CALL_CLOSE)}",
        *rules,
        'dict: "{" WS? (kv ("," WS? kv)* WS?)? "}"',
        'kv: KEY ":" WS? value',
        r"KEY: /[^:}<]+/",
        'list: "[" WS? (value ("," WS? value)* WS?)? "]"',
        "value: string | dict | list | NUMBER | \"true\" | \"false\" | \"null\"",
        f"string: {q} string_rest",
        f"string_rest[lazy]: /(.|\\n)*/ {json.dumps(QUOTE)}",   # any text up to the first <|"|>
        r"NUMBER: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/",
        r"WS: /[ \t\n]+/",
    ]
    return "\n".join(rules) + "\n"
