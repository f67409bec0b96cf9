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
# as a credential (knotless-run.credential.service), a replica with its
# sealing key as a credential (knotless-run.replicas.service), and the units
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
# knows them. Beside them: the runner's unit for the docker and the shell
# executor (knotless-run.docker.service, knotless-run.shell.service, which
# deploy/install --executor installs as knotless-run.service), and the
# output service's (knotless-output.service), whose service DID and
# runners are the host's, read from /etc/knotless-run/output.env, and
# those of an instance, named INSTANCE (knotless-run-INSTANCE.service,
# .docker.service, .shell.service, -kubeconfig.service and .timer), which
# deploy/install --instance NAME installs with NAME in its place. PATH
# lists each host directory once (every package is /usr there).
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
import json, os, re, sys
out = sys.argv[1]
d = json.load(sys.stdin)["scenarios"]
files = dict(d["docs"]["units"])
files["knotless-run.json"] = json.dumps(json.loads(d["docs"]["settingsJSON"]), indent=2, sort_keys=True) + "\n"
files["knotless-run.docker.service"] = d["docker"]["units"]["knotless-run.service"]
files["knotless-run.shell.service"] = d["shell"]["units"]["knotless-run.service"]
files["knotless-run.podman.service"] = d["podman"]["units"]["knotless-run.service"]
files["knotless-run.credential.service"] = d["kubeconfig-credential"]["units"]["knotless-run.service"]
files["knotless-run.replicas.service"] = d["replicas-named"]["units"]["knotless-run.service"]
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
    host = {"@knotless-run@": "/usr/local", "@config@": "/etc/knotless-run/config.json"}
    dep = d["deploy"]
    out = {n: t for n, t in dep["units"].items() if n.startswith("knotless-run")}
    out["config.json"] = json.dumps(json.loads(dep["settingsJSON"]), indent=2, sort_keys=True) + "\n"
    for executor in ("docker", "shell"):
        out[f"knotless-run.{executor}.service"] = d["deploy-" + executor]["units"]["knotless-run.service"]
    # Instance INSTANCE (deploy/install --instance NAME puts NAME in its
    # place): its units for each executor, and its settings, which are those
    # of the default runner with its own directories.
    for executor, scen in (("kubernetes", "deploy-instance"), ("docker", "deploy-instance-docker"), ("shell", "deploy-instance-shell")):
        units = d[scen]["units"]
        suffix = "" if executor == "kubernetes" else "." + executor
        out[f"knotless-run-INSTANCE{suffix}.service"] = units["knotless-run-INSTANCE.service"]
        if executor == "kubernetes":
            for name in ("knotless-run-INSTANCE-kubeconfig.service", "knotless-run-INSTANCE-kubeconfig.timer"):
                out[name] = units[name]
            mine = d[scen]["runners"]["knotless-run-INSTANCE"]["settings"]
            theirs = json.loads(out["config.json"].replace("/var/lib/knotless/", "/var/lib/knotless-INSTANCE/")
                .replace("\"/var/lib/knotless\"", "\"/var/lib/knotless-INSTANCE\"").replace("\"/var/cache/knotless\"", "\"/var/cache/knotless-INSTANCE\""))
            if mine != theirs:
                sys.exit(f"render-units: instance INSTANCE has the settings {mine}, not config.json with its directories: {theirs}")
    # The output service: its DID and runners from the host file
    # (--runner takes DIDs separated by commas).
    output = d["deploy-output"]["units"]["knotless-output.service"]
    fixed = {
        " --service-did did:web:output.example.com ": " \"--service-did=${KNOTLESS_OUTPUT_DID}\" ",
        " --runner did:plc:7u2ld3ffgzqvezmv6wxgxiix\n": " \"--runner=${KNOTLESS_OUTPUT_RUNNERS}\"\n",
        "ExecStart=": "EnvironmentFile=/etc/knotless-run/output.env\nExecStart=",
    }
    for k, v in fixed.items():
        if output.count(k) != 1:
            sys.exit(f"render-units: the output service unit has {k!r} {output.count(k)} times, want once")
        output = output.replace(k, v)
    out["knotless-output.service"] = output
    newer = ("RestartSteps=", "RestartMaxDelaySec=")
    backoff = None
    for name in list(out):
        if not name.endswith(".service"):
            continue
        lines = out[name].splitlines(keepends=True)
        moved = [l for l in lines if l.startswith(newer)]
        runner = name.startswith("knotless-run") and "kubeconfig" not in name
        if moved and not runner:
            sys.exit(f"render-units: {name} has {moved}: only the runner unit has a drop-in for them")
        if runner:
            if backoff is not None and moved != backoff:
                sys.exit(f"render-units: {name} has {moved}, another runner unit {backoff}: one drop-in serves them all")
            backoff = moved
        out[name] = "".join(l for l in lines if not l.startswith(newer))
    if backoff:
        out["restart-backoff.conf"] = ("# knotless-run.service.d/restart-backoff.conf: the restart backoff that the\n"
            "# NixOS module gives its unit, for systemd 254 and later (deploy/install puts it\n"
            "# there only where systemd knows these keys).\n[Service]\n" + "".join(backoff))
    def once(m):
        dirs = []
        for x in m.group(1).split(":"):
            if x not in dirs:
                dirs.append(x)
        return "Environment=\"PATH=" + ":".join(dirs) + "\""
    for name, text in sorted(out.items()):
        if "INSTANCE" in name:
            text = text.replace("@config@", "/etc/knotless-run/INSTANCE/config.json")
        for k, v in host.items():
            text = text.replace(k, v)
        # Every other package (git, coreutils, hostPackages) is the host /usr.
        text = re.sub(r"@[a-z0-9-]+@", "/usr", text)
        text = re.sub(r"Environment=\"PATH=([^\"]*)\"", once, text)
        with open(os.path.join(deploy, name), "w") as f:
            f.write(text)
        print(os.path.join(deploy, name))
' "$out" "$deploy"
