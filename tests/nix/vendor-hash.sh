#!/usr/bin/env bash
# Prints the vendorHash that nix/package.nix needs: the NAR hash of what
# `go mod vendor` makes from the package's source (nix/source.nix),
# computed in a temporary copy so no vendor/ is ever left in the repository.
#
#   tests/nix/vendor-hash.sh           print the hash
#   tests/nix/vendor-hash.sh --write   also put it into nix/package.nix
#
# Needs go and Nix (Debian's nix-bin is enough). Modules come from the
# module cache or the Go module proxy, as for any go command.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

write=false
case "${1:-}" in
  --write) write=true ;;
  "") ;;
  *) echo "usage: $0 [--write]" >&2; exit 2 ;;
esac

root=$(repo_root)
ensure_nix
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT

copy_source "$tmp/src"
# buildGoModule vendors with its own Go and GOTOOLCHAIN=local, no GOFLAGS.
(cd "$tmp/src" && env -u GOFLAGS GOTOOLCHAIN=local GOWORK=off go mod vendor) >&2
mkdir -p "$tmp/src/vendor" # as buildGoModule does for a module without dependencies
hash=$(sri_hash "$tmp/src/vendor")
echo "$hash"

if $write; then
  sed -i -E "s|^(\s*vendorHash = )\"[^\"]*\";|\1\"$hash\";|" "$root/nix/package.nix"
  grep -q "vendorHash = \"$hash\";" "$root/nix/package.nix" || {
    echo "could not write vendorHash into nix/package.nix" >&2
    exit 1
  }
  echo "nix/package.nix: vendorHash = \"$hash\"" >&2
fi
