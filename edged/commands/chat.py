"""`edged chat`: an interactive client of the daemon that behaves as `ollama run` does.

Line editing and history come from Python's `readline` (history in
$XDG_STATE_HOME/edged/chat_history, at most HISTORY_LINES lines). Ctrl-C during a reply stops
that reply and keeps the conversation: as in `ollama run`, the user's message stays and the
partial reply is dropped (the next turn follows the user's message). Ctrl-C at the prompt clears
the line; Ctrl-D or /bye quits. A line starting with "/" is a command, never sent to the model
("//" sends the rest with one "/"); a message between triple quotes spans several lines.
Sampling parameters set with /set are checked against the daemon's own bounds (SamplingParams)
before any request."""
import base64
import mimetypes
import os
import sys

from ..errors import EdgedError
from .loadargs import add_socket_arg

HISTORY_LINES = 1000
PROMPT, MORE = ">>> ", "... "
QUOTES = '"""'
MAX_IMAGE_FILE = 64 << 20     # /image reads at most this (the daemon's image_max_bytes decides)
# /set NAME: SamplingParams field, or a request field ("max_tokens") checked here
PARAMS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
          "repeat_penalty": "repeat_penalty", "repeat_last_n": "penalty_last_n",
          "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
          "seed": "seed", "max_tokens": "max_tokens", "num_predict": "max_tokens"}
HELP = f"""Available commands:
  /set NAME VALUE   set a sampling parameter: {", ".join(sorted(PARAMS))}
  /set NAME         reset it to the daemon's default
  /system TEXT      set the system message (/system alone removes it)
  /image FILE       attach an image (PNG, JPEG, WebP, GIF) to the next message; the model
                    needs its mmproj
  /show             the model, system message, parameters and conversation length
  /clear            forget the conversation and the images not yet sent (the system message stays)
  /bye              exit (also Ctrl-D)
  /?, /help         this help

Use {QUOTES} to begin a multi-line message, {QUOTES} again to end it; start a line with // to
send a message that starts with /. Ctrl-C stops a reply (the conversation goes on without it)
or clears the line being typed."""


def configure(p):
    p.description = ("Interactive chat with a model served by `edged serve`, as `ollama run`: line "
                     "editing and history, Ctrl-C stops a reply, /help lists the commands, Ctrl-D "
                     "or /bye quits.")
    add_socket_arg(p)
    p.add_argument("--model", metavar="NAME", help="model to use (default: the daemon's default model)")
    p.add_argument("--system", metavar="TEXT", help="system prompt")
    p.add_argument("-p", "--prompt", metavar="TEXT", help="send this one message, print the reply, exit")
    p.add_argument("-n", "--max-tokens", type=int, metavar="N", help="limit the reply length")
    p.add_argument("--temp", type=float, metavar="T", help="sampling temperature")
    p.add_argument("--seed", type=int, metavar="S", help="sampling seed")
    p.set_defaults(func=run)


def history_path(environ=None):
    environ = os.environ if environ is None else environ
    state = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "edged", "chat_history")


def stream_chat(sock_path, body, out):
    """POST a streaming chat request; write the deltas to `out`; return the whole reply text."""
    from ..service.client import Daemon
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


class Session:
    """The conversation and settings of one `edged chat`; `handle(line)` is one entered line."""

    def __init__(self, args, out=sys.stdout):
        self.socket, self.model, self.out = args.socket, args.model, out
        self.system = args.system
        self.params = {}                     # /set NAME -> value, as sent
        for name, value in (("max_tokens", args.max_tokens), ("temperature", args.temp), ("seed", args.seed)):
            if value is not None:
                self.set_param(name, str(value))
        self.messages = []
        self.images = []                     # /image: data URLs for the next message
        self.pending = None                  # lines of a multi-line message, or None
        self.done = False

    def say(self, text):
        self.out.write(text + "\n")
        self.out.flush()

    # --- commands ---------------------------------------------------------------------
    def set_param(self, name, value):
        """Check `value` as the daemon would (SamplingParams' bounds) and keep it; None resets."""
        field = PARAMS.get(name)
        if field is None:
            raise EdgedError(f"unknown parameter {name!r}; one of: {', '.join(sorted(PARAMS))}")
        if value is None:
            self.params.pop(field, None)
            return
        if field == "max_tokens":
            if not value.isdigit() or int(value) < 1:
                raise EdgedError(f"{name}={value!r}: must be an integer >= 1")
            self.params[field] = int(value)
            return
        from ..text.sampling import SamplingParams
        checked = SamplingParams(**{field: value})          # RequestError names the bound
        self.params[field] = getattr(checked, field)

    def command(self, line):
        words = line.split()
        cmd, rest = words[0], line[len(words[0]):].strip()
        if cmd in ("/bye", "/exit"):
            self.done = True
        elif cmd in ("/help", "/?"):
            self.say(HELP)
        elif cmd == "/clear":
            self.messages, self.images = [], []
            self.say("Cleared the conversation.")
        elif cmd == "/system" or cmd == "/set" and words[1:2] == ["system"]:
            text = rest if cmd == "/system" else rest[len("system"):].strip()
            self.system = text or None
            self.say("Set the system message." if text else "Removed the system message.")
        elif cmd == "/set":
            args = words[2:] if words[1:2] == ["parameter"] else words[1:]     # ollama's form too
            if not args:
                self.say(HELP)
            else:
                self.set_param(args[0], " ".join(args[1:]) or None)
                self.say(f"Set {args[0]} to {' '.join(args[1:])}." if args[1:] else f"Reset {args[0]}.")
        elif cmd == "/image":
            self.attach(rest)
        elif cmd == "/show":
            self.show()
        else:
            self.say(f"Unknown command {cmd!r}. Type /? for help.")

    def attach(self, path):
        """/image FILE: read here (the daemon may not see this file) and sent inline."""
        if not path:
            raise EdgedError("/image needs a file name")
        path = os.path.expanduser(path)
        try:
            with open(path, "rb") as fh:
                data = fh.read(MAX_IMAGE_FILE + 1)
        except OSError as e:
            raise EdgedError(f"/image {path}: {e.strerror}") from None
        if len(data) > MAX_IMAGE_FILE:
            raise EdgedError(f"/image {path}: larger than {MAX_IMAGE_FILE >> 20} MiB")
        mime = mimetypes.guess_type(path)[0] or "application/octet-stream"
        self.images.append(f"data:{mime};base64," + base64.b64encode(data).decode())
        self.say(f"Added image {path} ({len(data)} bytes) to the next message.")

    def show(self):
        from ..service.client import Daemon
        with Daemon(self.socket) as daemon:
            models = daemon.request("GET", "/v1/models")["data"]
        # the model asked for, else the one the daemon would use: its loaded model
        info = next((m for m in models if m["id"] == self.model or not self.model and m.get("loaded")), {})
        name = self.model or info.get("id")
        turns = sum(1 for m in self.messages if m["role"] == "user")
        lines = [f"model: {name or '(none loaded)'}"]
        for key in ("size", "signer", "kernel_path", "kv_cache"):
            if info.get(key) is not None:
                lines.append(f"  {key}: {info[key]}")
        lines.append(f"system: {self.system!r}" if self.system else "system: (none)")
        lines.append("parameters: " + (", ".join(f"{k}={v}" for k, v in self.params.items()) or "(daemon defaults)"))
        lines.append(f"conversation: {turns} message(s) sent")
        self.say("\n".join(lines))

    # --- lines and turns ----------------------------------------------------------------
    def handle(self, line):
        """One line as entered; sends a message when one is complete."""
        if self.pending is not None:                        # inside a multi-line message
            text, end = _cut_suffix(line, QUOTES)
            self.pending.append(text)
            if end:
                text, self.pending = "\n".join(self.pending), None
                self.send(text)
            return
        if line.startswith(QUOTES):
            text, end = _cut_suffix(line[len(QUOTES):], QUOTES)
            if end:
                self.send(text)
            else:
                self.pending = [text]
            return
        if line.startswith("//"):
            self.send(line[1:])
        elif line.startswith("/"):
            try:
                self.command(line)
            except EdgedError as e:
                self.say(f"error: {e}")
        elif line.strip():
            self.send(line)

    def request_body(self):
        system = [{"role": "system", "content": self.system}] if self.system else []
        body = {"messages": system + self.messages, **self.params}
        if self.model:
            body["model"] = self.model
        return body

    def send(self, text, once=False):
        """One turn. Ctrl-C (KeyboardInterrupt) stops the reply: closing the connection cancels it
        in the daemon; the user's message stays and the partial reply is dropped, as ollama does.
        A refusal or a missing daemon is printed (raised when `once`: `edged chat -p`)."""
        if not text.strip():
            return
        content = text
        if self.images:
            content = [{"type": "image_url", "image_url": {"url": u}} for u in self.images] + \
                [{"type": "text", "text": text}]
        self.messages.append({"role": "user", "content": content})
        try:
            reply = stream_chat(self.socket, self.request_body(), self.out)
        except KeyboardInterrupt:
            self.say("")
            return
        except EdgedError as e:                         # the daemon refused it: not in the conversation
            self.messages.pop()
            if once:
                raise
            self.say(f"\nerror: {e}")
            return
        self.say("")
        self.images = []
        self.messages.append({"role": "assistant", "content": reply})


def _cut_suffix(text, suffix):
    return (text[:-len(suffix)], True) if text.endswith(suffix) else (text, False)


def _readline(path):
    """Python's readline with the history at `path` (None when stdin is not a terminal)."""
    if not sys.stdin.isatty():
        return None
    try:
        import readline
    except ImportError:
        return None
    readline.set_history_length(HISTORY_LINES)
    try:
        readline.read_history_file(path)
    except OSError:
        pass
    return readline


def _save_history(rl, path):
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        rl.write_history_file(path)                 # at most HISTORY_LINES lines
        os.chmod(path, 0o600)                       # what the user typed: theirs alone
    except OSError as e:
        print(f"edged chat: history not saved: {e.strerror}: {path}", file=sys.stderr)


def run(args):
    session = Session(args)
    if args.prompt is not None:
        session.send(args.prompt, once=True)
        return 0
    path = history_path()
    rl = _readline(path)
    tty = rl is not None
    try:
        while not session.done:
            try:
                line = input((MORE if session.pending is not None else PROMPT) if tty else "")
            except EOFError:
                if tty:
                    session.say("")
                break
            except KeyboardInterrupt:                   # clears the line (and a multi-line message)
                empty = session.pending is None and not (rl.get_line_buffer() if rl else "")
                session.pending = None
                session.say("\nUse Ctrl-D or /bye to exit." if empty else "")
                continue
            session.handle(line)
    finally:
        if rl is not None:
            _save_history(rl, path)
    return 0
