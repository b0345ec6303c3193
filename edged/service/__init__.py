"""The daemon behind `edged serve`, in three layers (docs/architecture.md, "The service"):

- transport.py: the Unix socket (systemd activation or bound here), HTTP framing by aiohttp,
  the peer-credential check;
- api.py: the route table and dispatch, pure coroutines from an `ApiRequest` to a `Reply` or
  a `StreamReply` (wire.py), testable without a socket; one module per wire protocol
  (openai.py, its bodies in openai_schema.py) parses a body into the one internal request
  (request.py: SamplingParams, Output, ConstraintSpec, ToolUse) and renders the events back;
  prepare.py turns a request into prompt ids and a grammar; jobs.py runs it on the decode
  thread as a Generation;
- registry.py / scheduler.py: models by name (verify, load, warm, swap, pin, idle unload)
  and the bounded FIFO of requests over `n_parallel` generation slots.

policy.py says which models a request may cause to be loaded and how often it may swap;
renderer.py renders chat templates in a bounded child process forked before the sandbox;
config.py reads edged.toml; systemd.py is sd_notify/listen_fds; log.py journald-friendly
stderr logging; metrics.py the Prometheus counters; daemon.py wires it all together.
client.py is the other side: the httpx client of the socket that `edged chat`, `models`, `ps`,
`load` and `unload` use.
"""
