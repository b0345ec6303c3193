"""`edged gguf-dump FILE [--json]`: header, metadata, tensor table and totals of a GGUF file."""
import json
import sys

import numpy as np

from ..format.gguf import GGUFFile

ARRAY_SHOWN = 8     # long arrays are abbreviated to their first elements and their length


def configure(p):
    p.description = ("Print the header, all metadata (long arrays abbreviated), the "
                     "tensor table and totals by type of a GGUF file.")
    p.add_argument("file", metavar="FILE", help="GGUF file")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    p.add_argument("--full", action="store_true", help="do not abbreviate long arrays")
    p.set_defaults(func=run)


def _plain(value, full):
    """Metadata value -> JSON-able value; long arrays become {"length", "head"}."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, list):
        if full or len(value) <= ARRAY_SHOWN:
            return value
        return {"length": len(value), "head": value[:ARRAY_SHOWN]}
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return value


def describe(f, full=False):
    """The dump as a plain dict (what --json prints)."""
    totals = f.totals_by_type()
    return {
        "file": f.name,
        "version": f.version,
        "alignment": f.alignment,
        "data_offset": f.data_offset,
        "file_size": f.file_size,
        "metadata": {k: {"type": f.value_types[k].name, "value": _plain(v, full)}
                     for k, v in f.metadata.items()},
        "tensors": [{"name": t.name, "type": t.type.name, "shape": list(t.shape),
                     "offset": t.offset, "bytes": t.nbytes} for t in f.tensors.values()],
        "totals": {name: {"tensors": n, "bytes": b} for name, (n, b) in sorted(totals.items())},
        "total_bytes": sum(b for _, b in totals.values()),
    }


def _text_value(v):
    if isinstance(v, dict) and "length" in v:
        head = ", ".join(json.dumps(x, ensure_ascii=False) for x in v["head"])
        return f"[{head}, ...] ({v['length']} items)"
    text = json.dumps(v, ensure_ascii=False)
    return text if len(text) <= 200 else text[:200] + f"... ({len(text)} chars)"


def run(args):
    with GGUFFile.open(args.file) as f:
        d = describe(f, args.full)
    out = sys.stdout
    if args.json:
        json.dump(d, out, ensure_ascii=False, indent=1)
        out.write("\n")
        return 0
    out.write(f"{d['file']}: GGUF v{d['version']}, {len(d['metadata'])} metadata entries, "
              f"{len(d['tensors'])} tensors, alignment {d['alignment']}, "
              f"data at offset {d['data_offset']}, {d['file_size']} bytes\n\n")
    out.write("metadata:\n")
    width = max((len(k) for k in d["metadata"]), default=0)
    for k, e in d["metadata"].items():
        out.write(f"  {k:<{width}}  {e['type']:<7}  {_text_value(e['value'])}\n")
    out.write(f"\ntensors:\n  {'name':<40} {'type':<6} {'shape':<24} {'offset':>12} {'bytes':>12}\n")
    for t in d["tensors"]:
        shape = "x".join(map(str, t["shape"]))
        out.write(f"  {t['name']:<40} {t['type']:<6} {shape:<24} {t['offset']:>12} {t['bytes']:>12}\n")
    out.write("\ntotals:\n")
    for name, e in d["totals"].items():
        out.write(f"  {name:<6} {e['tensors']:>5} tensors {e['bytes']:>14} bytes\n")
    out.write(f"  {'all':<6} {len(d['tensors']):>5} tensors {d['total_bytes']:>14} bytes\n")
    return 0
