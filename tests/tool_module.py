"""Import one of tools/'s scripts (not a package) as a module, for the tests of its parsers."""
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_tool(relpath: str, name: str):
    """tools/<relpath> as the module `name` (registered in sys.modules, as dataclasses need)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tools", relpath))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
