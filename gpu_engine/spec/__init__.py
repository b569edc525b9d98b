"""Speculative decoding: drafters, verification (rejection sampling), and the registry of methods."""
