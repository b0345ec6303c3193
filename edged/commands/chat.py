"""`edged chat`: a small interactive client for the daemon; streams each reply as it comes."""
import sys

from ..service.client import Daemon
from .loadargs import add_socket_arg


def configure(p):
    p.description = ("Interactive chat through the daemon's Unix socket. Empty line or "
                     "Ctrl-D ends; /reset forgets the conversation.")
    add_socket_arg(p)
    p.add_argument("--model", metavar="NAME", help="model to use (default: the daemon's default model)")
    p.add_argument("--system", metavar="TEXT", help="system prompt")
    p.add_argument("-p", "--prompt", metavar="TEXT", help="send this one message, print the reply, exit")
    p.add_argument("-n", "--max-tokens", type=int, metavar="N", help="limit the reply length")
    p.add_argument("--temp", type=float, metavar="T", help="sampling temperature")
    p.add_argument("--seed", type=int, metavar="S", help="sampling seed")
    p.set_defaults(func=run)


def stream_chat(sock_path, body, out):
    """POST a streaming chat request; write the deltas to `out`; return the whole reply text."""

    parts = []
    with Daemon(sock_path) as daemon:
        for event in daemon.stream("/v1/chat/completions", body):
            for ch in event.get("choices", []):
                text = (ch.get("delta") or {}).get("content")
                if text:
                    parts.append(text)
                    out.write(text)
                    out.flush()
    return "".join(parts)


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
