"""Benchmarks (scripts run by path: python3 bench/bench.py ...; inside them `bench` names bench.py)
and the leaderboard stand-in, a package: python -m bench.leaderboard.harness FILE --mode test."""
