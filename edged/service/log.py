"""Logging to stderr, journald-friendly: with JOURNAL_STREAM set (stderr connected to the
journal) each line carries a syslog priority prefix "<N>" and no timestamp, since the journal
adds its own; otherwise lines carry a UTC timestamp and the level name."""
import logging
import os
import sys
import time

PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}
log = logging.getLogger("edged")


def _to_journal(stream):
    js = os.environ.get("JOURNAL_STREAM")
    if not js:
        return False
    try:
        dev, ino = (int(x) for x in js.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


class _Formatter(logging.Formatter):
    def __init__(self, journal):
        super().__init__()
        self.journal = journal

    def format(self, record):
        msg = record.getMessage()
        if record.exc_info:
            msg += " | " + self.formatException(record.exc_info).replace("\n", " | ")
        if self.journal:
            return f"<{PRIORITY.get(record.levelno, 6)}>{msg}"
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{ts}.{int(record.msecs):03d}Z edged[{os.getpid()}] {record.levelname.lower()}: {msg}"


def setup(level="info", stream=None):
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_Formatter(_to_journal(stream)))
    log.handlers[:] = [handler]
    log.setLevel(level.upper())
    log.propagate = False
    return log
