#!/usr/bin/env bash
# Set everything up (tools/bootstrap.sh) and run edged end to end, no downloads: first the engine
# alone (a random-weight model of a tiny shape: info, bench), then the main job: the built-in demo
# model (TinyStories 260K, edged/data/), a signing key, the signed model served by the daemon on
# a local socket, and a story streamed through the socket.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/bootstrap.sh
EDGED=.venv/bin/edged
PY=.venv/bin/python

rm -rf demo
mkdir -p demo/models demo/keys demo/run

echo "--- the engine on its own: a random-weight model of a tiny shape (info, bench)"
"$EDGED" synth --shape tiny --type Q4_K_M demo/tiny-Q4_K_M.gguf
"$EDGED" info -m demo/tiny-Q4_K_M.gguf -c 512
"$EDGED" bench -m demo/tiny-Q4_K_M.gguf -p 64 -n 16 -r 2

echo "--- the main job: a signed demo model served by the daemon over a Unix socket"
chmod 755 demo demo/models demo/keys
cp "$("$PY" -c 'from edged.data import DEMO_MODEL; print(DEMO_MODEL)')" demo/models/stories.gguf
"$EDGED" gguf-dump demo/models/stories.gguf | head -n 8
"$EDGED" keygen --out demo/operator.pem
cp demo/operator.pub.pem demo/keys/
"$EDGED" sign --key demo/operator.pem demo/models/stories.gguf
"$EDGED" verify --trusted demo/keys demo/models/stories.gguf

cat > demo/edged.toml <<EOF
socket = "$PWD/demo/run/edged.sock"
socket_group = ""
models_dir = "$PWD/demo/models"
trusted_keys = "$PWD/demo/keys"
default_model = "stories"
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
echo "--- a story streamed through demo/run/edged.sock (POST /v1/completions, \"stream\": true)"
"$PY" - demo/run/edged.sock <<'PY'
import json, sys, httpx
body = {"prompt": "Once upon a time", "max_tokens": 80, "temperature": 0, "stream": True}
with httpx.Client(transport=httpx.HTTPTransport(uds=sys.argv[1]), timeout=60) as client:
    with client.stream("POST", "http://edged/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                print(json.loads(line[6:])["choices"][0]["text"], end="", flush=True)
print()
PY
echo "--- daemon log"
kill -TERM $DAEMON
wait $DAEMON
trap - EXIT
cat demo/edged.log
