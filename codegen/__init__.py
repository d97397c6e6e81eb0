"""mlagen code generator: KernelSpec -> Jinja2 templates -> generated/ HIP sources."""
from .spec import KernelSpec, SpecError  # noqa: F401
