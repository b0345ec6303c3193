#!/usr/bin/env bash
# Set everything up (tools/bootstrap.sh), make a small random-weight model with edged's own
# quantizer, and generate text from it end to end (the text is random: the weights are).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/bootstrap.sh
mkdir -p demo
.venv/bin/edged synth --shape tiny --type Q4_K_M demo/tiny-Q4_K_M.gguf
.venv/bin/edged info -m demo/tiny-Q4_K_M.gguf -c 512
.venv/bin/edged generate -m demo/tiny-Q4_K_M.gguf -p "Once upon a time" -n 32 --temp 0.8 --seed 1
.venv/bin/edged bench -m demo/tiny-Q4_K_M.gguf -p 64 -n 16 -r 2
