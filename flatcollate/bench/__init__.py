"""Benchmarks of padding-free training: realistic length profiles, throughput and memory per collation mode."""

from .profiles import LengthProfile, available_profiles, load_profile, padded_fill

__all__ = ["LengthProfile", "available_profiles", "load_profile", "padded_fill"]
