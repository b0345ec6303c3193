"""edged: an LLM runtime for edge Linux devices."""

__version__ = "0.1.0"

# Public names are imported lazily so that `edged --help` and the GGUF tools stay fast and
# do not need the engine's compiled modules.
_LAZY = {
    "Model": "edged.engine.model",
    "Session": "edged.engine.model",
    "BatchEntry": "edged.engine.batch",
    "SamplingParams": "edged.text.sampling",
    "Speculation": "edged.engine.speculative",
    "Tokenizer": "edged.text.tokenizer",
    "GGUFFile": "edged.format.gguf",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edged' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
