#!/usr/bin/env bash
# Do the portable kernels vectorise on aarch64? For each hot function of the
# release library built for aarch64-unknown-linux-gnu, count its NEON vector
# FMAs (`fmla v.4s` four float32 lanes, `fmla v.2s` two) beside its scalar
# ones (`fmadd s`), and for the float64 kernel (exact products: multiply,
# then add) its two-lane `fmla` / `fmul v.2d` beside scalar `fmadd` / `fmul d`. A kernel inlined into another is counted in the function that
# holds it (docs/releasing.md names which is which).
#
# Needs cargo-show-asm (`cargo install cargo-show-asm`) and the cross C
# compiler scripts/test_aarch64.sh needs.
#
#   scripts/aarch64_asm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
target=aarch64-unknown-linux-gnu
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
functions=(
    kvselect::indexer::kernels::score_keys
    kvselect::block_sparse::engine::score_blocks
    kvselect::attention::kernels::scores
    kvselect::attention::kernels::softmax
    kvselect::attention::kernels::accumulate
    kvselect::exp::exp_shifted
    kvselect::quest::kernels::scores
    kvselect::moba::kernels::gates
    kvselect::vslash::kernels::tile
    kvselect::eviction::kernels::scores
)
list=$(cargo asm -q --target "$target" --lib --release 2>&1 || true)  # the listing goes to stderr
printf '%-44s %8s %8s %8s %8s %8s\n' function "fmla.4s" "fmla.2s" "fmadd.s" "f64x2" "f64x1"
for f in "${functions[@]}"; do
    i=$(grep -F "\"$f\"" <<<"$list" | awk '{print $1}' | head -1)
    if [ -z "$i" ]; then
        printf '%-44s %s\n' "$f" "(inlined into its callers: not a symbol)"
        continue
    fi
    asm=$(cargo asm -q --target "$target" --lib --release "$i" 2>/dev/null)
    count() { grep -cE "$1" <<<"$asm" || true; }
    printf '%-44s %8d %8d %8d %8d %8d\n' "$f" "$(count 'fmla\s+v[0-9]+\.4s')" "$(count 'fmla\s+v[0-9]+\.2s')" \
        "$(count 'fmadd\s+s[0-9]+')" "$(count '(fmla|fmul)\s+v[0-9]+\.2d')" "$(count '(fmadd|fmul)\s+d[0-9]+')"
done
