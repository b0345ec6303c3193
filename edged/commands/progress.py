"""Progress bars on stderr for long operations, drawn by tqdm (edged draws none of its own).

tqdm decides when to draw: only on a terminal (disable=None), only once an operation has run
for a moment (delay), at a bounded rate; in a log or a pipe nothing is written."""
from tqdm import tqdm

DELAY = 0.5     # seconds before a bar appears: quick operations print nothing


def bar(desc, total=None, unit="B", disable=None, delay=DELAY, **kw):
    """A tqdm bar on stderr (or file=); bytes are shown as KiB/MiB/GiB and B/s. disable=None:
    only on a terminal; True: never."""
    return tqdm(desc=desc, total=total, unit=unit, unit_scale=unit == "B", unit_divisor=1024,
                disable=disable, delay=delay, leave=False, dynamic_ncols=True, **kw)


class ByteProgress:
    """Adapter for the `progress(done, total)` callbacks of hashing and signing (cumulative
    bytes) onto one tqdm bar. Use as a context manager; the bar is removed at exit."""

    def __init__(self, desc, **kw):
        self.bar = bar(desc, **kw)

    def __call__(self, done, total):
        if self.bar.total != total:
            self.bar.reset(total)
        self.bar.update(done - self.bar.n)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.bar.close()
