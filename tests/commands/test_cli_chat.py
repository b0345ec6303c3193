"""`edged chat` in a terminal (issue 43.7), driven through a real pty by pexpect against a real
daemon serving SmolLM2-135M: commands are handled locally (/help is never sent), Ctrl-C during
a reply stops only the reply (the conversation goes on, without the partial reply, as in
`ollama run`), Ctrl-C at the prompt clears the line, readline's history survives a restart."""
import os
import re
import sys

import pytest

from conftest import ROOT
from daemon_support import Server, signed_shared_models

pexpect = pytest.importorskip("pexpect")
SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
STORY = "Write a very long story about a dragon and a knight."


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp, models, trusted = signed_shared_models(tmp_path_factory, "chat", {"smol": SMOL})
    s = Server(tmp, models, trusted, default_model="smol",
               extra={"ctx_size": 1024, "log_prompts": True, "max_output_tokens": 1000})
    yield s
    assert s.stop() == 0, s.logtext()


def chat_lines(srv):
    return [line for line in srv.logtext().splitlines() if "POST /v1/chat/completions" in line]


def spawn(srv, home):
    env = dict(os.environ, HOME=str(home), TERM="xterm", PYTHONPATH=ROOT)
    env.pop("XDG_STATE_HOME", None)
    child = pexpect.spawn(sys.executable, ["-m", "edged", "chat", "--socket", srv.socket, "--temp", "0"],
                          cwd=ROOT, env=env, encoding="utf-8", timeout=60, dimensions=(40, 200))
    child.expect_exact(">>> ")
    return child


def test_chat_commands_ctrl_c_and_history_in_a_terminal(srv, tmp_path):
    hist = tmp_path / ".local" / "state" / "edged" / "chat_history"
    hist.parent.mkdir(parents=True)
    hist.write_text("".join(f"old line {i}\n" for i in range(1100)))     # more than it keeps
    child = spawn(srv, tmp_path)
    try:
        child.sendline("/help")
        child.expect_exact("/bye")
        child.expect_exact(">>> ")
        child.sendline("/set temperature 9")                    # over SamplingParams' bound
        child.expect_exact("error: 'temperature' must be between 0 and 2 (got 9.0)")
        child.expect_exact(">>> ")
        child.sendline("/system Be brief.")
        child.expect_exact("Set the system message.")
        child.sendline("/nonsense")
        child.expect_exact("Unknown command '/nonsense'")
        child.expect_exact(">>> ")
        assert chat_lines(srv) == []                            # nothing went to the model

        child.sendline(STORY)                                   # Ctrl-C in the middle of the reply
        child.expect_exact(STORY)
        child.expect_exact("\r\n")                             # readline took the line (a redraw
        child.expect(r"\w+ \w+ \w+")                            # may echo it again): the reply streams
        child.sendintr()
        child.expect_exact(">>> ")
        child.sendline("/set max_tokens 4")
        child.expect_exact("Set max_tokens to 4.")
        child.expect_exact(">>> ")
        child.sendline('"""Say')                               # a two-line message
        child.expect_exact("... ")
        child.sendline('hello."""')
        child.expect_exact(">>> ")
        child.sendline("/show")
        child.expect(r"model: smol\r\n  size: \d+")
        child.expect_exact("system: 'Be brief.'")
        child.expect_exact("parameters: temperature=0.0, max_tokens=4")
        child.expect_exact("conversation: 2 message(s) sent")
        child.sendline("/clear")
        child.expect_exact("Cleared the conversation.")
        child.sendline("/show")
        child.expect_exact("conversation: 0 message(s) sent")
        child.expect_exact(">>> ")
        child.sendcontrol("d")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0

        lines = chat_lines(srv)
        assert len(lines) == 2, srv.logtext()
        assert "finish=cancelled" in lines[0], lines[0]
        assert " 200 " in lines[1] and "finish=length" in lines[1] and "completion_tokens=4" in lines[1]
        # the interrupted reply was dropped; the user's turn and the two-line message were sent
        prompt = re.search(r"prompt=(\[.*\]) reply=", lines[1]).group(1)
        assert prompt.count('"role": "user"') == 2 and '"role": "assistant"' not in prompt, prompt
        assert prompt.startswith('[{"role": "system", "content": "Be brief."}')
        assert '"Say\\nhello."' in prompt

        saved = hist.read_text().splitlines()
        assert len(saved) == 1000 and hist.stat().st_mode & 0o777 == 0o600
        assert saved[-5:] == ['"""Say', 'hello."""', "/show", "/clear", "/show"] and STORY in saved

        child = spawn(srv, tmp_path)                            # a new session: the history is back
        child.send("\x1b[A\x1b[A")                            # Up twice: "/clear" from the last session
        child.sendline("")
        child.expect_exact("Cleared the conversation.")
        child.expect_exact(">>> ")
        child.send("Hello")
        child.expect_exact("Hello")                             # in readline's buffer, not the tty's
        child.sendintr()                                        # Ctrl-C clears the line
        child.expect_exact(">>> ")
        child.sendline("/show")
        child.expect_exact("conversation: 0 message(s) sent")
        child.sendline("/bye")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0 and len(chat_lines(srv)) == 2
    finally:
        if child.isalive():
            child.terminate(force=True)
