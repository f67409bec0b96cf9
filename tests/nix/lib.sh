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

# The Debian packages whose binaries stand in for stdenv's tools, which are
# on PATH in every Nix build (coreutils, findutils, diffutils, sed, grep,
# gawk, gnutar, gzip, bzip2, xz, gnumake, bash, patch).
STDENV_DEBS=(coreutils findutils diffutils sed grep gawk tar gzip bzip2 xz-utils make bash patch)

# debian_standin NIXNAME prints the Debian package standing in for the
# nixpkgs package NIXNAME (an attribute name a package declares in
# nativeCheckInputs); fails for one it does not know, so a new input needs
# a stand-in here before the sandbox check can pass.
debian_standin() {
  case $1 in
    git | gitMinimal) echo git ;;
    *) return 1 ;;
  esac
}

# sandbox_path_dir DIR BINROOT DEB... fills DIR with symlinks to exactly the
# binaries of the Debian packages DEB... (as BINROOT/NAME: /usr/bin is bound
# there inside the sandbox), plus go and gofmt, plus the names nixpkgs'
# packages add (sh for bash, awk for gawk). Fails if a package is missing.
sandbox_path_dir() {
  local dir=$1 binroot=$2 deb name gobin
  shift 2
  rm -rf "$dir"
  mkdir -p "$dir"
  for deb in "$@"; do
    if ! dpkg -s "$deb" >/dev/null 2>&1; then
      if [ "$(id -u)" -eq 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$deb" >/dev/null 2>&1 || {
          echo "sandbox: Debian package $deb missing and not installable" >&2
          return 1
        }
      else
        echo "sandbox: Debian package $deb missing" >&2
        return 1
      fi
    fi
    dpkg -L "$deb" | sed -n 's|^\(/usr\)\{0,1\}/bin/\([^/]*\)$|\2|p' | while read -r name; do
      [ -e "/usr/bin/$name" ] && ln -sfn "$binroot/$name" "$dir/$name"
    done
  done
  # -L, not -e: the links point into BINROOT, which is empty until the
  # sandbox binds /usr/bin there.
  [ -L "$dir/bash" ] && ln -sfn "$binroot/bash" "$dir/sh"
  [ -L "$dir/gawk" ] && ln -sfn "$binroot/gawk" "$dir/awk"
  gobin=$(dirname "$(readlink -f "$(command -v go)")")
  ln -sfn "$gobin/go" "$dir/go"
  ln -sfn "$gobin/gofmt" "$dir/gofmt"
}

# ensure_build_user creates the unprivileged build user nixbld1 (group
# nixbld), as a Nix installation has, if it is missing.
ensure_build_user() {
  getent group nixbld >/dev/null || groupadd --system nixbld
  getent passwd nixbld1 >/dev/null ||
    useradd --system --no-create-home --home-dir /homeless-shelter --shell /usr/sbin/nologin \
      --gid nixbld --comment "Nix build user 1" nixbld1
}

# sandbox_go_test DIR SRC NIXINPUTS ARGS... runs `go test ARGS` in SRC (a
# copy of the package's source) the way buildGoModule's check phase runs in
# the Nix build sandbox:
#   - as the unprivileged build user nixbld1, with a source it cannot
#     write (owned by root, modes as unpackPhase leaves them);
#   - in a network namespace with loopback only (unshare -n);
#   - PATH holding only stdenv's tools, Go, and the Debian stand-ins of the
#     nixpkgs packages NIXINPUTS (space-separated nativeCheckInputs); /usr/bin
#     itself holds only sh, /usr/sbin and /usr/local/bin are empty;
#   - HOME=/homeless-shelter (missing), TMPDIR a fresh writable directory;
#   - modules from a read-only GOMODCACHE filled beforehand (as the
#     vendorHash fetch is), GOFLAGS=-mod=mod, GOPROXY=off; GOCACHE writable.
# DIR is a work directory kept between runs (module and build caches).
# Needs root (it creates the user and the namespaces).
sandbox_go_test() {
  local dir=$1 src=$2 inputs=$3 input debs deb
  shift 3
  debs=("${STDENV_DEBS[@]}")
  for input in $inputs; do
    if ! deb=$(debian_standin "$input"); then
      echo "sandbox: no Debian stand-in for the nixpkgs package $input (add one to debian_standin in tests/nix/lib.sh)" >&2
      return 1
    fi
    debs+=("$deb")
  done
  ensure_build_user
  mkdir -p "$dir/modcache" "$dir/gocache" "$dir/usrbin"
  # The fixed-output fetch of vendorHash, as root with the network: every
  # module the build list needs, from the host's module cache when it has
  # them, else from the proxy.
  (cd "$src" && env -u GOFLAGS GOTOOLCHAIN=local GOMODCACHE="$dir/modcache" \
    GOPROXY="file://$(go env GOMODCACHE)/cache/download,$(go env GOPROXY)" GOFLAGS=-mod=mod \
    go mod download) || { echo "sandbox: go mod download failed" >&2; return 1; }
  chmod -R a+rX "$dir/modcache"
  sandbox_path_dir "$dir/path" "$dir/usrbin" "${debs[@]}" || return 1
  # Read-only for the build user, who does not own it; the modes are what
  # unpackPhase leaves (it makes the source u+w), so what a test copies
  # out of it (a checkout) stays removable.
  chown -R root:root "$src"
  chmod -R u+w,go-w,a+rX "$src"
  chown -R nixbld1:nixbld "$dir/gocache"
  rm -rf "$dir/build"
  install -d -o nixbld1 -g nixbld -m 0700 "$dir/build"
  unshare -m -n --propagation private bash -euo pipefail -c '
    dir=$1 src=$2 cores=$(nproc)
    shift 2
    ip link set lo up
    mount --bind /usr/bin "$dir/usrbin"
    # From here on /usr/bin holds only sh; the host tools are reached
    # through the bind mount.
    mount -t tmpfs -o mode=0755 tmpfs /usr/bin
    PATH=$dir/usrbin
    ln -s "$dir/usrbin/dash" /usr/bin/sh
    mount -t tmpfs -o mode=0755 tmpfs /usr/sbin
    mount -t tmpfs -o mode=0755 tmpfs /usr/local/bin
    cd "$src"
    exec setpriv --reuid=nixbld1 --regid=nixbld --clear-groups --no-new-privs --inh-caps=-all \
      env -i PATH="$dir/path" HOME=/homeless-shelter \
      TMPDIR="$dir/build" TMP="$dir/build" TEMP="$dir/build" TEMPDIR="$dir/build" \
      NIX_BUILD_TOP="$dir/build" NIX_BUILD_CORES="$cores" \
      GOCACHE="$dir/gocache" GOMODCACHE="$dir/modcache" GOPATH="$dir/build/go" \
      GOFLAGS=-mod=mod GOPROXY=off GOSUMDB=off GOTOOLCHAIN=local CGO_ENABLED=0 \
      go test "$@"
  ' sandbox "$dir" "$src" "$@"
}
