"""A one-line progress bar on stderr for long file operations (hashing, copying).

Shown only when stderr is a terminal and the work is big enough to take a while."""
import sys
import time

MIN_BYTES = 256 << 20


class ProgressBar:
    def __init__(self, label, stream=None, min_bytes=MIN_BYTES, width=30):
        self.label, self.width, self.min_bytes = label, width, min_bytes
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty()
        self.start = time.monotonic()
        self.last = 0.0
        self.shown = False

    def __call__(self, done, total):
        if not self.enabled or total < self.min_bytes:
            return
        now = time.monotonic()
        if now - self.last < 0.1 and done < total:
            return
        self.last = now
        filled = self.width * done // total
        rate = done / max(now - self.start, 1e-9) / 1e9
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] "
                          f"{100 * done // total:3d}% {done / 1e9:.2f}/{total / 1e9:.2f} GB {rate:.2f} GB/s")
        self.stream.flush()
        self.shown = True

    def finish(self):
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
            self.shown = False
