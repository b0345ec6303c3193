#!/usr/bin/env python3
"""Guest instructions per generated token and per prompt token on aarch64, for edged and
llama.cpp on the same GGUF files, counted under qemu-aarch64 (no Arm machine needed).

Counts are a proxy for speed, not a measurement of it: they ignore memory bandwidth, caches,
issue width and the cost of each instruction (a dotprod SDOT counts as one, like a MOV).

How: a 30-line TCG plugin (built here with gcc) adds each translated block's instruction count
to one counter every time the block runs; qemu prints it at exit. Each figure is the
difference of two runs, k and 2k tokens, divided by k, so process start, model load and
warm-up cancel out. Both programs run one thread (no spinning workers in the count).
Debian's qemu-user (the dynamic `qemu-aarch64`) loads plugins; qemu-user-static does not.

--by-symbol N: where edged's instructions go. The plugin also counts each translated block's
runs (to the file $ICOUNT_TB_OUT), the edged driver writes its /proc/self/maps, and the blocks
are attributed to the symbols of the mapped files (aarch64-linux-gnu-nm/readelf); the N largest
per token are printed after each edged figure.

The CPU qemu emulates decides the kernel path: `-cpu cortex-a72` (Pi 4: NEON, no dotprod) and
`-cpu cortex-a76` (Pi 5: NEON with dotprod); edged picks its path from the CPU's features as on
real hardware, llama.cpp needs a binary built for each (-DGGML_CPU_ARM_ARCH=armv8-a /
armv8.2-a+dotprod, static, aarch64-linux-gnu-g++).

edged runs as Debian's arm64 python3.11 from an arm64 root (-L), with edged's aarch64 build and
numpy on PYTHONPATH (tools/build-wheels.sh makes both).

    python tools/arm_icount.py -m q4_0.gguf -m q4_k_m.gguf --arm-root ROOT --site SITE \\
        --llama-bench-pi4 llama-bench-armv8-a --llama-bench-pi5 llama-bench-armv8.2-a+dotprod
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

CPUS = {"pi4": "cortex-a72", "pi5": "cortex-a76"}

PLUGIN = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
/* The few declarations of qemu's plugin API (include/qemu/qemu-plugin.h, API version 1) this
   plugin uses: Debian does not ship the header. */
typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
typedef struct qemu_info_t qemu_info_t;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t, void (*)(qemu_plugin_id_t, struct qemu_plugin_tb *));
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *, enum qemu_plugin_op, void *, uint64_t);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t, void (*)(qemu_plugin_id_t, void *), void *);
__attribute__((visibility("default"))) int qemu_plugin_version = 1;
static uint64_t insns;  /* one counter: the programs counted run one compute thread */
typedef struct blk { uint64_t va, n, runs; struct blk *next; } blk;  /* with $ICOUNT_TB_OUT */
static blk *blocks;
static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &insns, qemu_plugin_tb_n_insns(tb));
    if (!getenv("ICOUNT_TB_OUT")) return;
    blk *b = calloc(1, sizeof *b);
    b->va = qemu_plugin_tb_vaddr(tb); b->n = qemu_plugin_tb_n_insns(tb); b->next = blocks; blocks = b;
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &b->runs, 1);
}
static void at_end(qemu_plugin_id_t id, void *p) {
    fprintf(stderr, "\nICOUNT %llu\n", (unsigned long long)insns);
    FILE *o = getenv("ICOUNT_TB_OUT") ? fopen(getenv("ICOUNT_TB_OUT"), "w") : NULL;
    for (blk *b = blocks; o && b; b = b->next)  /* address, instructions run */
        if (b->runs) fprintf(o, "%llx %llu\n", (unsigned long long)b->va, (unsigned long long)(b->runs * b->n));
    if (o) fclose(o);
}
__attribute__((visibility("default")))
int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv) {
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_atexit_cb(id, at_end, NULL);
    return 0;
}
"""

# k prompt tokens as one batch, or k tokens decoded one at a time, after loading the model
EDGED_DRIVER = r"""
import sys
from edged import Model
path, mode, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
m = Model.load(path, n_threads=1)
s = m.session(n_ctx=512)
toks = [(i * 7919) % 1000 + 10 for i in range(k)]
if mode == "prompt":
    s.eval(toks)
else:
    for t in toks:
        s.eval([t])
from edged import _core
dotprod = "dotprod" in " ".join(map(str, _core.cpu_features()))
print("KERNELS", _core.kernel_path() + ("+dotprod" if dotprod else ""), file=sys.stderr)
import os
if os.environ.get("ICOUNT_MAPS"):  # for --by-symbol: where each file is mapped
    with open(os.environ["ICOUNT_MAPS"], "w") as f:
        f.write(open("/proc/self/maps").read())
"""


def build_plugin(tmp):
    src, lib = os.path.join(tmp, "icount.c"), os.path.join(tmp, "libicount.so")
    with open(src, "w") as f:
        f.write(PLUGIN)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", lib, src], check=True)
    return lib


def count(cmd, env=None):
    # from / so that `python -c` finds edged on PYTHONPATH, not a checkout in the current directory
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd="/")
    m = re.search(r"ICOUNT (\d+)", r.stderr)
    if r.returncode != 0 or not m:
        raise RuntimeError(f"{' '.join(cmd[:8])} ...: exit {r.returncode}: {r.stderr[-2000:]}")
    kernels = re.search(r"KERNELS (\S+)", r.stderr)
    print(f"  {int(m.group(1)):>15,} instructions: {' '.join(os.path.basename(c) for c in cmd[-3:])}", file=sys.stderr)
    return int(m.group(1)), kernels.group(1) if kernels else ""


def per_token(run, k):
    """(instructions per token, what ran) from runs of k and 2k tokens."""
    (c1, what), (c2, _) = run(k), run(2 * k)
    return (c2 - c1) / k, what


def edged_runs(a, plugin, model, cpu, mode, tbdir=None):
    # a fixed hash seed: the same dict layouts in both runs, so Python's own work cancels exactly;
    # one BLAS thread: numpy's OpenBLAS workers spin-wait under qemu for as long as the host
    # schedules them (1-4 M instructions per token that differ from run to run)
    env = {**os.environ, "PYTHONPATH": a.site, "PYTHONNOUSERSITE": "1", "PYTHONHASHSEED": "0",
           "OPENBLAS_NUM_THREADS": "1"}
    py = os.path.join(a.arm_root, "usr", "bin", "python3.11")

    def run(k):
        e = env if not tbdir else {**env, "ICOUNT_TB_OUT": os.path.join(tbdir, f"{k}.tb"),
                                   "ICOUNT_MAPS": os.path.join(tbdir, f"{k}.maps")}
        return count([a.qemu, "-L", a.arm_root, "-cpu", cpu, "-plugin", plugin, py, "-c", EDGED_DRIVER,
                      model, mode, str(k)], e)
    return run


def by_symbol(a, tbdir, k, top):
    """The `top` symbols with the most instructions per token, from the runs of k and 2k tokens."""
    tools = {t: shutil.which(f"aarch64-linux-gnu-{t}") or t for t in ("nm", "readelf")}
    files = {}

    def symbols(path):  # (LOAD segments (offset, vaddr, size), sorted function symbols)
        if path not in files:
            real = path if os.path.exists(path) and not path.startswith("/usr") else a.arm_root + path
            segs, syms = [], []
            for line in subprocess.run([tools["readelf"], "-lW", real], capture_output=True, text=True).stdout.splitlines():
                p = line.split()
                if p and p[0] == "LOAD":
                    segs.append((int(p[1], 16), int(p[2], 16), int(p[4], 16)))
            for line in subprocess.run([tools["nm"], "-S", "--defined-only", real], capture_output=True, text=True).stdout.splitlines():
                p = line.split()
                if len(p) == 4 and p[2] in "tTwW":
                    syms.append((int(p[0], 16), int(p[0], 16) + int(p[1], 16), p[3]))
            files[path] = (segs, sorted(syms))
        return files[path]

    def attribute(n):
        maps = []
        for line in open(os.path.join(tbdir, f"{n}.maps")):
            p = line.split()
            if len(p) >= 6 and "x" in p[1]:
                lo, hi = (int(x, 16) for x in p[0].split("-"))
                maps.append((lo, hi, int(p[2], 16), p[5]))
        out = collections.Counter()
        for line in open(os.path.join(tbdir, f"{n}.tb")):
            va, c = line.split()
            va, name = int(va, 16), "?"
            for lo, hi, off, path in maps:
                if lo <= va < hi:
                    segs, syms = symbols(path)
                    fo = va - lo + off
                    sv = next((fo - so + sva for so, sva, sz in segs if so <= fo < so + sz), None)
                    sym = next((s for s0, s1, s in syms if sv is not None and s0 <= sv < s1), "?")
                    name = f"{os.path.basename(path)}:{sym}"
                    break
            out[name] += int(c)
        return out
    c1, c2 = attribute(k), attribute(2 * k)
    d = collections.Counter({n: (c2[n] - c1[n]) / k for n in set(c1) | set(c2)})
    for n, v in d.most_common(top):
        print(f"    {v / 1e6:9.2f} M  {n}", file=sys.stderr)


def llama_runs(a, plugin, binary, model, cpu, mode):
    def run(k):
        p, n = (k, 0) if mode == "prompt" else (0, k)
        c, _ = count([a.qemu, "-cpu", cpu, "-plugin", plugin, binary, "-m", model, "-t", "1", "-r", "1",
                      "--no-warmup", "-p", str(p), "-n", str(n), "-o", "json"])
        return c, os.path.basename(binary)
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", action="append", required=True, help="GGUF file (repeatable)")
    ap.add_argument("-n", "--n-gen", type=int, default=4, help="k for generated tokens (runs of k and 2k)")
    ap.add_argument("-p", "--n-prompt", type=int, default=16, help="k for prompt tokens (runs of k and 2k)")
    ap.add_argument("--arm-root", default=os.environ.get("EDGED_ARM64_ROOT"),
                    help="arm64 Debian root with python3.11 (or $EDGED_ARM64_ROOT)")
    ap.add_argument("--site", default=os.environ.get("EDGED_ARM64_SITE"),
                    help="PYTHONPATH holding edged's aarch64 build and numpy (or $EDGED_ARM64_SITE)")
    ap.add_argument("--llama-bench-pi4", help="llama-bench for aarch64 built with GGML_CPU_ARM_ARCH=armv8-a")
    ap.add_argument("--llama-bench-pi5", help="llama-bench built with GGML_CPU_ARM_ARCH=armv8.2-a+dotprod")
    ap.add_argument("--cpus", default="pi4,pi5", help="which emulated CPUs: pi4 (cortex-a72), pi5 (cortex-a76)")
    ap.add_argument("--by-symbol", type=int, default=0, metavar="N",
                    help="also print the N symbols with the most edged instructions per token")
    ap.add_argument("--qemu", default=shutil.which("qemu-aarch64") or "qemu-aarch64",
                    help="qemu-aarch64 that loads plugins (Debian's qemu-user, not qemu-user-static)")
    a = ap.parse_args()
    if not (a.arm_root and a.site):
        ap.error("--arm-root and --site are needed to run edged")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        plugin = build_plugin(tmp)
        for model in a.model:
            model = os.path.abspath(model)
            for board in a.cpus.split(","):
                cpu = CPUS[board]
                llama = getattr(a, f"llama_bench_{board}")
                row = {"model": os.path.basename(model), "cpu": f"{board} ({cpu})"}
                for mode, k in (("gen", a.n_gen), ("prompt", a.n_prompt)):
                    tbdir = tempfile.mkdtemp(dir=tmp) if a.by_symbol else None
                    row[f"edged_{mode}"], row["edged_path"] = per_token(edged_runs(a, plugin, model, cpu, mode, tbdir), k)
                    if tbdir:
                        print(f"  edged, {os.path.basename(model)}, {board}, {mode}: M instructions per token", file=sys.stderr)
                        by_symbol(a, tbdir, k, a.by_symbol)
                    if llama:
                        row[f"llama_{mode}"], _ = per_token(llama_runs(a, plugin, os.path.abspath(llama), model, cpu,
                                                                       mode), k)
                    print(f"{row}", file=sys.stderr)
                rows.append(row)
    print("| file | CPU (qemu) | edged path | edged M instr / generated token | llama.cpp | ratio "
          "| edged M instr / prompt token | llama.cpp | ratio |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        cells = []
        for mode in ("gen", "prompt"):
            e, l_ = r[f"edged_{mode}"], r.get(f"llama_{mode}")
            cells += [f"{e / 1e6:.1f}", f"{l_ / 1e6:.1f}" if l_ else "-", f"{e / l_:.2f}" if l_ else "-"]
        print(f"| {r['model']} | {r['cpu']} | {r['edged_path']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
