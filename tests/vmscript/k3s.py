#!/usr/bin/python3
"""k3s as the VM test's script reaches it, on the stand-in's machine.

Only `k3s kubectl ARGS` exists: kubectl with /etc/rancher/k3s/k3s.yaml (the
test cluster's admin kubeconfig, as k3s's own) unless ARGS give
--kubeconfig. The test cluster is shared, so what the VM test owns is
mapped onto what the stand-in owns (config.json beside this file):

  - namespaces: knotless-runs and default become the test's own two
    (`-n`, `--namespace`, and `namespace:` in files given with -f); the
    kubeconfig's context namespace is the test's "default";
  - nodes: `server` is the cluster's node; `agent` is the same node while
    it carries the label agent.vmscript.knotless.dev/<the test's runs
    namespace>, which `k3s vmscript-agent join` sets (with capacity for
    the two namespaces on it) and `delete node agent` removes. `leave`
    (the agent VM's shutdown) takes the capacity back but keeps the label:
    a k3s agent that shuts down leaves its Node behind, NotReady, until
    someone deletes it. So `get nodes -o name` lists node/server, and
    node/agent while that label is on the real node (with `-l
    !node-role.kubernetes.io/control-plane`, k3s's servers' role label,
    node/agent alone): the VM script's node counts are read from the
    cluster, and a node left behind is counted.
    `drain agent` takes the capacity back and deletes the test's pods.
    The node itself is never cordoned, drained or deleted.
  - `k3s crictl img -o json`, run on the agent (the driver runs the
    agent's commands on this host): the images of the cluster node's
    containerd (ctr), in crictl's JSON shape.

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
ADMIN = CONFIG.get("kubeconfig", "/etc/rancher/k3s/k3s.yaml")
NODE_RESOURCES = {"node", "nodes", "no"}
# The label that makes the cluster's node the agent's Node too.
AGENT_LABEL = "agent.vmscript.knotless.dev/" + CONFIG["namespaces"]["knotless-runs"]


def kubectl(args, **kw):
    if not any(a == "--kubeconfig" or a.startswith("--kubeconfig=") for a in args):
        args = ["--kubeconfig", ADMIN] + args
    return subprocess.run(["kubectl"] + args, **kw)


def node_labels():
    """The cluster node's labels, or None when it has no Node."""
    p = kubectl(["get", "node", CONFIG["node"], "-o", "json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    if p.returncode != 0:
        return None
    return json.loads(p.stdout)["metadata"].get("labels", {})


def agent_exists():
    return AGENT_LABEL in (node_labels() or {})


def set_agent(on):
    label = AGENT_LABEL + ("=true" if on else "-")
    kubectl(["label", "--overwrite", "node", CONFIG["node"], label], check=True, stdout=subprocess.DEVNULL)


# k3s gives its servers this role label, and its agents none.
CONTROL_PLANE = "node-role.kubernetes.io/control-plane"


def list_nodes(output, selector):
    """`get nodes -o name [-l SELECTOR]`: node/server while the cluster has
    its node, and node/agent while that node carries AGENT_LABEL; with
    `-l !node-role.kubernetes.io/control-plane`, the agent alone."""
    if output != "name":
        sys.exit(f"k3s (stand-in): lists nodes only with -o name; got -o {output!r}")
    if selector not in (None, "!" + CONTROL_PLANE):
        sys.exit(f"k3s (stand-in): lists nodes only with -l !{CONTROL_PLANE}; got -l {selector!r}")
    labels = node_labels()
    if labels is None:
        return
    if selector is None:
        print("node/server")
    if AGENT_LABEL in labels:
        print("node/agent")


def get_nodes(args):
    """If args are `get nodes|node|no` with no name, lists them
    (list_nodes) and returns True."""
    rest, output, selector, i = [], None, None, 0
    while i < len(args):
        a = args[i]
        if a in ("-o", "--output", "-l", "--selector") and i + 1 < len(args):
            if a in ("-o", "--output"):
                output = args[i + 1]
            else:
                selector = args[i + 1]
            i += 2
            continue
        for flag, short in (("--output=", "-o"), ("--selector=", "-l")):
            if a.startswith(flag) or (a.startswith(short) and len(a) > 2):
                value = a[len(flag):] if a.startswith(flag) else a[2:].lstrip("=")
                if short == "-o":
                    output = value
                else:
                    selector = value
                break
        else:
            rest.append(a)
        i += 1
    if rest[:1] != ["get"] or len(rest) != 2 or rest[1] not in NODE_RESOURCES:
        return False
    list_nodes(output, selector)
    return True


def namespace(name):
    return CONFIG["namespaces"].get(name, name)


def node(name):
    if name == "server" or (name == "agent" and agent_exists()):
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
    if name != "agent" or not agent_exists():
        sys.exit(f'Error from server (NotFound): nodes "{name}" not found (the stand-in drains only a joined agent)')
    capacity(False)
    timeout = next((a.split("=", 1)[1] for a in args if a.startswith("--timeout=")), "120s")
    for ns in CONFIG["namespaces"].values():
        kubectl(["-n", ns, "delete", "pods", "--all", f"--timeout={timeout}"], check=True)
    print("node/agent drained")


def delete_node(name):
    if name != "agent" or not agent_exists():
        sys.exit(f'Error from server (NotFound): nodes "{name}" not found (the stand-in deletes only a joined agent)')
    capacity(False)
    set_agent(False)
    print('node "agent" deleted')


def crictl(args):
    """`crictl img -o json` on the agent: the cluster node's images, as
    its containerd lists them, in crictl's JSON shape."""
    if args not in (["img", "-o", "json"], ["images", "-o", "json"]):
        sys.exit(f"k3s (stand-in): crictl has only `img -o json`; got: crictl {' '.join(args)}")
    sock = CONFIG.get("containerdSock")
    if not sock:
        sys.exit("k3s (stand-in): crictl runs on the agent only (the stand-in's server has no containerd)")
    p = subprocess.run(["ctr", "--address", sock, "-n", "k8s.io", "images", "ls", "-q"], stdout=subprocess.PIPE, check=True)
    refs = [r for r in p.stdout.decode().split() if not r.startswith("sha256:")]
    print(json.dumps({"images": [{"repoTags": [r]} for r in refs]}))


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
            set_agent(True)
            kubectl(["wait", "--for=condition=Ready", f"node/{CONFIG['node']}", "--timeout=300s"], check=True)
            return None
        if argv[1:] == ["leave"]:
            # The VM stops; its Node stays until someone deletes it.
            capacity(False)
            return None
    if argv[:1] == ["crictl"]:
        return crictl(argv[1:])
    if argv[:1] != ["kubectl"]:
        sys.exit(f"k3s (the VM script's stand-in) has only `k3s kubectl` and `k3s crictl`; got: k3s {' '.join(argv)}")
    args = argv[1:]
    verbs = [a for a in args if not a.startswith("-")]
    if verbs[:1] == ["get"] and get_nodes(args):
        return None
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
