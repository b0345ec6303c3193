"""systemd integration without dependencies: sd_notify() and listen_fds().

notify() is a no-op without NOTIFY_SOCKET; listen_fds() honours LISTEN_PID, so a child the
daemon might start never inherits its parent's sockets by mistake.
"""
import os
import socket

SD_LISTEN_FDS_START = 3


def notify(*lines):
    """Send "KEY=VALUE" lines to the service manager; returns True when sent."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr or not lines:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]          # abstract namespace
    elif not addr.startswith("/"):
        return False                    # vsock etc.: not used on devices
    msg = "\n".join(lines).encode()
    # Non-blocking: a service manager that is slow to read must never stall the event loop.
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as s:
        try:
            s.sendto(msg, addr)
        except OSError:
            return False
    return True


def watchdog_interval():
    """Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC), or None when not asked for."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(int(usec) / 2e6, 0.01)
    except ValueError:
        return None


def listen_fds(unset=True):
    """Sockets passed by systemd socket activation, as socket objects (possibly empty)."""
    pid, n = os.environ.get("LISTEN_PID"), os.environ.get("LISTEN_FDS")
    if unset:
        for k in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            os.environ.pop(k, None)
    if not pid or not n or pid != str(os.getpid()):
        return []
    try:
        count = int(n)
    except ValueError:
        return []
    socks = []
    for fd in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + count):
        os.set_inheritable(fd, False)
        socks.append(socket.socket(fileno=fd))
    return socks
