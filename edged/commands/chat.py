"""`edged chat`: a small interactive client for the daemon; streams each reply as it comes."""
import http.client
import json
import os
import socket
import sys

from ..errors import EdgedError

DEFAULT_SOCKET = "/run/edged/edged.sock"


def register(sub):
    p = sub.add_parser("chat", help="chat with a model served by `edged serve` (streams the reply)",
                       description="Interactive chat through the daemon's Unix socket. Empty line or "
                                   "Ctrl-D ends; /reset forgets the conversation.")
    p.add_argument("--socket", metavar="PATH", default=os.environ.get("EDGED_SOCKET", DEFAULT_SOCKET),
                   help=f"daemon socket (default $EDGED_SOCKET or {DEFAULT_SOCKET})")
    p.add_argument("--model", metavar="NAME", help="model to use (default: the daemon's default model)")
    p.add_argument("--system", metavar="TEXT", help="system prompt")
    p.add_argument("-p", "--prompt", metavar="TEXT", help="send this one message, print the reply, exit")
    p.add_argument("-n", "--max-tokens", type=int, metavar="N", help="limit the reply length")
    p.add_argument("--temp", type=float, metavar="T", help="sampling temperature")
    p.add_argument("--seed", type=int, metavar="S", help="sampling seed")
    p.set_defaults(func=run)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("edged", timeout=600)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        try:
            self.sock.connect(self.unix_path)
        except FileNotFoundError:
            raise EdgedError(f"no daemon socket at {self.unix_path} (is `edged serve` running? --socket?)") from None
        except PermissionError:
            raise EdgedError(f"permission denied on {self.unix_path} (are you in the socket's group?)") from None
        except ConnectionRefusedError:
            raise EdgedError(f"nothing listening on {self.unix_path}") from None


def stream_chat(sock_path, body, out):
    """POST a streaming chat request; write the deltas to `out`; return the whole reply text."""
    conn = _UnixConnection(sock_path)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps({**body, "stream": True}),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            data = r.read().decode(errors="replace")
            try:
                msg = json.loads(data)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = data.strip()
            raise EdgedError(f"daemon answered {r.status}: {msg}")
        parts = []
        for raw in r:
            line = raw.decode().rstrip("\r\n")
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                raise EdgedError(f"daemon: {ev['error'].get('message')}")
            for ch in ev.get("choices", []):
                text = ch.get("delta", {}).get("content")
                if text:
                    parts.append(text)
                    out.write(text)
                    out.flush()
        return "".join(parts)
    finally:
        conn.close()


def run(args):
    messages = [{"role": "system", "content": args.system}] if args.system else []
    extra = {k: v for k, v in (("model", args.model), ("max_tokens", args.max_tokens),
                               ("temperature", args.temp), ("seed", args.seed)) if v is not None}
    interactive = args.prompt is None
    while True:
        if interactive:
            try:
                line = input("> " if sys.stdin.isatty() else "")
            except EOFError:
                break
            if not line.strip():
                break
            if line.strip() == "/reset":
                messages = messages[:1] if args.system else []
                continue
        else:
            line = args.prompt
        messages.append({"role": "user", "content": line})
        reply = stream_chat(args.socket, {"messages": messages, **extra}, sys.stdout)
        sys.stdout.write("\n")
        sys.stdout.flush()
        messages.append({"role": "assistant", "content": reply})
        if not interactive:
            break
    return 0
