"""Signatures: trust store, verification, signature blocks, signing."""
