#!/usr/bin/env bash
# Build a gfx950 shared library (host + device code) with clang-21 inside the sid chroot:
#   tools/amd/link_gfx950.sh [-o OUT.so] [--chroot DIR] [--gen DIR] [-I DIR]... [-D X]... [--dlopen-check] SRC.hip|SRC.cpp...
# .hip sources: clang++-21 -x hip --offload-arch=gfx950 -O3 -fPIC -c
# .cpp/.cc sources (host only): clang++-21 -O3 -fPIC -c
# then: clang++-21 -shared ... -lamdhip64 -o OUT.so   (default OUT: build/amd-check/libmlagen_gfx950.so)
# --dlopen-check: then dlopen(RTLD_NOW) the library inside the chroot (all symbols resolve, the
# HIP runtime loads; no GPU is needed for that).
# Include paths runtime/include and generated/ (or --gen DIR: another generated kernel set, e.g. a
# bundle's slim one) are always passed (a source's own folder is not:
# pass it with -I if it includes files beside it). The sources and include folders
# are copied into <chroot>/work/mlagen-link-<pid>/ (no mounts) and removed afterwards.
# Exit: 0 built; 1 compile/link error; 3 toolchain missing (TOOLCHAIN UNAVAILABLE printed).
# Example (the self-test): tools/amd/link_gfx950.sh tools/amd/selftest.hip tools/amd/selftest_host.cpp
set -uo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
ROOT=${MLAGEN_AMD_CHROOT:-$REPO/.toolchains/sid}
OUT=$REPO/build/amd-check/libmlagen_gfx950.so
GEN=$REPO/generated
INCS=()
DEFS=()
SRCS=()
DLOPEN=0
while [ $# -gt 0 ]; do
  case $1 in
    -o) OUT=${2:?-o needs a file}; shift 2 ;;
    --chroot) ROOT=${2:?--chroot needs a folder}; shift 2 ;;
    --gen) GEN=${2:?--gen needs a folder}; shift 2 ;;
    -I) INCS+=("${2:?-I needs a folder}"); shift 2 ;;
    -I*) INCS+=("${1#-I}"); shift ;;
    -D) DEFS+=("-D${2:?-D needs a macro}"); shift 2 ;;
    -D*) DEFS+=("$1"); shift ;;
    --dlopen-check) DLOPEN=1; shift ;;
    -h|--help) sed -n "2,14p" "$0"; exit 0 ;;
    -*) echo "link_gfx950.sh: unknown option $1" >&2; exit 2 ;;
    *) SRCS+=("$1"); shift ;;
  esac
done
[ ${#SRCS[@]} -gt 0 ] || { echo "link_gfx950.sh: no sources given" >&2; exit 2; }
case $GEN in /*) ;; *) GEN=$PWD/$GEN ;; esac
INCS=("$REPO/runtime/include" "$GEN" ${INCS[@]+"${INCS[@]}"})
case $OUT in /*) ;; *) OUT=$PWD/$OUT ;; esac
ROOT=$(cd "$ROOT" 2>/dev/null && pwd || echo "$ROOT")

if [ ! -e "$ROOT/usr/bin/clang++-21" ] || [ ! -e "$ROOT/usr/lib/x86_64-linux-gnu/libamdhip64.so" ]; then
  why=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["gfx950"].get("link_why") or d["gfx950"].get("why") or "")' \
        "$(dirname "$ROOT")/status.json" 2>/dev/null)
  echo "TOOLCHAIN UNAVAILABLE: gfx950 link (clang-21 + libamdhip64 in sid chroot): ${why:-no chroot with clang++-21 and libamdhip64 at $ROOT (run tools/amd/setup_toolchains.sh)}"
  exit 3
fi
[ "$(id -u)" = 0 ] || { echo "TOOLCHAIN UNAVAILABLE: gfx950 link: chroot needs root"; exit 3; }

INNER=/work/mlagen-link-$$
W=$ROOT$INNER
cleanup() { rm -rf --one-file-system "$W"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
rm -rf --one-file-system "$W"; mkdir -p "$W/inc" "$W/src" "$W/obj"

IFLAGS=()
SEDMAP=()
i=0
for d in "${INCS[@]}"; do
  [ -d "$d" ] || continue
  mkdir -p "$W/inc/$i"; cp -a "$d/." "$W/inc/$i/"
  IFLAGS+=(-I "$INNER/inc/$i"); SEDMAP+=(-e "s#$INNER/inc/$i#$d#g"); i=$((i + 1))
done
CHROOT_BIN=$(command -v chroot || echo /usr/sbin/chroot)
run() { env -i PATH=/usr/bin:/bin LC_ALL=C HOME=/root TMPDIR=/tmp "$CHROOT_BIN" "$ROOT" "$@"; }
# Map diagnostics back onto the host paths.
unmap() { sed "${SEDMAP[@]}" -e "s#$INNER/##g"; }

OBJS=()
n=0
for s in "${SRCS[@]}"; do
  [ -f "$s" ] || { echo "link_gfx950.sh: no such source $s" >&2; exit 2; }
  mkdir -p "$W/src/$n"; cp "$s" "$W/src/$n/"; SEDMAP+=(-e "s#$INNER/src/$n/#$(dirname "$s")/#g")
  b=$(basename "$s"); in=$INNER/src/$n/$b; obj=$INNER/obj/$n-${b%.*}.o
  case $b in
    *.hip) cmd=(/usr/bin/clang++-21 -x hip --offload-arch=gfx950 -O3 -fPIC -Werror "${DEFS[@]}" "${IFLAGS[@]}" -c -o "$obj" "$in") ;;
    *.cpp|*.cc|*.cxx) cmd=(/usr/bin/clang++-21 -O3 -fPIC -Werror "${DEFS[@]}" "${IFLAGS[@]}" -c -o "$obj" "$in") ;;
    *) echo "link_gfx950.sh: $s: want .hip or .cpp" >&2; exit 2 ;;
  esac
  echo "[link-gfx950] ${cmd[*]}" | unmap
  run "${cmd[@]}" > "$W/log" 2>&1; rc=$?
  unmap < "$W/log"
  [ $rc = 0 ] && [ -f "$W${obj#"$INNER"}" ] || { echo "link_gfx950.sh: compiling $s FAILED"; exit 1; }
  OBJS+=("$obj"); n=$((n + 1))
done

lib=$INNER/obj/$(basename "$OUT")
cmd=(/usr/bin/clang++-21 -shared -fPIC -o "$lib" "${OBJS[@]}" -lamdhip64)
echo "[link-gfx950] ${cmd[*]}" | unmap
run "${cmd[@]}" > "$W/log" 2>&1; rc=$?
unmap < "$W/log"
[ $rc = 0 ] && [ -f "$W${lib#"$INNER"}" ] || { echo "link_gfx950.sh: linking FAILED"; exit 1; }
if [ $DLOPEN = 1 ]; then
  printf '%s\n' '#include <dlfcn.h>' '#include <cstdio>' \
    'int main(int argc, char** argv) {' \
    '  void* h = dlopen(argv[1], RTLD_NOW);' \
    '  if (!h) { std::printf("dlopen failed: %s\n", dlerror()); return 1; }' \
    '  std::printf("dlopen ok: %s\n", argv[1]);' \
    '  return 0;' '}' > "$W/dlopen.cpp"
  run /usr/bin/clang++-21 -o "$INNER/dlopen" "$INNER/dlopen.cpp" > "$W/log" 2>&1 &&
    run "$INNER/dlopen" "$lib" > "$W/log" 2>&1; rc=$?
  unmap < "$W/log" | sed 's/^/[link-gfx950] /'
  [ $rc = 0 ] || { echo "link_gfx950.sh: dlopen check FAILED"; exit 1; }
fi
mkdir -p "$(dirname "$OUT")"
cp "$W${lib#"$INNER"}" "$OUT"
echo "[link-gfx950] built $OUT ($(stat -c %s "$OUT") bytes)"
exit 0
