"""Images in requests: where their bytes come from, and their decoding to RGB in a bounded child.

An image reaches a request as a `data:` URL (OpenAI `image_url`, Responses `input_image`), a
base64 string (Ollama `images`, Anthropic's base64 source) or a `file://` path, read only
under the configured `image_dirs` (symbolic links resolved first); edged never fetches a URL
from the network. What comes in is only bytes here: `ImageInput` holds them with their
SHA-256 (the key under which an image's embeddings and KV prefix are reused).

Decoding is native code on untrusted bytes, so the daemon's own process never does it: with a
decoder installed (`use_decoder`: the daemon's render worker, edged/service/renderer.py), every
`decode()` runs in a fresh child of that worker under the same limits as a chat template
(address space, CPU time, no new processes). Without one (the CLI, tests) it decodes here.
Either way the decoder is Pillow, limited to PNG, JPEG, WebP and GIF (its first frame), and the
pixel count is read from the header and checked before any pixel is decoded, so a
decompression bomb is refused for the price of its header.
"""
import base64
import binascii
import dataclasses
import hashlib
import os
import stat
import struct
import urllib.parse

import numpy as np

from ..errors import RequestError

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
MAX_PIXELS = 1 << 23            # default image_max_pixels: a 4K frame (3840 x 2160) fits
MAX_BYTES = 16 << 20            # default image_max_bytes: an image's encoded size
DECODE_SECONDS = 5.0            # CPU time a decode may take in the render worker's child
MAX_FRAMES = 10_000             # an animated GIF: more frames than this is refused (only the first is read)
MARKER = "<__media__>"          # where an image goes in a message's text (llama.cpp's mtmd marker)


@dataclasses.dataclass(frozen=True)
class ImageInput:
    """An image as a request gave it: its encoded bytes (not parsed here) and where it came
    from (the field, for errors)."""
    data: bytes
    where: str

    @property
    def sha256(self):
        return hashlib.sha256(self.data).hexdigest()


@dataclasses.dataclass(frozen=True)
class DecodedImage:
    rgb: np.ndarray                 # (height, width, 3) uint8
    sha256: str                     # of the encoded bytes it came from


@dataclasses.dataclass(frozen=True)
class Limits:
    """What a request's images may be: encoded bytes each, pixels each, and the directories a
    file:// URL may name (none: file URLs refused)."""
    max_bytes: int = MAX_BYTES
    max_pixels: int = MAX_PIXELS
    dirs: tuple = ()

    @classmethod
    def of(cls, cfg):
        return cls(cfg.image_max_bytes, cfg.image_max_pixels, tuple(cfg.image_dirs))


@dataclasses.dataclass(frozen=True)
class ImageRef:
    """An image as a request names it, checked for its form when the body is parsed and read
    (read()) when the request is prepared for its model: a data:/file:// URL (`url`) or base64
    text; `where` is the field, for errors."""
    source: str
    where: str
    url: bool = True

    def read(self, limits):
        """The ImageInput: its bytes, within limits (size, image_dirs)."""
        if self.url:
            return from_url(self.source, self.where, limits)
        return from_base64(self.source, self.where, limits)


def url_ref(url, where):
    """ImageRef of an image URL field, refused now (400) unless a data: or file:// URL."""
    if not isinstance(url, str):
        raise RequestError(f"'{where}' must be a string URL", param=where)
    _scheme(url, where)
    return ImageRef(url, where)


def base64_ref(text, where):
    if not isinstance(text, str):
        raise RequestError(f"'{where}' must be a base64 string", param=where)
    return ImageRef(text, where, url=False)


def _scheme(url, where):
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme not in ("data", "file"):
        raise RequestError(f"'{where}': only data: URLs and file:// paths under image_dirs are read; "
                           f"edged does not fetch {scheme or 'relative'} URLs (send the image as "
                           "data:image/...;base64,...)", param=where)
    return scheme


def from_base64(text, where, limits):
    """ImageInput from base64 text (Ollama's `images`, Anthropic's base64 source)."""
    if not isinstance(text, str):
        raise RequestError(f"'{where}' must be a base64 string", param=where)
    if len(text) > (limits.max_bytes + 2) // 3 * 4 + 4:
        raise RequestError(f"'{where}': the image is larger than image_max_bytes={limits.max_bytes}",
                           param=where)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(f"'{where}' is not valid base64", param=where) from None
    if not data:
        raise RequestError(f"'{where}' is empty", param=where)
    if len(data) > limits.max_bytes:
        raise RequestError(f"'{where}': the image is larger than image_max_bytes={limits.max_bytes}",
                           param=where)
    return ImageInput(data, where)


def from_url(url, where, limits):
    """ImageInput from a `data:` URL or a `file://` path under limits.dirs; any other URL (http,
    https, ...) is refused: edged makes no network requests for a client."""
    if not isinstance(url, str):
        raise RequestError(f"'{where}' must be a string URL", param=where)
    if _scheme(url, where) == "data":
        head, sep, body = url[5:].partition(",")
        if not sep or not head.lower().endswith(";base64"):
            raise RequestError(f"'{where}': a data URL must be base64 (data:image/png;base64,...)",
                               param=where)
        return from_base64(body, where, limits)
    return _from_file(url, where, limits)


def _from_file(url, where, limits):
    parts = urllib.parse.urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise RequestError(f"'{where}': a file URL names a path on this machine (file:///...)", param=where)
    path = os.path.realpath(urllib.parse.unquote(parts.path))
    allowed = [os.path.realpath(d) for d in limits.dirs]
    if not any(os.path.commonpath([path, d]) == d for d in allowed):
        raise RequestError(f"'{where}': {path} is not under image_dirs "
                           f"({', '.join(allowed) or 'none configured: file URLs are refused'})",
                           param=where)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise RequestError(f"'{where}': {path} is not a regular file", param=where)
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(limits.max_bytes + 1)
    except OSError as e:
        raise RequestError(f"'{where}': cannot read {path}: {e.strerror}", param=where) from None
    if len(data) > limits.max_bytes:
        raise RequestError(f"'{where}': {path} is larger than image_max_bytes={limits.max_bytes}",
                           param=where)
    if not data:
        raise RequestError(f"'{where}': {path} is empty", param=where)
    return ImageInput(data, where)


def mmproj_beside(model_path):
    """llama.cpp's naming: DIR/mmproj-NAME.gguf pairs with DIR/NAME.gguf; its path when it exists."""
    d, f = os.path.split(model_path)
    p = os.path.join(d, "mmproj-" + (f[:-5] if f.endswith(".gguf") else f) + ".gguf")
    return p if os.path.exists(p) else None


# --- decoding --------------------------------------------------------------------------------

_DECODER = None         # the daemon's render worker (edged/service/renderer.py), or None


def use_decoder(decoder):
    """Route every decode() through `decoder(data, max_pixels) -> (height, width, rgb bytes)`
    (a bounded child process), or back in-process with None."""
    global _DECODER
    _DECODER = decoder


def preload():
    """Import Pillow's format plugins now: the render worker's children are forked from a
    process that may no longer open files (the sandbox)."""
    from PIL import Image
    Image.init()


def decode(image, max_pixels=MAX_PIXELS):
    """DecodedImage of `image` (ImageInput): RGB, first frame. RequestError naming the field when
    the bytes are not an image of an accepted format, or it has more than max_pixels pixels."""
    try:
        if _DECODER is not None:
            h, w, rgb = _DECODER(image.data, max_pixels)
        else:
            h, w, rgb = decode_here(image.data, max_pixels)
    except RequestError as e:
        raise RequestError(f"'{image.where}': {e}", param=image.where) from None
    if len(rgb) != h * w * 3:
        raise RequestError(f"'{image.where}': the image decoder returned {len(rgb)} bytes for "
                           f"{w}x{h} pixels", param=image.where)
    return DecodedImage(np.frombuffer(rgb, np.uint8).reshape(h, w, 3), image.sha256)


def gif_frames(data, limit):
    """The frames (image descriptors) of GIF `data`, counted up to limit + 1 by walking its
    blocks (no pixel is decoded): header and screen descriptor, colour tables, extensions and
    image data as chains of length-prefixed sub-blocks. Stops at the trailer or at the end of
    the bytes (Pillow judges a truncated file)."""
    n, i, end = 0, 13, len(data)
    if end >= 13 and data[10] & 0x80:                       # global colour table
        i += 3 << ((data[10] & 7) + 1)
    while i < end and n <= limit:
        block = data[i]
        if block == 0x2C:                                   # image descriptor
            n += 1
            if i + 10 > end:
                break
            flags = data[i + 9]
            i += 10 + ((3 << ((flags & 7) + 1)) if flags & 0x80 else 0) + 1    # + LZW code size
        elif block == 0x21:                                 # extension: label, then sub-blocks
            i += 2
        else:                                               # trailer, or not a GIF block
            break
        while i < end and data[i]:                          # sub-blocks up to a zero length
            i += data[i] + 1
        i += 1
    return n


def decode_here(data, max_pixels):
    """(height, width, RGB bytes) of the first frame of encoded image `data`, in this process
    (the render worker's child runs this). RequestError for anything but a whole PNG, JPEG,
    WebP or GIF of at most max_pixels pixels."""
    import io
    import warnings

    from PIL import Image, UnidentifiedImageError
    Image.MAX_IMAGE_PIXELS = None            # checked here, from the header, before decoding
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            im = Image.open(io.BytesIO(data), formats=FORMATS)
            w, h = im.size
            if w <= 0 or h <= 0 or w * h > max_pixels:
                raise RequestError(f"the image is {w}x{h} pixels, more than image_max_pixels={max_pixels} "
                                   "(decompression bombs are refused from the header)")
            # a fresh image is at its first frame; an animation's others are never decoded
            # (n_frames would decode them all to count them)
            if im.format == "GIF" and gif_frames(data, MAX_FRAMES) > MAX_FRAMES:
                raise RequestError(f"the GIF has more than {MAX_FRAMES} frames (only its first would "
                                   "be read; an animation that long is refused)")
            rgb = im.convert("RGB")
            return h, w, rgb.tobytes()
    except UnidentifiedImageError:
        raise RequestError(f"not an image edged decodes ({', '.join(FORMATS)})") from None
    except Image.DecompressionBombError as e:
        raise RequestError(f"the image has too many pixels: {e}") from None
    except (OSError, ValueError, SyntaxError, EOFError, IndexError, struct.error) as e:
        raise RequestError(f"the image cannot be decoded ({type(e).__name__}: {e})") from None
