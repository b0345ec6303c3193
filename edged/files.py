"""File-creation mode shared by the writers in every layer (quantize, synth, sign).

Atomic writers create a temporary file with mkstemp (mode 0600 whatever the umask) and rename
it into place; they set the mode a plain open() would have given, so `umask 022` yields 0644
and `umask 077` keeps models private, as operators expect of a command-line tool."""
import os


def creation_mode(mode=0o666):
    """`mode` less this process's umask (the mode open(path, "w") gives a new file)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:   # Linux >= 4.7: no umask race
            for line in f:
                if line.startswith("Umask:"):
                    return mode & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o077)
    os.umask(old)
    return mode & ~old
