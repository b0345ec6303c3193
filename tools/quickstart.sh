#!/usr/bin/env bash
# Set everything up (tools/bootstrap.sh) and run edged end to end on a built-in demo.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/bootstrap.sh
mkdir -p demo
.venv/bin/python - <<'PY'
import gguf, numpy as np
w = gguf.GGUFWriter("demo/demo.gguf", "llama")
w.add_block_count(1)
w.add_tensor("token_embd.weight", np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
PY
.venv/bin/edged gguf-dump demo/demo.gguf
