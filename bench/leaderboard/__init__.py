"""Leaderboard stand-in: the task's input recipe and check (task_inputs), and a harness that
runs a submission file in a fresh process the way the leaderboard does (harness).

    python -m bench.leaderboard.harness dist/submission.py --mode test
    python -m bench.leaderboard.harness dist/submission.py --mode benchmark --seed-peer --json out.json
"""
