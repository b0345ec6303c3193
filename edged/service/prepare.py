"""A request's prompt as the model takes it: chat template, tools, reasoning and grammar.

Runs in a worker thread (template rendering and grammar compilation take milliseconds to a
second), before the request takes a place on the decode thread. Knows no wire protocol: it
reads a GenerateRequest (service/request.py).
"""
import dataclasses

from ..errors import RequestError
from ..text import grammar, harmony, infill, reasoning, tools
from .request import ConstraintSpec


@dataclasses.dataclass
class Prepared:
    prompts: list                   # token ids per prompt
    family: str | None = None       # tool-call family when tools are on
    tools: list = dataclasses.field(default_factory=list)   # the tools offered (their schemas)
    think: bool = False             # split <think> reasoning out
    think_inside: bool = False      # the prompt opened the think block
    harmony: bool = False           # gpt-oss's channels: analysis / final / calls (text/harmony.py)
    constraint: object = None       # grammar.Constraint in its start state (each choice a copy)
    images: list = dataclasses.field(default_factory=list)  # ImageEmbedding of each image in the prompt
    image_ids: frozenset = frozenset()      # their pseudo ids in prompts (>= n_vocab, engine/vision.py)


RESERVED_TEMPLATE_VARS = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
                          "max_chars", "max_seconds", "template_file", "template_name"}


def prepare(lm, request):
    """Prompt ids, tool-call family, reasoning split and grammar of `request` on the loaded
    model `lm` (service/loader.py LoadedModel)."""
    tok = lm.tokenizer
    prep = Prepared([])
    spec = request.constraint
    prep.images = lm.image_embeddings(request.images)      # 400 when the model takes none
    prep.image_ids = frozenset(t for e in prep.images for t in e.token_ids(lm.model.hp.n_vocab))
    if request.chat:
        template = lm.template_source()
        messages = tools.messages_for_template(list(request.messages))
        prep.harmony = harmony.is_harmony(template)
        if prep.harmony:
            messages = harmony.messages_for_template(messages)
        kwargs = request.template_kwargs
        bad = sorted(k for k in kwargs if k in RESERVED_TEMPLATE_VARS or not k.isidentifier())
        if bad:
            raise RequestError(f"'chat_template_kwargs' may not set {', '.join(bad)}",
                               param="chat_template_kwargs")
        use = request.tools.offered()
        choice = request.tools.choice
        if use:
            prep.family = tools.family_of(template)
            prep.tools = use
            if tools.template_takes_tools(template):
                kwargs = dict(kwargs, tools=use)
            else:
                note = tools.generic_system_prompt(use, required=choice != "auto")
                if messages[0]["role"] == "system":
                    messages = [dict(messages[0], content=messages[0]["content"] + "\n\n" + note)] + messages[1:]
                else:
                    messages = [{"role": "system", "content": note}] + messages
            args_style = tools.mistral_args_style(template)
            if choice != "auto":
                # a named function is called once; "required" may call several unless told not to
                parallel = request.tools.parallel and choice == "required"
                spec = ConstraintSpec("lark", tools.call_grammar(
                    prep.family, use, parallel=parallel, args_style=args_style, token=special_token(tok)), "tools")
            elif spec is None and (trigger := call_trigger(tok, prep.family)) is not None:
                # "auto": text, or calls whose arguments follow their schemas from the call's
                # opening token on (llama.cpp's lazy grammar)
                spec = ConstraintSpec("lark", tools.call_grammar(
                    prep.family, use, parallel=request.tools.parallel, args_style=args_style,
                    token=special_token(tok)), "tools", trigger)
        ids = lm.encode_chat_images(messages, prep.images, **kwargs) if prep.images else \
            lm.encode_chat(messages, **kwargs)
        prep.prompts.append(ids)
        prep.think = request.output.reasoning and (prep.harmony or reasoning.OPEN in template)
        if prep.think and not prep.harmony:
            prep.think_inside = reasoning.starts_inside(tok.decode(ids[-8:], special=True))
    elif request.infill is not None:
        prep.prompts.append(infill_ids(tok, request.infill, lm.n_ctx, request.output.max_tokens, lm.spm_infill))
    else:
        for prompt in request.prompts:
            prep.prompts.append(prompt if isinstance(prompt, list)
                                else lm.encode_text(prompt, add_special=True, parse_special=False))
    if spec is not None:
        try:
            prep.constraint = grammar.constraint(spec.kind, spec.source, spec.what, tok, lm.model.n_vocab,
                                                 spec.trigger)
        except RequestError as e:       # the field's name as OpenAI's error.param too
            e.param = e.param or spec.what
            raise
    return prep


def infill_ids(tok, fill, n_ctx, max_tokens, spm_infill=False):
    """llama-server's /infill prompt (text/infill.py) within a context of n_ctx: the prefix and
    suffix within half of it (llama-server: n_batch, 2048), room kept for the reply (max_tokens,
    or an eighth of the context), the extra context in what is left."""
    return infill.prompt_ids(tok, fill, n_ctx, n_batch=min(infill.N_BATCH, n_ctx // 2),
                             n_predict=max_tokens or n_ctx // 8, spm_infill=spm_infill)


def call_trigger(tok, family):
    """The token that opens a tool call of `family` when it is one token of the vocabulary
    (Hermes/Qwen's <tool_call>, Mistral's [TOOL_CALLS], Phi-4's <|tool_call|>), else None:
    families whose calls start as text (Llama 3's JSON, the generic one) or share their opening
    with other messages (harmony) stay unconstrained under tool_choice "auto"."""
    mark = {"hermes": "<tool_call>", "qwen3coder": "<tool_call>", "mistral": "[TOOL_CALLS]",
            "phi4": "<|tool_call|>"}.get(family)
    if mark is None:
        return None
    ids = tok.encode(mark, add_special=False, parse_special=True)
    return ids[0] if len(ids) == 1 else None


def special_token(tok):
    """text -> `<[id]>` (llguidance's token syntax) when text is one control token."""
    def token(text):
        ids = tok.encode(text, add_special=False, parse_special=True)
        return f"<[{ids[0]}]>" if len(ids) == 1 and tok.is_control(ids[0]) else None
    return token
