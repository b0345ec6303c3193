"""Chat-template limits that hold (issue 13.3): arguments that would make a huge string or run
long are refused before the call, and what no check sees is bounded by the render process
(address space and time) the daemon renders in, which a crash or kill does not take down."""
import os
import signal
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edged.errors import TemplateError
from edged.service.renderer import RENDER_MEMORY, RenderWorker
from edged.text import chat

MSGS = [{"role": "user", "content": "hi"}]
EXAMPLES = int(os.environ.get("EDGED_FUZZ_EXAMPLES", "200"))

# The payloads, and their relatives: each refused by an argument check, at once.
PAYLOADS = [
    "{{ lipsum(n=10000) }}",
    "{{ ''|center(10**9) }}",
    "{{ ''|center(3000000000) }}",
    "{{ '%*s'|format(10**9,'x') }}",
    "{{ '{:>1000000000}'.format('x') }}",
    "{{ '{:{}}'.format('x', 10**9) }}",
    "{{ ('a'*100000)|replace('a', 'b'*10000) }}",
    "{{ ('a'*100000).replace('a', 'b'*10000) }}",
    "{{ ('x '*500000)|wordwrap(1, wrapstring='\\n'*100) }}",
    "{{ ('x\\n'*100000)|indent(100000) }}",
    "{{ 'x'|indent(10**9, true) }}",
    "{{ 'x'*10**10 }}",
    "{{ (['x'*1000000]*1000)|join }}",
    "{{ ('y'*1000).join(['x'*1000000]*1000) }}",
    "{{ 'x'.ljust(10**9) }}", "{{ 'x'.rjust(10**9) }}", "{{ 'x'.center(10**9) }}", "{{ 'x'.zfill(10**9) }}",
    "{{ ('\\t'*1000).expandtabs(10**7) }}",
    "{{ '%1000000000s' % 'x' }}",
    "{{ '%.1000000000f' % 1.0 }}",
    "{{ [1]|batch(10**9, 'x')|list }}",
    "{{ [1]|slice(10**9)|list }}",
    "{{ {'a': [1]}|tojson(indent=10**9) }}",
    "{{ {'a': [1]}|tojson(indent='x'*10**6) }}",
]


@pytest.mark.parametrize("template", PAYLOADS)
def test_payload_is_refused_before_the_call(template):
    t0 = time.monotonic()
    with pytest.raises(TemplateError, match="asks for|repeats a sequence"):
        chat.render(template, MSGS)
    assert time.monotonic() - t0 < 1.0


def test_small_arguments_still_work():
    cases = {"{{ 'x'|center(5) }}": "  x  ", "{{ '%5s'|format('x') }}": "    x",
             "{{ '{:>3}'.format('x') }}": "  x", "{{ 'aXa'|replace('X', 'b') }}": "aba",
             "{{ 'ab cd'|wordwrap(2) }}": "ab\ncd", "{{ 'a\\nb'|indent(2, true) }}": "  a\n  b",
             "{{ ['a', 'b']|join(', ') }}": "a, b", "{{ ', '.join(['a', 'b']) }}": "a, b",
             "{{ [1, 2, 3]|batch(2)|list }}": "[[1, 2], [3]]", "{{ [1, 2, 3]|slice(2)|list }}": "[[1, 2], [3]]",
             "{{ 'x'.zfill(3) }}": "00x", "{{ '%d items' % 3 }}": "3 items",
             "{{ {'a': 1}|tojson(indent=2) }}": '{\n  "a": 1\n}', "{{ lipsum(2, false, 5, 10)|length > 0 }}": "True"}
    for template, expected in cases.items():
        assert chat.render(template, MSGS) == expected, template


@pytest.fixture(scope="module")
def worker():
    w = RenderWorker("off")
    w.start()
    yield w
    w.close()
    assert chat._RENDERER is None


SIZE = st.one_of(st.integers(0, 64), st.integers(0, 2**40), st.sampled_from([10**6, 10**7, 2**31, 2**32 + 1]))
SHORT = st.one_of(st.text(alphabet="ab \n\t%{}:>0123456789sdx", max_size=12),
                  st.sampled_from(["a" * 1000, "%*s", "{:>{}}", "\t" * 50]))
CALLS = st.one_of(
    st.builds(lambda s, n: f"{{{{ {s!r}|center({n}) }}}}", SHORT, SIZE),
    st.builds(lambda s, n, m: f"{{{{ {s!r}|format({n}, {m}) }}}}", SHORT, SIZE, SIZE),
    st.builds(lambda s, n, w: f"{{{{ ({s!r}*{n % 1000})|wordwrap({w % 100 + 1}, wrapstring={s!r}) }}}}",
              SHORT, SIZE, SIZE),
    st.builds(lambda s, o, r, n: f"{{{{ ({s!r}*{n % 2000})|replace({o!r}, {r!r}*{n % 5000}) }}}}",
              SHORT, SHORT, SHORT, SIZE),
    st.builds(lambda s, n, f: f"{{{{ ({s!r}*{n % 2000})|indent({f}, true, true) }}}}", SHORT, SIZE, SIZE),
    st.builds(lambda s, n, k: f"{{{{ ([{s!r}*{n % 100000}]*{k % 10000})|join({s!r}) }}}}", SHORT, SIZE, SIZE),
    st.builds(lambda n, k: f"{{{{ range({n % 1000})|batch({k})|list|length }}}}", SIZE, SIZE),
    st.builds(lambda n, k: f"{{{{ range({n % 1000})|slice({k})|list|length }}}}", SIZE, SIZE),
    st.builds(lambda n, k: f"{{{{ lipsum({n}, false, 1, {k})|length }}}}", SIZE, SIZE),
    st.builds(lambda s, m, n: f"{{{{ {s!r}.{m}({n}) }}}}", SHORT,
              st.sampled_from(["center", "ljust", "rjust", "zfill", "expandtabs"]), SIZE),
    st.builds(lambda s, n: f"{{{{ {s!r} % {n} }}}}", SHORT, SIZE),
    st.builds(lambda s, n: f"{{{{ {s!r}.format({n}, {n}) }}}}", SHORT, SIZE),
    st.builds(lambda n: f"{{{{ {{'a': [1, 2]}}|tojson(indent={n}) }}}}", SIZE),
)


@settings(max_examples=max(EXAMPLES // 2, 1), deadline=None, derandomize=not os.environ.get("EDGED_FUZZ_RANDOM"),
          database=None, suppress_health_check=[HealthCheck.too_slow])
@given(template=CALLS)
def test_filter_arguments_never_get_past_the_checks(worker, template):
    """Rendered in the bounded process: a missing check would show up as a render that needed
    more than the memory limit or was killed at the time limit. Every outcome must instead be
    an output within MAX_OUTPUT_CHARS or a refusal (argument check, output size, or an ordinary
    template error such as a bad format string)."""
    t0 = time.monotonic()
    try:
        out = chat.render(template, MSGS)
    except TemplateError as e:
        msg = str(e)
        assert "memory" not in msg and "longer than" not in msg and "render process" not in msg, (template, msg)
    else:
        assert len(out) <= chat.MAX_OUTPUT_CHARS
    assert time.monotonic() - t0 < chat.MAX_SECONDS + 5


def test_what_no_check_sees_is_bounded_by_the_render_process(worker):
    doubling = ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                "{% endfor %}{{ ns.s|length }}")
    squaring = ("{% set ns = namespace(n=7) %}{% for i in range(40) %}{% set ns.n = ns.n * ns.n %}"
                "{% endfor %}{{ ns.n > 1 }}")
    for template, pattern in ((doubling, "more memory"), (squaring, "longer than|more memory")):
        t0 = time.monotonic()
        with pytest.raises(TemplateError, match=pattern):
            chat.render(template, MSGS)
        assert time.monotonic() - t0 < chat.MAX_SECONDS + 3
    assert chat.render("{{ messages[0].content }}", MSGS) == "hi"     # the next render works
    assert RENDER_MEMORY <= 256 << 20


def test_a_killed_render_process_and_a_dead_worker_do_not_take_the_caller_down(worker):
    import threading
    hang = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    errors = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(TemplateError, chat.render, hang, MSGS)))
    t.start()
    child = None
    for _ in range(100):
        try:
            kids = open(f"/proc/{worker.pid}/task/{worker.pid}/children").read().split()
        except OSError:
            kids = []
        if kids:
            child = int(kids[0])
            break
        time.sleep(0.02)
    assert child, "no render process appeared"
    os.kill(child, signal.SIGKILL)
    t.join(30)
    assert "SIGKILL" in str(errors[0].value)
    assert chat.render("{{ messages[0].content }}", MSGS) == "hi"     # a fresh child next time


def test_a_killed_worker_is_replaced_and_without_one_nothing_renders_here(tmp_path):
    """A worker killed from outside is replaced by the next render (issue 41.3); with the
    zygote gone too, renders answer 503 and never fall back to rendering in this process."""
    from edged.errors import NotReady
    w = RenderWorker("off")
    w.start()
    try:
        first = w.pid
        os.kill(first, signal.SIGKILL)
        assert chat.render("{{ messages[0].content }}", MSGS) == "hi"
        assert w.pid != first
        os.kill(w.zygote, signal.SIGKILL)
        os.waitpid(w.zygote, 0)
        w.zygote = None
        for _ in range(2):
            with pytest.raises(NotReady, match="render worker"):
                chat.render("{{ 1 }}", MSGS)
        assert chat._RENDERER is not None                   # never back to in-process rendering
    finally:
        w.close()
    assert chat._RENDERER is None
