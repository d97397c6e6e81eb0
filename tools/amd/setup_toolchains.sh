#!/usr/bin/env bash
# Set up the AMD compile-check toolchains (idempotent; run as root on Debian bookworm):
#   gfx942: Debian's clang-19 + lld-19 on the host (apt)
#   gfx950: clang-21 + ROCm device libs / HIP headers in a Debian sid chroot (debootstrap)
#
#   tools/amd/setup_toolchains.sh [--root DIR] [--no-chroot]
#
# DIR (the chroot) defaults to ${MLAGEN_AMD_CHROOT:-<repo>/.toolchains/sid}. Point
# MLAGEN_AMD_CHROOT at a folder outside the clone to keep the chroot (1.2 GB) between clones.
#
# A toolchain that cannot be set up (sid changes daily; no network; ...) is reported with a loud
#   TOOLCHAIN UNAVAILABLE: <which>: <why>
# line and the script still exits 0. <DIR>/../status.json records what is usable, so that
# callers (tools/amd/check_amd.py, tests/cpu/test_amd_toolchain.py) can skip loudly instead of
# failing. Exit status 2 only for a usage error.
set -uo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
ROOT=${MLAGEN_AMD_CHROOT:-$REPO/.toolchains/sid}
DO_CHROOT=1
SID_MIRROR=${MLAGEN_SID_MIRROR:-http://deb.debian.org/debian}
SID_PACKAGES=${MLAGEN_SID_PACKAGES:-clang-21,clang-tools-21,llvm-21,lld-21,rocm-device-libs-21,libamdhip64-dev}

while [ $# -gt 0 ]; do
  case $1 in
    --root) ROOT=${2:?--root needs a folder}; shift 2 ;;
    --root=*) ROOT=${1#--root=}; shift ;;
    --no-chroot) DO_CHROOT=0; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "setup_toolchains.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case $ROOT in /*) ;; *) ROOT=$PWD/$ROOT ;; esac
ROOT=${ROOT%/}
STATE_DIR=$(dirname "$ROOT")
STATUS=$STATE_DIR/status.json
mkdir -p "$STATE_DIR"
export DEBIAN_FRONTEND=noninteractive
T0=$(date +%s)

say() { echo "[setup-amd] $*"; }
loud() { echo; echo "************************************************************************"
         echo "TOOLCHAIN UNAVAILABLE: $1: $2"
         echo "************************************************************************"; echo; }
json_str() { python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$1"; }

if [ "$(id -u)" != 0 ]; then
  say "not root: cannot apt-get install or debootstrap; only checking what is there"
fi

APT_UPDATED=0
apt_install() {  # apt_install pkg...  (apt-get update once per run, only when something is missing)
  if [ "$(id -u)" != 0 ]; then return 1; fi
  if [ $APT_UPDATED = 0 ]; then
    say "apt-get update"
    apt-get update -qq || return 1
    APT_UPDATED=1
  fi
  say "apt-get install -y $*"
  apt-get install -y -qq --no-install-recommends "$@" > "$STATE_DIR/apt-install.log" 2>&1 ||
    { tail -20 "$STATE_DIR/apt-install.log"; return 1; }
}

# A tiny device kernel: proves the compiler, the target and (with headers) the HIP headers work.
PROBE_SRC='__attribute__((global)) void mlagen_probe(float* p) { p[0] = 1.0f; }'

# ---------------------------------------------------------------- gfx942: host clang-19
G942_OK=false; G942_WHY=""; G942_VER=""
if command -v clang++-19 >/dev/null; then
  say "gfx942: clang++-19 already installed ($(command -v clang++-19)), nothing to install"
else
  say "gfx942: clang++-19 missing, installing clang-19 lld-19 from Debian"
  apt_install clang-19 lld-19 || G942_WHY="apt-get install clang-19 lld-19 failed (see $STATE_DIR/apt-install.log)"
fi
if command -v clang++-19 >/dev/null; then
  G942_VER=$(clang++-19 --version | head -1)
  tmp=$(mktemp -d)
  echo "$PROBE_SRC" > "$tmp/p.hip"
  if clang++-19 -x hip --offload-arch=gfx942 --offload-device-only -nogpulib -nogpuinc -O3 -S \
       -o "$tmp/p.s" "$tmp/p.hip" > "$tmp/log" 2>&1; then
    G942_OK=true
    say "gfx942: OK: $G942_VER compiles a gfx942 device kernel"
  else
    G942_WHY="clang++-19 cannot compile for gfx942: $(head -3 "$tmp/log" | tr '\n' ' ')"
  fi
  rm -rf "$tmp"
elif [ -z "$G942_WHY" ]; then
  G942_WHY="clang++-19 not found"
fi
[ "$G942_OK" = true ] || loud "gfx942 (clang-19)" "$G942_WHY"

# ---------------------------------------------------------------- gfx950: sid chroot clang-21
G950_OK=false; G950_WHY=""; G950_VER=""; G950_CO=false; G950_CO_WHY=""
unmount_under() {  # unmount everything mounted at or below $1 (deepest first)
  local d=$1
  awk -v d="$d" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/self/mounts | sort -r |
    while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
}
have_chroot_clang() { [ -x "$ROOT/usr/bin/clang++-21" ] || [ -L "$ROOT/usr/bin/clang++-21" ]; }

if [ $DO_CHROOT = 0 ]; then
  G950_WHY="skipped (--no-chroot)"
elif have_chroot_clang; then
  say "gfx950: chroot $ROOT already has clang++-21, skipping debootstrap"
elif [ "$(id -u)" != 0 ]; then
  G950_WHY="no chroot at $ROOT and not root (debootstrap needs root)"
elif [ -z "$ROOT" ] || [ "$ROOT" = / ] || { [ -e "$ROOT" ] && [ -n "$(ls -A "$ROOT" 2>/dev/null)" ] &&
       ! { [ -f "$ROOT/etc/debian_version" ] && [ -d "$ROOT/var/lib/dpkg" ]; }; }; then
  G950_WHY="$ROOT exists and is not a Debian chroot: refusing to touch it (choose another --root)"
else
  if ! command -v debootstrap >/dev/null; then
    say "gfx950: debootstrap missing, installing it"
    apt_install debootstrap || G950_WHY="apt-get install debootstrap failed (see $STATE_DIR/apt-install.log)"
  fi
  if command -v debootstrap >/dev/null; then
    # Build into ROOT.partial and rename on success, so that an interrupted run never leaves a
    # half-made chroot that looks finished.
    PART=$ROOT.partial
    if [ -e "$PART" ]; then
      say "gfx950: removing the leftover $PART of an earlier interrupted run"
      unmount_under "$PART"
      rm -rf --one-file-system "$PART"
    fi
    if [ -d "$ROOT" ] && [ -z "$(ls -A "$ROOT")" ]; then
      rmdir "$ROOT"
    elif [ -e "$ROOT" ]; then
      say "gfx950: the chroot $ROOT has no clang++-21: moving it aside to $ROOT.broken"
      unmount_under "$ROOT"
      rm -rf --one-file-system "$ROOT.broken"; mv "$ROOT" "$ROOT.broken"
    fi
    say "gfx950: debootstrap --variant=minbase --include=$SID_PACKAGES sid $ROOT $SID_MIRROR"
    say "gfx950: (about 1.2 GB; a few minutes; log: $STATE_DIR/debootstrap.log)"
    t=$(date +%s)
    if debootstrap --variant=minbase --include="$SID_PACKAGES" sid "$PART" "$SID_MIRROR" \
         > "$STATE_DIR/debootstrap.log" 2>&1; then
      unmount_under "$PART"
      mv "$PART" "$ROOT"
      rm -f "$ROOT"/var/cache/apt/archives/*.deb    # the downloaded packages
      say "gfx950: debootstrap done in $(( $(date +%s) - t )) s; $(du -sh --one-file-system "$ROOT" | cut -f1) in $ROOT"
      rm -rf --one-file-system "$ROOT.broken"
    else
      unmount_under "$PART"
      G950_WHY="debootstrap of sid with $SID_PACKAGES failed: $(grep -E '^(E|W):' "$STATE_DIR/debootstrap.log" | tail -3 | tr '\n' ' ')"
      [ -n "${G950_WHY##*failed: }" ] || G950_WHY="$G950_WHY$(tail -3 "$STATE_DIR/debootstrap.log" | tr '\n' ' ')"
      say "gfx950: keeping the failed attempt in $PART for inspection (log: $STATE_DIR/debootstrap.log)"
    fi
  fi
fi

if [ $DO_CHROOT = 1 ] && have_chroot_clang; then
  G950_VER=$(chroot "$ROOT" clang++-21 --version 2>/dev/null | head -1)
  # Same route as check_amd.py: copy the source into <chroot>/work, compile there.
  W=$(mktemp -d "$ROOT/tmp/mlagen-probe.XXXXXX"); w=${W#"$ROOT"}
  printf '#include <hip/hip_runtime.h>\n%s\n' "$PROBE_SRC" > "$W/p.hip"
  if chroot "$ROOT" clang++-21 -x hip --offload-arch=gfx950 --offload-device-only -O3 -S \
       -o "$w/p.s" "$w/p.hip" > "$W/log" 2>&1; then
    G950_OK=true
    say "gfx950: OK: $G950_VER compiles a gfx950 device kernel with the HIP headers and device libs"
  else
    G950_WHY="clang++-21 in $ROOT cannot compile for gfx950: $(head -3 "$W/log" | tr '\n' ' ') (to rebuild the chroot: rm -rf $ROOT and run this again)"
  fi
  # The library's route (tools/amd/hip-device-cc): a device-only compile to a plain code object v5.
  if chroot "$ROOT" clang++-21 -x hip --offload-arch=gfx950 --offload-device-only --no-gpu-bundle-output -O3 \
       -mcode-object-version=5 -o "$w/p.hsaco" "$w/p.hip" > "$W/log" 2>&1 && [ "$(head -c 4 "$W/p.hsaco" | od -An -c | tr -d ' ')" = '177ELF' ]; then
    G950_CO=true
    say "gfx950: OK: writes a gfx950 code object (ELF, v5) as the library's build does"
  else
    G950_CO_WHY="gfx950 code object compile failed: $(grep -m3 -E 'error|cannot' "$W/log" | tr '\n' ' ')"
    say "gfx950: code object probe FAILED: $G950_CO_WHY"
  fi
  rm -rf "$W"
elif [ $DO_CHROOT = 1 ] && [ -z "$G950_WHY" ]; then
  G950_WHY="no clang++-21 in $ROOT"
fi
[ "$G950_OK" = true ] || loud "gfx950 (clang-21 in sid chroot)" "$G950_WHY"

# ---------------------------------------------------------------- status.json
cat > "$STATUS.tmp" <<EOF
{
  "written_by": "tools/amd/setup_toolchains.sh",
  "time": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "chroot": $(json_str "$ROOT"),
  "gfx942": {"usable": $G942_OK, "compiler": "clang++-19", "where": "host",
             "version": $(json_str "$G942_VER"), "why": $(json_str "$G942_WHY")},
  "gfx950": {"usable": $G950_OK, "compiler": "clang++-21", "where": "chroot",
             "version": $(json_str "$G950_VER"), "why": $(json_str "$G950_WHY"),
             "code_object_usable": $G950_CO, "code_object_why": $(json_str "$G950_CO_WHY")}
}
EOF
mv "$STATUS.tmp" "$STATUS"
say "status: gfx942 usable=$G942_OK, gfx950 usable=$G950_OK (code objects=$G950_CO) -> $STATUS"
say "done in $(( $(date +%s) - T0 )) s"
exit 0
