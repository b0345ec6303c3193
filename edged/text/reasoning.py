"""Reasoning split: models that think (Qwen 3, QwQ, DeepSeek-R1 distills) write
`<think>...</think>` before their answer (Gemma 4: `<|channel>thought...<channel|>`); OpenAI-style servers return that part as
`reasoning_content` and the rest as `content`. Some templates open the `<think>` block in the
prompt itself (the generation prompt ends with it), so the reply starts inside it.
"""

from . import gemma4

OPEN, CLOSE = "<think>", "</think>"
# Gemma 4 thinks in a channel: `<|channel>thought\n...<channel|>` (text/gemma4.py)
GEMMA4_TAGS = ("<|channel>thought", "<channel|>")


def tags_of(template):
    """(open, close) of the reasoning block a chat template's model writes, or None."""
    if gemma4.is_gemma4(template):
        return GEMMA4_TAGS
    return (OPEN, CLOSE) if OPEN in (template or "") else None


def starts_inside(prompt, tags=(OPEN, CLOSE)):
    """Whether a rendered prompt leaves the model inside an open think block."""
    tail = prompt.rstrip()
    return tail.endswith(tags[0])


class ThinkSplitter:
    """push(text) -> (reasoning delta, content delta); holds back a possible partial tag.
    States: start (maybe a <think> opens) -> think -> after (white space after </think>) -> answer."""

    def __init__(self, inside=False, tags=(OPEN, CLOSE)):
        self.state = "think" if inside else "start"     # start -> think -> answer
        self.buf = ""
        self.open, self.close = tags

    def _hold(self, tag):
        """Split self.buf into (ready, held) where held could be the start of `tag`."""
        for n in range(min(len(tag) - 1, len(self.buf)), 0, -1):
            if self.buf.endswith(tag[:n]):
                return self.buf[:-n], self.buf[-n:]
        return self.buf, ""

    def push(self, text):
        self.buf += text
        reasoning = content = ""
        if self.state == "start":
            s = self.buf.lstrip()
            if s.startswith(self.open):
                self.buf, self.state = s[len(self.open):], "think"
            elif self.open.startswith(s):
                return "", ""                              # maybe the start of <think>
            else:
                self.state = "answer"
        if self.state == "think":
            i = self.buf.find(self.close)
            if i >= 0:
                reasoning, self.buf, self.state = self.buf[:i], self.buf[i + len(self.close):], "after"
            else:
                reasoning, self.buf = self._hold(self.close)
                return reasoning, ""
        if self.state == "after":                          # the blank lines after </think>
            self.buf = self.buf.lstrip()
            if not self.buf:
                return reasoning, ""
            self.state = "answer"
        if self.state == "answer":
            content, self.buf = self.buf, ""
        return reasoning, content

    def flush(self):
        """What is left at the end (an unclosed think block is reasoning)."""
        rest, self.buf = self.buf, ""
        if self.state == "think":
            return rest, ""
        return "", rest


def split(text, inside=False, tags=(OPEN, CLOSE)):
    """(reasoning, content) of a complete reply; reasoning is None when there was none."""
    s = ThinkSplitter(inside, tags)
    r1, c1 = s.push(text)
    r2, c2 = s.flush()
    reasoning = (r1 + r2).strip()
    return (reasoning or None), c1 + c2
