"""Shared pytest setup for tests/cpu/ and tests/gpu/: import paths, the gpu marker, and a count
of executed GPU tests.

Import paths: the checkout's runtime/python (unless MLAGEN_TEST_INSTALLED=1), the repository root
(codegen, tools, bench.leaderboard) and tests/ itself (the shared helpers reference, tolerances,
tool_module).

GPU tests are the ones in tests/gpu/: each is `gpu`-marked here (so `-m gpu` selects exactly
them, and they skip with the reason where torch sees no GPU), and a module of tests/gpu/ skipped
as a whole at import (pytest.importorskip) is counted too. A `gpu`-marked test outside tests/gpu/
is a collection error. With MLAGEN_REQUIRE_GPU=1 (the H200 run, .ci/gpu) the session fails when
any GPU test or module was skipped, or none ran.
"""
import os
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
GPU_TESTS = os.path.join(TESTS, "gpu")
# MLAGEN_TEST_INSTALLED=1: test the installed package (pip install .), not runtime/python
INSTALLED = os.environ.get("MLAGEN_TEST_INSTALLED") == "1"
for p in ((TESTS, ROOT) if INSTALLED else (TESTS, os.path.join(ROOT, "runtime", "python"), ROOT)):
    if p not in sys.path:
        sys.path.insert(0, p)

_gpu_counts = {"passed": 0, "failed": 0, "skipped": 0, "modules_skipped": 0}
_gpu_skips: list = []
REQUIRE_GPU = os.environ.get("MLAGEN_REQUIRE_GPU") == "1"


def _is_gpu_module(path) -> bool:
    """A path in tests/gpu/ (a GPU test module, or the folder itself)."""
    p = os.path.abspath(str(path))
    return p == GPU_TESTS or p.startswith(GPU_TESTS + os.sep)


@pytest.fixture(scope="module")
def L():
    """The built library through the binding's loader (CPU tests of the C ABI: no GPU touched)."""
    from mlagen import _lib
    path = _lib.library_path()
    if not os.path.exists(path):
        pytest.fail(f"library not built at {path}: run `make` first")
    return _lib.lib()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped with the reason elsewhere)")
    config.addinivalue_line("markers", "multigpu: needs 2+ CUDA GPUs; its skip (the test says why) is listed in "
                                       "the summary and not counted by MLAGEN_REQUIRE_GPU=1 (the one-GPU runs)")


def gpu_available():
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "no CUDA GPU visible to torch"
    return True, ""


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config, items):
    ok, why = gpu_available()
    outside = []
    for item in items:
        if _is_gpu_module(item.path):
            item.add_marker(pytest.mark.gpu)
        elif item.get_closest_marker("gpu"):
            outside.append(item.nodeid)
        if "gpu" in item.keywords and not ok:
            item.add_marker(pytest.mark.skip(reason=f"GPU test: {why}"))
    if outside:
        raise pytest.UsageError(f"gpu-marked tests outside tests/gpu/ (move them there): {', '.join(outside[:5])}")


def pytest_collectreport(report):
    if report.skipped and _is_gpu_module(report.fspath):
        _gpu_counts["modules_skipped"] += 1
        _gpu_skips.append(f"{report.nodeid}: module skipped: {report.longrepr}")


_multigpu_skips: list = []


def pytest_runtest_logreport(report):
    if "gpu" in report.keywords and (report.when == "call" or (report.when == "setup" and report.skipped)):
        if report.skipped and "multigpu" in report.keywords:  # fewer than 2 GPUs: listed, not a failed GPU run
            why = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
            _multigpu_skips.append(f"{report.nodeid}: {why}")
            return
        outcome = "skipped" if report.skipped else ("passed" if report.passed else "failed")
        _gpu_counts[outcome] += 1
        if report.skipped:
            _gpu_skips.append(f"{report.nodeid}: {report.longrepr}")


def _require_gpu_failure() -> str | None:
    c = _gpu_counts
    if not REQUIRE_GPU:
        return None
    if c["skipped"] or c["modules_skipped"]:
        return f"MLAGEN_REQUIRE_GPU=1: {c['skipped']} GPU tests and {c['modules_skipped']} GPU modules skipped"
    if c["passed"] + c["failed"] == 0:
        return "MLAGEN_REQUIRE_GPU=1: no GPU test ran"
    return None


def pytest_sessionfinish(session, exitstatus):
    if _require_gpu_failure() and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_report_header(config):
    import importlib.util
    spec = importlib.util.find_spec("mlagen")
    return f"mlagen under test: {spec.origin if spec else 'not importable'}" + (" (installed)" if INSTALLED else "")


def _mlagen_origin():
    import importlib.util
    spec = importlib.util.find_spec("mlagen")
    return spec.origin if spec else None


def pytest_sessionstart(session):
    """MLAGEN_TEST_INSTALLED=1 must test the installed package: stop if the checkout's is found."""
    origin = _mlagen_origin()
    if INSTALLED and origin and os.path.abspath(origin).startswith(os.path.join(ROOT, "runtime") + os.sep):
        pytest.exit(f"MLAGEN_TEST_INSTALLED=1 but mlagen comes from the checkout ({origin}): unset PYTHONPATH", 2)


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"mlagen under test: {_mlagen_origin()}" + (" (installed)" if INSTALLED else ""))
    c = _gpu_counts
    terminalreporter.write_line(
        f"GPU tests: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped, "
        f"{c['modules_skipped']} GPU modules skipped (executed: {c['passed'] + c['failed']})")
    if _multigpu_skips:
        terminalreporter.write_line(
            f"multi-GPU tests skipped: {len(_multigpu_skips)} (not counted by MLAGEN_REQUIRE_GPU=1)")
        for line in _multigpu_skips[:10]:
            terminalreporter.write_line(f"  skipped multi-GPU: {line}")
    why = _require_gpu_failure()
    if why:
        for line in _gpu_skips[:20]:
            terminalreporter.write_line(f"  skipped GPU: {line}")
        terminalreporter.write_line(f"FAILED: {why}")
