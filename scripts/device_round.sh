#!/usr/bin/env bash
# Several people's GPU-machine work in one device call ("a round"). Device time is scarce and
# every machine start costs minutes, so instead of each helper calling the device, each packs a
# request and one person runs all ready requests in one call, one after another (never
# concurrently: the GPU is the request's alone while it runs).
#
# A request is a folder .devdeps/req/NAME/ (carried along with .devdeps) holding
#   patch.tgz  the files the branch changes, relative to the repository root
#              (`git diff --name-only --diff-filter=AMR main | tar czf patch.tgz -T -`)
#   run.sh     run from the root of a fresh copy of this tree with the patch unpacked over it,
#              OUT set to the request's own empty folder; it builds what it needs (in /tmp/b,
#              emptied before each request), tests first, then measures before/after in one go
#   ready      created last
# On the GPU machine, from the repository root (with `carry: [".devdeps"]`):
#   LIMIT=250 scripts/device_round.sh [NAME...]      (default: every ready request)
# Each request's files come back packed as $OUT/NAME.tgz (the device tool returns at most 8
# files), its run time and exit status in $OUT/rounds.txt, the tail of its output on stdout.
set -uo pipefail
root=$(pwd)
# Requests of one call build the same tree in the same /tmp paths, so a compiler cache shared by
# them turns every build after the first into the patched files only (when .devdeps carries the
# ccache .deb: fetch-deps.sh ... ccache libhiredis0.14; CMake reads the launchers from the env).
if [ -x /opt/devdeps/usr/bin/ccache ]; then
  export PATH=/opt/devdeps/usr/bin:$PATH CCACHE_DIR=/tmp/ccache CCACHE_NOHASHDIR=1
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache
fi
names=${*:-$(ls .devdeps/req)}
for n in $names; do
  d=$root/.devdeps/req/$n
  [ -f "$d/ready" ] || { echo "$n: not ready"; continue; }
  rm -rf /tmp/b /tmp/t "/tmp/o/$n"; mkdir -p /tmp/t "/tmp/o/$n"
  tar --exclude=./.git --exclude=./.devdeps -cf - . | tar -xf - -C /tmp/t
  ln -s "$root/.devdeps" /tmp/t/.devdeps
  t0=$(date +%s)
  # The patch's files replace the tree's: name them, since a stale patch.tgz left in a request
  # folder silently brings back old versions of files (an empty patch: the tree as it is).
  echo "$n: patch of $(tar tzf "$d/patch.tgz" | grep -vc '/$') files: $(tar tzf "$d/patch.tgz" | grep -v '/$' | head -8 | tr '\n' ' ')"
  (cd /tmp/t && tar xzmf "$d/patch.tgz" && OUT=/tmp/o/$n timeout "${LIMIT:-250}" bash "$d/run.sh") \
    >"/tmp/o/$n/stdout.txt" 2>&1
  rc=$?
  echo "== $n rc=$rc in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/rounds.txt"
  tail -25 "/tmp/o/$n/stdout.txt"
  tar czf "$OUT/$n.tgz" -C /tmp/o "$n"
done
