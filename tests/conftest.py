"""Shared pytest setup: import paths, the gpu marker, and a count of executed GPU tests."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (os.path.join(ROOT, "runtime", "python"), ROOT):
    if p not in sys.path:
        sys.path.insert(0, p)

_gpu_counts = {"passed": 0, "failed": 0, "skipped": 0}


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped with the reason elsewhere)")


def gpu_available():
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "no CUDA GPU visible to torch"
    return True, ""


def pytest_collection_modifyitems(config, items):
    ok, why = gpu_available()
    for item in items:
        if "gpu" in item.keywords and not ok:
            item.add_marker(pytest.mark.skip(reason=f"GPU test: {why}"))


def pytest_runtest_logreport(report):
    if "gpu" in report.keywords and (report.when == "call" or (report.when == "setup" and report.skipped)):
        outcome = "skipped" if report.skipped else ("passed" if report.passed else "failed")
        _gpu_counts[outcome] += 1


def pytest_terminal_summary(terminalreporter):
    c = _gpu_counts
    terminalreporter.write_line(
        f"GPU tests: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped (executed: "
        f"{c['passed'] + c['failed']})")
