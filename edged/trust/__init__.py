"""Signed models. The daemon imports only what checks signatures:

- rules.py: the refusal vocabulary (every SignatureError starts with its rule);
- keys.py: RSA public keys (one PEM key per file), fingerprints, verifying digests;
- store.py: the trust store (trusted keys, revocations) and its defaults;
- blocks.py: the appended signature-block format and the prefix digests it signs;
- verify.py: open a model once, verify that descriptor, cache the result.

sign.py (signing, key generation, atomic writes) is used by `edged sign` and `edged keygen`
only.
"""
