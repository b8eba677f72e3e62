"""Fingerprint probes: running node tools and parsing their output (pure parsers)."""
