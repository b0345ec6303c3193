"""Images from requests: their sources (data URLs, base64, file:// under image_dirs, no network)
and their decoding in a bounded child of the render worker (service/images.py, renderer.py).

Hostile images (issue 45) each get a clear RequestError (400) in well under a second, and the
process that asked (the daemon's) never grows by what the image would have cost."""
import base64
import io
import os
import resource
import time

import numpy as np
import pytest
from PIL import Image

from edged.errors import RequestError
from edged.service import images
from edged.service.renderer import RenderWorker
from image_files import encoded, gif_frames, png, zero_png

LIMITS = images.Limits()


@pytest.fixture(scope="module", params=["in-process", "worker"])
def decoder(request):
    """images.decode() as the CLI runs it (here) and as the daemon does (a child of the render
    worker, confined as the daemon's: enforce)."""
    if request.param == "in-process":
        yield None
        return
    w = RenderWorker("enforce")
    w.start()
    assert images._DECODER is not None
    yield w
    w.close()
    assert images._DECODER is None


def decode(data, max_pixels=images.MAX_PIXELS):
    return images.decode(images.ImageInput(data, "messages[0].content[1].image_url"), max_pixels)


@pytest.mark.parametrize("fmt,kw,exact", [("PNG", {}, True), ("WEBP", {"lossless": True}, True),
                                          ("JPEG", {"quality": 95}, False), ("GIF", {}, False)])
def test_each_format_decodes_to_rgb(decoder, fmt, kw, exact):
    data, arr = encoded(fmt, **kw)
    img = decode(data)
    assert img.rgb.shape == (3, 5, 3) and img.rgb.dtype == np.uint8
    if exact:
        assert np.array_equal(img.rgb, arr)
    else:          # lossy (JPEG) or palette (GIF): the same picture, near
        assert np.abs(img.rgb.astype(int) - Image.open(io.BytesIO(data)).convert("RGB")).max() == 0
    assert img.sha256 == images.ImageInput(data, "x").sha256


def test_alpha_and_palette_images_come_out_rgb(decoder):
    data, arr = encoded("PNG", mode="RGBA")
    assert np.array_equal(decode(data).rgb, arr)
    data, _ = encoded("PNG", mode="P")
    assert decode(data).rgb.shape == (3, 5, 3)


def refused(data, pattern, max_pixels=images.MAX_PIXELS):
    t0 = time.monotonic()
    with pytest.raises(RequestError, match=pattern) as e:
        decode(data, max_pixels)
    assert time.monotonic() - t0 < 1.0
    assert e.value.status == 400 and e.value.param == "messages[0].content[1].image_url"
    return str(e.value)


def test_hostile_images_get_a_clear_400_in_under_a_second(decoder):
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    refused(png(100_000, 100_000), r"100000x100000 pixels, more than image_max_pixels")
    jpeg, _ = encoded("JPEG", size=(64, 64))
    refused(jpeg[:len(jpeg) // 2], r"cannot be decoded .*truncated")
    refused(b"\x89PNG\r\n\x1a\n" + b"\0" * 30, r"cannot be decoded|not an image")
    refused(b"plain text, not an image", r"not an image edged decodes \(PNG, JPEG, WEBP, GIF\)")
    bmp, _ = encoded("BMP")
    refused(bmp, r"not an image edged decodes")              # a format outside the four
    refused(zero_png(20, 20), r"20x20 pixels, more than image_max_pixels=100", max_pixels=100)
    # the process that asked did not grow by what the images would have cost
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 32 << 10     # KiB


def test_a_gif_of_100000_frames_is_refused_in_under_a_second(decoder):
    """Its frames are counted by walking the blocks (no pixel decoded) up to MAX_FRAMES."""
    t0 = time.monotonic()
    with pytest.raises(RequestError, match=r"the GIF has more than 10000 frames"):
        decode(gif_frames(100_000))
    assert time.monotonic() - t0 < 1.0


def test_an_animated_gif_gives_its_first_frame(decoder):
    img = decode(gif_frames(images.MAX_FRAMES))
    assert img.rgb.shape == (1, 1, 3) and img.rgb.tolist() == [[[0, 0, 0]]]
    frames = [Image.fromarray(np.full((4, 6, 3), 40 * k, np.uint8)) for k in range(5)]
    b = io.BytesIO()
    frames[0].save(b, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    assert images.gif_frames(b.getvalue(), 100) == 5
    assert decode(b.getvalue()).rgb.tolist() == np.full((4, 6, 3), 0, np.uint8).tolist()


def test_an_image_past_the_decoders_memory_is_refused_and_the_worker_serves_on():
    """12000 x 12000 pixels (432 MB decoded) allowed by max_pixels but not by the child's
    address space: the child fails, the request gets a 400, the next image decodes."""
    w = RenderWorker("enforce")
    w.start()
    try:
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        data = zero_png(12000, 12000)
        with pytest.raises(RequestError, match="image decoding .*memory|image decoding process failed"):
            decode(data, max_pixels=12000 * 12000)
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 64 << 10     # KiB
        assert decode(encoded("PNG")[0]).rgb.shape == (3, 5, 3)
    finally:
        w.close()


# --- where the bytes come from -------------------------------------------------------------

def test_data_urls_and_base64():
    data, _ = encoded("PNG")
    b64 = base64.b64encode(data).decode()
    assert images.from_url("data:image/png;base64," + b64, "u", LIMITS).data == data
    assert images.from_base64(b64, "images[0]", LIMITS).data == data
    with pytest.raises(RequestError, match="'u': a data URL must be base64"):
        images.from_url("data:image/png," + b64, "u", LIMITS)
    with pytest.raises(RequestError, match="'images\\[0\\]' is not valid base64"):
        images.from_base64("not base64!", "images[0]", LIMITS)


def test_a_50_mb_data_url_is_refused_before_it_is_decoded():
    url = "data:image/png;base64," + "A" * (50 << 20)
    t0 = time.monotonic()
    with pytest.raises(RequestError, match=f"larger than image_max_bytes={images.MAX_BYTES}"):
        images.from_url(url, "u", LIMITS)
    assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize("url,scheme", [("http://example.com/cat.png", "http"),
                                        ("https://example.com/cat.png", "https"),
                                        ("ftp://example.com/cat.png", "ftp"), ("cat.png", "relative")])
def test_no_network_fetch(url, scheme):
    with pytest.raises(RequestError, match=f"edged does not fetch {scheme} URLs") as e:
        images.from_url(url, "messages[0].content[0].image_url.url", LIMITS)
    assert e.value.param == "messages[0].content[0].image_url.url"


def test_file_urls_only_under_image_dirs(tmp_path):
    allowed, other = tmp_path / "cam", tmp_path / "secret"
    allowed.mkdir()
    other.mkdir()
    data, _ = encoded("PNG")
    (allowed / "a b.png").write_bytes(data)
    (other / "key.png").write_bytes(data)
    (allowed / "link.png").symlink_to(other / "key.png")
    limits = images.Limits(dirs=(str(allowed),))
    assert images.from_url(f"file://{allowed}/a%20b.png", "u", limits).data == data
    for url in (f"file://{other}/key.png", f"file://{allowed}/../secret/key.png", f"file://{allowed}/link.png"):
        with pytest.raises(RequestError, match=f"{other}/key.png is not under image_dirs \\({allowed}\\)"):
            images.from_url(url, "u", limits)
    with pytest.raises(RequestError, match="none configured: file URLs are refused"):
        images.from_url(f"file://{allowed}/a%20b.png", "u", LIMITS)
    with pytest.raises(RequestError, match="is not a regular file"):
        images.from_url(f"file://{allowed}", "u", limits)
    with pytest.raises(RequestError, match="cannot read .*missing.png"):
        images.from_url(f"file://{allowed}/missing.png", "u", limits)
    big = images.Limits(max_bytes=10, dirs=(str(allowed),))
    with pytest.raises(RequestError, match="larger than image_max_bytes=10"):
        images.from_url(f"file://{allowed}/a%20b.png", "u", big)
    assert os.path.exists(other / "key.png")
