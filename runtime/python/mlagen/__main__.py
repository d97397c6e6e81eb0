"""python -m mlagen: what the installed library holds (path, archs, kernels, fingerprint)."""
from __future__ import annotations

import sys

from . import _lib


def main() -> int:
    try:
        L = _lib.lib()
    except _lib.MlagenError as e:
        print(f"mlagen: {e}", file=sys.stderr)
        return 1
    kernels = _lib.kernels()
    roles = {}
    for k in kernels:
        roles[k["role"]] = roles.get(k["role"], 0) + 1
    print(f"library      {_lib.library_path()}")
    print(f"archs        {L.mlagen_build_archs().decode()}")
    print(f"kernels      {len(kernels)} ({', '.join(f'{n} {r}' for r, n in sorted(roles.items()))})")
    print(f"fingerprint  {_lib.fingerprint()}")
    print(f"abi          {_lib.ABI_VERSION}")
    for k in kernels:
        if "-v" in sys.argv[1:]:
            print(f"  {k['name']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
