#!/usr/bin/env bash
# Tests a built wheel as a user gets it: installed (with its [test] extra)
# into a fresh venv, with no Rust toolchain on PATH, and the Python suite
# run from a copy of the tree without python/kvselect, so that the installed
# package is the one imported. Tests that need the source tree say so and
# skip there (tests/python/conftest.py: `requires_source_tree`).
#
#   scripts/test_installed_wheel.sh WHEEL [PYTEST_ARGS...]
#   KVSELECT_SIMD=avx2 scripts/test_installed_wheel.sh dist/kvselect-*x86_64.whl
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
wheel=$(realpath "$1")
shift
python=${PYTHON:-$(command -v python || command -v python3)}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "== fresh venv in $work, $(basename "$wheel") installed with [test]"
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check "kvselect[test] @ file://$wheel"

# The tree as committed plus new files, without the package's source.
# (A tracked file deleted in the work tree is left out.)
mkdir "$work/tree"
git -C "$root" ls-files -z --cached --others --exclude-standard | grep -zv '^python/kvselect/' |
    tar -C "$root" --null --no-recursion --ignore-failed-read -cf - -T - | tar -xf - -C "$work/tree"
cd "$work/tree"
test ! -e python/kvselect

# PATH without cargo, rustc or maturin: nothing can build the package here.
path="$work/venv/bin"
IFS=: read -r -a dirs <<<"$PATH"
for dir in "${dirs[@]}"; do
    if [ -n "$dir" ] && [ ! -e "$dir/cargo" ] && [ ! -e "$dir/rustc" ] && [ ! -e "$dir/maturin" ]; then
        path="$path:$dir"
    fi
done
export PATH="$path" VIRTUAL_ENV="$work/venv" KVSELECT_INSTALLED_WHEEL=1
if command -v cargo >/dev/null || command -v rustc >/dev/null; then
    echo "a Rust toolchain is still on PATH" >&2
    exit 1
fi
python -c 'import kvselect, sys; f = kvselect.__file__; print("kvselect", kvselect.__version__, "from", f, "at", kvselect.simd_level()); sys.exit("site-packages" not in f)'
python -m pytest -q -p no:cacheprovider "$@"
