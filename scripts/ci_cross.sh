#!/usr/bin/env bash
# .ci/run's cross stage, runnable alone: the platforms this machine is not.
#
#   scripts/ci_cross.sh [subset|full]      (default: subset)
#
# aarch64 Linux: clippy -D warnings for the target (all targets, all
# features), the test binaries cross-built, and tests run under qemu-user;
# macOS (arm64, x86_64) and Windows (x86_64): clippy -D warnings on the
# library, all features (a check build: no SDK, no linker), so a release build
# there is not the first to find an x86-only path.
#
# The tests under qemu. `full` runs the whole Rust suite (as
# scripts/test_aarch64.sh does). `subset` (the default, and what .ci/run runs)
# runs the tests that hold the aarch64 build to x86-64's bits, and those only:
#   - the library's unit tests, all of them: every kernel module's
#     bit-identity tests (src/**/kernels/tests.rs and the modules that keep
#     theirs beside their kernels: moba, vslash, eviction, nsa, infllm,
#     compressed), src/simd.rs, the key formats' lanes (src/keys), the
#     project's exp (src/exp; its exhaustive bound stays #[ignore]d, as on
#     x86-64, where .ci/run runs it), the checkers;
#   - tests/attention.rs's the_portable_kernels_give_the_same_bits_as_the_simd_ones,
#     the digest of dense and sparse attention pinned to what every x86-64
#     level computes.
# What it leaves out: the integration tests' randomised comparisons against
# naive ports of each rule (tests/*.rs). They test each rule's logic, which is
# the same source on every architecture and runs at every SIMD level on x86-64
# in .ci/run; the kernels they would reach on aarch64 are the portable ones the
# unit tests above already hold to their documented chains. They are also most
# of the time: the whole suite under qemu is about 10 minutes more, which the
# 30-minute CI budget does not have. Run them with `full`.
#
# The build is the release one (`cargo test --release`: Cargo.toml's bench
# profile, thin LTO and one codegen unit, as the wheel is built), so the code
# under test is the vectorised code a user runs, not debug code the compiler
# left scalar; and it makes the runs under qemu quick.
#
# Wall times on a 2-core AMD EPYC (Zen 3), cold target directory, shared with
# other builds (load about 3): see docs/releasing.md ("The cross stage").
#
# Needs Debian's qemu-user and gcc-aarch64-linux-gnu (a C cross compiler, not
# only a linker: a dev-dependency builds C code) and libc6-dev-arm64-cross:
# installed with apt-get when missing (as root, or through sudo -n).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-subset}
case "$mode" in
    subset | full) ;;
    *)
        echo "usage: scripts/ci_cross.sh [subset|full]" >&2
        exit 2
        ;;
esac
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

runner=(qemu-aarch64 -L /usr/aarch64-linux-gnu)
if [ "$mode" = full ]; then
    step "cargo test --release --target $aarch64 --no-run (the aarch64 test binaries, release)"
    cargo test --release --target "$aarch64" --no-run
    done_step "build aarch64 tests (full)"
    step "cargo test --release --target $aarch64 (under qemu-aarch64)"
    cargo test --release --target "$aarch64"
    done_step "tests under qemu (full)"
else
    # Built in one cargo call and run directly under the emulator (as cargo's
    # runner would be): a second cargo call selecting fewer targets would
    # rebuild every dependency, as LTO needs different objects for it.
    step "cargo test --release --target $aarch64 --lib --test attention --no-run (release)"
    bins=$(cargo test --release --target "$aarch64" --lib --test attention --no-run \
        --message-format=json-render-diagnostics |
        python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print("test" if m["target"]["kind"] == ["test"] else "lib", m["executable"])
')
    lib=$(awk '$1 == "lib" { print $2 }' <<<"$bins")
    attention=$(awk '$1 == "test" { print $2 }' <<<"$bins")
    if [ -z "$lib" ] || [ -z "$attention" ]; then
        echo "the test binaries were not found in cargo's output: $bins" >&2
        exit 1
    fi
    done_step "build aarch64 tests (subset)"
    step "the library's unit tests, and tests/attention.rs's digest, under qemu-aarch64"
    echo "== $lib"
    "${runner[@]}" "$lib"
    echo "== $attention --exact the_portable_kernels_give_the_same_bits_as_the_simd_ones"
    # --exact matches nothing, and passes, if the test is renamed: count it.
    out=$("${runner[@]}" "$attention" --exact the_portable_kernels_give_the_same_bits_as_the_simd_ones)
    echo "$out"
    grep -q '^test result: ok\. 1 passed' <<<"$out" || {
        echo "tests/attention.rs: the digest test did not run" >&2
        exit 1
    }
    done_step "tests under qemu (subset)"
fi

for target in "${others[@]}"; do
    step "cargo clippy --target $target --lib --all-features -- -D warnings"
    cargo clippy --target "$target" --lib --all-features -- -D warnings
    done_step "clippy $target"
done

echo "== cross stage ($mode): wall time per step"
printf '%s\n' "${timings[@]}"
