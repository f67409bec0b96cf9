#!/usr/bin/env bash
# Offline checks of the Nix side of knotless-run (flake, package, NixOS
# module, VM test). No binary cache is reachable here, so nothing is built
# with Nix; what can be checked without one is:
#
#   1. every .nix file parses;
#   2. flake.lock is fully locked and agrees with flake.nix
#      (`nix flake metadata --no-update-lock-file`);
#   3. nix/package.nix: its Go builder matches go.mod's go line, no
#      dependency needs a newer Go, and vendorHash is the NAR hash of
#      `go mod vendor` for the package's source;
#   4. the package's source set (nix/source.nix) builds the binary
#      with the version ldflag, and the package's check phase passes in an
#      emulated build sandbox (tests/nix/sandbox.sh: unprivileged user, no
#      network, only stdenv's tools, Go and the declared nativeCheckInputs);
#   5. nix/module.nix evaluated with the real module system (nixpkgs' lib)
#      gives the expected units, and their rendering equals
#      tests/nix/golden/; systemd-analyze verifies the rendered units;
#   6. flake.nix's outputs, nix/package.nix and default.nix evaluated
#      against a stand-in nixpkgs (real lib, stub builders), and the VM
#      test's Python script compiled and linted (a local repository source
#      needs allow-local-sources: check-vm-sources.py).
#
# Run as root (CI does): it installs Debian's nix-bin if missing and uses a
# mount namespace for the sandbox emulation.
#
#   bash tests/nix/check.sh
set -euo pipefail
. "$(dirname "$0")/lib.sh"

root=$(repo_root)
cd "$root"
start=$SECONDS
failures=0
passes=0
skipped=0
pass() { printf '  ok    %s\n' "$1"; passes=$((passes + 1)); }
fail() { printf '  FAIL  %s\n' "$1"; failures=$((failures + 1)); }
skip() { printf '  SKIP  %s\n' "$1"; skipped=$((skipped + 1)); }
# no_lib_banner says, so that nobody misses it, that a check needing
# nixpkgs' lib was skipped and how to give it one.
no_lib_banner() {
  echo
  echo "  !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
  echo "  !! SKIPPED: no nixpkgs lib (NIXPKGS_LIB, <nixpkgs/lib>, ../shared/nixpkgs-lib)"
  echo "  !! $1."
  echo "  !! Give it one: NIXPKGS_LIB=/path/to/nixpkgs (or its lib/) make test"
  echo "  !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
  skipped=$((skipped + 1))
}
step() { printf '\n== %s\n' "$1"; }

work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

ensure_nix
echo "nix: $(nix --version)"

# ---------------------------------------------------------------- 1. parse
step "every .nix file parses"
mapfile -t nixfiles < <(find . -name '*.nix' -not -path './.git/*' -not -path './vendor/*' -not -path '*/node_modules/*' | sort)
for f in "${nixfiles[@]}"; do
  if err=$(nix-instantiate "${NIX_FLAGS[@]}" --parse "$f" 2>&1 >/dev/null); then
    pass "$f"
  else
    fail "$f: $err"
  fi
done

# ---------------------------------------------------------------- 2. flake
step "flake.lock is fully locked and agrees with flake.nix"
if python3 - flake.lock <<'PY'
import json, sys
lock = json.load(open(sys.argv[1]))
bad = []
if lock.get("version") != 7:
    bad.append(f"lock version {lock.get('version')}, want 7")
for name, node in lock["nodes"].items():
    if name == lock["root"]:
        continue
    locked = node.get("locked", {})
    for key in ("rev", "narHash", "lastModified"):
        if not locked.get(key):
            bad.append(f"node {name}: locked.{key} missing")
    if locked.get("narHash", "").startswith("sha256-") is False:
        bad.append(f"node {name}: narHash is not an SRI sha256")
for b in bad:
    print("   ", b)
sys.exit(1 if bad else 0)
PY
then pass "every lock node has rev, narHash and lastModified"; else fail "flake.lock has unlocked nodes"; fi

# The inputs flake.nix declares must be exactly the lock's root inputs, with
# the same original references.
inputs_json=$(nix-instantiate "${NIX_FLAGS[@]}" --eval --strict --json --expr '(import ./flake.nix).inputs')
if python3 - "$inputs_json" flake.lock <<'PY'
import json, sys
inputs = json.loads(sys.argv[1])
lock = json.load(open(sys.argv[2]))
root = lock["nodes"][lock["root"]].get("inputs", {})
ok = True
if sorted(inputs) != sorted(root):
    print("    flake.nix inputs", sorted(inputs), "lock root inputs", sorted(root)); ok = False
for name, spec in inputs.items():
    node = lock["nodes"].get(root.get(name, ""), {})
    o = node.get("original", {})
    url = spec.get("url", "")
    want = f"{o.get('type')}:{o.get('owner')}/{o.get('repo')}" + (f"/{o['ref']}" if o.get("ref") else "")
    if url != want:
        print(f"    input {name}: flake.nix says {url}, lock original is {want}"); ok = False
sys.exit(0 if ok else 1)
PY
then pass "flake.nix inputs = lock root inputs (nixpkgs, same reference)"; else fail "flake.nix inputs and flake.lock differ"; fi

# nix flake metadata reads the lock as Nix does. A path: flake sees every
# file (a git+file flake would see only tracked ones), so the flake's files
# are copied into a temporary directory first.
mkdir -p "$work/flake"
cp -a flake.nix flake.lock default.nix nix go.mod go.sum "$work/flake/"
if meta=$(timeout 300 nix "${NIX_FLAGS[@]}" flake metadata --no-update-lock-file --json "path:$work/flake" 2>"$work/meta.err"); then
  if python3 - "$meta" flake.lock <<'PY'
import json, sys
meta = json.loads(sys.argv[1])
lock = json.load(open(sys.argv[2]))
sys.exit(0 if meta["locks"] == lock else 1)
PY
  then pass "nix flake metadata --no-update-lock-file: lock unchanged ($(python3 -c 'import json,sys; l=json.load(open("flake.lock"))["nodes"]["nixpkgs"]["locked"]; print(l["owner"]+"/"+l["repo"], l["rev"][:12])'))"
  else fail "nix flake metadata reports other locks than flake.lock"; fi
else
  fail "nix flake metadata --no-update-lock-file failed: $(tail -n 3 "$work/meta.err")"
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  untracked=$(git ls-files --others --exclude-standard -- flake.nix flake.lock default.nix nix tests/nix docs/guide/nixos.md)
  if [ -n "$untracked" ]; then
    echo "  note  untracked (a git flake ignores them until they are added):"; printf '          %s\n' $untracked
  fi
fi

# default.nix pins the same nixpkgs: it reads flake.lock, so check it does.
if grep -q 'builtins.readFile ./flake.lock' default.nix && grep -q 'pinned.narHash' default.nix; then
  pass "default.nix fetches nixpkgs from flake.lock's rev and narHash"
else
  fail "default.nix does not take nixpkgs from flake.lock"
fi

# ---------------------------------------------------------------- 3. Go line and vendorHash
step "package: Go builder, go line and vendorHash"
goline=$(sed -n 's/^go \([0-9.]*\)$/\1/p' go.mod)
gominor=$(echo "$goline" | cut -d. -f1,2)
builder=$(sed -n 's/^ *\(buildGo[0-9]*Module\) ?$/\1/p' nix/package.nix | head -n 1)
want_builder="buildGo$(echo "$gominor" | tr -d .)Module"
if [ "$builder" = "$want_builder" ]; then
  pass "go.mod says go $goline; nix/package.nix builds with $builder"
else
  fail "go.mod says go $goline (wants $want_builder) but nix/package.nix takes ${builder:-no buildGoXXXModule}"
fi
localminor=$(go env GOVERSION | sed 's/^go\([0-9]*\.[0-9]*\).*/\1/')
if [ "$localminor" != "$gominor" ]; then
  echo "  note  local Go is $(go env GOVERSION), go.mod's minor is $gominor: vendor/modules.txt may differ from what Nix's Go writes"
fi

# A fixed directory, not a fresh temporary one: Go's build cache keys
# include the source directory, so the build and tests below stay warm
# between runs.
sb="${TMPDIR:-/tmp}/knotless-run-nix-check"
rm -rf "$sb/src"
mkdir -p "$sb"
copy_source "$sb/src"
if ! (cd "$sb/src" && env -u GOFLAGS GOTOOLCHAIN=local GOWORK=off go mod vendor) 2>"$work/vendor.err"; then
  fail "go mod vendor failed: $(tail -n 5 "$work/vendor.err")"
fi
mkdir -p "$sb/src/vendor"
too_new=$( (cd "$sb/src" && env -u GOFLAGS GOTOOLCHAIN=local GOFLAGS=-mod=vendor go list -deps -test -f '{{with .Module}}{{.Path}} {{.GoVersion}}{{end}}' ./... 2>/dev/null || true) |
  sort -u | awk -v want="$goline" '
    function cmp(a, b,   x, y, i, n) { n = split(a, x, "."); split(b, y, "."); for (i = 1; i <= 3; i++) { if ((x[i]+0) != (y[i]+0)) return (x[i]+0) - (y[i]+0) } return 0 }
    $2 != "" && cmp($2, want) > 0 { print $1 " needs go " $2 }' || true)
if [ -z "$too_new" ]; then
  pass "no module the package uses needs a Go above $goline"
else
  fail "modules need a newer Go than go.mod's $goline:"; printf '          %s\n' "$too_new"
fi
have=$(sed -n 's/^ *vendorHash = "\(.*\)";/\1/p' nix/package.nix)
want=$(sri_hash "$sb/src/vendor" || echo "(hash failed)")
if [ "$have" = "$want" ]; then
  pass "vendorHash $have"
else
  fail "vendorHash is $have but go mod vendor gives $want (run tests/nix/vendor-hash.sh --write)"
fi

# ---------------------------------------------------------------- 4. build and unit tests as Nix would
step "package source builds and its unit tests pass as in the build sandbox"
if (cd "$sb/src" && env -u GOFLAGS GOTOOLCHAIN=local GOPROXY=off CGO_ENABLED=0 GOFLAGS="-mod=vendor -trimpath" \
  go build -ldflags "-s -X knotless.dev/run/internal/lib/version.Version=0-unstable-check" -o "$work/knotless-run" ./cmd/knotless-run) 2>"$work/build.err"; then
  v=$("$work/knotless-run" version 2>&1 || true)
  if [ "$v" = "knotless-run 0-unstable-check" ]; then
    pass "go build ./cmd/knotless-run from the source of nix/source.nix; version ldflag lands ($v)"
  else
    fail "the version ldflag did not land: 'knotless-run version' printed '$v'"
  fi
else
  fail "go build from the package's source failed: $(tail -n 5 "$work/build.err")"
fi

# The check phase as buildGoModule runs it in the real sandbox: see
# tests/nix/sandbox.sh (unprivileged build user, no network, PATH of
# stdenv's tools plus Go plus the package's nativeCheckInputs, read-only
# source, checkFlags from nix/package.nix).
# The check phase's flags and inputs are read from nix/package.nix with
# nixpkgs' lib: a clone without one (no ../shared, no NIXPKGS_LIB) skips
# it loudly, as the module's evaluation below does.
if [ "$(id -u)" -ne 0 ] || ! command -v unshare >/dev/null || ! command -v setpriv >/dev/null; then
  skip "unit tests in an emulated sandbox: needs root, unshare and setpriv"
elif ! find_nixpkgs_lib >/dev/null 2>&1; then
  no_lib_banner "the check phase was NOT run as in the Nix sandbox (its checkFlags and nativeCheckInputs come from nix/package.nix)"
else
  if bash "$root/tests/nix/sandbox.sh" >"$work/test.out" 2>&1; then
    pass "check phase as in the Nix sandbox ($(sed -n 's/^checkFlags: //p' "$work/test.out"); inputs: $(sed -n 's/^nativeCheckInputs: //p' "$work/test.out"); nixbld1, unshare -n, stdenv PATH): $(grep -c '^ok' "$work/test.out") packages ok"
  else
    fail "the check phase fails in the emulated sandbox (tests/nix/sandbox.sh):"
    # The failing tests' lines, else (a failure before go test ran) the
    # output's end; no match must not end this script.
    { grep -E '^\s*--- FAIL|^(FAIL|panic:|sandbox:)|^\s+[a-z_]+\.go:[0-9]+:' "$work/test.out" ||
      tail -n 20 "$work/test.out"; } | sed 's/^/          /' | head -n 40 || true
  fi
fi
rm -rf "$sb/src"

# ---------------------------------------------------------------- 5. module
step "NixOS module evaluated with the module system"
libdir=$(find_nixpkgs_lib) || libdir=""
if [ -z "$libdir" ]; then
  no_lib_banner "the module was NOT evaluated; only the golden files are checked"
  for g in knotless-run.service knotless-run-kubeconfig.service knotless-run-kubeconfig.timer knotless-run.json; do
    if [ -s "tests/nix/golden/$g" ] && grep -q '^\(\[Service\]\|\[Timer\]\|{\)' "tests/nix/golden/$g"; then
      pass "golden $g exists"
    else
      fail "golden $g missing or empty"
    fi
  done
else
  echo "  lib: $libdir"
  if ! eval_module "$libdir" >"$work/eval.json" 2>"$work/eval.err"; then
    fail "evaluating the module failed:"; sed 's/^/          /' "$work/eval.err" | tail -n 30
  else
    python3 "$root/tests/nix/assert-module.py" "$work/eval.json" >"$work/assert.out" || true
    cat "$work/assert.out"
    passes=$((passes + $(grep -c '^  ok' "$work/assert.out" || true)))
    failures=$((failures + $(grep -c '^  FAIL' "$work/assert.out" || true)))

    bash "$root/tests/nix/render-units.sh" "$work/units" "$work/deploy" >/dev/null
    if diff -ru tests/nix/golden "$work/units" >"$work/golden.diff"; then
      pass "rendered units equal tests/nix/golden/ ($(ls tests/nix/golden | wc -l) files)"
    else
      fail "rendered units differ from tests/nix/golden/ (update with tests/nix/render-units.sh tests/nix/golden deploy):"
      sed 's/^/          /' "$work/golden.diff" | head -n 60
    fi
    # deploy/ holds the same units for a host without NixOS, and the
    # scripts and examples beside them.
    if (cd "$work/deploy" && for f in *; do diff -u "$root/deploy/$f" "$f" || exit 1; done) >"$work/deploy.diff"; then
      pass "deploy/ units and config.json equal the module's rendering ($(ls "$work/deploy" | wc -l) files)"
    else
      fail "deploy/ differs from the module's rendering (update with tests/nix/render-units.sh tests/nix/golden deploy):"
      sed 's/^/          /' "$work/deploy.diff" | head -n 60
    fi

    if command -v systemd-analyze >/dev/null; then
      mkdir -p "$work/verify/pkg/bin" "$work/verify/units"
      printf '#!/bin/sh\n' >"$work/verify/pkg/bin/knotless-run"
      chmod +x "$work/verify/pkg/bin/knotless-run"
      cp "$work/units/knotless-run.json" "$work/verify/knotless-run.json"
      for f in "$work"/units/*.service "$work"/units/*.timer; do
        b=$(basename "$f" | sed 's/\.\(docker\|shell\|podman\|credential\|replicas\)\.service$/-\1.service/')
        sed -e "s|@knotless-run@|$work/verify/pkg|g" -e "s|@coreutils@|/usr|g" \
          -e "s|@config@|$work/verify/knotless-run.json|g" "$f" >"$work/verify/units/$b"
      done
      # RestartSteps= and RestartMaxDelaySec= came with systemd 254 (NixOS
      # has it); an older systemd-analyze says it ignores them, and only that
      # is forgiven.
      newer="Unknown key '(RestartSteps|RestartMaxDelaySec)' in section \[Service\], ignoring\.\$"
      if out=$(cd "$work/verify/units" && systemd-analyze verify --man=no ./*.service ./*.timer 2>&1) &&
        out=$(printf '%s\n' "$out" | grep -Ev "$newer" || true) && [ -z "$out" ]; then
        pass "systemd-analyze verify: no unknown key or bad value in any rendered unit ($(systemd-analyze --version | head -n 1 | cut -d' ' -f2): RestartSteps/RestartMaxDelaySec of systemd 254 allowed)"
      else
        fail "systemd-analyze verify:"; echo "$out" | sed 's/^/          /'
      fi
      # deploy/ is for hosts without NixOS, Debian 12's systemd 252 among
      # them: its units verify with no key forgiven.
      mkdir -p "$work/verify/deploy"
      for f in "$root"/deploy/*.service "$root"/deploy/*.timer; do
        sed -e "s|/usr/local/bin/knotless-run|$work/verify/pkg/bin/knotless-run|g" \
          -e "s|/etc/knotless-run/config.json|$work/verify/knotless-run.json|g" "$f" >"$work/verify/deploy/$(basename "$f")"
      done
      if out=$(cd "$work/verify/deploy" && systemd-analyze verify --man=no ./*.service ./*.timer 2>&1) && [ -z "$out" ]; then
        pass "systemd-analyze verify: deploy/ units have no unknown key or bad value ($(systemd-analyze --version | head -n 1 | cut -d' ' -f2), nothing forgiven)"
      else
        fail "systemd-analyze verify of deploy/:"; echo "$out" | sed 's/^/          /'
      fi
      if grep -q '^RestartSteps=8$' "$root/deploy/restart-backoff.conf" && grep -q '^RestartMaxDelaySec=5min$' "$root/deploy/restart-backoff.conf" &&
        ! grep -q '^Restart\(Steps\|MaxDelaySec\)=' "$root"/deploy/*.service; then
        pass "deploy/: the restart backoff is a drop-in (restart-backoff.conf) deploy/install adds on systemd 254 and later"
      else
        fail "deploy/: RestartSteps=/RestartMaxDelaySec= must be in restart-backoff.conf alone"
      fi
      for u in knotless-run knotless-run-docker knotless-run-shell knotless-run-podman knotless-run-credential knotless-run-replicas knotless-run-kubeconfig knotless-run-alpha knotless-run-beta knotless-output; do
        score=$(cd "$work/verify/units" && systemd-analyze security --offline=yes "./$u.service" 2>/dev/null | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
        if [ -n "$score" ] && awk -v s="$score" 'BEGIN { exit !(s <= 2.0) }'; then
          pass "systemd-analyze security: $u.service exposure $score (at most 2.0)"
        else
          fail "systemd-analyze security: $u.service exposure ${score:-unknown}, want at most 2.0"
        fi
      done
    else
      skip "systemd-analyze not installed: units not verified"
    fi
  fi
fi

# ---------------------------------------------------------------- 6. flake wiring
step "flake outputs, package and default.nix against a stand-in nixpkgs"
if [ -z "${libdir:-}" ]; then
  skip "no nixpkgs lib: flake outputs not evaluated"
else
  if [ "$(id -u)" -eq 0 ] && ! /usr/bin/python3 -m pyflakes --version >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-pyflakes >/dev/null 2>&1 || true
  fi
  if nix-instantiate "${NIX_FLAGS[@]}" --eval --strict --json "$root/tests/nix/eval-flake.nix" \
    --arg lib "import $libdir" >"$work/flake.json" 2>"$work/flake.err"; then
    python3 "$root/tests/nix/assert-flake.py" "$work/flake.json" "$goline" >"$work/flake.out" || true
    cat "$work/flake.out"
    passes=$((passes + $(grep -c '^  ok' "$work/flake.out" || true)))
    failures=$((failures + $(grep -c '^  FAIL' "$work/flake.out" || true)))
  else
    fail "evaluating flake.nix failed:"; sed 's/^/          /' "$work/flake.err" | tail -n 30
  fi
  # The VM test's server evaluated as tests/vmscript runs it: a local
  # repository source needs allow-local-sources.
  if nix-instantiate "${NIX_FLAGS[@]}" --store "$work/vmstore" --read-write-mode --eval --strict --json \
    "$root/tests/vmscript/eval.nix" --arg lib "import $libdir" >"$work/vm.json" 2>"$work/vm.err"; then
    settings=$work/vmstore$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["server"]["settingsFile"])' "$work/vm.json")
    if out=$(python3 "$root/tests/nix/check-vm-sources.py" "$work/vm.json" "$settings" 2>&1); then
      pass "VM test: every local repository source is allowed (allow-local-sources; the lint finds it when unset)"
    else
      fail "VM test: $out"
    fi
  else
    fail "evaluating the VM test's server (tests/vmscript/eval.nix) failed:"; sed 's/^/          /' "$work/vm.err" | tail -n 30
  fi
fi

# ---------------------------------------------------------------- summary
echo
echo "took $((SECONDS - start)) s"
echo "nix: $passes passed, $failures failed, $skipped skipped"
[ "$failures" -eq 0 ]
