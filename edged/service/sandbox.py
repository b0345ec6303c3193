"""Confine the running process: no new privileges, no capabilities, Landlock, seccomp.

The daemon calls `apply()` once after start-up (socket bound, keys and config read, names
resolved) and before it starts worker threads. From then on, in "enforce" mode:

- PR_SET_NO_NEW_PRIVS is set and the process is not dumpable (no core dumps of prompts, no
  same-uid ptrace).
- Every capability is dropped: bounding set (PR_CAPBSET_DROP, when CAP_SETPCAP allows it),
  ambient set, then effective/permitted/inheritable via capset(2).
- Landlock (raw syscalls, ABI 1..8 detected with LANDLOCK_CREATE_RULESET_VERSION): the
  `read_only` paths can be read, the `read_write` paths read and written, plus what a running
  Python needs (see `runtime_read_paths`); nothing else on the filesystem can be opened. ABI 4+
  also forbids TCP bind/connect, ABI 6+ sending signals outside the process, ABI 8+ covers all
  threads at once. A kernel without Landlock gives a logged warning, not a failure.
- seccomp (pyseccomp, all threads through TSYNC): the calls in `DENIED_SYSCALLS` fail with
  EPERM (or kill the process, `on_deny="kill"`); `clone` is allowed only with CLONE_THREAD
  (threads yes, processes no); `clone3` answers ENOSYS so glibc falls back to `clone`, where
  the flags can be inspected; `socket` is allowed only for AF_UNIX; `connect` is refused
  whatever the family (the daemon only accepts; sd_notify uses sendto on an unconnected
  datagram socket). Denials are also written to the kernel audit log (SECCOMP_FILTER_FLAG_LOG).

"log" mode sets no_new_privs and loads the same seccomp filter with SCMP_ACT_LOG (the calls
succeed and are logged by the kernel) so an operator can see what enforce would break;
Landlock has no audit-only mode, so it is skipped, and capabilities are kept. "off" does nothing.

Why the runtime read paths: a daemon keeps importing modules lazily after start-up (codecs,
parts of aiohttp and the stdlib imported on first use, C extensions loaded with dlopen), so
the Python installation (stdlib, lib-dynload, every sys.path entry a loaded module came from),
the directories of every shared object already mapped, and /etc/ld.so.cache stay readable.
None of them is writable; they hold code the process could already run, not data. Exec is
refused by seccomp whatever Landlock allows. Also readable: this process's /proc entry (RSS,
status for `describe()`), /proc/meminfo (memory budget), /proc/stat (the CPUs' idle time:
the thread pool probes a dropped worker only when some CPU had time to spare), /sys/devices/system/{cpu,node}
(CPU and NUMA topology for the thread pool) and /sys/fs/cgroup (the CPU quota that caps the
default thread count of a model loaded after apply()). mbind(2) stays allowed on purpose: session arenas
and hot-swapped models get their NUMA memory policy after apply() (edged/threads.py).

Threads that exist before `apply()` get the seccomp filter (TSYNC) but, before Landlock ABI 8,
neither the Landlock domain nor the capability drop (both are per thread in Linux); `apply()`
counts them and logs a warning. Import numpy with OPENBLAS_NUM_THREADS=1 (the systemd unit
sets it) and start the engine's thread pool after `apply()`.
"""
import ctypes
import errno
import logging
import os
import platform
import signal
import socket
import sys
import sysconfig
import threading
import time

from ..errors import SandboxError

log = logging.getLogger("edged.service.sandbox")

MODES = ("enforce", "log", "off")
ON_DENY = ("eperm", "kill")


# --- prctl / capabilities -------------------------------------------------------------------
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_GET_NO_NEW_PRIVS = 39
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CAP_SETPCAP = 8
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


# --- Landlock (include/uapi/linux/landlock.h) -----------------------------------------------
# The three syscalls have the same numbers on every architecture edged runs on (generic table).
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
LANDLOCK_RULE_PATH_BENEATH = 1
LANDLOCK_RESTRICT_SELF_TSYNC = 1 << 3        # ABI 8

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13           # ABI 2
FS_TRUNCATE = 1 << 14        # ABI 3
FS_IOCTL_DEV = 1 << 15       # ABI 5
NET_BIND_TCP = 1 << 0        # ABI 4
NET_CONNECT_TCP = 1 << 1     # ABI 4
SCOPE_SIGNAL = 1 << 1        # ABI 6 (abstract-socket scoping is left off: NOTIFY_SOCKET may be one)

# Rights Landlock can handle, by the ABI that introduced them.
_FS_BY_ABI = {1: (1 << 13) - 1, 2: FS_REFER, 3: FS_TRUNCATE, 5: FS_IOCTL_DEV}
# Rights that make sense on a regular file (a rule on a file may only carry these).
_FS_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
READ_RIGHTS = FS_READ_FILE | FS_READ_DIR
WRITE_RIGHTS = (READ_RIGHTS | FS_WRITE_FILE | FS_TRUNCATE | FS_REMOVE_FILE | FS_REMOVE_DIR
                | FS_MAKE_REG | FS_MAKE_DIR | FS_MAKE_SOCK)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1      # the kernel's struct is __attribute__((packed)): 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


# --- seccomp ----------------------------------------------------------------------------------
CLONE_THREAD = 0x00010000
# Denied outright. Groups: run programs / make processes; debug or read other processes;
# filesystems and namespaces; kernel modules, BPF, keys, perf; machine state; io_uring and
# userfaultfd (io_uring performs opens/connects the filter never sees; both are favourite
# exploit primitives); handle-based opens that step around path checks.
DENIED_SYSCALLS = (
    "execve", "execveat", "fork", "vfork",
    "ptrace", "process_vm_readv", "process_vm_writev",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr", "setns", "unshare",
    "init_module", "finit_module", "delete_module", "bpf", "keyctl", "add_key", "request_key",
    "perf_event_open",
    "reboot", "kexec_load", "kexec_file_load", "swapon", "swapoff",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd",
    "name_to_handle_at", "open_by_handle_at",
    "connect",
)

_libc = ctypes.CDLL(None, use_errno=True)     # the C library already linked into Python
_libc.syscall.restype = ctypes.c_long
_libc.prctl.restype = ctypes.c_int
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                        ctypes.c_ulong]

# What apply() did, for describe().
_state = {"mode": "off", "applied": False}


def _prctl(option, arg2=0, arg3=0):
    if _libc.prctl(option, arg2, arg3, 0, 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"prctl({option}): {os.strerror(e)}")


def _syscall(nr, *args):
    r = _libc.syscall(ctypes.c_long(nr), *args)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def landlock_abi():
    """Landlock ABI version of the running kernel; 0 when Landlock is missing or disabled."""
    try:
        return _syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    except OSError:
        return 0


def _handled_fs(abi):
    return sum(bits for v, bits in _FS_BY_ABI.items() if v <= abi)


def runtime_read_paths():
    """Paths a running Python needs to read (see the module docstring): sorted, existing."""
    paths = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            paths.add(p)
    entries = [os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)]
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if not f:
            continue
        f = os.path.realpath(f)
        # the sys.path entry the module was found under (longest match)
        hits = [e for e in entries if f.startswith(e.rstrip("/") + "/")]
        if hits:
            paths.add(max(hits, key=len))
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    paths.add(os.path.dirname(parts[5].rstrip("\n")))
    except OSError:
        pass
    paths.update(["/etc/ld.so.cache", f"/proc/{os.getpid()}", "/proc/meminfo", "/proc/stat",
                  "/sys/devices/system/cpu", "/sys/devices/system/node", "/sys/fs/cgroup"])
    # Never grant the whole filesystem because a script ran from "/".
    return sorted(p for p in paths if os.path.realpath(p) != "/" and os.path.exists(p))


# Directories shared with the rest of the system: a file in one of them is granted by itself,
# never the whole directory.
_SHARED_DIRS = frozenset(["/", "/etc", "/usr", "/usr/local", "/usr/local/etc", "/var", "/var/lib",
                          "/opt", "/srv", "/home", "/root", "/tmp", "/var/tmp", "/run", "/dev"])


def reloadable(path):
    """What to grant so that `path` (a file re-read on reload) stays readable when it is
    replaced by rename, as editors and configuration management do: Landlock rules follow
    inodes, so a rule on the file itself would not cover its replacement. Its directory is
    granted instead, unless that directory is shared with the rest of the system (/etc, /var,
    a home ...): then the file alone, and a replaced file needs a restart."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    if os.path.isdir(path) or os.path.realpath(parent) in _SHARED_DIRS \
            or parent in _SHARED_DIRS or parent.startswith("/home/") and parent.count("/") == 2:
        return path
    return parent


def _landlock(abi, read_only, read_write, tsync):
    handled = _handled_fs(abi)
    attr = _RulesetAttr(handled_access_fs=handled)
    size = 8
    if abi >= 4:
        attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP
        size = 16
    if abi >= 6:
        attr.scoped = SCOPE_SIGNAL
        size = 24
    ruleset = _syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                       ctypes.c_uint32(0))
    granted = []
    try:
        for rights, paths in ((READ_RIGHTS, read_only), (WRITE_RIGHTS, read_write)):
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError as e:
                    log.warning("sandbox: not granting %s: %s", path, e.strerror)
                    continue
                try:
                    allowed = rights & handled
                    if not os.path.isdir(path):
                        allowed &= _FS_FILE_RIGHTS
                    rule = _PathBeneathAttr(allowed_access=allowed, parent_fd=fd)
                    _syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset),
                             ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH), ctypes.byref(rule),
                             ctypes.c_uint32(0))
                    granted.append(path)
                finally:
                    os.close(fd)
        flags = LANDLOCK_RESTRICT_SELF_TSYNC if tsync else 0
        _syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(flags))
    finally:
        os.close(ruleset)
    return granted


def _capabilities():
    """{"CapEff": int, "CapPrm": int, ...} of this thread, from /proc/self/status."""
    caps = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.startswith("Cap"):
                caps[key] = int(value, 16)
    return caps


def _drop_capabilities(caps):
    """Drop the bounding and ambient sets, then every capability of this thread.

    `caps` was read before Landlock hid /proc. Calls that need a capability the process does
    not hold are skipped: under the unit (no capabilities, capset filtered) there is nothing
    to drop and nothing is attempted.
    """
    if caps.get("CapEff", 0) >> CAP_SETPCAP & 1:
        for cap in range(64):
            if _libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0) < 0:
                break                      # EINVAL: past the last capability of this kernel
            _prctl(PR_CAPBSET_DROP, cap)
    if caps.get("CapAmb", 0):
        _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    if caps.get("CapEff", 0) or caps.get("CapPrm", 0) or caps.get("CapInh", 0):
        header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
        data = (_CapData * 2)()
        if _libc.capset(ctypes.byref(header), data) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"capset: {os.strerror(e)}")


def _pyseccomp():
    # Imported before anything is restricted: pyseccomp finds libseccomp.so with
    # ctypes.util.find_library, which runs `ldconfig -p` in a child process.
    try:
        import pyseccomp
    except (ImportError, RuntimeError) as e:   # RuntimeError: libseccomp.so missing
        raise SandboxError(f"seccomp unavailable: {e}") from e
    return pyseccomp


def _seccomp(sc, action, allow_fork=False):
    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.CTL_TSYNC, 1)
    f.set_attr(sc.Attr.CTL_NNP, 1)
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)   # no 32-bit/x32 syscall back door
    try:
        f.set_attr(sc.Attr.CTL_LOG, 1)                   # denials go to the audit log
    except OSError:
        log.info("sandbox: this kernel/libseccomp cannot log seccomp denials")
    denied = []
    for name in DENIED_SYSCALLS:
        if allow_fork and name in ("fork", "vfork"):
            continue
        nr = sc.resolve_syscall(sc.Arch.NATIVE, name)
        if nr == -1:          # unknown to libseccomp on this architecture
            continue
        try:
            f.add_rule(action, nr)
        except OSError as e:   # a syscall this architecture does not have
            log.debug("sandbox: no rule for %s: %s", name, e.strerror)
            continue
        denied.append(name)
    if allow_fork:            # the chat-template render worker: processes yes, exec no
        f.add_rule(action, "socket", sc.Arg(0, sc.NE, socket.AF_UNIX))
        f.add_rule(action, "socketpair", sc.Arg(0, sc.NE, socket.AF_UNIX))
        f.load()
        return denied + ["socket/socketpair other than AF_UNIX"]
    # clone: threads (CLONE_THREAD set) only. The flags are argument 0 on x86-64/arm/arm64.
    f.add_rule(action, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
    # clone3 passes its flags in memory a filter cannot read: make glibc fall back to clone.
    if sc.resolve_syscall(sc.Arch.NATIVE, "clone3") != -1:
        f.add_rule(sc.LOG if action == sc.LOG else sc.ERRNO(errno.ENOSYS), "clone3")
    f.add_rule(action, "socket", sc.Arg(0, sc.NE, socket.AF_UNIX))
    f.add_rule(action, "socketpair", sc.Arg(0, sc.NE, socket.AF_UNIX))
    f.load()
    return denied + ["clone without CLONE_THREAD", "clone3 (ENOSYS)",
                     "socket/socketpair other than AF_UNIX"]


# Thread-pool sizes of the numeric libraries numpy may load; each read once, when the library
# starts. `edged serve` sets them to 1 before anything imports numpy, so that no thread exists
# when the sandbox is applied (Landlock before ABI 8 and capabilities are per thread).
LIBRARY_THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                      "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS",
                      "GOTO_NUM_THREADS")


def single_thread_libraries(environ=os.environ):
    for name in LIBRARY_THREAD_ENV:
        environ[name] = "1"


def other_threads():
    """Names (comm) of this process's threads other than the calling one."""
    me = str(threading.get_native_id())
    names = []
    try:
        for tid in os.listdir("/proc/self/task"):
            if tid != me:
                with open(f"/proc/self/task/{tid}/comm") as fh:
                    names.append(f"{fh.read().strip()} ({tid})")
    except OSError:
        pass
    return names


def _threads():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def die_with_parent():
    """SIGKILL this process when the thread that forked it exits (PR_SET_PDEATHSIG)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def deny_new_tasks():
    """One more seccomp filter: no new processes or threads (fork, vfork, clone, clone3). For a
    process that runs untrusted code single-threaded (a chat-template render child)."""
    sc = _pyseccomp()
    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.CTL_NNP, 1)
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    for name in ("fork", "vfork", "clone", "clone3"):
        if sc.resolve_syscall(sc.Arch.NATIVE, name) != -1:
            f.add_rule(sc.ERRNO(errno.EPERM), name)
    f.load()


def apply(mode="enforce", *, read_only=(), read_write=(), on_deny="eperm", allow_fork=False):
    """Confine this process for the rest of its life; returns `describe()`.

    `read_only`: directories or files the daemon reads (models, trust store, config).
    `read_write`: directories it writes (the socket directory). Resolve user and group
    names, read keys and bind sockets before calling: /etc and the network are gone after.
    Applying twice is refused (a second Landlock layer could only narrow the first).
    `allow_fork`: processes may still be created (never exec'd): for the chat-template render
    worker, which forks one bounded child per render (edged/service/renderer.py).
    """
    if mode not in MODES:
        raise SandboxError(f"sandbox mode {mode!r} is not one of {', '.join(MODES)}")
    if on_deny not in ON_DENY:
        raise SandboxError(f"sandbox on_deny {on_deny!r} is not one of {', '.join(ON_DENY)}")
    if _state["applied"]:
        raise SandboxError("the sandbox is already applied to this process")
    if mode == "off":
        _state.update(mode="off")
        log.warning("sandbox: off (no seccomp, no Landlock)")
        return describe()

    sc = _pyseccomp()
    time.localtime()             # glibc reads /etc/localtime once, now, while it may
    threads_before = _threads()
    read_only = [os.path.abspath(p) for p in read_only]
    read_write = [os.path.abspath(p) for p in read_write]
    runtime = runtime_read_paths()
    abi = landlock_abi()
    caps_before = _capabilities()
    notes = []
    _prctl(PR_SET_NO_NEW_PRIVS, 1)

    landlock = "skipped (log mode)"
    caps = "kept (log mode)"
    if mode == "enforce":
        _prctl(PR_SET_DUMPABLE, 0)
        if abi == 0:
            landlock = "unsupported by this kernel"
            log.warning("sandbox: Landlock is not available (kernel without it, or disabled "
                        "at boot); filesystem access is limited only by file permissions")
        else:
            tsync = abi >= 8
            try:
                _landlock(abi, read_only + runtime, read_write, tsync)
                landlock = f"enforced (ABI {abi})"
                if threads_before > 1 and not tsync:
                    notes.append(f"{threads_before - 1} thread(s) started before the sandbox "
                                 "are outside the Landlock domain (needs Landlock ABI 8)")
            except OSError as e:
                landlock = f"failed: {e.strerror}"
                log.warning("sandbox: Landlock could not be applied: %s", e.strerror)
        _drop_capabilities(caps_before)
        caps = "dropped"
        if threads_before > 1 and any(caps_before.get(k) for k in ("CapEff", "CapPrm")):
            notes.append(f"capabilities of {threads_before - 1} earlier thread(s) were not "
                         "dropped (capabilities are per thread)")

    action = {"eperm": sc.ERRNO(errno.EPERM), "kill": sc.KILL_PROCESS}[on_deny]
    denied = _seccomp(sc, sc.LOG if mode == "log" else action, allow_fork)
    for note in notes:
        log.warning("sandbox: %s", note)
    _state.update(mode=mode, applied=True, on_deny=on_deny if mode == "enforce" else "log",
                  landlock=landlock, landlock_abi=abi, capabilities=caps,
                  read_only=read_only, read_write=read_write, runtime_read=runtime,
                  denied=denied, notes=notes)
    log.info("sandbox: %s (Landlock %s, seccomp %s, capabilities %s)", mode, landlock,
             _state["on_deny"], caps)
    if os.environ.get("EDGED_SANDBOX_SELFTEST") == "1":      # test hook: probe from inside
        for name, outcome in probe(read_write[0] if read_write else None).items():
            log.info("sandbox self-test: %s %s", name, outcome)
    return describe()


def probe(scratch_dir=None):
    """Try what the sandbox forbids, harmlessly; {probe: "denied (EPERM)" | "allowed"}.

    exec targets a path that does not exist (ENOENT when allowed, EPERM when filtered), a fork
    that succeeds exits at once, files are only opened for reading except a scratch file in
    the parent of `scratch_dir` (e.g. the socket directory's parent), removed again.
    """
    def attempt(fn):
        try:
            fn()
        except OSError as e:
            return f"denied ({errno.errorcode.get(e.errno, e.errno)})"
        return "allowed"

    def fork():
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)

    def execve():
        try:
            os.execv("/nonexistent/edged-sandbox-probe", ["probe"])
        except FileNotFoundError:
            pass                          # the call got through to the filesystem: allowed

    def inet():
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()

    def read_etc():
        with open("/etc/passwd", "rb") as f:
            f.read(1)

    def write_outside():
        target = os.path.join(os.path.dirname(os.path.abspath(scratch_dir or "/tmp/x")),
                              f".edged-sandbox-probe-{os.getpid()}")
        with open(target, "w"):
            pass
        os.unlink(target)

    return {"execve": attempt(execve), "fork": attempt(fork), "socket(AF_INET)": attempt(inet),
            "open /etc/passwd": attempt(read_etc), "write outside allowed dirs": attempt(write_outside)}


def _status_fields():
    fields = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("Seccomp", "Seccomp_filters", "NoNewPrivs", "CapEff", "CapPrm",
                           "CapBnd", "CapAmb", "Threads"):
                    fields[key] = value.strip()
    except OSError:
        pass
    return fields


def describe():
    """What is in force now: the mode apply() used, the policy, and the kernel's own view."""
    d = {k: v for k, v in _state.items() if k != "applied"}
    d["kernel"] = _status_fields()
    if "landlock_abi" not in d:
        d["landlock_abi"] = landlock_abi()
    d["machine"] = platform.machine()
    return d


def format_description(d=None):
    """describe() as the lines `edged serve --check-sandbox` prints."""
    d = d or describe()
    k = d.get("kernel", {})
    lines = [f"sandbox mode: {d['mode']}"]
    if d["mode"] != "off":
        lines += [
            f"no_new_privs: {k.get('NoNewPrivs', '?')}   seccomp: {k.get('Seccomp', '?')} "
            f"(filters: {k.get('Seccomp_filters', '?')})",
            f"capabilities: {d.get('capabilities')} (CapEff {k.get('CapEff', '?')}, "
            f"CapBnd {k.get('CapBnd', '?')})",
            f"landlock: {d.get('landlock')}",
            "  read-only: " + ", ".join(d.get("read_only", [])),
            "  read-write: " + ", ".join(d.get("read_write", [])),
            f"  runtime (read-only): {len(d.get('runtime_read', []))} paths "
            "(Python installation, loaded libraries, /proc/self, CPU topology)",
            f"denied syscalls ({d.get('on_deny')}): " + ", ".join(d.get("denied", [])),
        ]
        lines += [f"note: {n}" for n in d.get("notes", [])]
    else:
        lines.append(f"landlock ABI available: {d['landlock_abi']}; "
                     f"seccomp: {k.get('Seccomp', '?')}")
    return "\n".join(lines)
