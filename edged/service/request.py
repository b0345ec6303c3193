"""The one internal request every wire protocol parses into.

OpenAI's chat and completions (service/openai.py), and the protocols that come after it, each
turn their JSON into a GenerateRequest: typed, frozen groups checked once when the body is
validated. Scheduling, limits, authorization and logging see only this, never the protocol.

    GenerateRequest
      sampling    text.sampling.SamplingParams    how tokens are drawn
      output      Output                          how many, when to stop, what to report
      constraint  ConstraintSpec | None           structured output (JSON schema, grammar)
      tools       ToolUse                         functions offered and how they may be called
      messages    chat turns, as templates see them (chat) | prompts: texts or id lists
      speculative False: no speculative decoding for this request (it never changes the tokens)
      infill      text.infill.Infill | None     fill-in-the-middle (its prompt replaces prompts)
      images      images.ImageRef, in the order of the image markers in messages (chat)
"""
from __future__ import annotations

import dataclasses

from ..text.sampling import SamplingParams

MAX_N = 8                 # choices per request (each holds a KV cache while it decodes)


@dataclasses.dataclass(frozen=True)
class Output:
    """What a request asks back: up to max_tokens tokens (None: the server's limit) per
    choice, n choices per prompt, stop strings, logprobs (None: none; k: each token's and the
    k most likely alternatives'), reasoning split out of the content, streamed or whole;
    context: the request's own context window (Ollama's num_ctx), prompt and reply within the
    smaller of it and the model's."""
    max_tokens: int | None = None
    n: int = 1
    stop: tuple = ()
    logprobs: int | None = None
    reasoning: bool = True
    stream: bool = False
    include_usage: bool = False
    context: int | None = None


@dataclasses.dataclass(frozen=True)
class ConstraintSpec:
    """Structured output as asked: kind "json_schema" (source: a schema), "grammar" (GBNF or
    Lark text), "regex" or "lark"; `what` is the request field it came from (errors name it);
    `trigger`: the grammar is lazy (text/grammar.py LazyConstraint)."""
    kind: str
    source: object
    what: str
    trigger: int | None = None      # a token the grammar starts with: it holds from there on


@dataclasses.dataclass(frozen=True)
class ToolUse:
    """The functions offered (as chat templates see them: {"type": "function", "function":
    {name, description, parameters}}) and `choice`: "none", "auto", "required" or a function's
    name; parallel: "required" may call several. legacy: offered as OpenAI's legacy
    `functions` (one call, answered as `function_call`)."""
    tools: tuple = ()
    choice: str = "none"
    parallel: bool = True
    legacy: bool = False

    def offered(self):
        """The tools the model may call under `choice`."""
        if self.choice == "none":
            return []
        if self.choice in ("auto", "required"):
            return list(self.tools)
        return [t for t in self.tools if t["function"]["name"] == self.choice]


@dataclasses.dataclass(frozen=True)
class GenerateRequest:
    """One generation request: a chat (messages) or prompts (texts or token-id lists)."""
    model: str | None = None
    sampling: SamplingParams = SamplingParams()
    output: Output = Output()
    constraint: ConstraintSpec | None = None
    tools: ToolUse = ToolUse()
    messages: tuple | None = None
    prompts: tuple = ()
    template_kwargs: dict = dataclasses.field(default_factory=dict)
    speculative: bool = True
    infill: object = None
    images: tuple = ()

    @property
    def chat(self):
        return self.messages is not None

    def seeds(self):
        """The SamplingParams of each of the n choices of a prompt: choice j draws with seed +
        j (mod 2^64), so n > 1 choices differ and each is reproducible."""
        s = self.sampling
        if s.seed is None or self.output.n == 1:
            return [s] * self.output.n
        return [s.with_seed((s.seed + j) & 0xFFFFFFFFFFFFFFFF) for j in range(self.output.n)]
