#!/usr/bin/python3
"""k3s as the VM test's script reaches it, on the stand-in's machine.

Only `k3s kubectl ARGS` exists: kubectl with /etc/rancher/k3s/k3s.yaml (the
test cluster's admin kubeconfig, as k3s's own) unless ARGS give
--kubeconfig. The test cluster is shared, so what the VM test owns is
mapped onto what the stand-in owns (config.json beside this file):

  - namespaces: knotless-runs and default become the test's own two
    (`-n`, `--namespace`, and `namespace:` in files given with -f); the
    kubeconfig's context namespace is the test's "default";
  - nodes: `server` is the cluster's node; `agent` is the same node once
    the agent joined (`k3s vmscript-agent join`, which gives the two
    namespaces capacity on it) and is NotFound before and after `delete
    node agent`; `drain agent` takes the capacity back and deletes the
    test's pods. The node itself is never cordoned, drained or deleted.

Two commands of the stand-in's own: `k3s vmscript-agent join|leave`
(the agent VM's boot and shutdown) and `k3s vmscript-wait-apiserver` (the
stand-in's k3s.service: the API server answers).
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = json.load(open(os.path.join(HERE, "..", "config.json")))
ADMIN = "/etc/rancher/k3s/k3s.yaml"
STATE = "/run/knotless-vmscript/agent"  # absent, "joined" or "deleted"
NODE_RESOURCES = {"node", "nodes", "no"}


def kubectl(args, **kw):
    if not any(a == "--kubeconfig" or a.startswith("--kubeconfig=") for a in args):
        args = ["--kubeconfig", ADMIN] + args
    return subprocess.run(["kubectl"] + args, **kw)


def agent_state():
    try:
        return open(STATE).read().strip()
    except FileNotFoundError:
        return ""


def set_agent(state):
    os.makedirs(os.path.dirname(STATE), exist_ok=True)
    with open(STATE, "w") as f:
        f.write(state + "\n")


def namespace(name):
    return CONFIG["namespaces"].get(name, name)


def node(name):
    if name == "server" or (name == "agent" and agent_state() == "joined"):
        return CONFIG["node"]
    return name  # NotFound, as for a node that is not (or no longer) there


def rewrite_file(path):
    text = open(path).read()
    for vm, own in CONFIG["namespaces"].items():
        text = re.sub(rf"\bnamespace:\s*{re.escape(vm)}\b", f"namespace: {own}", text)
    f = tempfile.NamedTemporaryFile("w", suffix=os.path.splitext(path)[1], delete=False)
    f.write(text)
    f.close()
    return f.name


def translate(args):
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a in ("-n", "--namespace") and i + 1 < len(args):
            out += [a, namespace(args[i + 1])]
            i += 2
            continue
        if a.startswith("--namespace="):
            out.append("--namespace=" + namespace(a.split("=", 1)[1]))
        elif a.startswith("-n") and len(a) > 2 and not a.startswith("--"):
            out.append("-n" + namespace(a[2:]))
        elif a in ("-f", "--filename") and i + 1 < len(args):
            out += [a, rewrite_file(args[i + 1])]
            i += 2
            continue
        elif "/" in a and a.split("/", 1)[0] in NODE_RESOURCES:
            kind, name = a.split("/", 1)
            out.append(f"{kind}/{node(name)}")
        elif out and out[-1] in NODE_RESOURCES:
            out.append(node(a))
        else:
            out.append(a)
        i += 1
    return out


def capacity(on):
    """Label (or unlabel) the node so that the test's namespaces' pods,
    which their node selector (set by the Go side) binds to the label, may
    be scheduled there: the agent's capacity."""
    labels = [f"capacity.knotless.dev/{ns}" + ("=true" if on else "-") for ns in CONFIG["namespaces"].values()]
    kubectl(["label", "--overwrite", "node", CONFIG["node"]] + labels, check=True, stdout=subprocess.DEVNULL)


def drain(args):
    name = args[0] if args else ""
    if name != "agent" or agent_state() != "joined":
        sys.exit(f'Error from server (NotFound): nodes "{name}" not found (the stand-in drains only a joined agent)')
    capacity(False)
    timeout = next((a.split("=", 1)[1] for a in args if a.startswith("--timeout=")), "120s")
    for ns in CONFIG["namespaces"].values():
        kubectl(["-n", ns, "delete", "pods", "--all", f"--timeout={timeout}"], check=True)
    print("node/agent drained")


def delete_node(name):
    if name != "agent" or agent_state() != "joined":
        sys.exit(f'Error from server (NotFound): nodes "{name}" not found (the stand-in deletes only a joined agent)')
    capacity(False)
    set_agent("deleted")
    print('node "agent" deleted')


def wait_apiserver():
    for _ in range(600):
        if kubectl(["get", "--raw", "/readyz"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
            return
        time.sleep(1)
    sys.exit("k3s (stand-in): the test cluster's API server did not answer in 10 minutes")


def main(argv):
    if argv[:1] == ["vmscript-wait-apiserver"]:
        return wait_apiserver()
    if argv[:1] == ["vmscript-agent"]:
        if argv[1:] == ["join"]:
            capacity(True)
            set_agent("joined")
            kubectl(["wait", "--for=condition=Ready", f"node/{CONFIG['node']}", "--timeout=300s"], check=True)
            return None
        if argv[1:] == ["leave"]:
            if agent_state() == "joined":
                capacity(False)
            set_agent("deleted")
            return None
    if argv[:1] != ["kubectl"]:
        sys.exit(f"k3s (the VM script's stand-in) has only `k3s kubectl`; got: k3s {' '.join(argv)}")
    args = argv[1:]
    verbs = [a for a in args if not a.startswith("-")]
    if verbs[:1] == ["drain"]:
        return drain([a for a in args if a != "drain"])
    if verbs[:2] in (["delete", "node"], ["delete", "nodes"], ["delete", "no"]):
        return delete_node(verbs[2] if len(verbs) > 2 else "")
    if verbs[:1] == ["delete"] and len(verbs) > 1 and verbs[1].split("/", 1)[0] in NODE_RESOURCES and "/" in verbs[1]:
        return delete_node(verbs[1].split("/", 1)[1])
    if verbs[:1] in (["cordon"], ["uncordon"], ["taint"]):
        sys.exit(f"k3s (stand-in): {verbs[0]} is not done on the shared test cluster")
    sys.exit(kubectl(translate(args)).returncode)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
