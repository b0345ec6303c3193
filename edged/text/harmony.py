"""gpt-oss's harmony format: a reply is a series of messages, each a header and a body,

    <|channel|>analysis<|message|>Let me think.<|end|>
    <|start|>assistant<|channel|>final<|message|>The answer.
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}

(the prompt ends with `<|start|>assistant`, so the first header has no `<|start|>`; the model
ends with `<|return|>` or, after a call, `<|call|>`, both end-of-generation tokens the
tokenizer does not render). The `analysis` channel is the reasoning (`reasoning_content`),
`final` the answer (`content`), a message addressed `to=functions.NAME` (in the header, before
or after the channel) an OpenAI tool call with the body as its arguments, and `commentary`
without a recipient (a preamble the user may see) content. The recipient may also stand in the
role part (`<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>`), as the
template renders earlier calls.

A reply without harmony headers is all content. With reasoning off (`reasoning_format: none`)
the analysis messages stay in the content as the raw text the model wrote, as llama-server
does. Text only: no sampling, no HTTP.
"""
import re

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, CALL, RETURN = "<|constrain|>", "<|call|>", "<|return|>"
_ENDS = (END, CALL, RETURN, START)     # what closes a body (START: a header without <|end|>)
_HEADS = (START, CHANNEL, "to=")       # what a header begins with (the first one follows
                                       # the prompt's `<|start|>assistant`: maybe " to=...")
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_WORD = re.compile(r"[^\s<]*")
FUNCTIONS = "functions."


def is_harmony(template):
    """Whether a chat template writes harmony (gpt-oss)."""
    t = template or ""
    return CHANNEL in t and MESSAGE in t and START in t


def messages_for_template(messages):
    """An assistant tool-call message's reasoning goes back as `thinking`, the field the
    gpt-oss template reads (it refuses content and thinking together)."""
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls") and m.get("reasoning_content") \
                and not m.get("content"):
            m = dict(m, thinking=m["reasoning_content"])
        out.append(m)
    return out


def _header(h):
    """(channel, recipient function or None) of a message header."""
    i = h.find(CHANNEL)
    channel = _WORD.match(h, i + len(CHANNEL)).group(0) if i >= 0 else ""
    m = _RECIPIENT.search(h)
    to = m.group(1) if m else ""
    return channel, (to[len(FUNCTIONS):] or None) if to.startswith(FUNCTIONS) else None


def _held(text, marks):
    """Length of the end of `text` that could be the start of one of `marks`."""
    for n in range(min(max(len(m) for m in marks) - 1, len(text)), 0, -1):
        if any(m.startswith(text[-n:]) for m in marks):
            return n
    return 0


class HarmonyStream:
    """push(text) -> (reasoning delta, content delta); finish() -> (reasoning, content, calls)
    with calls as (function name, arguments text) pairs (tools.make_call gives them OpenAI's
    shape). Tool calls are parsed only when `calls` is true (else a call's body is content)."""

    def __init__(self, reasoning=True, calls=True):
        self.reasoning, self.parse_calls = reasoning, calls
        self.state = "header"          # header -> body -> header ...; "plain": not harmony
        self.buf = ""
        self.kind = None               # of the current body: analysis, content, call
        self.name = None               # the function of a call body
        self.body = ""                 # a call body so far
        self.calls = []

    def _route(self, text, r, c):
        if self.kind == "analysis":
            return r + text, c
        if self.kind == "call":
            self.body += text
            return r, c
        return r, c + text

    def _close(self):
        if self.kind == "call":
            self.calls.append((self.name, self.body.strip()))
            self.body = ""

    def push(self, text):
        self.buf += text
        r = c = ""
        while True:
            if self.state == "plain":
                c, self.buf = c + self.buf, ""
                return r, c
            if self.state == "header":
                head = self.buf.lstrip()
                if not head:
                    return r, c
                if not any(head.startswith(h) or h.startswith(head) for h in _HEADS):
                    self.state = "plain"       # not harmony (or not any more): content
                    continue
                i = self.buf.find(MESSAGE)
                if i < 0:
                    return r, c
                header, self.buf = self.buf[:i], self.buf[i + len(MESSAGE):]
                channel, self.name = _header(header)
                if self.name is not None and self.parse_calls:
                    self.kind = "call"
                elif channel == "analysis":
                    self.kind = "analysis" if self.reasoning else "raw"
                else:
                    self.kind = "content"
                if self.kind == "raw":         # reasoning off: the message as written
                    c += header + MESSAGE
                self.state = "body"
            hits = [(j, m) for j, m in ((self.buf.find(m), m) for m in _ENDS) if j >= 0]
            if not hits:
                keep = _held(self.buf, _ENDS)
                out, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
                return self._route(out, r, c)
            j, mark = min(hits)
            r, c = self._route(self.buf[:j], r, c)
            if self.kind == "raw" and mark != START:
                c += mark
            self._close()
            self.buf = self.buf[j + (0 if mark == START else len(mark)):]
            self.state = "header"

    def finish(self):
        """What is left at the end: the open body, and every call."""
        r, c = "", ""
        if self.state == "body":
            r, c = self._route(self.buf, r, c)
            self._close()
        elif self.state == "plain" or not self.buf.lstrip().startswith(_HEADS):
            c = self.buf                       # (a header cut off by the end is dropped)
        self.buf, self.state = "", "header"
        return r, c, self.calls


def parse(text, reasoning=True, calls=True):
    """(reasoning or None, content, (name, arguments) pairs) of a complete reply."""
    s = HarmonyStream(reasoning, calls)
    r1, c1 = s.push(text)
    r2, c2, found = s.finish()
    return (r1 + r2) or None, c1 + c2, found
