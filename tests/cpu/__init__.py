"""Tests that need no GPU: the generator, the C ABI, the binding, the bundle, the AMD toolchain
and emulation, the leaderboard harness and its task inputs."""
