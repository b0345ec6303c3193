"""Fill-in-the-middle: POST /infill, llama-server's route that code editors' plugins (llama.vim,
llama.vscode) call.

The body as llama-server takes it: `input_prefix` and `input_suffix` (strings, or lists of
strings and token ids), `input_extra` ([{"filename", "text"}]: other files, the repo-level
context), `prompt` (the start of the middle, already typed), `n_predict`, the sampling fields of
/v1/completions, `stream`, `response_fields`. It becomes the one internal request with a
text.infill.Infill (the prompt is laid out by prepare(), from the FIM tokens the model's
vocabulary has: a model without them gets a 400 naming the missing ones), is admitted and run
like any completion (Api.generate), and is answered in llama-server's own completion shape
(`content`, `stop`, `stop_type`, `tokens_predicted`, `tokens_evaluated`, `tokens_cached`,
`truncated`, `timings`), or streamed as server-sent events of that shape without a closing
[DONE], as llama-server does for its non-OpenAI routes. `response_fields` keeps only the named
fields, nested ones as "timings/prompt_n" keys; `t_max_predict_ms` bounds the generation once
it has a new line (PredictLimit). `n_predict` 0 (llama.vim's warm-up of its
extra context) is answered at once with an empty completion; nothing is evaluated.

/v1/completions with `suffix` goes through service/openai.py with the same Infill.
"""
import dataclasses
import time
from typing import Annotated, Any, Union

from pydantic import Field

from ..errors import RequestError
from ..text.infill import Infill
from ..text.sampling import SamplingParams
from .openai import _constraint
from .openai_schema import MAX_STOP, _Common, _Strict, validated
from .request import GenerateRequest, Output
from .wire import Reply, StreamReply, error_for, json_body, serialised, sse

Fragment = Union[str, list[Union[str, int]]]


class ExtraChunk(_Strict):
    text: str
    filename: str | None = None
    time: Any = None                    # llama.vim sends each chunk's time; unused


class InfillRequest(_Common):
    input_prefix: Fragment
    input_suffix: Fragment
    input_extra: list[ExtraChunk] | None = None
    prompt: str = ""
    n_predict: Annotated[int, Field(ge=-1)] | None = None
    repeat_last_n: int | None = None    # llama-server's name of penalty_last_n
    response_fields: list[str] | None = None
    t_max_prompt_ms: int | None = None  # accepted, not enforced (request_timeout bounds a request)
    t_max_predict_ms: Annotated[int, Field(ge=0)] | None = None


def routes(api):
    """(method, path) -> handler of the infill route, for Api's table."""
    return {("POST", "/infill"): InfillRoute(api).infill}


def parse(body):
    """An /infill body -> (GenerateRequest, InfillRequest); RequestError naming the field."""
    r = validated(InfillRequest, body)
    stop = [r.stop] if isinstance(r.stop, str) else (r.stop or [])
    if len(stop) > MAX_STOP or not all(stop):
        raise RequestError(f"'stop' must be a non-empty string or a list of up to {MAX_STOP} of them",
                           param="stop")
    if r.n > 1:
        raise RequestError("'n' must be 1 for /infill", param="n")
    fields = {f.name: getattr(r, f.name) for f in dataclasses.fields(SamplingParams)}
    if r.repeat_last_n is not None:
        fields["penalty_last_n"] = r.repeat_last_n
    max_tokens = r.max_tokens if r.n_predict in (None, -1) else r.n_predict
    fill = Infill(prefix=_fragment(r.input_prefix), suffix=_fragment(r.input_suffix),
                  extra=tuple((c.filename, c.text) for c in r.input_extra or ()), prompt=r.prompt)
    return GenerateRequest(model=r.model, sampling=SamplingParams(**fields), constraint=_constraint(r),
                           output=Output(max_tokens=max_tokens or None, stop=tuple(stop), stream=r.stream),
                           prompts=(r.prompt,), infill=fill), r


def _fragment(x):
    return x if isinstance(x, str) else tuple(x)


def pick(fields, obj):
    """llama-server's response_fields: only these, "a/b" read from nested objects."""
    out = {}
    for path in fields:
        cur, ok = obj, True
        for k in path.split("/"):
            if isinstance(cur, dict) and k in cur:
                cur = cur[k]
            else:
                ok = False
                break
        if ok:
            out[path] = cur
    return out


class PredictLimit:
    """llama-server's t_max_predict_ms: once the reply has a new line, generation stops when
    this many milliseconds have passed since its first token (an editor's latency bound)."""

    def __init__(self, ms):
        self.ms, self.t0, self.new_line, self.hit = ms, None, False, False

    def see(self, choice, text):
        if not self.ms:
            return
        now = time.monotonic()
        self.t0 = self.t0 or now
        self.new_line = self.new_line or "\n" in text
        if self.new_line and (now - self.t0) * 1e3 > self.ms and not self.hit:
            self.hit = True
            choice.job.cancel.set()


class InfillRoute:
    def __init__(self, api):
        self.api = api

    async def infill(self, req):
        request, r = parse(json_body(req, self.api.state.cfg.max_body_bytes))
        if r.n_predict == 0:
            name = self.api.state.registry.resolve(r.model)
            req.info.update(model=name, prompt_tokens=0, completion_tokens=0)
            return Reply(200, self._final(name, "", 0, 0, 0, "limit", {}, r.response_fields))
        gen = await self.api.generate(req, request)
        limit = PredictLimit(r.t_max_predict_ms)
        if request.output.stream:
            return StreamReply(self._events(gen, req, r.response_fields, limit), gen.close)
        try:
            async for c, text, fin in gen.events(req):
                if fin is None:
                    limit.see(c, text)
        finally:
            await gen.close()
        return await serialised(lambda: Reply(200, self._result(gen, r.response_fields, whole=True)),
                                self.api.state.cfg.max_reply_bytes)

    @staticmethod
    def _final(model, content, n_prompt, n_gen, cached, stop_type, timings, response_fields):
        res = {"index": 0, "content": content, "tokens": [], "id_slot": 0, "stop": True,
               "model": model, "tokens_predicted": n_gen, "tokens_evaluated": n_prompt,
               "has_new_line": "\n" in content, "truncated": False, "stop_type": stop_type,
               "stopping_word": "", "tokens_cached": cached, "timings": timings}
        return pick(response_fields, res) if response_fields else res

    def _result(self, gen, response_fields, whole):
        c = gen.choices[0]
        u = gen.usage()
        now = time.monotonic()
        t_first = gen.t_first or now
        prompt_n = gen.prefill.get("evaluated", u["prompt"] - u.get("cached", 0))
        prompt_ms = (t_first - gen.t_start) * 1e3
        gen_ms = (now - t_first) * 1e3
        timings = {"cache_n": u.get("cached", 0), "prompt_n": prompt_n, "prompt_ms": prompt_ms,
                   "prompt_per_token_ms": prompt_ms / max(prompt_n, 1),
                   "prompt_per_second": prompt_n * 1e3 / prompt_ms if prompt_ms > 0 else 0.0,
                   "predicted_n": c.n_gen, "predicted_ms": gen_ms,
                   "predicted_per_token_ms": gen_ms / max(c.n_gen, 1),
                   "predicted_per_second": c.n_gen * 1e3 / gen_ms if gen_ms > 0 else 0.0}
        content = c.result()[1] if whole else ""
        stop_type = "limit" if c.finish in ("length", "cancelled") else "eos"
        return self._final(gen.lm.name, content, u["prompt"], c.n_gen, u["prompt"] + c.n_gen,
                           stop_type, timings, response_fields)

    async def _events(self, gen, req, response_fields, limit):
        n = 0
        try:
            async for c, text, fin in gen.events(req):
                if fin is None:
                    n += 1
                    limit.see(c, text)
                    if text:
                        yield sse({"index": 0, "content": text, "tokens": [], "stop": False, "id_slot": 0,
                                   "tokens_predicted": n, "tokens_evaluated": gen.usage()["prompt"]})
                elif fin != "cancelled" or limit.hit:
                    yield sse(self._result(gen, response_fields, whole=False))
        except Exception as e:  # noqa: BLE001 - the status line is gone; report in-band
            yield sse(error_for(e).body)
