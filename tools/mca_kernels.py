#!/usr/bin/env python3
"""Modelled speed of the x86 one-token row kernels on CPUs this project has no machine of.

The R4 row kernels (the matrices every x86 path repacks at load; ed_simd_x86.inc) are compiled
with -DED_MCA, which marks each kernel's block loop (one 32-block, or one 256-weight
super-block, of 8 rows) as an llvm-mca region named by kernel and column count. llvm-mca
(LLVM's machine-code analyser, Debian package `llvm`) runs each region through its scheduling
model of a CPU (ports, latencies, micro-ops: Zen 1-3, Haswell, Skylake ...) and gives the
cycles per iteration in the steady state. From those:

    GB/s per core = 8 rows x block bytes / cycles x GHz

which is the speed the kernel's integer work allows one core from the cache: where it is above
what a core reads from memory, the one-token product is memory-bound on that CPU.

A model, not a measurement: it leaves out the memory, the prefetches, the front end and the
loop's entry and exit, and its port tables are LLVM's. On the machine at hand, check it
against `tools/bench_r4.c T 4096 1 PATH 41` (one thread, from the cache) with the model of the
nearest CPU; BENCHMARKS.md has that comparison. `tools/neon_icount.py` is the Arm counterpart
(instruction counts under qemu).

    python tools/mca_kernels.py [--table avx2] [--cpus znver1,znver2,znver3,haswell,skylake]
                                [--nc 1] [--ghz 3.0] [--types Q4_0,Q2_K,...] [--read GBS]

--table picks the x86 build whose kernels are modelled: avx2 (plain AVX2, no VNNI: what
EDGED_KERNELS=avx2-vnni runs), avx2vnni, avx512, avx512nv (AVX-512 without VNNI).
--read GBS adds, per CPU, the % of a two-core read of GBS that two cores' kernels reach
(min(100, 2 x GB/s per core / GBS)).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from edged.format.gguf import GGMLType, TYPE_INFO  # noqa: E402

# the R4 types (ed_repack.h) and their kernels' region names
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "MXFP4",
         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"]
ROWS = 8  # rows per R4 group: one block (super-block) of each per loop iteration


def region_name(t):
    return "r4_" + (t.lower() if not t.endswith("_K") else t[:-2].lower() + "_K")


def compile_regions(tmp):
    """{(function, region): [instruction lines]} of the -DED_MCA build's assembly"""
    asm = os.path.join(tmp, "k.s")
    subprocess.run(["gcc", "-O3", "-std=gnu11", "-pthread", "-DED_MCA",
                    "-I" + os.path.join(ROOT, "cython_kernels", "kernels"),
                    "-I" + os.path.join(ROOT, "cython_kernels", "forward"),
                    "-S", os.path.join(ROOT, "tools", "bench_r4.c"), "-o", asm], check=True)
    regions, fn, cur = {}, None, None
    for line in open(asm):
        m = re.match(r"^([A-Za-z_][\w.]*):", line)
        if m:
            fn = m.group(1)
        m = re.search(r"LLVM-MCA-(BEGIN|END) (\S+)", line)
        if m and m.group(1) == "BEGIN":
            cur = []
            continue
        if m:
            regions.setdefault((fn, m.group(2)), cur)  # the first copy of a region in a function
            cur = None
            continue
        if cur is not None and not line.lstrip().startswith((".", "#")) and line.strip():
            cur.append(line)
    return regions


# instructions LLVM 14 leaves without a model on a CPU (its default: latency 100), each timed as a
# stand-in of the same operands and the same or lower cost on that core (Agner Fog's tables: on
# Zen 1/2, vcvtph2ps y, m128 is 2 micro-ops of latency ~6-7, vpmovzxwd y, m128 2 of ~4-5;
# vphaddw y is ~4 micro-ops, vpaddw 2): so the figures there are if anything slightly optimistic
UNMODELLED = {"znver1": {"vcvtph2ps": "vpmovzxwd", "vphaddw": "vpaddw"},
              "znver2": {"vcvtph2ps": "vpmovzxwd", "vphaddw": "vpaddw"}}


def mca_cycles(lines, cpu, tmp, iterations=200):
    path = os.path.join(tmp, "r.s")
    subst = UNMODELLED.get(cpu, {})
    with open(path, "w") as f:
        for line in lines:
            for a, b in subst.items():
                line = re.sub(r"\b%s\b" % a, b, line)
            f.write(line)
    out = subprocess.run(["llvm-mca", "-mcpu=" + cpu, "-iterations=%d" % iterations, path],
                         capture_output=True, text=True)
    m = re.search(r"Total Cycles:\s+(\d+)", out.stdout)
    if not m:
        raise SystemExit("llvm-mca -mcpu=%s failed: %s" % (cpu, out.stderr.strip()[:300]))
    return int(m.group(1)) / iterations


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", default="avx2", choices=["avx2", "avx2vnni", "avx512", "avx512nv"])
    ap.add_argument("--cpus", default="znver1,znver2,znver3,haswell,skylake")
    ap.add_argument("--nc", type=int, default=1, choices=[1, 2, 3, 4], help="columns (tokens) per call")
    ap.add_argument("--ghz", type=float, default=3.0, help="clock for the GB/s column")
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--read", type=float, default=None, help="a two-core read GB/s to compare with")
    args = ap.parse_args()
    if not shutil.which("llvm-mca"):
        raise SystemExit("llvm-mca not found (Debian: apt-get install llvm)")
    cpus = [c for c in args.cpus.split(",") if c]
    types = [t for t in args.types.split(",") if t]
    for t in types:
        if t not in TYPES:
            raise SystemExit("unknown type %s (R4 types: %s)" % (t, ",".join(TYPES)))
    with tempfile.TemporaryDirectory() as tmp:
        regions = compile_regions(tmp)
        fn_prefix = "ed_%s_rows_r4_" % args.table
        print("table %s, %d column(s), %s GHz; cycles per 8-row block (GB/s per core%s)"
              % (args.table, args.nc, args.ghz, ", %% of a 2-core read of %.1f GB/s" % args.read if args.read else ""))
        print("| type | bytes | " + " | ".join(cpus) + " |")
        print("| --- | ---: | " + " | ".join("---:" for _ in cpus) + " |")
        for t in types:
            name = region_name(t)
            key = next(((f, r) for (f, r) in regions if f.startswith(fn_prefix) and r == "%s_nc%d" % (name, args.nc)), None)
            if key is None:
                raise SystemExit("no region %s_nc%d in %s* (is the kernel marked?)" % (name, args.nc, fn_prefix))
            nbytes = ROWS * TYPE_INFO[GGMLType[t]].type_size
            cells = []
            for cpu in cpus:
                cyc = mca_cycles(regions[key], cpu, tmp)
                gbs = nbytes / cyc * args.ghz
                cell = "%.0f (%.1f" % (cyc, gbs)
                if args.read:
                    cell += ", %d%%" % min(100, round(200 * gbs / args.read))
                cells.append(cell + ")")
            print("| %s | %d | %s |" % (t, nbytes, " | ".join(cells)))


if __name__ == "__main__":
    main()
