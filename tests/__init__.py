"""mlagen's tests: cpu/ (no GPU needed), gpu/ (skipped, with the reason, where torch sees no GPU);
the shared helpers (reference, tolerances, tool_module, fixtures/) and conftest.py here."""
