"""Tests that run on a CUDA GPU (every test here is `gpu`-marked by tests/conftest.py and skipped,
with the reason, where torch sees none): numerics against float32 / float64 references."""
