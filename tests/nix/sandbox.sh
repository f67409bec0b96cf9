#!/usr/bin/env bash
# Runs the package's check phase as the Nix build sandbox would (see
# sandbox_go_test in lib.sh): `go test $checkFlags -vet=off ./...` over the
# package's source, as an unprivileged build user, without network, with
# PATH holding only stdenv's tools, Go and the Debian stand-ins of the
# package's nativeCheckInputs. checkFlags and nativeCheckInputs are read
# from nix/package.nix (evaluated with nixpkgs' lib, see eval-flake.nix),
# so dropping an input there makes this fail.
#
#   bash tests/nix/sandbox.sh [EXTRA GO TEST ARGS...]   # as root
#   PACKAGES=./internal/mirror bash tests/nix/sandbox.sh  # some packages only
#
# Prints the package's declared inputs and flags, then go test's output.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

root=$(repo_root)
if [ "$(id -u)" -ne 0 ]; then
  echo "sandbox.sh needs root (a build user, namespaces)" >&2
  exit 1
fi
ensure_nix
libdir=$(find_nixpkgs_lib) || { echo "no nixpkgs lib found (set NIXPKGS_LIB)" >&2; exit 1; }
pkgjson=$(nix-instantiate "${NIX_FLAGS[@]}" --eval --strict --json "$root/tests/nix/eval-flake.nix" \
  --arg lib "import $libdir" -A package)
inputs=$(python3 -c 'import json,sys; print(" ".join(json.loads(sys.argv[1])["nativeCheckInputs"]))' "$pkgjson")
flags=$(python3 -c 'import json,sys; print(" ".join(json.loads(sys.argv[1])["checkFlags"]))' "$pkgjson")
echo "nativeCheckInputs: ${inputs:-(none)}"
echo "checkFlags: $flags"

# A fixed directory, not a fresh temporary one: Go's build cache keys
# include the source directory, so the tests stay warm between runs.
dir="${TMPDIR:-/tmp}/knotless-run-nix-sandbox"
mkdir -p "$dir"
chmod 0755 "$dir"
if [ -d "$dir/src" ]; then chmod -R u+w "$dir/src"; rm -rf "$dir/src"; fi
copy_source "$dir/src"
# shellcheck disable=SC2086 # checkFlags are words, as in the check phase
sandbox_go_test "$dir" "$dir/src" "$inputs" $flags -vet=off -p "$(nproc)" -count=1 "$@" ${PACKAGES:-./...}
