"""Assertions on tests/nix/eval.nix's result: the units services.knotless-run
makes for the configurations there. Prints one line per check; exits 1 if
any fails."""

import json
import re
import sys

d = json.load(open(sys.argv[1]))
s = d["scenarios"]
failed = 0


def check(name, ok, detail=""):
    global failed
    print(f"  {'ok  ' if ok else 'FAIL'}  {name}" + ("" if ok else f": {detail}"))
    failed += not ok


docs = s["docs"]
svc = docs["service"]
ref = docs["refresh"]
timer = docs["timer"]

check("docs configuration: no failed assertion", docs["failedAssertions"] == [], docs["failedAssertions"])
check("Type=notify, NotifyAccess=main", (svc["Type"], svc["NotifyAccess"]) == ("notify", "main"), (svc["Type"], svc["NotifyAccess"]))
check("Restart=always", svc["Restart"] == "always", svc["Restart"])
check(
    "KillSignal=SIGTERM, KillMode=mixed",
    (svc["KillSignal"], svc["KillMode"]) == ("SIGTERM", "mixed"),
    (svc["KillSignal"], svc["KillMode"]),
)
check("TimeoutStopSec = stop-wait 15m + 30 s = 930", svc["TimeoutStopSec"] == "930", svc["TimeoutStopSec"])
check(
    "ExecStart runs `serve --config @config@` then the repos after --",
    svc["ExecStart"] == "@knotless-run@/bin/knotless-run serve --config @config@ -- did:plc:ewvi7nxzyoun6zhxrhs64oiz/hello",
    svc["ExecStart"],
)
check(
    "LoadCredential: app-password and secrets from their files",
    svc["LoadCredential"].split("\n")
    == ["app-password:/run/secrets/knotless-run/app-password", "secrets:/run/secrets/knotless-run/secrets.json"],
    svc["LoadCredential"],
)
check("EnvironmentFile passed through", svc["EnvironmentFile"] == "/run/secrets/knotless-run/env", svc.get("EnvironmentFile"))
check(
    "StateDirectory=knotless, CacheDirectory=knotless, journald output",
    (svc["StateDirectory"], svc["CacheDirectory"], svc["StandardOutput"], svc["StandardError"])
    == ("knotless", "knotless", "journal", "journal"),
)
hardening = {
    "ProtectSystem": "strict",
    "ProtectHome": "true",
    "PrivateTmp": "true",
    "PrivateDevices": "true",
    "PrivateUsers": "true",
    "NoNewPrivileges": "true",
    "RestrictAddressFamilies": "AF_UNIX\nAF_INET\nAF_INET6",
    "SystemCallFilter": "@system-service\n~@privileged\n~@resources",
    "SystemCallArchitectures": "native",
    "CapabilityBoundingSet": "",
    "AmbientCapabilities": "",
    "LockPersonality": "true",
    "ProtectKernelTunables": "true",
    "ProtectKernelModules": "true",
    "ProtectKernelLogs": "true",
    "ProtectControlGroups": "true",
    "ProtectClock": "true",
    "ProtectHostname": "true",
    "ProtectProc": "invisible",
    "ProcSubset": "pid",
    "RestrictNamespaces": "true",
    "RestrictRealtime": "true",
    "RestrictSUIDSGID": "true",
    "MemoryDenyWriteExecute": "true",
    "RemoveIPC": "true",
    "UMask": "0077",
}
for unit, cfg in (("knotless-run", svc), ("knotless-run-kubeconfig", ref)):
    wrong = {k: cfg.get(k) for k, v in hardening.items() if cfg.get(k) != v}
    check(f"{unit}: hardening ({len(hardening)} settings)", not wrong, wrong)
check("runs as the static user knotless", (svc["User"], svc["Group"]) == ("knotless", "knotless") and "knotless" in docs["users"])

# Secrets: no secret file in the store, none in the settings file, none inlined.
settings = json.loads(docs["settingsJSON"])
secret_paths = ["/run/secrets/knotless-run/app-password", "/run/secrets/knotless-run/secrets.json", "/etc/rancher/k3s/k3s.yaml"]
check(
    "settings file holds no secret path or password key",
    not any(p in docs["settingsJSON"] for p in secret_paths) and not any("password" in k or "secret" in k for k in settings),
    docs["settingsJSON"],
)
check("no credential is read from the store", not any("/nix/store" in c for c in svc["LoadCredential"].split("\n") + [ref["LoadCredential"]]))
check(
    "settings file: typed values and defaults",
    settings
    == {
        "cache-dir": "/var/cache/knotless",
        "concurrency": 2,
        "did": "did:plc:7u2ld3ffgzqvezmv6wxgxiix",
        "executor": "kubernetes",
        "kubeconfig": "/var/lib/knotless/kubeconfig",
        "namespace": "knotless-runs",
        "pds": "https://pds.example.com",
        "plc-url": "https://plc.example.com",
        "state-dir": "/var/lib/knotless",
        "stop-wait": "15m",
    },
    settings,
)
unit = docs["serviceUnit"]
check("restartIfChanged = true (the handover makes a restart safe)", unit["restartIfChanged"] is True)
check(
    "runner wants and follows the refresh service",
    "knotless-run-kubeconfig.service" in unit["wants"] and "knotless-run-kubeconfig.service" in unit["after"],
    unit,
)

check("git on the daemon's PATH (repository mirrors)", unit["path"] == ["@git@"], unit["path"])
check("WatchdogSec=2min (the daemon pings at half of it)", svc["WatchdogSec"] == "2min", svc.get("WatchdogSec"))
ea = s["env-args"]["service"]["ExecStart"]
check(
    "extraArgs: ${NAME} left for systemd to expand, % escaped",
    ea == "@knotless-run@/bin/knotless-run serve --config @config@ \"--did=${RUNNER_DID}\" \"--poll=50%%\"",
    ea,
)

# Refresh unit and timer.
check("refresh: oneshot, admin kubeconfig as a credential", ref["Type"] == "oneshot" and ref["LoadCredential"] == "admin-kubeconfig:/etc/rancher/k3s/k3s.yaml", ref)
check(
    "refresh: ExecStart mints with %d/admin-kubeconfig into a temp file",
    ref["ExecStart"]
    == "@knotless-run@/bin/knotless-run kubeconfig --admin-kubeconfig %d/admin-kubeconfig --out /var/lib/knotless/kubeconfig.new --namespace knotless-runs --service-account knotless-runner --duration 24h",
    ref["ExecStart"],
)
check(
    "refresh: renamed over the old kubeconfig (atomic), same user and state directory",
    ref["ExecStartPost"] == "@coreutils@/bin/mv -fT /var/lib/knotless/kubeconfig.new /var/lib/knotless/kubeconfig"
    and (ref["User"], ref["StateDirectory"]) == ("knotless", "knotless"),
    ref,
)
check(
    "timer: OnCalendar every 12 h, Persistent=true, RandomizedDelaySec",
    timer == {"OnCalendar": "*-*-* 00/12:00:00", "Persistent": True, "RandomizedDelaySec": "5min"},
    timer,
)
check("timer: 30m becomes *-*-* *:00/30:00", s["minutes"]["timer"]["OnCalendar"] == "*-*-* *:00/30:00", s["minutes"]["timer"])

# Assertions.
check(
    "refresh without the kubeconfig command fails with the issue-7 message",
    s["no-kubeconfig-command"]["failedAssertions"]
    == ["services.knotless-run.kubeconfigRefresh needs a knotless-run with the kubeconfig command (issue 7)"],
    s["no-kubeconfig-command"]["failedAssertions"],
)
check("missing appPasswordFile is refused", any("appPasswordFile" in m for m in s["no-app-password"]["failedAssertions"]))
check("an interval that divides no day is refused", any("interval" in m for m in s["odd-interval"]["failedAssertions"]))

# Executors.
dk, sh = s["docker"]["service"], s["shell"]["service"]
check("docker: SupplementaryGroups=docker, PrivateUsers=false", (dk.get("SupplementaryGroups"), dk["PrivateUsers"]) == ("docker", "false"), dk)
check("docker: after docker.service", "docker.service" in s["docker"]["serviceUnit"]["after"])
check(
    "shell: MemoryDenyWriteExecute=false, SystemCallFilter=@system-service only",
    (sh["MemoryDenyWriteExecute"], sh["SystemCallFilter"]) == ("false", "@system-service"),
    sh,
)
check("kubernetes/shell: no docker group", "SupplementaryGroups" not in svc and "SupplementaryGroups" not in sh)
check("no refresh units unless enabled", s["docker"]["refresh"] == {} and s["docker"]["timer"] == {})

# Durations.
want = {"1h30m": "5430", "90s": "120", "1.5m": "120", "500ms": "31", "0": "30", "2h45m10s": "9940"}
check("TimeoutStopSec from Go durations (+30 s)", d["stopWait"] == want, d["stopWait"])

# Rejected configurations.
for name, refused in sorted(d["rejected"].items()):
    check(f"refused: {name}", refused)

sys.exit(1 if failed else 0)
