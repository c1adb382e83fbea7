#!/usr/bin/env bash
# The Rust suite for aarch64-unknown-linux-gnu, run under qemu-user on an
# x86-64 machine: the portable kernels (the only ones off x86-64) held to the
# same tests as at home, and to x86-64's bits (tests/attention.rs pins the
# digest every level there computes). Also clippy -D warnings for the target,
# which catches x86-only code left in the portable build.
#
# Needs Debian's `qemu-user` and `gcc-aarch64-linux-gnu` (a C cross compiler,
# not only a linker: a dev-dependency builds C code), and libc6-dev-arm64-cross:
#   apt-get install qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross
#
#   scripts/test_aarch64.sh [CARGO_TEST_ARGS...]
#
# A debug build, any cargo test arguments: for running by hand. .ci/run's cross
# stage is scripts/ci_cross.sh: the whole suite release-built (quicker in all
# under qemu, and the vectorised code a user runs; its header says why).
set -euo pipefail
cd "$(dirname "$0")/.."
target=aarch64-unknown-linux-gnu
for tool in qemu-aarch64 aarch64-linux-gnu-gcc; do
    command -v "$tool" >/dev/null || {
        echo "$tool not found: apt-get install qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross" >&2
        exit 1
    }
done
rustup target add "$target" >/dev/null 2>&1 || true
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
# There is no AVX2 to require off x86-64 (the comparisons against it skip).
unset KVSELECT_REQUIRE_AVX2 KVSELECT_SIMD

echo "== cargo clippy --target $target (all targets, all features) -D warnings"
cargo clippy --target "$target" --all-targets --all-features -- -D warnings
echo "== cargo test --target $target under qemu-aarch64"
cargo test --target "$target" "$@"
