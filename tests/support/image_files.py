"""Image files for the tests of images in requests: real encodings (Pillow) and hand-made
hostile ones (a PNG header of any size, a GIF of many frames)."""
import io
import struct
import zlib

import numpy as np
from PIL import Image


def encoded(fmt, size=(5, 3), mode="RGB", **kw):
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    im = Image.fromarray(arr, "RGB").convert(mode)
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue(), arr


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width, height, idat=b""):
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b""))


def zero_png(width, height):
    """A PNG of width x height black pixels: tiny on the wire, width*height*3 bytes decoded."""
    z = zlib.compressobj(9)
    row = bytes(1 + 3 * width)
    idat = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    return png(width, height, idat)


def gif_frames(n):
    """A 1x1 GIF of n frames (each: an image descriptor and one LZW-coded pixel)."""
    head = b"GIF89a" + struct.pack("<HHBBB", 1, 1, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00"
    return head + frame * n + b"\x3b"
