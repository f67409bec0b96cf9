"""Assertions on tests/nix/eval.nix's result: the units services.knotless-run
makes for the configurations there. Prints one line per check; exits 1 if
any fails."""

import json
import re
import shutil
import subprocess
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
# The Kubernetes runner reads its host's addresses (netlink) to keep pods
# of the public and allow-dns egress modes from them; the refresh unit
# and the other executors need no netlink.
netlink = dict(hardening, RestrictAddressFamilies="AF_UNIX\nAF_INET\nAF_INET6\nAF_NETLINK")
for unit, cfg, want in (("knotless-run", svc, netlink), ("knotless-run-kubeconfig", ref, hardening)):
    wrong = {k: cfg.get(k) for k, v in want.items() if cfg.get(k) != v}
    check(f"{unit}: hardening ({len(want)} settings)", not wrong, wrong)
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
        "egress": "open",
        "egress-untrusted": "public",
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
    ea == "@knotless-run@/bin/knotless-run serve --config @config@ \"--did=${RUNNER_DID}\" \"--poll=50%%\" -- did:plc:ewvi7nxzyoun6zhxrhs64oiz/hello",
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
    "refresh: the policy it mints allows root steps (baseline) and each pull Secret of image-pull-secret, once",
    s["refresh-policy"]["refresh"]["ExecStart"].endswith(
        "--duration 24h --pod-security baseline --allow-image-pull-secret ci-pull --allow-image-pull-secret mirror-pull"
    ),
    s["refresh-policy"]["refresh"]["ExecStart"],
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

# Every interval the module accepts is a calendar the host's systemd
# parses (systemd-analyze calendar: the timer's own parser); what would
# give none is refused at evaluation.
hours = [f"{n}h" for n in (1, 2, 3, 4, 6, 8, 12, 24)]
minutes = [f"{n}m" for n in (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60)]
accepted = sorted(k for k, v in d["intervals"].items() if v is not None)
check(
    "refresh intervals accepted: hours dividing a day (24h too), minutes dividing an hour (60m too), calendar expressions",
    accepted == sorted(hours + minutes + ["30min", "daily", "hourly", "*-*-* 03:00:00"]),
    accepted,
)
analyze = shutil.which("systemd-analyze")
if analyze is None:
    print("  SKIP  systemd-analyze not installed: accepted intervals not parsed")
else:
    def parses(expr):
        return subprocess.run([analyze, "calendar", expr], capture_output=True).returncode == 0
    bad = {k: v for k, v in d["intervals"].items() if v is not None and not parses(v)}
    check(f"systemd-analyze calendar parses the OnCalendar= of all {len(accepted)} accepted intervals", not bad, bad)
    # What the module gave for 24h and 60m before: systemd refuses them.
    check("systemd-analyze calendar refuses 00/24 and *:00/60 (the check can fail)", not parses("*-*-* 00/24:00:00") and not parses("*-*-* *:00/60:00"))

# Restarts: back off, and stop on a configuration error.
check(
    "runner: Restart=always after 5 s, backing off to 5 min; not on exit 78 (EX_CONFIG)",
    (svc["Restart"], svc["RestartSec"], svc.get("RestartSteps"), svc.get("RestartMaxDelaySec"), svc.get("RestartPreventExitStatus"))
    == ("always", "5s", "8", "5min", "78"),
    svc,
)
check("refresh: a start timeout (a oneshot has none by default)", ref.get("TimeoutStartSec") == "2min", ref)
check(
    "refresh: Restart=on-failure after 30 s; not on exit 78 (EX_CONFIG)",
    (ref["Restart"], ref["RestartSec"], ref.get("RestartPreventExitStatus")) == ("on-failure", "30s", "78"),
    ref,
)
check(
    "environmentFile, then environmentFiles in order, as EnvironmentFile= lines",
    d["environmentFiles"].split("\n") == ["/run/secrets/knotless-run/env", "/run/secrets/knotless-run/more", "/etc/knotless-run/site.env"],
    d["environmentFiles"],
)

# Assertions.
check(
    "refresh without the kubeconfig command fails with the issue-7 message",
    s["no-kubeconfig-command"]["failedAssertions"]
    == ["services.knotless-run.kubeconfigRefresh needs a knotless-run with the kubeconfig command (issue 7)"],
    s["no-kubeconfig-command"]["failedAssertions"],
)
check("missing appPasswordFile is refused", any("appPasswordFile" in m for m in s["no-app-password"]["failedAssertions"]))
check("an interval that divides no day is refused", any("interval" in m for m in s["odd-interval"]["failedAssertions"]))

# Evaluation-time assertions name the option to set.
def asserted(name):
    return s[name]["failedAssertions"]


# enable = true alone: each assertion names the option(s) to set and says
# why, after a colon.
nothing_wants = [
    ["services.knotless-run.appPasswordFile"],
    ["services.knotless-run.settings.did"],
    ["services.knotless-run.repos", "services.knotless-run.settings.discover"],
    ["services.knotless-run.settings.kubeconfig", "services.knotless-run.kubeconfigFile", "services.knotless-run.kubeconfigRefresh.enable", "services.knotless-run.inCluster"],
]
check(
    "enable = true alone: four assertions (app password, DID, repos, cluster access), each naming what to set and why",
    len(asserted("nothing")) == len(nothing_wants)
    and all(all(o in m for o in want) and len(m.split(": ", 1)) == 2 and len(m.split(": ", 1)[1]) > 20 for m, want in zip(asserted("nothing"), nothing_wants)),
    asserted("nothing"),
)
guide = open(__file__.rsplit("/tests/nix/", 1)[0] + "/docs/guide/nixos.md").read()
check(
    "docs/guide/nixos.md quotes the four messages of enable = true alone verbatim",
    all(f"- {m}\n" in guide for m in asserted("nothing")),
    [m for m in asserted("nothing") if f"- {m}\n" not in guide],
)
check("no DID: refused, naming settings.did", asserted("no-did") != [] and all("services.knotless-run.settings.did" in m for m in asserted("no-did")), asserted("no-did"))
check("--did= in extraArgs stands for settings.did", asserted("did-in-args") == [], asserted("did-in-args"))
check(
    "no repositories and no discover: refused, naming repos and settings.discover",
    len(asserted("no-repos")) == 1 and "services.knotless-run.repos" in asserted("no-repos")[0] and "settings.discover" in asserted("no-repos")[0],
    asserted("no-repos"),
)
check("settings.discover = true or a repository in extraArgs stands for repos", asserted("discover") == [] and asserted("repo-in-args") == [], (asserted("discover"), asserted("repo-in-args")))
check(
    "kubernetes executor without kubeconfig, refresh timer or inCluster: refused, naming all three",
    len(asserted("kube-nothing")) == 1
    and all(o in asserted("kube-nothing")[0] for o in ("settings.kubeconfig", "kubeconfigRefresh.enable", "inCluster")),
    asserted("kube-nothing"),
)
check("inCluster = true stands for a kubeconfig", asserted("kube-in-cluster") == [], asserted("kube-in-cluster"))
check(
    "two runners writing one kubeconfig are refused, naming both options",
    any("services.knotless-run.kubeconfigRefresh.output" in m and "instances.alpha.kubeconfigRefresh.output" in m for m in asserted("shared-output")),
    asserted("shared-output"),
)
check("an instance named like a refresh unit is refused", any("instances: names" in m for m in asserted("bad-instance-name")), asserted("bad-instance-name"))

# extraPackages: on the runner's PATH after git.
host_tools = ["@" + t + "@" for t in "bash coreutils findutils diffutils gnused gnugrep gawk gnutar gzip bzip2 xz gnumake gnupatch".split()]
check(
    "shell: git, extraPackages, then hostPackages (by default stdenv's tools) on the PATH of the steps",
    s["shell"]["serviceUnit"]["path"] == ["@git@", "@nodejs@"] + host_tools,
    s["shell"]["serviceUnit"]["path"],
)
check(
    "hostPackages only for the shell executor: the Kubernetes and docker runners' PATH is git alone",
    docs["serviceUnit"]["path"] == s["docker"]["serviceUnit"]["path"] == ["@git@"],
    (docs["serviceUnit"]["path"], s["docker"]["serviceUnit"]["path"]),
)

# Instances: each its own user, directories, units and timer; nothing
# writable shared between any two runners (the default one included).
inst = s["instances"]
runners = inst["runners"]
check("instances: no failed assertion; the disabled instance makes no unit", inst["failedAssertions"] == [] and sorted(runners) == ["knotless-run", "knotless-run-alpha", "knotless-run-beta"], (inst["failedAssertions"], sorted(runners)))
check(
    "instances: units and timers per instance (knotless-run-NAME, knotless-run-NAME-kubeconfig)",
    {"knotless-run-alpha.service", "knotless-run-alpha-kubeconfig.service", "knotless-run-alpha-kubeconfig.timer", "knotless-run-beta.service"} <= set(inst["units"])
    and "knotless-run-beta-kubeconfig.timer" not in inst["units"],
    sorted(inst["units"]),
)
alpha = inst["units"]["knotless-run-alpha.service"]
alpha_exec = alpha.split("ExecStart=")[1].split("\n")[0]
check(
    "instances: the lander's push credentials are credentials (pushCredentials), never in the unit's command",
    "LoadCredential=push-credential-0:/run/secrets/knotless-run-alpha/push-token" in alpha
    and "LoadCredential=push-credential-1:/run/secrets/knotless-run-alpha/push-key" in alpha
    and "/run/secrets" not in alpha_exec,
    alpha,
)
check(
    "instances: each push credential is bound to its host and each path, its file in the credentials directory (%d)",
    [a for a in alpha_exec.split() if "push-credential" in a]
    == [
        '"--push-credential=git.example.org/your-org=%d/push-credential-0"',
        '"--push-credential=git.example.org/you/site.git=%d/push-credential-0"',
        '"--push-credential=ssh.example.org:2222=%d/push-credential-1"',
    ],
    alpha_exec,
)
check(
    "the older pushCredentialFile (bound to no host) fails evaluation, saying what to write",
    any("pushCredentialFile is a push credential bound to no host" in m and "pushCredentials = [ { host = " in m for m in s["push-credential-file"]["failedAssertions"]),
    s["push-credential-file"]["failedAssertions"],
)


def writable(r):
    """What a runner's units may write, as absolute paths."""
    paths = {"/var/lib/" + r["stateDirectory"], "/var/cache/" + r["cacheDirectory"], *r["readWritePaths"]}
    if r["refreshStateDirectory"]:
        paths.add("/var/lib/" + r["refreshStateDirectory"])
    if r["refreshOutput"]:
        paths.add(r["refreshOutput"])
    return paths


def overlaps(a, b):
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


shared = []
names = sorted(runners)
for i, a in enumerate(names):
    ra = runners[a]
    if not (ra["refreshUser"] in (None, ra["user"]) and ra["privateTmp"] is True):
        shared.append(f"{a}: refresh user {ra['refreshUser']} or PrivateTmp={ra['privateTmp']}")
    if set(ra["settingsDirs"]) != {"/var/lib/" + ra["stateDirectory"], "/var/cache/" + ra["cacheDirectory"]}:
        shared.append(f"{a}: settings state-dir/cache-dir {ra['settingsDirs']} are not its unit's directories")
    for b in names[i + 1 :]:
        rb = runners[b]
        if ra["user"] == rb["user"]:
            shared.append(f"{a} and {b} run as {ra['user']}")
        for pa in writable(ra):
            for pb in writable(rb):
                if overlaps(pa, pb):
                    shared.append(f"{a} writes {pa}, {b} writes {pb}")
check("instances: no two runners share a user or anything writable", not shared, shared)

# Metrics: off by default; on, serve gets --metrics-listen through the
# settings file; a package without the flag is refused.
mx = json.loads(s["metrics"]["settingsJSON"])
check("metrics: off by default (no metrics-listen in the settings)", "metrics-listen" not in settings, settings)
check(
    "metrics.enable: settings metrics-listen = 127.0.0.1:9465, no failed assertion",
    (mx.get("metrics-listen"), s["metrics"]["failedAssertions"]) == ("127.0.0.1:9465", []),
    (mx.get("metrics-listen"), s["metrics"]["failedAssertions"]),
)
check(
    "metrics.listen: passed as given",
    json.loads(s["metrics-listen"]["settingsJSON"]).get("metrics-listen") == "[::]:9100",
    s["metrics-listen"]["settingsJSON"],
)
check(
    "metrics.enable with a package lacking --metrics-listen: refused",
    any("--metrics-listen" in m for m in s["metrics-unsupported"]["failedAssertions"]),
    s["metrics-unsupported"]["failedAssertions"],
)
check(
    "metrics.rulesFile: the package's share/knotless-run/knotless-run.rules.yml",
    s["metrics"]["rulesFile"] == "@knotless-run@/share/knotless-run/knotless-run.rules.yml",
    s["metrics"]["rulesFile"],
)

# Live output: the options reach serve's settings file as its flags; a
# package without them, an output service without its DID, a public URL
# with nothing to read there are refused.
lv = json.loads(s["live"]["settingsJSON"])
check(
    "liveOutput: listen, public-url, output-service, output-service-did in the settings, no failed assertion",
    {k: lv.get(k) for k in ("listen", "public-url", "output-service", "output-service-did")}
    == {"listen": "127.0.0.1:8788", "public-url": "https://ci.example.com", "output-service": "https://output.example.com",
        "output-service-did": "did:web:output.example.com"}
    and s["live"]["failedAssertions"] == [],
    (lv, s["live"]["failedAssertions"]),
)
check("liveOutput: off by default (no listen in the settings)", "listen" not in settings and "output-service" not in settings, settings)
for name, needle in [
    ("live-unsupported", "--listen and --output-service (issue 31)"),
    ("live-no-service-did", "liveOutput.serviceDid is null"),
    ("live-public-url-alone", "no live output to read there"),
    ("output-service-incomplete", "outputService.serviceDid must be set"),
    ("output-service-unsupported", "output-service command (issue 31)"),
    ("output-service-instance-clash", "instances.output would share"),
]:
    check(f"refused: {name}", any(needle in m for m in s[name]["failedAssertions"]), s[name]["failedAssertions"])
check(
    "outputService: no failed assertion",
    s["output-service"]["failedAssertions"] == [] and "knotless-output.service" not in s["docs"]["units"],
    s["output-service"]["failedAssertions"],
)
ou = s["output-service"]["units"]["knotless-output.service"]
check(
    "outputService: ExecStart output-service with the listen, data dir, DID, runners, PLC, retention and extraArgs",
    "ExecStart=@knotless-run@/bin/knotless-run output-service --listen 127.0.0.1:8789 --data-dir /var/lib/knotless-output"
    " --service-did did:web:output.example.com --plc-url https://plc.example.com --retention 168h"
    " --runner did:plc:7u2ld3ffgzqvezmv6wxgxiix --runner did:plc:ewvi7nxzyoun6zhxrhs64oiz --max-subscribers=100" in ou,
    ou,
)
check(
    "outputService: Restart=on-failure after 5 s; not on exit 78 (EX_CONFIG)",
    all(x in ou.splitlines() for x in ("Restart=on-failure", "RestartSec=5s", "RestartPreventExitStatus=78")),
    ou,
)
check(
    "outputService: its own user and state directory, hardened",
    all(x in ou.splitlines() for x in ("User=knotless-output", "StateDirectory=knotless-output", "ProtectSystem=strict",
                                       "PrivateUsers=true", "MemoryDenyWriteExecute=true", "NoNewPrivileges=true")),
    ou,
)

# Option docs: every {option}`X` names an option that exists, by its full
# name (the NixOS manual links it; a relative name breaks there).
docs_opts = d["optionDocs"]
opt_names = {o["name"] for o in docs_opts}
broken = sorted(
    {(o["name"], ref) for o in docs_opts for ref in re.findall(r"\{option\}`([^`]+)`", o["description"] or "") if ref not in opt_names}
)
check(
    f"option docs: {len(docs_opts)} options, every {{option}} reference names an existing option",
    len(docs_opts) > 40 and not broken and "services.knotless-run.instances.<name>.extraPackages" in opt_names,
    broken,
)

# Egress: pulls' pods get public by default (settings file above); both
# modes are settings written as serve's flags.
eg = json.loads(s["egress"]["settingsJSON"])
check(
    "settings.egress and settings.egress-untrusted reach serve's settings file",
    (eg.get("egress"), eg.get("egress-untrusted")) == ("deny", "allow-dns") and s["egress"]["failedAssertions"] == [],
    (eg, s["egress"]["failedAssertions"]),
)

# Replicas (serve --replicas): settings replicas and replica-name (the
# host's name by default, none with an empty one), the sealing key as a
# credential copied into the state directory before the daemon starts,
# and what serve refuses refused at evaluation.
def settings_of(name):
    return json.loads(s[name]["settingsJSON"])
rp, rn, rh = settings_of("replicas"), settings_of("replicas-named"), settings_of("replicas-no-host-name")
check(
    "replicas.enable: replicas and replica-name (networking.hostName) in serve's settings; none by default",
    (rp.get("replicas"), rp.get("replica-name"), rn.get("replica-name"), rh.get("replicas"), "replica-name" in rh)
    == (True, "nixos", "ci-2", True, False)
    and "replicas" not in settings and "replica-name" not in settings
    and asserted("replicas") == [] and asserted("replicas-named") == [] and asserted("replicas-no-host-name") == [],
    (rp, rn, rh, asserted("replicas"), asserted("replicas-named")),
)
rs = s["replicas-named"]["service"]
check(
    "replicas.sealingKeyFile: credential secrets-key, installed 0600 beside the state's key and renamed over it before start",
    "secrets-key:/run/secrets/knotless-run/secrets-key.json" in rs["LoadCredential"].split("\n")
    and rs.get("ExecStartPre", "").split("\n")
    == [
        "@coreutils@/bin/install -m 0600 -T %d/secrets-key /var/lib/knotless/secrets-key.json.new",
        "@coreutils@/bin/mv -fT /var/lib/knotless/secrets-key.json.new /var/lib/knotless/secrets-key.json",
    ]
    and "ExecStartPre" not in s["replicas"]["service"] and "secrets-key" not in s["replicas"]["service"]["LoadCredential"],
    (rs["LoadCredential"], rs.get("ExecStartPre")),
)
for name, needle in [
    ("replicas-shell", 'replicas.enable needs services.knotless-run.settings.executor = "kubernetes" (it is shell)'),
    ("replicas-queue", "replicas.enable with services.knotless-run.settings.queue (--queue)"),
    ("replicas-warm-pods", "replicas.enable with services.knotless-run.settings.warm-pods (--warm-pods)"),
    ("replicas-key-alone", "replicas.sealingKeyFile is set but services.knotless-run.replicas.enable is false"),
    ("replicas-unsupported", "serve has --replicas (issue 48)"),
]:
    check(f"refused: {name}", any(needle in m for m in asserted(name)), asserted(name))

# Executors.
dk, sh = s["docker"]["service"], s["shell"]["service"]
check("docker: SupplementaryGroups=docker, PrivateUsers=false", (dk.get("SupplementaryGroups"), dk["PrivateUsers"]) == ("docker", "false"), dk)
check("docker: after docker.service", "docker.service" in s["docker"]["serviceUnit"]["after"])
check(
    "docker executor with neither Docker nor Podman (nor a daemon elsewhere): refused, naming virtualisation.docker.enable and the Podman ways",
    len(asserted("docker-nothing")) == 1
    and all(o in asserted("docker-nothing")[0] for o in ("virtualisation.docker.enable", "virtualisation.podman.dockerSocket.enable", "environment.DOCKER_HOST", "settings.docker-host")),
    asserted("docker-nothing"),
)
check("docker executor with Podman but neither its Docker socket nor DOCKER_HOST: refused", len(asserted("docker-podman-alone")) == 1, asserted("docker-podman-alone"))
for name in ("docker-podman-socket", "docker-podman-host"):
    pd = s[name]
    check(
        f"{name}: accepted; SupplementaryGroups=podman, PrivateUsers=false, after podman.socket",
        pd["failedAssertions"] == []
        and (pd["service"].get("SupplementaryGroups"), pd["service"]["PrivateUsers"]) == ("podman", "false")
        and "podman.socket" in pd["serviceUnit"]["after"]
        and "docker.service" not in pd["serviceUnit"]["after"],
        (pd["failedAssertions"], pd["service"].get("SupplementaryGroups"), pd["serviceUnit"]["after"]),
    )
check(
    "docker-podman-host: DOCKER_HOST reaches the unit's environment",
    s["docker-podman-host"]["serviceUnit"]["environment"] == {"DOCKER_HOST": "unix:///run/podman/podman.sock"},
    s["docker-podman-host"]["serviceUnit"]["environment"],
)
rm = s["docker-remote"]
check(
    "docker executor with a daemon elsewhere (settings.docker-host tcp://): accepted, no local group, PrivateUsers kept",
    rm["failedAssertions"] == [] and "SupplementaryGroups" not in rm["service"] and rm["service"]["PrivateUsers"] == "true",
    (rm["failedAssertions"], rm["service"].get("SupplementaryGroups"), rm["service"]["PrivateUsers"]),
)
check(
    "shell: MemoryDenyWriteExecute=false, SystemCallFilter=@system-service only",
    (sh["MemoryDenyWriteExecute"], sh["SystemCallFilter"]) == ("false", "@system-service"),
    sh,
)
check("kubernetes/shell: no docker group", "SupplementaryGroups" not in svc and "SupplementaryGroups" not in sh)
check(
    "docker/shell: no AF_NETLINK (only the Kubernetes executor reads the host's addresses)",
    dk["RestrictAddressFamilies"] == sh["RestrictAddressFamilies"] == "AF_UNIX\nAF_INET\nAF_INET6",
    (dk["RestrictAddressFamilies"], sh["RestrictAddressFamilies"]),
)
check("no refresh units unless enabled", s["docker"]["refresh"] == {} and s["docker"]["timer"] == {})

# The peers' conveniences.
ou_ = s["own-user"]
ou_svc, ou_ref = ou_["service"], ou_["refresh"]
check(
    "user, group: both units run as them; the module creates neither (they are the operator's)",
    (ou_svc["User"], ou_svc["Group"], ou_ref["User"], ou_ref["Group"]) == ("ci", "ci-group", "ci", "ci-group")
    and "ci" not in ou_["users"] and "knotless" not in ou_["users"] and ou_["groups"] == []
    and ou_["failedAssertions"] == [],
    (ou_svc["User"], ou_svc["Group"], ou_ref["User"], sorted(ou_["users"]), ou_["groups"], ou_["failedAssertions"]),
)
check(
    "default user and group: the module creates knotless and its group",
    docs["users"]["knotless"]["group"] == "knotless" and docs["groups"] == ["knotless"],
    (docs["users"].get("knotless"), docs["groups"]),
)
check(
    "extraGroups: SupplementaryGroups= of the runner (not the refresh), and PrivateUsers=false so the group's id is mapped",
    (ou_svc.get("SupplementaryGroups"), ou_svc["PrivateUsers"], ou_ref.get("SupplementaryGroups"), ou_ref["PrivateUsers"]) == ("ci-data", "false", None, "true"),
    (ou_svc.get("SupplementaryGroups"), ou_svc["PrivateUsers"], ou_ref.get("SupplementaryGroups"), ou_ref["PrivateUsers"]),
)
check(
    "two runners with one user: refused, naming both user options",
    any("services.knotless-run.user = knotless" in m and "instances.beta.user = knotless" in m for m in asserted("shared-user")),
    asserted("shared-user"),
)
env = s["environment"]
check(
    "environment: each variable an Environment= line of the runner's unit, a path value as its store copy",
    {k: v for k, v in env["serviceUnit"]["environment"].items() if k != "STUBS"} == {"GOMAXPROCS": "4", "HTTPS_PROXY": "http://proxy.example.com:3128"}
    and re.fullmatch(r"/nix/store/[a-z0-9]{32}-nixos-stubs\.nix", env["serviceUnit"]["environment"].get("STUBS", ""))
    and 'Environment="GOMAXPROCS=4"' in env["units"]["knotless-run.service"].splitlines()
    and 'Environment="HTTPS_PROXY=http://proxy.example.com:3128"' in env["units"]["knotless-run.service"].splitlines()
    and env["failedAssertions"] == [],
    (env["serviceUnit"]["environment"], env["failedAssertions"]),
)
check("environment: empty by default", docs["serviceUnit"]["environment"] == {}, docs["serviceUnit"]["environment"])
check(
    "environment.PATH: refused, naming extraPackages and hostPackages",
    any("environment.PATH" in m and "extraPackages" in m and "hostPackages" in m for m in asserted("environment-path"))
    and "PATH" not in s["environment-path"]["serviceUnit"]["environment"],
    asserted("environment-path"),
)
ov = s["overrides"]["service"]
check(
    "serviceOverrides: replace the runner's values (Restart, a mkDefault hardening, a list) and add new keys; the refresh unit keeps its own",
    (ov["Restart"], ov["ProtectHome"], ov["RestrictAddressFamilies"], ov.get("CPUQuota")) == ("on-failure", "read-only", "AF_UNIX", "200%")
    and s["overrides"]["failedAssertions"] == []
    and ov["ProtectSystem"] == "strict"
    and (s["overrides"]["refresh"]["ProtectHome"], s["overrides"]["refresh"]["RestrictAddressFamilies"]) == ("true", "AF_UNIX\nAF_INET\nAF_INET6")
    and "CPUQuota" not in s["overrides"]["refresh"],
    (ov["Restart"], ov["ProtectHome"], ov["RestrictAddressFamilies"], ov.get("CPUQuota"), s["overrides"]["failedAssertions"]),
)
fw = s["firewall"]
check(
    "openFirewall: the metrics, live output and output service ports in networking.firewall.allowedTCPPorts",
    sorted(fw["firewall"]) == [8788, 8789, 9100] and fw["failedAssertions"] == [],
    (fw["firewall"], fw["failedAssertions"]),
)
check(
    "openFirewall: off by default, even for metrics on [::]:9100",
    s["metrics-listen"]["firewall"] == [] and s["metrics-listen"]["failedAssertions"] == [] and docs["firewall"] == [],
    (s["metrics-listen"]["firewall"], s["metrics-listen"]["failedAssertions"]),
)
fl = asserted("firewall-loopback")
check(
    "openFirewall with a loopback listen (or none): refused for each listener, naming its listen option, nothing opened",
    len(fl) == 3
    and any("metrics.listen is \"127.0.0.1:9465\"" in m for m in fl)
    and any("liveOutput.listen is null" in m for m in fl)
    and any("outputService.listen is \"127.0.0.1:8789\"" in m for m in fl)
    and s["firewall-loopback"]["firewall"] == [],
    (fl, s["firewall-loopback"]["firewall"]),
)
check("metrics.openFirewall without metrics.enable: refused", any("metrics.enable is false" in m for m in asserted("firewall-metrics-off")), asserted("firewall-metrics-off"))
kc = s["kubeconfig-credential"]
check(
    "kubeconfigFile: a credential (LoadCredential=kubeconfig:FILE), --kubeconfig=%d/kubeconfig, no refresh unit, not in the settings",
    kc["failedAssertions"] == []
    and "kubeconfig:/etc/rancher/k3s/k3s.yaml" in kc["service"]["LoadCredential"].split("\n")
    and kc["service"]["ExecStart"].startswith("@knotless-run@/bin/knotless-run serve --config @config@ --kubeconfig=%d/kubeconfig ")
    and kc["refresh"] == {} and kc["timer"] == {}
    and "kubeconfig" not in json.loads(kc["settingsJSON"])
    and "/etc/rancher" not in kc["settingsJSON"],
    (kc["failedAssertions"], kc["service"]["LoadCredential"], kc["service"]["ExecStart"], kc["settingsJSON"]),
)
check("no kubeconfigFile: no kubeconfig credential or flag", "--kubeconfig" not in svc["ExecStart"] and "kubeconfig:" not in svc["LoadCredential"])
for name, other in (("kubeconfig-credential-and-refresh", "kubeconfigRefresh.enable"), ("kubeconfig-credential-and-setting", "settings.kubeconfig")):
    check(f"kubeconfigFile with {other}: refused, naming both", any("kubeconfigFile" in m and other in m for m in asserted(name)), asserted(name))
check(
    "token lifetime under 10m: refused, naming duration and interval",
    any("kubeconfigRefresh.duration = \"9m\"" in m and "kubeconfigRefresh.interval" in m and "600 s" in m for m in asserted("token-short")),
    asserted("token-short"),
)
check(
    "token lifetime no longer than the refresh interval (12h, 12h): refused",
    any("kubeconfigRefresh.duration = \"12h\"" in m for m in asserted("token-under-interval")),
    asserted("token-under-interval"),
)
check(
    "token lifetimes: at least 600 s and longer than the interval, for durations, named and generated calendars",
    d["tokenLifetimes"]
    == {
        "24h 12h": True, "24h 24h": False, "25h daily": True, "24h daily": False, "24h *-*-* 03:00:00": False,
        "169h weekly": True, "168h weekly": False, "2h *-*-* 00/1:00:00": True, "1h *-*-* 00/1:00:00": False,
        "10m 5m": True, "9m59s 1m": False, "599s 1m": False, "600s 1m": True, "31m 30min": True,
        "30m *-*-* *:00/30:00": False,
    },
    d["tokenLifetimes"],
)
tc = s["token-calendar"]
check(
    "a calendar the module cannot read a period from: accepted with a warning that says the lifetime was not compared",
    tc["failedAssertions"] == [] and len(tc["warnings"]) == 1 and "cannot check" in tc["warnings"][0] and docs["warnings"] == [],
    (tc["failedAssertions"], tc["warnings"]),
)

# Durations.
want = {"1h30m": "5430", "90s": "120", "1.5m": "120", "500ms": "31", "0": "30", "2h45m10s": "9940"}
check("TimeoutStopSec from Go durations (+30 s)", d["stopWait"] == want, d["stopWait"])

# Rejected configurations.
for name, refused in sorted(d["rejected"].items()):
    check(f"refused: {name}", refused)

sys.exit(1 if failed else 0)
