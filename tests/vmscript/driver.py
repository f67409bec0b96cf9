"""A stand-in for the NixOS test driver that runs a VM test's testScript,
unmodified, against machines that are not VMs.

The script is the one Nix interpolates from nix/tests/k3s.nix (its store
paths point into the stand-in machine's /nix/store). It runs with the
names the driver gives a script: one object per node, start_all,
subtest, log, retry, machines. Each node is one of:

  - a Machine: a booted systemd (tests/systemd: systemd-nspawn of the
    host's /usr) entered with nsenter; execute() runs
    `timeout T bash -c 'set -euo pipefail; CMD'` in it as root, as the
    driver's backdoor shell does, stdout captured and stderr logged. The
    other methods are the driver's, written again on top of execute()
    with the driver's semantics (succeed/fail per command, retries once a
    second up to the timeout, wait_for_unit failing on a failed unit or an
    inactive one with no job pending). start() starts what the VM's boot
    would (the units wanted by multi-user.target); the machine itself was
    booted before the script.
  - a ClusterNode: a k3s agent that is only capacity on the test
    cluster's node for the test's namespaces (see k3s.py): start() joins,
    shutdown() leaves (its Node stays, as a k3s agent's does),
    wait_for_unit("k3s.service") is the join's wait and joins first if
    the script did not start it (the driver boots a VM on its first
    command). Its commands (succeed, wait_until_succeeds) run on this
    host with the stand-in's k3s first in PATH, whose `k3s crictl img`
    lists the cluster node's images.

What it cannot show: the VM's kernel, its network (eth0/eth1, flannel),
k3s itself (its API server, its scheduler's taints, its agent), NixOS's
activation and boot. A method the script calls that is not here fails
the script, naming it.

  python3 driver.py CONFIG.json   (CONFIG: machines, script, result)
Writes the result as JSON: ok, error, and where the script failed (its
innermost line in the script and the statement at top level).
"""

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
import traceback

SCRIPT_NAME = "testScript"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# CAP is (the text of a script line, seconds): a wait called from that
# line waits at most that long. A run with a fix reverted sets it for the
# line it must fail at, whose failure is certain, so that the proof does
# not wait out the script's own timeout (300 s); every other wait keeps
# the script's. None in the run of the script as it is.
CAP = None


def capped(timeout):
    """timeout, or less when the calling script line is CAP's."""
    if CAP is None:
        return timeout
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename != SCRIPT_NAME:
        f = f.f_back
    if f is None or SCRIPT_LINES is None or not (0 < f.f_lineno <= len(SCRIPT_LINES)):
        return timeout
    if SCRIPT_LINES[f.f_lineno - 1].strip() != CAP[0]:
        return timeout
    return min(timeout, CAP[1])


SCRIPT_LINES = None


def retry(fn, timeout=900):
    """The driver's retry: fn(last) once a second until it is true."""
    timeout = capped(timeout)
    for _ in range(timeout):
        if fn(False):
            return
        time.sleep(1)
    if not fn(True):
        raise Exception(f"action timed out after {timeout} seconds")


class Machine:
    def __init__(self, name, leader, path, boot_units):
        self.name = name
        self.leader = leader
        self.path = path
        self.boot_units = boot_units
        self.booted = False

    def __repr__(self):
        return f"<Machine '{self.name}' (stand-in)>"

    def log(self, msg):
        log(f"{self.name}: {msg}")

    @contextlib.contextmanager
    def nested(self, msg):
        self.log(msg)
        start = time.monotonic()
        try:
            yield
        finally:
            self.log(f"({msg}: {time.monotonic() - start:.2f} s)")

    def execute(self, command, check_return=True, check_output=True, timeout=900):
        wrapped = f"set -euo pipefail; {command}"
        argv = ["nsenter", "-t", str(self.leader), "-a", "--", "env", "-i", f"PATH={self.path}", "HOME=/root", "USER=root",
                "LANG=C.UTF-8", "TERM=dumb", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0"]
        if timeout is not None:
            argv += ["timeout", str(timeout)]
        argv += ["bash", "-c", wrapped]
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out = p.stdout.decode(errors="replace")
        err = p.stderr.decode(errors="replace").rstrip("\n")
        if err:
            for line in err.splitlines():
                self.log(f"  | {line}")
        return p.returncode, out

    def succeed(self, *commands, timeout=None):
        output = ""
        for command in commands:
            with self.nested(f"must succeed: {command}"):
                status, out = self.execute(command, timeout=timeout)
                if status != 0:
                    self.log(f"output: {out}")
                    raise Exception(f"command `{command}` failed (exit code {status})")
                output += out
        return output

    def fail(self, *commands, timeout=None):
        output = ""
        for command in commands:
            with self.nested(f"must fail: {command}"):
                status, out = self.execute(command, timeout=timeout)
                if status == 0:
                    raise Exception(f"command `{command}` unexpectedly succeeded")
                output += out
        return output

    def wait_until_succeeds(self, command, timeout=900):
        output = ""

        def check_success(_):
            nonlocal output
            status, output = self.execute(command, timeout=timeout)
            return status == 0

        with self.nested(f"waiting for success: {command}"):
            retry(check_success, timeout)
            return output

    def wait_until_fails(self, command, timeout=900):
        output = ""

        def check_failure(_):
            nonlocal output
            status, output = self.execute(command, timeout=timeout)
            return status != 0

        with self.nested(f"waiting for failure: {command}"):
            retry(check_failure, timeout)
            return output

    def systemctl(self, q, user=None):
        if user is not None:
            raise Exception("the stand-in has no user sessions (systemctl --user)")
        return self.execute(f"systemctl {q}")

    def get_unit_info(self, unit, user=None):
        status, lines = self.systemctl(f'--no-pager show "{unit}"', user)
        if status != 0:
            raise Exception(f'retrieving systemctl info for unit "{unit}" failed with exit code {status}')
        info = {}
        for line in lines.split("\n"):
            m = re.match(r"^([^=]+)=(.*)$", line)
            if m:
                info[m.group(1)] = m.group(2)
        return info

    def get_unit_property(self, unit, property, user=None):
        status, out = self.systemctl(f'--no-pager show "{unit}" --property="{property}"', user)
        if status != 0:
            raise Exception(f'retrieving systemctl property "{property}" for unit "{unit}" failed with exit code {status}')
        m = re.match(r"^([^=]+)=(.*)$", out.rstrip("\n"))
        if m is None or m.group(1) != property:
            raise Exception(f'unexpected output of systemctl show for "{unit}": {out!r}')
        return m.group(2)

    def require_unit_state(self, unit, require_state="active"):
        with self.nested(f"checking if unit '{unit}' has reached state '{require_state}'"):
            state = self.get_unit_info(unit)["ActiveState"]
            if state != require_state:
                raise Exception(f"Expected unit '{unit}' to to be in state '{require_state}' but it is in state '{state}'")

    def wait_for_unit(self, unit, user=None, timeout=900):
        def check_active(_):
            state = self.get_unit_info(unit, user)["ActiveState"]
            if state == "failed":
                raise Exception(f'unit "{unit}" reached state "{state}"')
            if state == "inactive":
                _, jobs = self.systemctl("list-jobs --full 2>&1", user)
                if "No jobs" in jobs:
                    if self.get_unit_info(unit, user)["ActiveState"] == state:
                        raise Exception(f'unit "{unit}" is inactive and there are no pending jobs')
            return state == "active"

        with self.nested(f"waiting for unit {unit}"):
            retry(check_active, timeout)

    def start_job(self, jobname, user=None):
        return self.systemctl(f"start {jobname}", user)

    def stop_job(self, jobname, user=None):
        return self.systemctl(f"stop {jobname}", user)

    def wait_for_file(self, filename, timeout=900):
        with self.nested(f"waiting for file '{filename}'"):
            retry(lambda _: self.execute(f"test -e {filename}")[0] == 0, timeout)

    def wait_for_open_port(self, port, addr="localhost", timeout=900):
        # The driver probes with `nc -z`; the host's /usr has no nc, so
        # bash's /dev/tcp makes the same connection.
        probe = f"timeout 5 bash -c 'exec 3<>/dev/tcp/{addr}/{port}'"
        with self.nested(f"waiting for TCP port {port} on {addr}"):
            retry(lambda _: self.execute(probe)[0] == 0, timeout)

    def wait_for_closed_port(self, port, addr="localhost", timeout=900):
        probe = f"timeout 5 bash -c 'exec 3<>/dev/tcp/{addr}/{port}'"
        with self.nested(f"waiting for TCP port {port} on {addr} to be closed"):
            retry(lambda _: self.execute(probe)[0] != 0, timeout)

    def copy_from_host(self, source, target):
        with self.nested(f"copying {source} from the host to {target}"):
            with open(source, "rb") as f:
                p = subprocess.run(
                    ["nsenter", "-t", str(self.leader), "-a", "--", "sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", target],
                    stdin=f,
                )
            if p.returncode != 0:
                raise Exception(f"copy_from_host {source} {target} failed")

    def sleep(self, secs):
        time.sleep(secs)

    def start(self, allow_reboot=False):
        if self.booted:
            return
        with self.nested("starting (the stand-in's machine is booted: starting what multi-user.target wants)"):
            self.succeed("systemctl daemon-reload", "systemctl start --no-block " + " ".join(shlex.quote(u) for u in self.boot_units))
            self.booted = True

    def shutdown(self):
        raise Exception("the stand-in does not shut its machine down inside the script")

    def __getattr__(self, name):
        raise AttributeError(f"Machine.{name} is not in the VM script's stand-in (tests/vmscript/driver.py): add it there")


class ClusterNode:
    """A k3s agent VM, which on the stand-in is capacity on the test
    cluster's node (k3s.py, `vmscript-agent`)."""

    def __init__(self, name, via, path):
        self.name = name
        self.via = via
        self.path = path
        self.started = False

    def __repr__(self):
        return f"<ClusterNode '{self.name}' (stand-in)>"

    def log(self, msg):
        log(f"{self.name}: {msg}")

    def start(self, allow_reboot=False):
        if self.started:
            return
        self.log("starting: joining the test cluster's node as capacity for the test's namespaces")
        self.via.succeed("k3s vmscript-agent join")
        self.started = True

    def wait_for_unit(self, unit, user=None, timeout=900):
        if unit != "k3s.service":
            raise Exception(f"the stand-in's {self.name} has no unit {unit}: it is a k3s agent only")
        self.start()
        self.log("k3s.service: the join waited for the node to be Ready")

    def execute(self, command, check_return=True, check_output=True, timeout=900):
        self.start()
        argv = ["env", "-i", f"PATH={self.path}", "LANG=C.UTF-8"]
        if timeout is not None:
            argv += ["timeout", str(timeout)]
        argv += ["bash", "-c", f"set -euo pipefail; {command}"]
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for line in p.stderr.decode(errors="replace").rstrip("\n").splitlines():
            self.log(f"  | {line}")
        return p.returncode, p.stdout.decode(errors="replace")

    succeed = Machine.succeed
    fail = Machine.fail
    wait_until_succeeds = Machine.wait_until_succeeds
    wait_until_fails = Machine.wait_until_fails
    nested = Machine.nested

    def shutdown(self):
        self.log("shutting down: leaving (its Node stays until deleted)")
        self.via.succeed("k3s vmscript-agent leave")
        self.started = False

    def __getattr__(self, name):
        raise AttributeError(f"{self.name}.{name}: the stand-in's {self.name} is a k3s agent only, with no shell")


@contextlib.contextmanager
def subtest(name):
    log(f"subtest: {name}")
    start = time.monotonic()
    try:
        yield
        log(f"(subtest {name}: {time.monotonic() - start:.2f} s)")
    except Exception as e:
        log(f"subtest {name} failed: {e}")
        raise


class Logger:
    def info(self, msg):
        log(msg)

    warning = error = log_serial = info

    def log(self, msg):
        log(msg)

    @contextlib.contextmanager
    def nested(self, msg, attrs=None):
        log(msg)
        yield


def where(exc, script):
    """The script's lines in the traceback: the innermost (where it
    raised) and the outermost (the top-level statement)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == SCRIPT_NAME]
    lines = script.splitlines()

    def at(f):
        return {"line": f.lineno, "text": lines[f.lineno - 1].strip() if 0 < f.lineno <= len(lines) else ""}

    if not frames:
        return {}
    return {"innermost": at(frames[-1]), "toplevel": at(frames[0])}


def main():
    global CAP, SCRIPT_LINES
    cfg = json.load(open(sys.argv[1]))
    script = open(cfg["script"]).read()
    SCRIPT_LINES = script.splitlines()
    if cfg.get("capLine"):
        CAP = (cfg["capLine"].strip(), int(cfg["capSeconds"]))
    machines = {}
    for name, m in cfg["machines"].items():
        machines[name] = Machine(name, m["leader"], m["path"], m["bootUnits"])
    via = machines[cfg["clusterNodesVia"]]
    for name in cfg["clusterNodes"]:
        machines[name] = ClusterNode(name, via, cfg["clusterNodePath"])

    def start_all():
        for m in machines.values():
            m.start()

    symbols = {
        "start_all": start_all,
        "subtest": subtest,
        "log": Logger(),
        "retry": retry,
        "machines": list(machines.values()),
        "os": os,
        "test_script": None,
        **machines,
    }
    result = {"ok": True}
    start = time.monotonic()
    try:
        exec(compile(script, SCRIPT_NAME, "exec"), symbols)
    except Exception as e:
        result = {"ok": False, "error": f"{type(e).__name__}: {e}", **where(e, script)}
        log("".join(traceback.format_exception(e)))
    result["seconds"] = round(time.monotonic() - start, 1)
    with open(cfg["result"], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
