"""Assertions on tests/nix/eval-flake.nix's result: the flake's outputs,
the package's builder arguments, default.nix, and the VM test's script
(compiled, its names checked by check-vm-script.py, and linted with
pyflakes where Debian's python3-pyflakes is installed). One line per check; exits 1 if any fails."""

import json
import os
import subprocess
import sys
import tempfile

d = json.load(open(sys.argv[1]))
goline = sys.argv[2]
failed = 0


def check(name, ok, detail=""):
    global failed
    print(f"  {'ok  ' if ok else 'FAIL'}  {name}" + ("" if ok else f": {detail}"))
    failed += not ok


systems = ["aarch64-linux", "x86_64-linux"]
check("outputs for x86_64-linux and aarch64-linux", all(v == systems for v in d["systems"].values()), d["systems"])
check(
    "flake outputs",
    d["outputs"] == ["apps", "checks", "devShells", "formatter", "nixosModules", "overlays", "packages"],
    d["outputs"],
)
check("checks: package (build + unit tests), version, vm-k3s", d["perSystem"]["checks"] == ["package", "version", "vm-k3s"], d["perSystem"])
check(
    "nixosModules.default = { imports = [ ./nix/module.nix (package default) ]; }",
    d["moduleImports"] == ["module.nix", "<function>"],
    d["moduleImports"],
)
mp = d["modulePackage"]
check(
    "nixosModules.default: package defaults to the flake's build, for instances too; a user's setting wins",
    mp["default"] == mp["instance"] == f"knotless-run-{d['package']['version']}" and mp["userSet"] == "mine",
    mp,
)
p = d["package"]
check(
    "package: passthru.hasMetricsListen (serve --metrics-listen); metrics.enable with the flake's package is not refused",
    p["hasMetricsListen"] is True and mp["metricsRefused"] == [],
    (p["hasMetricsListen"], mp["metricsRefused"]),
)
check("package: passthru.hasReplicas (serve --replicas)", p["hasReplicas"] is True, p["hasReplicas"])
img = d["image"]
image_meta = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "nix", "image.json")))
uid = str(image_meta["uid"])
check(
    "packages.image: streamLayeredImage knotless-run:VERSION of the package, git and CA certificates, as UID 65532 (nix/image.json)",
    d["perSystem"]["packages"] == ["default", "image", "knotless-run"]
    and (img["name"], img["tag"]) == (image_meta["name"], p["version"])
    and img["contents"] == [f"knotless-run-{p['version']}", "gitMinimal", "cacert"]
    and img["config"]["User"] == f"{uid}:{uid}"
    and img["config"]["Entrypoint"] == [f"@knotless-run-{p['version']}@/bin/knotless-run"]
    and f"{image_meta['user']}:x:{uid}:{uid}:" in img["fakeRootCommands"],
    (d["perSystem"]["packages"], img),
)
check("apps.default has meta.description", bool(d["app"].get("meta", {}).get("description")), d["app"])
check("package: passthru.tests.version (testers.testVersion) and vm-k3s", d["packageTests"] == ["version", "vm-k3s"], d["packageTests"])
vt = d["packageVmTest"]
check(
    "package: passthru.tests.vm-k3s is the VM test (nodes server and agent), the flake's checks.vm-k3s, and default.nix's tests.vm-k3s",
    vt == {"name": "knotless-run-k3s", "sameScript": True, "nodes": ["agent", "server"]} and d["defaultNixVmTest"] == "knotless-run-k3s",
    (vt, d["defaultNixVmTest"]),
)
check("apps.default runs bin/knotless-run of packages.default", d["app"]["program"].endswith(f"-{p['version']}@/bin/knotless-run") and d["app"]["type"] == "app", d["app"])
check("package: subPackages = [ cmd/knotless-run ], mainProgram, MIT", (p["subPackages"], p["mainProgram"], p["license"]) == (["cmd/knotless-run"], "knotless-run", "MIT"), p)
check(
    "package: version ldflag carries the flake's version",
    f"-X knotless.dev/run/internal/lib/version.Version={p['version']}" in p["ldflags"] and p["version"] == "0-unstable-20260427-abc1234",
    p["ldflags"],
)
check("package: checkPhase runs go test $checkFlags over ./...", p["checkPhaseRunsAll"])
check("package: checkFlags = [ -short ] (tests that need more skip under -short)", p["checkFlags"] == ["-short"], p["checkFlags"])
check("package: nativeCheckInputs = [ gitMinimal ] (internal/mirror runs git)", p["nativeCheckInputs"] == ["gitMinimal"], p["nativeCheckInputs"])
check(f"package: go line read from go.mod ({goline})", p["goLine"] == goline, p["goLine"])
check("package: a Go older than the go line is refused at evaluation", d["goTooOld"] is False and d["goNewer"] is True, (d["goTooOld"], d["goNewer"]))
check("version check runs `knotless-run version`", d["versionCheck"] == {"command": "knotless-run version", "version": p["version"]}, d["versionCheck"])
check(
    "vm-k3s is the VM test (nodes server and agent): the package has the kubeconfig command",
    p["hasKubeconfigCommand"] and d["vmCheck"] == "knotless-run-k3s" and d["vmNodes"] == ["agent", "server"],
    (p["hasKubeconfigCommand"], d["vmCheck"], d["vmNodes"]),
)
check("devShell: the package's Go, gopls, kubectl", d["devShellPackages"][1:] == ["gopls", "kubectl"] and d["devShellPackages"][0].startswith("go-"), d["devShellPackages"])
check("formatter is a package for each system", d["formatterIsDrv"])
check("overlays.default adds knotless-run", d["overlay"] == "knotless-run")
check("default.nix builds the same package (same vendorHash), given pkgs", d["defaultNix"] == {"pname": "knotless-run", "vendorHash": p["vendorHash"]}, d["defaultNix"])

script = d["vmTestScript"]
try:
    compile(script, "testScript", "exec")
    check("VM test script compiles", True)
except SyntaxError as e:
    check("VM test script compiles", False, e)
# Every name the script uses is defined (by it, by Python, or by the test
# driver) and every node method exists: check-vm-script.py.
def check_script(text):
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(text)
    r = subprocess.run(
        [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "check-vm-script.py"), f.name, *d["vmNodes"]],
        capture_output=True,
        text=True,
    )
    os.unlink(f.name)
    return r


r = check_script(script)
check("VM test script: every name defined, every Machine method exists (symtable)", r.returncode == 0, r.stdout + r.stderr)
# The checker itself: each typo below must be found.
typos = [("server.succeed(", "server.suceed(", 1), ("wait_check(event)", "wait_chek(event)", 1), ("kubectl(", "kubectll(", 1)]
missed = [new for old, new, n in typos if check_script(script.replace(old, new, n)).returncode == 0]
check("check-vm-script.py finds a misspelt Machine method, helper and function", not missed, missed)
pyflakes = "/usr/bin/python3"
if subprocess.run([pyflakes, "-m", "pyflakes", "--version"], capture_output=True).returncode == 0:
    # The test driver provides the machines, subtest and log.
    prelude = "from contextlib import nullcontext as subtest\nserver = agent = log = None\n"
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(prelude + script)
    r = subprocess.run([pyflakes, "-m", "pyflakes", f.name], capture_output=True, text=True)
    os.unlink(f.name)
    check("VM test script: pyflakes finds nothing", r.returncode == 0, r.stdout + r.stderr)
else:
    print("  SKIP  pyflakes (Debian's python3-pyflakes) not installed")

sys.exit(1 if failed else 0)
