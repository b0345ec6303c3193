"""Subcommands of the `edged` CLI, one module each (see edged/cli.py).

COMMANDS is the light table the parser is built from: each subcommand's one-line help and the
function ("module:function") that configures its parser. `edged --help` lists every command from
it without importing any command module, and running a command imports only that command's
module (and with it numpy, the engine or cryptography only where that command needs them)."""

COMMANDS = {
    "bench": ("bench:configure",
              "measure prompt (pp) and generation (tg) tokens/s"),
    "chat": ("chat:configure",
             "chat with a model served by `edged serve` (streams the reply)"),
    "generate": ("generate:configure",
                 "generate text from a prompt"),
    "gguf-dump": ("gguf_dump:configure",
                  "print a GGUF file's header, metadata and tensor table"),
    "info": ("info:configure",
             "model requirements and the machine's compute setup"),
    "keygen": ("keygen:configure",
               "make an RSA key pair for signing models"),
    "load": ("models:configure_load",
             "load a model in the daemon (verify, map, warm up)"),
    "models": ("models:configure_models",
               "list the daemon's models (loaded or not)"),
    "ps": ("models:configure_ps",
           "list the models the daemon has loaded"),
    "quantize": ("quantize:configure",
                 "quantize a GGUF model (Q4_K_M, Q8_0, ...)"),
    "rerank": ("rerank:configure",
               "score documents against a query with a reranker"),
    "serve": ("serve:configure",
              "run the daemon: serve signed models over a Unix socket"),
    "sign": ("sign:configure",
             "sign a model file (appended block or detached .sig)"),
    "embed": ("embed:configure", "print the embeddings of texts"),
    "synth": ("synth:configure",
              "write a random-weight GGUF model of a known shape"),
    "tokenize": ("tokenize:configure",
                 "print the token ids of a text under a model's tokenizer"),
    "unload": ("models:configure_unload",
               "unload a model from the daemon"),
    "verify": ("verify:configure",
               "check a model's signature against trusted keys"),
}
