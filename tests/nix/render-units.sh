#!/usr/bin/env bash
# Renders the units of services.knotless-run, for the configuration of
# docs/guide/nixos.md, into OUTDIR as NixOS would write them:
#
#   knotless-run.service  knotless-run-kubeconfig.service
#   knotless-run-kubeconfig.timer  knotless-run.json (the --config file)
#
# plus the docker and shell executors' runner units
# (knotless-run.docker.service, knotless-run.shell.service), the docker
# executor on Podman as user ci with extraGroups, environment and
# serviceOverrides (knotless-run.podman.service), a runner given k3s.yaml
# as a credential (knotless-run.credential.service), and the units
# of two instances beside the default runner (knotless-run-alpha.service,
# its -kubeconfig service and timer; knotless-run-beta.service, a shell
# runner with extraPackages), and the output service's
# (knotless-output.service). Store paths are
# placeholders: @knotless-run@ (the package), @coreutils@, @config@ (the
# settings file). The module is evaluated with nixpkgs' lib (see
# find_nixpkgs_lib in lib.sh).
#
# With DEPLOYDIR, also the units of deploy/ (a host without NixOS), from
# the same module, the store paths made host paths: the binary in
# /usr/local/bin, coreutils and git from /usr, the settings file
# /etc/knotless-run/config.json (written there as config.json). The
# deploy/ units are for hosts whose systemd may be older than 254 (Debian
# 12 has 252), which ignores RestartSteps= and RestartMaxDelaySec= with a
# warning: those lines leave the units for restart-backoff.conf, a
# drop-in deploy/install puts beside the runner's unit where systemd
# knows them.
#
#   tests/nix/render-units.sh OUTDIR [DEPLOYDIR]
set -euo pipefail
. "$(dirname "$0")/lib.sh"

out=${1:?usage: $0 OUTDIR [DEPLOYDIR]}
deploy=${2:-}
ensure_nix
libdir=$(find_nixpkgs_lib) || { echo "no nixpkgs lib found (set NIXPKGS_LIB)" >&2; exit 1; }
mkdir -p "$out"
eval_module "$libdir" | python3 -c '
import json, os, sys
out = sys.argv[1]
d = json.load(sys.stdin)["scenarios"]
files = dict(d["docs"]["units"])
files["knotless-run.json"] = json.dumps(json.loads(d["docs"]["settingsJSON"]), indent=2, sort_keys=True) + "\n"
files["knotless-run.docker.service"] = d["docker"]["units"]["knotless-run.service"]
files["knotless-run.shell.service"] = d["shell"]["units"]["knotless-run.service"]
files["knotless-run.podman.service"] = d["podman"]["units"]["knotless-run.service"]
files["knotless-run.credential.service"] = d["kubeconfig-credential"]["units"]["knotless-run.service"]
files["knotless-output.service"] = d["output-service"]["units"]["knotless-output.service"]
for name, text in d["instances"]["units"].items():
    if name.startswith(("knotless-run-alpha", "knotless-run-beta")):
        files[name] = text
for name, text in sorted(files.items()):
    with open(os.path.join(out, name), "w") as f:
        f.write(text)
    print(os.path.join(out, name))
deploy = sys.argv[2]
if deploy:
    os.makedirs(deploy, exist_ok=True)
    host = {"@knotless-run@": "/usr/local", "@coreutils@": "/usr", "@git@": "/usr", "@config@": "/etc/knotless-run/config.json"}
    dep = d["deploy"]
    out = {n: t for n, t in dep["units"].items() if n.startswith("knotless-run")}
    out["config.json"] = json.dumps(json.loads(dep["settingsJSON"]), indent=2, sort_keys=True) + "\n"
    newer = ("RestartSteps=", "RestartMaxDelaySec=")
    backoff = []
    for name in list(out):
        if not name.endswith(".service"):
            continue
        lines = out[name].splitlines(keepends=True)
        moved = [l for l in lines if l.startswith(newer)]
        if moved and name != "knotless-run.service":
            sys.exit(f"render-units: {name} has {moved}: only knotless-run.service has a drop-in for them")
        backoff += moved
        out[name] = "".join(l for l in lines if not l.startswith(newer))
    if backoff:
        out["restart-backoff.conf"] = ("# knotless-run.service.d/restart-backoff.conf: the restart backoff that the\n"
            "# NixOS module gives its unit, for systemd 254 and later (deploy/install puts it\n"
            "# there only where systemd knows these keys).\n[Service]\n" + "".join(backoff))
    for name, text in sorted(out.items()):
        for k, v in host.items():
            text = text.replace(k, v)
        with open(os.path.join(deploy, name), "w") as f:
            f.write(text)
        print(os.path.join(deploy, name))
' "$out" "$deploy"
