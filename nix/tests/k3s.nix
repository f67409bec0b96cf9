# The appliance end to end: knotless-run from the NixOS module on a k3s
# server, a PDS beside it, and an agent node that joins only when a run
# needs it.
#
#   nix build -L .#checks.x86_64-linux.vm-k3s
#   nix run .#checks.x86_64-linux.vm-k3s.driverInteractive   # to debug
#
# The forge is real atproto: accounts on nixpkgs' PDS (the npm
# @atproto/pds), the dev.knotless.* records of docs/design/protocol.md
# written by nix/tests/forge.py, and a bare git repository on the server
# that the repository record names as its source. The runner's DID exists
# only once the test has made the account, so it reaches the daemon
# through environmentFile and extraArgs (systemd expands ''${NAME}).
{
  lib,
  pkgs,
  package,
  module,
}:

let
  # One image for k3s's pause container and for the runs: busybox has the
  # sh, tar and nc the steps and the executor use.
  imageEnv = pkgs.buildEnv {
    name = "knotless-vm-image-env";
    paths = [
      pkgs.tini
      pkgs.busybox
    ];
  };
  mkImage =
    name:
    pkgs.dockerTools.buildImage {
      inherit name;
      tag = "local";
      copyToRoot = imageEnv;
      config.Entrypoint = [
        "/bin/tini"
        "--"
        "/bin/sleep"
        "inf"
      ];
    };
  pauseImage = mkImage "test.local/pause";
  runImage = mkImage "test.local/runner";

  tokenFile = pkgs.writeText "k3s-token" "knotless-vm-test-token";
  k3sFlags = [
    "--disable coredns"
    "--disable local-storage"
    "--disable metrics-server"
    "--disable servicelb"
    "--disable traefik"
    "--pause-image test.local/pause:local"
    # The test driver gives each VM eth0 (user-mode networking, the same
    # address on every VM) and eth1 (the shared VLAN): flannel must use
    # eth1, as nixpkgs' multi-node k3s tests say.
    "--flannel-iface eth1"
  ];
  k3sNode = {
    environment.systemPackages = [ pkgs.jq ];
    networking.firewall.allowedTCPPorts = [
      6443
      10250
    ];
    networking.firewall.allowedUDPPorts = [ 8472 ];
    networking.firewall.trustedInterfaces = [
      "flannel.1"
      "cni0"
    ];
  };

  forge = "${pkgs.python3}/bin/python3 ${./forge.py}";

  # Workflows pushed by the test: each a tree with .knotless/workflows/.
  tree =
    name: steps:
    pkgs.writeTextDir "${name}/.knotless/workflows/ci.yaml" ''
      on: [push]
      timeout: 10m
      steps:
      ${steps}
    '';
  quick = tree "quick" ''
    - name: hello
      run: echo hello from the vm test
  '';
  listener = tree "listener" ''
    - name: listen
      run: |
        while true; do nc -l -p 8080 -e echo run-pod; done &
        sleep 90
  '';
  slow = tree "slow" ''
    - name: slow
      run: |
        sleep 60
        echo survived the handover
  '';

  # A pod to probe from, and a target without any policy: the control that
  # shows the network works and only the runner's policy refuses.
  podsYaml = pkgs.writeText "probe.yaml" ''
    apiVersion: v1
    kind: Pod
    metadata: {name: probe, namespace: default}
    spec:
      containers:
      - {name: probe, image: "test.local/runner:local", imagePullPolicy: Never}
    ---
    apiVersion: v1
    kind: Pod
    metadata: {name: target, namespace: default}
    spec:
      containers:
      - name: target
        image: "test.local/runner:local"
        imagePullPolicy: Never
        command: ["sh", "-c", "while true; do nc -l -p 8080 -e echo target; done"]
  '';
in
pkgs.testers.runNixOSTest {
  name = "knotless-run-k3s";

  nodes = {
    server =
      { config, nodes, ... }:
      {
        imports = [
          module
          k3sNode
        ];
        virtualisation.memorySize = 3072;
        virtualisation.diskSize = 4096;
        virtualisation.cores = 2;

        services.k3s = {
          enable = true;
          role = "server";
          inherit tokenFile;
          images = [
            pauseImage
            runImage
          ];
          # No run may land here: the server is control plane only, so a run
          # waits Pending until an agent joins (scale to zero).
          extraFlags = k3sFlags ++ [
            "--node-ip ${config.networking.primaryIPAddress}"
            "--node-taint CriticalAddonsOnly=true:NoExecute"
          ];
        };

        # The PDS (nixpkgs' package of @atproto/pds) with a local PLC, set
        # up as the working harness tests/pds (pds.go) sets it up.
        services.bluesky-pds = {
          enable = true;
          settings = {
            PDS_PORT = 3000;
            PDS_HOSTNAME = "localhost";
            PDS_DID_PLC_URL = "http://127.0.0.1:2582";
            PDS_INVITE_REQUIRED = "true";
            # A hostname of localhost and http:// URLs: dev mode, as in
            # tests/pds.
            PDS_DEV_MODE = "true";
            # The PLC and the PDS itself are on loopback, which the SSRF
            # protection refuses to fetch from.
            PDS_DISABLE_SSRF_PROTECTION = "true";
            # No relay to notify: the VM has no network beyond its VLAN.
            PDS_CRAWLERS = "";
            # The test signs in and writes records in quick succession.
            PDS_RATE_LIMITS_ENABLED = "false";
            # Not set, unlike tests/pds: PDS_DATA_DIRECTORY and
            # PDS_BLOBSTORE_DISK_LOCATION (the module sets both under
            # /var/lib/pds), PDS_BLOB_UPLOAD_LIMIT (the runs' logs are small,
            # well under the default) and LOG_ENABLED=false (the journal
            # keeps the PDS's log, useful when the test fails).
            # Snake oil: this PDS lives and dies with the VM.
            PDS_JWT_SECRET = "00112233445566778899aabbccddeeff";
            PDS_ADMIN_PASSWORD = "vm-test-admin-password";
            PDS_PLC_ROTATION_KEY_K256_PRIVATE_KEY_HEX = "ae4f5028d04c833ba630f29debd5ff80b7700e43e9f4bf70f729a88cd6a6ce35";
          };
        };
        systemd.services.bluesky-pds = {
          after = [ "fake-plc.service" ];
          requires = [ "fake-plc.service" ];
        };
        systemd.services.fake-plc = {
          wantedBy = [ "multi-user.target" ];
          serviceConfig = {
            ExecStart = "${pkgs.python3}/bin/python3 ${./plc.py}";
            DynamicUser = true;
          };
        };

        services.knotless-run = {
          enable = true;
          inherit package;
          settings = {
            pds = "http://localhost:3000";
            "plc-url" = "http://127.0.0.1:2582";
            image = "test.local/runner:local";
            "stop-wait" = "2m";
            "schedule-timeout" = "15m";
            poll = "10s";
            "log-level" = "debug";
            # The repository's source is a bare repository on this machine
            # (file:///srv/git/hello.git): the daemon refuses local sources
            # unless told otherwise.
            "allow-local-sources" = true;
          };
          appPasswordFile = "/run/knotless-test/app-password";
          environmentFiles = [ "/run/knotless-test/env" ];
          extraArgs = [
            "--did=\${KNOTLESS_DID}"
            "\${KNOTLESS_REPO}"
          ];
          kubeconfigRefresh = {
            enable = true;
            adminKubeconfigFile = "/etc/rancher/k3s/k3s.yaml";
          };
        };
        # The account exists only once the test made it: start by hand.
        systemd.services.knotless-run.wantedBy = lib.mkForce [ ];
        systemd.services.knotless-run-kubeconfig.wantedBy = lib.mkForce [ ];
        systemd.timers.knotless-run-kubeconfig.wantedBy = lib.mkForce [ ];

        environment.systemPackages = [
          package
          pkgs.git
        ];
      };

    agent =
      { config, nodes, ... }:
      {
        imports = [ k3sNode ];
        virtualisation.memorySize = 1536;
        virtualisation.diskSize = 4096;
        services.k3s = {
          enable = true;
          role = "agent";
          inherit tokenFile;
          serverAddr = "https://${nodes.server.networking.primaryIPAddress}:6443";
          images = [
            pauseImage
            runImage
          ];
          extraFlags = [
            "--pause-image test.local/pause:local"
            "--flannel-iface eth1"
            "--node-ip ${config.networking.primaryIPAddress}"
          ];
        };
      };
  };

  testScript = ''
    import time

    def forge(*args):
        return server.succeed("${forge} " + " ".join(args)).strip()

    def kubectl(args):
        return server.succeed(f"k3s kubectl {args}").strip()

    def run_objects():
        return kubectl("-n knotless-runs get jobs,pods -o name")

    def run_id(event):
        # A check record does not name its run; the daemon's state.json
        # does (run and event of each run going on), and the run's Job and
        # pod carry it as the label dev.knotless.run
        # (internal/executor/kubernetes/job.go). startJob saves state.json
        # before the Job exists.
        query = f"jq -er --arg e '{event}' '.runs[] | select(.event == $e) | .run' /var/lib/knotless/state.json"
        server.wait_until_succeeds(query, timeout=300)
        return server.succeed(query).strip()

    def wait_running_pod(run):
        server.wait_until_succeeds(
            f"k3s kubectl -n knotless-runs get pods -l dev.knotless.run={run} --field-selector=status.phase=Running -o name | grep -q .",
            timeout=300,
        )
        return kubectl(f"-n knotless-runs get pods -l dev.knotless.run={run} -o jsonpath='{{.items[0].metadata.name}}'")

    def wait_check(event, status="success", timeout=600):
        server.wait_until_succeeds(
            f'test "$(${forge} check {runner_did} {event})" = {status}', timeout=timeout
        )

    # Scale to zero as a number: at each stage, the count of the nodes a
    # run can have (all but k3s's servers, which carry the control-plane
    # role label; this one is also tainted), in the log and asserted.
    node_counts = {}
    run_nodes = "k3s kubectl get nodes -l '!node-role.kubernetes.io/control-plane' -o name"

    def count_nodes(stage, want, timeout=0):
        if timeout:
            # A node joins (or goes) a moment after its VM starts (or
            # stops): wait for it, then record what is there.
            server.wait_until_succeeds(f'test "$({run_nodes} | wc -l)" -eq {want}', timeout=timeout)
        got = server.succeed(run_nodes).split()
        node_counts[stage] = len(got)
        log.info(f"node count {stage}: {len(got)} ({' '.join(got)})")
        assert len(got) == want, f"node count {stage}: {len(got)} ({got}), want {want}"

    server.start()
    server.wait_for_unit("k3s.service")
    server.wait_until_succeeds("k3s kubectl get node server", timeout=300)
    server.wait_for_unit("fake-plc.service")
    server.wait_for_unit("bluesky-pds.service")
    server.wait_for_open_port(3000)

    with subtest("accounts, a repository and its git source"):
        runner_did, runner_pw = forge("account", "runner.test").split()
        alice_did, _ = forge("account", "alice.test").split()
        alice_pw = "vm-test-password"
        server.succeed(
            "git config --global user.name vm-test",
            "git config --global user.email vm-test@example.com",
            "git config --global safe.directory '*'",
            "git init -q --bare -b main /srv/git/hello.git",
            "git init -q -b main /tmp/hello",
        )
        repo_uri = forge("repo", alice_did, alice_pw, "hello", "file:///srv/git/hello.git", runner_did)
        server.succeed(
            "install -d -m 0700 /run/knotless-test",
            f"printf %s '{runner_pw}' > /run/knotless-test/app-password",
            f"printf 'KNOTLESS_DID=%s\\nKNOTLESS_REPO=%s\\n' '{runner_did}' '{alice_did}/hello' > /run/knotless-test/env",
        )

    def push(tree):
        old = server.succeed(
            "git -C /srv/git/hello.git rev-parse -q --verify refs/heads/main || echo 0000000000000000000000000000000000000000"
        ).strip()
        server.succeed(
            f"rm -rf /tmp/hello/.knotless && cp -rT {tree} /tmp/hello && chmod -R u+w /tmp/hello",
            "git -C /tmp/hello add -A",
            "git -C /tmp/hello commit -q -m 'vm test'",
            "git -C /tmp/hello push -q /srv/git/hello.git HEAD:refs/heads/main",
            "chown -R knotless:knotless /srv/git",
        )
        new = server.succeed("git -C /srv/git/hello.git rev-parse refs/heads/main").strip()
        return forge("push", alice_did, alice_pw, repo_uri, old, new)

    with subtest("the refresh timer writes a scoped kubeconfig"):
        server.succeed("systemctl start knotless-run-kubeconfig.timer")
        server.succeed("systemctl list-timers --all | grep knotless-run-kubeconfig.timer")
        server.wait_until_succeeds("k3s kubectl get serviceaccount default", timeout=120)
        server.succeed("systemctl start knotless-run-kubeconfig.service")
        assert server.succeed("stat -c '%a %U' /var/lib/knotless/kubeconfig").strip() == "600 knotless"
        server.fail("test -e /var/lib/knotless/kubeconfig.new")
        kc = "--kubeconfig /var/lib/knotless/kubeconfig"
        assert kubectl(f"{kc} auth can-i create jobs.batch -n knotless-runs") == "yes"
        assert server.succeed(f"k3s kubectl {kc} auth can-i get nodes || true").strip() == "no"
        server.fail(f"k3s kubectl {kc} get nodes")
        # The admin kubeconfig reached the refresh unit only.
        server.fail("grep -r client-key-data /var/lib/knotless")

    with subtest("the service becomes active through sd_notify"):
        # Type=notify: start returns only after READY=1.
        server.succeed("systemctl start knotless-run.service")
        # -P A,B prints the values in systemd's order of the properties, not
        # in the order asked: read KEY=VALUE lines instead.
        state = dict(
            line.split("=", 1)
            for line in server.succeed("systemctl show -p ActiveState,SubState,NRestarts knotless-run").splitlines()
        )
        assert state == {"ActiveState": "active", "SubState": "running", "NRestarts": "0"}, state
        # The app password is in no unit text and no store file the unit names.
        server.fail(f"systemctl cat knotless-run.service | grep -F -e '{runner_pw}'")
        server.fail(f"grep -rlF -e '{runner_pw}' $(systemctl show -P ExecStart knotless-run | grep -o '/nix/store/[^ ;]*json')")

    with subtest("scale to zero: a run waits for a node, completes, leaves nothing"):
        count_nodes("before the agent joins", 0)
        event = push("${quick}/quick")
        server.wait_until_succeeds("k3s kubectl -n knotless-runs get pods -o name | grep -q .", timeout=300)
        server.wait_until_succeeds(
            "k3s kubectl -n knotless-runs get pods -o jsonpath='{.items[*].status.conditions[?(@.type==\"PodScheduled\")].reason}' | grep -q Unschedulable"
        )
        time.sleep(20)
        assert kubectl("-n knotless-runs get pods -o jsonpath='{.items[*].status.phase}'") == "Pending"
        # The daemon writes the `running` check beside the Job's creation
        # (the two-phase start: run.Engine.Begin, then the running write
        # while the pod starts; internal/parts/scheduler/worker.go), long before
        # these 20 s are over: so the check says running while the run
        # waits for a node. What must not be there yet is a final status.
        assert forge("check", runner_did, event) == "running"

        agent.start()
        agent.wait_for_unit("k3s.service")
        # The run starts on the agent only with its image in the agent's
        # containerd (nothing can be pulled in the VM): wait for k3s's
        # import of services.k3s.images, as nixpkgs' own k3s tests do, so
        # that a missing import fails here and says so.
        agent.wait_until_succeeds(
            "k3s crictl img -o json | jq -e '[.images[].repoTags[]] | index(\"test.local/runner:local\") != null'",
            timeout=120,
        )
        count_nodes("while a run needs one", 1, timeout=300)
        server.wait_until_succeeds("k3s kubectl wait --for=condition=Ready node/agent --timeout=10s", timeout=300)
        wait_check(event)
        server.wait_until_succeeds('test -z "$(k3s kubectl -n knotless-runs get jobs,pods -o name)"', timeout=120)

    with subtest("the runner's NetworkPolicy refuses other pods"):
        assert kubectl("-n knotless-runs get networkpolicy -o name") != ""
        kubectl("apply -f ${podsYaml}")
        kubectl("wait --for=condition=Ready pod/probe pod/target --timeout=120s")
        event = push("${listener}/listener")
        pod = wait_running_pod(run_id(event))
        ip = kubectl(f"-n knotless-runs get pod {pod} -o jsonpath='{{.status.podIP}}'")
        target_ip = kubectl("get pod target -o jsonpath='{.status.podIP}'")
        # The listener is up inside the run pod ...
        server.wait_until_succeeds(f"k3s kubectl -n knotless-runs exec {pod} -- nc -w 3 127.0.0.1 8080 | grep -q run-pod", timeout=60)
        # ... the network carries pod traffic ...
        server.succeed(f"k3s kubectl exec probe -- nc -w 3 {target_ip} 8080 | grep -q target")
        # ... and the policy refuses the probe.
        server.fail(f"k3s kubectl exec probe -- nc -w 5 {ip} 8080 | grep -q run-pod")
        wait_check(event)
        kubectl("delete -f ${podsYaml} --wait=false")

    with subtest("a restart hands a running run over without losing its check"):
        event = push("${slow}/slow")
        run = run_id(event)
        wait_running_pod(run)
        # The listener's Job may still be going away: select this run's.
        this_job = f"-n knotless-runs get jobs -l dev.knotless.run={run} -o jsonpath='{{.items[*].metadata.uid}}'"
        job_uid = kubectl(this_job)
        assert len(job_uid.split()) == 1, job_uid
        server.succeed("systemctl restart knotless-run.service")
        assert server.succeed("systemctl show -P ActiveState knotless-run").strip() == "active"
        # The same Job, not a new one, runs to its end.
        assert kubectl(this_job) == job_uid
        wait_check(event)
        assert forge("checks", runner_did, event) == "1"
        server.wait_until_succeeds('test -z "$(k3s kubectl -n knotless-runs get jobs,pods -o name)"', timeout=120)

    with subtest("the agent node can be removed"):
        kubectl("drain agent --ignore-daemonsets --delete-emptydir-data --timeout=120s")
        kubectl("delete node agent")
        agent.shutdown()
        count_nodes("after the drain", 0)
        assert run_objects() == ""
        server.succeed("systemctl is-active knotless-run.service")
        log.info(f"node counts: {node_counts}")
  '';

  meta.maintainers = [ ];
}
