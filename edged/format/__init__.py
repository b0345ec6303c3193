"""GGUF container, quantization types and the quantizer (no engine, no text)."""
