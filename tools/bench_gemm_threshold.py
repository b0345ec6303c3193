#!/usr/bin/env python3
"""From how many tokens the packed panels (ed_gemm.h) pay: the CPU time of one forward pass of
n prompt tokens with every product on the panels (gemm_min_cols 1) and with none (the row
tiles), for n from 4 to 128. Process CPU time of one thread, median of 5 passes, so the
ratio holds on a busy machine. The kernel path's threshold (ed_gemm_path.min_cols) is set
from such tables: BENCHMARKS.md, "Packed panels: from how many tokens".

    EDGED_KERNELS=avx2-vnni python tools/bench_gemm_threshold.py MODEL.gguf [THREADS]
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from edged import Model, _core               # noqa: E402
from edged.engine.batch import BatchEntry    # noqa: E402

SIZES = (4, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def main():
    m = Model.load(sys.argv[1], n_threads=int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    unit = m.tokenizer.encode("The old lighthouse keeper climbed the stairs every evening, counting the steps. ",
                              add_special=False)
    ids = (unit * (300 // len(unit) + 1))[:300]
    s = m.session(300)

    def cpu_ms(n, reps=5):
        ts = []
        for _ in range(reps):
            c0 = time.process_time()
            m.decode([BatchEntry(s, tuple(ids[:n]), None, "last")])
            ts.append((time.process_time() - c0) * 1e3)
            s.truncate(0)
        return statistics.median(ts)

    print(f"{os.path.basename(sys.argv[1])}, {_core.kernel_variant()}, path threshold {_core.gemm_min_cols()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| tokens | panels ms | tiles ms | tiles / panels |")
    print("| ---: | ---: | ---: | ---: |")
    old = _core.gemm_min_cols(1)
    try:
        for n in SIZES:
            _core.gemm_min_cols(1)
            a = cpu_ms(n)
            _core.gemm_min_cols(10**6)
            b = cpu_ms(n)
            _core.gemm_min_cols(1)
            a = min(a, cpu_ms(n))            # panels before and after the tiles: the lower
            print(f"| {n} | {a:.1f} | {b:.1f} | {b / a:.2f} |", flush=True)
    finally:
        _core.gemm_min_cols(old)
    m.close()


if __name__ == "__main__":
    main()
