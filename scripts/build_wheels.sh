#!/usr/bin/env bash
# Builds what a release of kvselect ships, into dist/ (or the directory given):
# the sdist and the abi3 manylinux2014 wheels for x86_64 and aarch64 Linux
# (one wheel each serves CPython 3.9 onwards: pyo3's abi3-py39).
#
# manylinux2014 (glibc 2.17) by linking through zig (`maturin --zig`, zig
# from the pinned `ziglang` PyPI package), not the build machine's glibc: a
# plain `maturin build` on a current distribution tags manylinux_2_34, which
# older ones cannot install. The x86_64 wheel keeps every SIMD level (runtime
# dispatch); the aarch64 one runs the portable kernels.
#
# maturin and zig (pinned) are installed into the running Python's environment
# (PYTHON=... picks another).
#
# Reproducible: Cargo.lock is obeyed (--locked), pinned maturin and zig, and
# the archives' timestamps are the commit's (SOURCE_DATE_EPOCH).
#
#   scripts/build_wheels.sh [OUT_DIR]
#   KVSELECT_WHEEL_TARGETS="x86_64-unknown-linux-gnu" scripts/build_wheels.sh   # one wheel
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
targets=${KVSELECT_WHEEL_TARGETS:-x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu}
python=${PYTHON:-$(command -v python || command -v python3)}

"$python" -m pip install -q "maturin==1.16.0" "ziglang==0.17.1"
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || date +%s)
export SOURCE_DATE_EPOCH
mkdir -p "$out"
# maturin looks for `zig` on PATH: the pinned one, through its package.
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
printf '#!/bin/sh\nexec "%s" -m ziglang "$@"\n' "$(command -v "$python")" >"$shim/zig"
chmod +x "$shim/zig"
export PATH="$shim:$PATH"

echo "== sdist"
"$python" -m maturin sdist --out "$out"
for target in $targets; do
    echo "== wheel for $target (abi3, manylinux2014)"
    rustup target add "$target" >/dev/null 2>&1 || true
    "$python" -m maturin build --release --locked --zig --compatibility manylinux2014 \
        --target "$target" --out "$out"
done
ls -l "$out"
