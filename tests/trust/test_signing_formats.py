"""Detached and appended signatures: openssl interoperability both ways and both paddings,
the appended block's layout, stacking, and every kind of tampering refused with its reason."""
import os
import shutil
import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import conftest
from edged.trust.rules import BAD_SIGNATURE, KEY_TOO_SMALL, MALFORMED_BLOCK, NO_TRUST_STORE, REVOKED_KEY, UNKNOWN_KEY, UNSIGNED
from edged.trust.keys import MADE_PKCS1, MADE_PSS, PKCS1V15, PSS, made_by
from edged.trust.store import TrustStore
from edged.trust.blocks import encode_block, read_blocks
from edged.trust.verify import open_verified
from edged.trust.sign import sign_file
from edged.errors import SignatureError
from signing_support import (copy_model, edged, keys, make_trust_dir, needs_openssl,  # noqa: F401
                             openssl, refused, trust)

PSS_OPTS = ["-sigopt", "rsa_padding_mode:pss", "-sigopt", "rsa_pss_saltlen:-1"]


@pytest.fixture
def model(tmp_path):
    return copy_model(tmp_path)


def verify(path, trust, require=True):
    with open_verified(path, trust, require, cache=None) as vf:
        return vf.signer, vf.kind, vf.algorithm, vf.signed_length, vf.size


def refusal(path, trust, rule, require=True):
    with pytest.raises(SignatureError) as e:
        open_verified(path, trust, require, cache=None)
    return refused(e, rule)


def sign(path, key, **kw):
    return sign_file(path, key.key, **kw)


def flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


# --- openssl interoperability ------------------------------------------------------------

@needs_openssl
@pytest.mark.parametrize("opts, algorithm", [
    ([], "RSA-PKCS1v15-SHA256"),
    (PSS_OPTS, "RSA-PSS-SHA256"),
    (["-sigopt", "rsa_padding_mode:pss", "-sigopt", "rsa_pss_saltlen:max"], "RSA-PSS-SHA256"),
])
def test_openssl_detached_signature_verifies_in_edged(model, keys, trust, opts, algorithm):
    r = openssl("dgst", "-sha256", "-sign", keys["operator"].private, *opts, "-out", model + ".sig", model)
    assert r.returncode == 0, r.stderr
    size = os.path.getsize(model)
    assert verify(model, trust) == (keys["operator"].fp, "detached", algorithm, size, size)
    r = edged("verify", "--trusted", trust.source, model)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == keys["operator"].fp


@needs_openssl
@pytest.mark.parametrize("pss", [False, True])
def test_edged_detached_signature_verifies_in_openssl(model, keys, pss):
    r = edged("sign", "--key", keys["operator"].private, "--detached", *(["--pss"] if pss else []), model)
    assert r.returncode == 0, r.stderr
    assert open(model, "rb").read() == open(conftest.testdata("models", "stories260K.gguf"), "rb").read()  # untouched
    pub = keys["operator"].public
    if pss:
        for saltlen in ("-1", "auto"):
            r = openssl("dgst", "-sha256", "-verify", pub, "-sigopt", "rsa_padding_mode:pss",
                        "-sigopt", f"rsa_pss_saltlen:{saltlen}", "-signature", model + ".sig", model)
            assert r.returncode == 0 and "Verified OK" in r.stdout, (saltlen, r.stdout, r.stderr)
        # and it is PSS, not PKCS#1 v1.5
        assert openssl("dgst", "-sha256", "-verify", pub, "-signature", model + ".sig", model).returncode == 1
    else:
        r = openssl("dgst", "-sha256", "-verify", pub, "-signature", model + ".sig", model)
        assert r.returncode == 0 and "Verified OK" in r.stdout, r.stderr
    flip(model, 20000)
    assert openssl("dgst", "-sha256", "-verify", pub, *(PSS_OPTS if pss else []),
                   "-signature", model + ".sig", model).returncode == 1


@needs_openssl
@pytest.mark.parametrize("pss", [False, True])
def test_appended_block_holds_an_openssl_signature_over_the_bytes_before_it(tmp_path, model, keys, trust, pss):
    original = open(model, "rb").read()
    r = edged("sign", "--key", keys["operator"].private, *(["--pss"] if pss else []), model)
    assert r.returncode == 0, r.stderr
    data = open(model, "rb").read()
    n = len(original)
    assert data[:n] == original
    block = data[n:]
    # the layout the README documents
    magic, version, algorithm, sig_len, signed_len, fp = struct.unpack_from("<8sHHIQ32s", block)
    assert (magic, version, algorithm, sig_len, signed_len) == (b"EDGEDSIG", 1, 2 if pss else 1, 256, n)
    assert fp.hex() == keys["operator"].fp and block[56:64] == bytes(8)
    assert struct.unpack("<Q8s", block[-16:]) == (len(block), b"EDGEDEND") and len(block) == 64 + 256 + 16
    (tmp_path / "prefix").write_bytes(data[:signed_len])
    (tmp_path / "sig").write_bytes(block[64:64 + sig_len])
    r = openssl("dgst", "-sha256", "-verify", keys["operator"].public, *(PSS_OPTS if pss else []),
                "-signature", str(tmp_path / "sig"), str(tmp_path / "prefix"))
    assert r.returncode == 0 and "Verified OK" in r.stdout, r.stderr
    assert verify(model, trust) == (keys["operator"].fp, "appended", "RSA-PSS-SHA256" if pss else "RSA-PKCS1v15-SHA256",
                                    n, len(data))


def test_signed_file_still_reads_with_the_gguf_package(model, keys):
    from gguf import GGUFReader

    before = GGUFReader(model)
    expected = {t.name: np.array(t.data) for t in before.tensors}
    meta = {k: f.parts[-1].tobytes() for k, f in before.fields.items()}
    del before
    sign(model, keys["vendor"])
    sign(model, keys["operator"], pss=True)
    after = GGUFReader(model)
    assert {t.name for t in after.tensors} == set(expected)
    for t in after.tensors:
        np.testing.assert_array_equal(np.array(t.data), expected[t.name])
    assert {k: f.parts[-1].tobytes() for k, f in after.fields.items()} == meta


def test_verified_descriptor_maps_with_the_edged_reader(model, keys, trust):
    from edged.format.gguf import GGUFFile

    with GGUFFile.open(model) as f:
        expected = {name: f.tensor_bytes(name).tobytes() for name in f.tensors}
    sign(model, keys["operator"])
    with open_verified(model, trust, True, cache=None) as vf:
        f = GGUFFile.from_fd(vf.fd, name=model, size=vf.signed_length)
        try:
            assert {name: f.tensor_bytes(name).tobytes() for name in f.tensors} == expected
        finally:
            f.close()


# --- stacking and policy ---------------------------------------------------------------------

def test_blocks_stack_and_either_trusted_signer_is_accepted(tmp_path, model, keys):
    n = os.path.getsize(model)
    sign(model, keys["vendor"])
    sign(model, keys["operator"], pss=True)
    with open(model, "rb") as f:
        blocks = read_blocks(f.fileno(), os.path.getsize(model), model)
    assert [(b.offset, b.fingerprint) for b in blocks] == [(n, keys["vendor"].fp), (n + 336, keys["operator"].fp)]
    for names, signer in [(("operator",), "operator"), (("vendor",), "vendor"), (("vendor", "operator"), "operator")]:
        d = tmp_path / ("t-" + "-".join(names))
        trust = TrustStore.load(*make_trust_dir(d, keys, names=names, revoked=()))
        assert verify(model, trust)[0] == keys[signer].fp
        assert verify(model, trust)[3] == n  # model bytes end where the first block starts


def test_key_rotation_resigned_file_passes_after_old_key_is_revoked(tmp_path, model, keys):
    sign(model, keys["old"])
    before = TrustStore.load(*make_trust_dir(tmp_path / "before", keys, names=("old",), revoked=()))
    assert verify(model, before)[0] == keys["old"].fp
    sign(model, keys["operator"])  # re-sign with the new key: a second block
    after = TrustStore.load(*make_trust_dir(tmp_path / "after", keys, names=("old", "operator"), revoked=("old",)))
    assert verify(model, after)[0] == keys["operator"].fp
    only_old = tmp_path / "only-old.gguf"
    shutil.copyfile(copy_model(tmp_path, as_name="m2.gguf"), only_old)
    sign(str(only_old), keys["old"])
    assert keys["old"].fp in refusal(str(only_old), after, REVOKED_KEY)


def test_unsigned_policy(model, trust):
    assert "no appended signature block" in refusal(model, trust, UNSIGNED)
    size = os.path.getsize(model)
    assert verify(model, trust, require=False) == (None, None, None, size, size)
    with pytest.raises(SignatureError) as e:
        open_verified(model, None, True)
    refused(e, NO_TRUST_STORE)


def test_without_trust_store_nothing_is_checked_but_model_length_is_known(model, keys):
    n = os.path.getsize(model)
    sign(model, keys["stranger"])
    with open_verified(model, None, False) as vf:
        assert (vf.signer, vf.signed_length, vf.size) == (None, n, n + 336)


def test_a_failing_signature_is_refused_even_when_signatures_are_optional(model, keys, trust):
    sign(model, keys["operator"])
    flip(model, 20000)
    refusal(model, trust, BAD_SIGNATURE, require=False)
    sign(model, keys["stranger"], detached=True)
    refusal(model + "", trust, BAD_SIGNATURE, require=False)


# --- tampering: each case refused with its own reason -----------------------------------------

REGIONS = {"header": 5, "metadata": 100, "tensor data": 14176 + 1000, "last tensor byte": 1185376 - 1}


@pytest.mark.parametrize("region", REGIONS)
@pytest.mark.parametrize("detached", [False, True])
def test_flipping_a_model_byte_is_a_bad_signature(model, keys, trust, region, detached):
    assert os.path.getsize(model) == 1185376
    sign(model, keys["operator"], detached=detached)
    verify(model, trust)
    flip(model, REGIONS[region])
    msg = refusal(model, trust, BAD_SIGNATURE)
    assert keys["operator"].fp in msg


def test_flipping_bytes_of_the_appended_block(model, keys, trust):
    n = os.path.getsize(model)
    sign(model, keys["operator"])
    pristine = open(model, "rb").read()
    cases = [
        (n + 64 + 100, BAD_SIGNATURE, "does not match"),  # signature
        (n + 24 + 3, UNKNOWN_KEY, "not in the trust store"),  # key fingerprint
        (n + 10, MALFORMED_BLOCK, "unknown algorithm"),  # algorithm 1 -> 0
        (n + 16, MALFORMED_BLOCK, "signs"),  # signed length
        (n + 2, MALFORMED_BLOCK, "no block header"),  # header magic
        (n + 8, MALFORMED_BLOCK, "version"),  # version
        (n + 336 - 16, MALFORMED_BLOCK, "trailer's length 337"),  # trailer: block length
        (n + 336 - 1, MALFORMED_BLOCK, "damaged trailer"),  # trailer: magic
    ]
    for offset, rule, words in cases:
        with open(model, "wb") as f:
            f.write(pristine)
        flip(model, offset)
        assert words in refusal(model, trust, rule), offset


def test_flipping_a_detached_signature_byte(model, keys, trust):
    sign(model, keys["operator"], detached=True)
    flip(model + ".sig", 100)
    msg = refusal(model, trust, UNKNOWN_KEY)
    assert "damaged" in msg  # a detached signature names no key: another key or damage


@pytest.mark.parametrize("cut, rule, words", [
    (1, MALFORMED_BLOCK, "truncated"),
    (300, MALFORMED_BLOCK, "truncated"),
    (336, UNSIGNED, "no appended signature block"),
    (5000, UNSIGNED, "no appended signature block"),
])
def test_truncated_appended_file(model, keys, trust, cut, rule, words):
    sign(model, keys["operator"])
    os.truncate(model, os.path.getsize(model) - cut)
    assert words in refusal(model, trust, rule)


def test_truncated_detached_file(model, keys, trust):
    sign(model, keys["operator"], detached=True)
    os.truncate(model, os.path.getsize(model) - 1)
    refusal(model, trust, BAD_SIGNATURE)


@pytest.mark.parametrize("garbage", [b"\x00", b"x" * 4096])
def test_appended_garbage(model, keys, trust, garbage):
    sign(model, keys["operator"])
    with open(model, "ab") as f:
        f.write(garbage)
    assert f"{len(garbage)} bytes of data after the signature block" in refusal(model, trust, MALFORMED_BLOCK)
    os.truncate(model, os.path.getsize(model) - len(garbage))
    verify(model, trust)
    sign(model, keys["operator"], detached=True)
    with open(model, "ab") as f:
        f.write(garbage)
    os.unlink(model + ".sig")
    refusal(model, trust, MALFORMED_BLOCK)


def test_swapped_signature_of_another_file(tmp_path, model, keys, trust):
    other = copy_model(tmp_path, "synthetic-llama-Q4_0.gguf", "other.gguf")
    sign(other, keys["operator"], detached=True)
    os.replace(other + ".sig", model + ".sig")
    assert "does not match" in refusal(model, trust, BAD_SIGNATURE)
    os.unlink(model + ".sig")
    # an appended block lifted from the other file, as is and re-framed for this file
    sign(other, keys["operator"])
    with open(other, "rb") as f:
        blocks = read_blocks(f.fileno(), os.path.getsize(other), other)
    pristine = open(model, "rb").read()
    with open(model, "ab") as f:
        f.write(encode_block(blocks[0].offset, blocks[0].algorithm, blocks[0].fingerprint, blocks[0].signature))
    assert "signs" in refusal(model, trust, MALFORMED_BLOCK)
    with open(model, "wb") as f:
        f.write(pristine + encode_block(len(pristine), blocks[0].algorithm, blocks[0].fingerprint,
                                                blocks[0].signature))
    assert "does not match" in refusal(model, trust, BAD_SIGNATURE)


@pytest.mark.parametrize("detached", [False, True])
def test_untrusted_key(model, keys, trust, detached):
    sign(model, keys["stranger"], detached=detached)
    msg = refusal(model, trust, UNKNOWN_KEY)
    if not detached:
        assert keys["stranger"].fp in msg
    r = edged("verify", "--trusted", trust.source, model)
    assert r.returncode == 1 and UNKNOWN_KEY in r.stderr and r.stdout == ""


@pytest.mark.parametrize("detached", [False, True])
def test_revoked_key(tmp_path, model, keys, trust, detached):
    sign(model, keys["old"], detached=detached)
    assert keys["old"].fp in refusal(model, trust, REVOKED_KEY)
    # revoked by fingerprint alone, its public key long gone from the trust store
    d, revoked = make_trust_dir(tmp_path / "gone", keys, names=("operator",), revoked=("old",))
    if not detached:
        assert keys["old"].fp in refusal(model, TrustStore.load(d, revoked), REVOKED_KEY)
    r = edged("verify", "--trusted", d, "--revoked", revoked, model)
    assert r.returncode == 1 and (REVOKED_KEY if not detached else UNKNOWN_KEY) in r.stderr
    r = edged("verify", "--trusted", trust.source, "--revoked", os.path.join(trust.source + "-revoked"), model)
    assert r.returncode == 1 and REVOKED_KEY in r.stderr


@needs_openssl
def test_1024_bit_key(model, keys, trust):
    r = openssl("dgst", "-sha256", "-sign", keys["small"].private, "-out", model + ".sig", model)
    assert r.returncode == 0, r.stderr
    assert "1024 bits" in refusal(model, trust, KEY_TOO_SMALL)
    os.unlink(model + ".sig")
    # edged sign refuses the key outright
    r = edged("sign", "--key", keys["small"].private, model)
    assert r.returncode == 2 and KEY_TOO_SMALL in r.stderr
    # a block made by other tools with a small key
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    data = open(model, "rb").read()
    sig = keys["small"].key.sign(data, padding.PKCS1v15(), hashes.SHA256())
    with open(model, "ab") as f:
        f.write(encode_block(len(data), PKCS1V15, keys["small"].fp, sig))
    assert keys["small"].fp in refusal(model, trust, KEY_TOO_SMALL)


# --- the block parser reads untrusted bytes ----------------------------------------------------


def _signed_bytes():
    payload = b"GGUF" + bytes(range(256)) * 2
    first = encode_block(len(payload), PKCS1V15, "ab" * 32, b"\x01" * 256)
    second = encode_block(len(payload) + len(first), PSS, "cd" * 32, b"\x02" * 384)
    return payload + first + second


@settings(max_examples=300, deadline=None)
@given(cut=st.integers(0, 900), at=st.integers(0, 1800), junk=st.binary(min_size=1, max_size=16),
       tail=st.binary(max_size=64))
def test_block_parser_returns_blocks_or_refuses_never_anything_else(cut, at, junk, tail):
    data = bytearray(_signed_bytes())
    data[at:at + len(junk)] = junk
    data = bytes(data[:max(0, len(data) - cut)]) + tail
    fd = os.memfd_create("blocks")
    try:
        os.write(fd, data)
        try:
            blocks = read_blocks(fd, len(data), "fuzz")
        except SignatureError as e:
            assert e.rule == MALFORMED_BLOCK
            return
        end = len(data)
        for b in reversed(blocks):  # every block found is framed exactly as the format says
            assert b.offset + b.length == end and data[b.offset:b.offset + 8] == b"EDGEDSIG"
            end = b.offset
    finally:
        os.close(fd)


def test_block_parser_finds_both_stacked_blocks():
    data = _signed_bytes()
    fd = os.memfd_create("blocks")
    try:
        os.write(fd, data)
        blocks = read_blocks(fd, len(data), "stacked")
    finally:
        os.close(fd)
    assert [(b.offset, b.algorithm, b.fingerprint, len(b.signature)) for b in blocks] == [
        (516, PKCS1V15, "ab" * 32, 256), (516 + 336, PSS, "cd" * 32, 384)]


def test_made_by_tells_certain_from_probable(keys):
    """A detached signature names no key, so a refusal finds its maker by opening it with every
    known key: a PKCS#1 v1.5 opening is certain, a PSS-shaped one only probable (about 1 in
    32768 signatures by another key have that shape), and the certain maker is named first."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    op, other = keys["operator"], keys["vendor"]
    pkcs = op.key.sign(b"some bytes", padding.PKCS1v15(), hashes.SHA256())
    pss = op.key.sign(b"some bytes", padding.PSS(padding.MGF1(hashes.SHA256()), padding.PSS.MAX_LENGTH),
                      hashes.SHA256())
    assert made_by(op.key.public_key(), pkcs) == MADE_PKCS1
    assert made_by(op.key.public_key(), pss) == MADE_PSS
    assert made_by(other.key.public_key(), pkcs) == 0
    assert made_by(op.key.public_key(), b"\x00" * len(pkcs)) == 0
    assert made_by(op.key.public_key(), pkcs[:-1]) == 0


def test_certain_maker_outranks_a_pss_shaped_match(tmp_path, model, keys, trust, monkeypatch):
    """If another trusted (or revoked) key also opens a detached signature as PSS-shaped, the
    key whose PKCS#1 v1.5 encoding opened is the one the refusal names."""
    real = made_by
    op = keys["operator"].key.public_key().public_numbers()
    monkeypatch.setattr("edged.trust.verify.made_by", lambda pk, sig: real(pk, sig) if pk.public_numbers() == op
                        else MADE_PSS)
    other = copy_model(tmp_path, "synthetic-llama-Q4_0.gguf", "other.gguf")
    sign(other, keys["operator"], detached=True)
    os.replace(other + ".sig", model + ".sig")
    msg = refusal(model, trust, BAD_SIGNATURE)
    assert f"by key {keys['operator'].fp} but does not match" in msg
