#!/usr/bin/env bash
# Set everything up (tools/bootstrap.sh) and run edged end to end on built-in demos, no downloads:
# first the engine alone (a random-weight model of a tiny shape: info, generate, bench), then the
# main job: make a demo model and a signing key, sign the model, start the daemon on a local
# socket, send a chat request through the socket and print the streamed reply.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/bootstrap.sh
EDGED=.venv/bin/edged
PY=.venv/bin/python

rm -rf demo
mkdir -p demo/models demo/keys demo/run

echo "--- the engine on its own: a random-weight model of a tiny shape (info, generate, bench)"
"$EDGED" synth --shape tiny --type Q4_K_M demo/tiny-Q4_K_M.gguf
"$EDGED" info -m demo/tiny-Q4_K_M.gguf -c 512
"$EDGED" generate -m demo/tiny-Q4_K_M.gguf -p "Once upon a time" -n 32 --temp 0.8 --seed 1
"$EDGED" bench -m demo/tiny-Q4_K_M.gguf -p 64 -n 16 -r 2

echo "--- the main job: a signed demo model served by the daemon over a Unix socket"
chmod 755 demo demo/models demo/keys
"$PY" tools/make_demo_model.py demo/models/demo.gguf
"$EDGED" gguf-dump demo/models/demo.gguf | head -n 12
"$EDGED" keygen --out demo/operator.pem
cp demo/operator.pub.pem demo/keys/
"$EDGED" sign --key demo/operator.pem demo/models/demo.gguf
"$EDGED" verify --trusted demo/keys demo/models/demo.gguf

cat > demo/edged.toml <<EOF
socket = "$PWD/demo/run/edged.sock"
socket_group = ""
models_dir = "$PWD/demo/models"
trusted_keys = "$PWD/demo/keys"
default_model = "demo"
ctx_size = 512
EOF
OPENBLAS_NUM_THREADS=1 "$EDGED" serve --config demo/edged.toml 2> demo/edged.log &
DAEMON=$!
trap 'kill $DAEMON 2>/dev/null; wait $DAEMON 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
    [ -S demo/run/edged.sock ] && curl -sf --unix-socket demo/run/edged.sock http://edged/health >/dev/null && break
    kill -0 $DAEMON 2>/dev/null || { cat demo/edged.log >&2; exit 1; }
    sleep 0.1
done

echo "--- GET /v1/models"
curl -sS --unix-socket demo/run/edged.sock http://edged/v1/models; echo
echo "--- edged chat (streamed through demo/run/edged.sock; random weights, so random words)"
"$EDGED" chat --socket demo/run/edged.sock -p "Tell me a story about a little cat." -n 40 --seed 1
echo "--- daemon log"
kill -TERM $DAEMON
wait $DAEMON
trap - EXIT
cat demo/edged.log
