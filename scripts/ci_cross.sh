#!/usr/bin/env bash
# .ci/run's cross stage, runnable alone: the platforms this machine is not.
#
#   scripts/ci_cross.sh
#
# aarch64 Linux: clippy -D warnings for the target (all targets, all
# features), and the whole Rust suite cross-built and run under qemu-user:
# the portable kernels (the only ones off x86-64) held to the same tests as at
# home and to x86-64's bits (every kernel module's bit-identity tests;
# tests/attention.rs pins the digest every x86-64 level computes). macOS
# (arm64, x86_64) and Windows (x86_64): clippy -D warnings on the library, all
# features (a check build: no SDK, no linker), so a release build there is not
# the first to find an x86-only path.
#
# The whole suite, not a subset: it fits. Built release (`cargo test
# --release`: Cargo.toml's bench profile, thin LTO and one codegen unit, as the
# wheel is built), the suite runs in about half a minute under qemu; debug, it
# takes 6-7 minutes. The release build costs about 3 minutes more than a debug
# one, and no less for a subset (the library's unit tests and
# tests/attention.rs alone took as long: both compile the library twice, rlib
# and unit tests, at one codegen unit). So the release build is
# both the quicker and the one that tests the code a user runs: vectorised, not
# the scalar debug code. The exhaustive exp bound stays #[ignore]d, as on
# x86-64 (.ci/run runs it there).
#
# Wall times on a 2-core AMD EPYC (Zen 3), cold, shared with other builds: see
# docs/releasing.md ("The cross stage").
#
# Needs Debian's qemu-user and gcc-aarch64-linux-gnu (a C cross compiler, not
# only a linker: a dev-dependency builds C code) and libc6-dev-arm64-cross:
# installed with apt-get when missing (as root, or through sudo -n).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -ne 0 ]; then
    echo "usage: scripts/ci_cross.sh (no arguments; scripts/test_aarch64.sh takes cargo test's)" >&2
    exit 2
fi
export CARGO_TERM_COLOR=never
aarch64="aarch64-unknown-linux-gnu"
others=(aarch64-apple-darwin x86_64-apple-darwin x86_64-pc-windows-msvc)

step_start=$SECONDS
timings=()
step() {
    echo "== $*"
    step_start=$SECONDS
}
done_step() {
    timings+=("$(printf '%4d s  %s' $((SECONDS - step_start)) "$1")")
}

if ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null; then
    step "apt-get install qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross"
    sudo=()
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || {
            echo "qemu-aarch64 / aarch64-linux-gnu-gcc missing, and not root: install qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross" >&2
            exit 1
        }
        sudo=(sudo -n)
    fi
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get -qq update
    "${sudo[@]}" apt-get -qq install -y --no-install-recommends \
        -o Dpkg::Use-Pty=0 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
        qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross >/dev/null
    done_step "apt-get install"
fi

step "rustup target add $aarch64 ${others[*]}"
rustup target add "$aarch64" "${others[@]}" >/dev/null 2>&1 || true
done_step "rustup target add"

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
# There is no AVX2 to require off x86-64 (the comparisons against it skip).
unset KVSELECT_REQUIRE_AVX2 KVSELECT_SIMD

step "cargo clippy --target $aarch64 --all-targets --all-features -- -D warnings"
cargo clippy --target "$aarch64" --all-targets --all-features -- -D warnings
done_step "clippy $aarch64"

step "cargo test --release --target $aarch64 --no-run (the aarch64 test binaries)"
cargo test --release --target "$aarch64" --no-run
done_step "build aarch64 tests (release)"
step "cargo test --release --target $aarch64 (the whole suite, under qemu-aarch64)"
cargo test --release --target "$aarch64"
done_step "the Rust suite under qemu"

for target in "${others[@]}"; do
    step "cargo clippy --target $target --lib --all-features -- -D warnings"
    cargo clippy --target "$target" --lib --all-features -- -D warnings
    done_step "clippy $target"
done

echo "== the cross stage: wall time per step"
printf '%s\n' "${timings[@]}"
