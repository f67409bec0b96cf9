# Shared helpers of the tests/nix scripts. Sourced, not run.

# NIX_FLAGS go on every nix command: no binary cache is reachable from here
# or from CI, and without an empty substituter list each command waits on it.
NIX_FLAGS=(--option substituters '' --extra-experimental-features 'nix-command flakes')

repo_root() { (cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd); }

# ensure_nix installs Debian's Nix when no nix-instantiate is on PATH.
ensure_nix() {
  command -v nix-instantiate >/dev/null 2>&1 && return 0
  echo "nix-instantiate missing: installing Debian's nix-bin" >&2
  if [ "$(id -u)" -ne 0 ]; then
    echo "not root: install nix-bin (apt-get install nix-bin) and run again" >&2
    return 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q nix-bin >/dev/null 2>&1 || {
    apt-get update -q >/dev/null && apt-get install -y -q nix-bin >/dev/null
  }
}

# sri_hash DIR prints the NAR hash of DIR as an SRI sha256 string.
sri_hash() {
  if out=$(nix "${NIX_FLAGS[@]}" hash path --type sha256 "$1" 2>/dev/null) && [[ $out == sha256-* ]]; then
    echo "$out"
  else
    echo "sha256-$(nix-hash --type sha256 "$1" | xxd -r -p | base64 -w0)"
  fi
}

# source_excludes prints nix/source.nix's exclude list, one path a line.
source_excludes() {
  nix-instantiate "${NIX_FLAGS[@]}" --eval --strict --json --expr \
    "(import $(repo_root)/nix/source.nix).exclude" |
    python3 -c 'import json,sys; print("\n".join(json.load(sys.stdin)))'
}

# copy_source DEST copies the package's source into DEST: the repository's
# files (tracked or not yet added, as git lists them; every file outside a
# git work tree) minus nix/source.nix's exclude list.
copy_source() {
  local root dest=$1
  root=$(repo_root)
  mkdir -p "$dest"
  (
    cd "$root"
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
      git ls-files -z --cached --others --exclude-standard
    else
      find . -type f -printf '%P\0'
    fi
  ) | python3 -c '
import os, sys
root, excludes = sys.argv[1], sys.argv[2].split()
for f in sys.stdin.buffer.read().decode().split("\0"):
    if f and os.path.lexists(os.path.join(root, f)) and not any(f == e or f.startswith(e + "/") for e in excludes):
        sys.stdout.write(f + "\0")
' "$root" "$(source_excludes | tr '\n' ' ')" | (cd "$root" && xargs -0 -r cp -a --parents -t "$dest")
}

# find_nixpkgs_lib prints the directory of nixpkgs' lib: $NIXPKGS_LIB, then
# <nixpkgs/lib>, then ../shared/nixpkgs-lib beside the repository.
find_nixpkgs_lib() {
  local d
  if [ -n "${NIXPKGS_LIB:-}" ]; then
    [ -f "$NIXPKGS_LIB/default.nix" ] && { echo "$NIXPKGS_LIB"; return 0; }
    [ -f "$NIXPKGS_LIB/lib/default.nix" ] && { echo "$NIXPKGS_LIB/lib"; return 0; }
    echo "NIXPKGS_LIB=$NIXPKGS_LIB holds no lib/default.nix" >&2
    return 1
  fi
  if d=$(nix-instantiate "${NIX_FLAGS[@]}" --eval --expr 'toString <nixpkgs/lib>' 2>/dev/null); then
    d=${d//\"/}
    [ -f "$d/default.nix" ] && { echo "$d"; return 0; }
  fi
  d="$(repo_root)/../shared/nixpkgs-lib/lib"
  [ -f "$d/default.nix" ] && { (cd "$d" && pwd); return 0; }
  return 1
}

# eval_module LIBDIR prints tests/nix/eval.nix's result as JSON.
eval_module() {
  nix-instantiate "${NIX_FLAGS[@]}" --eval --strict --json --read-write-mode \
    "$(repo_root)/tests/nix/eval.nix" --arg lib "import $1"
}

# sandbox_go_test SRC ARGS... runs `go test ARGS` in SRC (a vendored copy
# of the package's source) the way the Nix build sandbox would: /bin and
# /usr/bin hold only sh, the tools are elsewhere on PATH, HOME does not
# exist, no module proxy, vendored modules. Needs root (a mount namespace).
sandbox_go_test() {
  local src=$1 gobin stash
  shift
  gobin=$(dirname "$(readlink -f "$(command -v go)")")
  stash=$(mktemp -d)
  chmod 0755 "$stash"
  unshare -m --propagation private bash -euo pipefail -c '
    stash=$1 gobin=$2 src=$3 gocache=$4
    shift 4
    mkdir -p "$stash/bin"
    mount --bind /usr/bin "$stash/bin"
    PATH="$stash/bin"
    mount -t tmpfs -o mode=0755 tmpfs /usr/bin
    cp "$stash/bin/dash" /usr/bin/sh
    mount -t tmpfs -o mode=0755 tmpfs /usr/sbin
    mount -t tmpfs -o mode=0755 tmpfs /usr/local/bin
    cd "$src"
    exec env -i PATH="$stash/bin:$gobin" HOME=/homeless-shelter TMPDIR="$stash" \
      GOCACHE="$gocache" GOPATH="$stash/gopath" GOFLAGS=-mod=vendor GOPROXY=off \
      GOTOOLCHAIN=local CGO_ENABLED=0 go test "$@"
  ' sandbox "$stash" "$gobin" "$src" "$(go env GOCACHE)" "$@"
  local rc=$?
  rm -rf "$stash"
  return $rc
}
