#!/usr/bin/env python3
"""Benchmark model verification speed: SHA-256 over a file descriptor (edged.trust.signing.hash_fd)
and a whole `open_verified` of an appended-signed file, with a warm page cache.

    python tools/bench_hash.py [--size-mib 1024] [--repeat 3] [--dir DIR] [--file MODEL]

Reports wall-clock and CPU-time throughput (CPU time shows the hashing speed itself when other
processes share the machine), and `openssl dgst -sha256` over the same file for comparison.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from edged.trust.keys import fingerprint  # noqa: E402
from edged.trust.store import TrustStore  # noqa: E402
from edged.trust.blocks import HASH_CHUNK, hash_fd  # noqa: E402
from edged.trust.verify import open_verified  # noqa: E402
from edged.trust.sign import generate_key, sign_file  # noqa: E402


def timed(fn, repeat):
    walls, cpus = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.thread_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.thread_time() - c)
    return walls, cpus


def report(label, size, walls, cpus):
    gb = size / 1e9
    print(f"{label:34s} wall {gb / min(walls):5.2f} GB/s best, {gb / statistics.median(walls):5.2f} median;"
          f"  cpu {gb / min(cpus):5.2f} GB/s best")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=1024, help="size of the generated test file")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", help="where to create the test file (default: the temp directory)")
    ap.add_argument("--file", help="benchmark this existing file instead (read only)")
    args = ap.parse_args()

    workdir = tempfile.mkdtemp(prefix="edged-bench-", dir=args.dir)
    try:
        if args.file:
            path = args.file
        else:
            path = os.path.join(workdir, "bench.gguf")
            chunk = os.urandom(8 << 20)
            with open(path, "wb") as f:
                for _ in range(max(1, args.size_mib // 8)):
                    f.write(chunk)
        size = os.path.getsize(path)
        print(f"file {path}: {size / 2**20:.0f} MiB, warm page cache, chunk {HASH_CHUNK >> 20} MiB, "
              f"{os.cpu_count()} CPUs")

        fd = os.open(path, os.O_RDONLY)
        try:
            hash_fd(fd, [size])  # warm the page cache
            report("hash_fd (SHA-256 of the fd)", size, *timed(lambda: hash_fd(fd, [size]), args.repeat))
        finally:
            os.close(fd)

        if not args.file:
            key = generate_key(2048)
            sign_file(path, key)
            trust = TrustStore({fingerprint(key): key.public_key()})

            def verify():
                open_verified(path, trust, True, cache=None).close()

            report("open_verified (appended, RSA-2048)", size, *timed(verify, args.repeat))

        if shutil.which("openssl"):
            def ossl():
                subprocess.run(["openssl", "dgst", "-sha256", path], check=True, stdout=subprocess.DEVNULL)

            walls, _ = timed(ossl, args.repeat)
            print(f"{'openssl dgst -sha256 (reference)':34s} wall {size / 1e9 / min(walls):5.2f} GB/s best")
    finally:
        shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
