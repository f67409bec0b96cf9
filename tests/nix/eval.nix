# Evaluates nix/module.nix with the real module system (lib.evalModules)
# for the configurations below, and renders the resulting units to the text
# NixOS would write: one `Key=value` line per value (lists give one line per
# item), booleans as true/false, keys sorted. Store paths of packages are
# placeholders (@knotless-run@, @coreutils@) and the settings file is
# @config@, so a later step can install the units into a real systemd.
#
#   nix-instantiate --eval --strict --json --read-write-mode \
#     tests/nix/eval.nix --arg lib 'import <nixpkgs/lib>'
{ lib }:
let
  inherit (lib)
    concatStrings
    concatStringsSep
    filterAttrs
    toList
    ;

  stubPackage =
    name: extra:
    {
      type = "derivation";
      inherit name;
      outPath = "@${name}@";
      outputs = [ "out" ];
      meta.mainProgram = name;
    }
    // extra;

  # pkgs.formats.json's value type, and a generate that writes the file.
  jsonValue = lib.types.nullOr (
    lib.types.oneOf [
      lib.types.bool
      lib.types.int
      lib.types.float
      lib.types.str
      lib.types.path
      (lib.types.attrsOf jsonValue)
      (lib.types.listOf jsonValue)
    ]
  );

  # hostPackages' default: @bash@, @coreutils@, … (coreutils is also the
  # refresh unit's mv).
  hostTools = [
    "bash"
    "coreutils"
    "findutils"
    "diffutils"
    "gnused"
    "gnugrep"
    "gawk"
    "gnutar"
    "gzip"
    "bzip2"
    "xz"
    "gnumake"
    "gnupatch"
  ];

  stubPkgs =
    package:
    lib.genAttrs hostTools (name: stubPackage name { })
    // {
      formats.json =
        { }:
        {
          type = jsonValue;
          generate = name: value: builtins.toFile name (builtins.toJSON value);
        };
      git = stubPackage "git" { };
      knotless-run = package;
      callPackage = _: _: throw "stub pkgs: callPackage is not available here";
    };

  withCommand = stubPackage "knotless-run" { hasKubeconfigCommand = true; };
  withMetrics = stubPackage "knotless-run" { hasMetricsListen = true; };
  withLive = stubPackage "knotless-run" {
    hasKubeconfigCommand = true;
    hasLiveOutput = true;
  };
  withoutCommand = stubPackage "knotless-run" { };
  withReplicas = stubPackage "knotless-run" { hasReplicas = true; };

  # cfg is services.knotless-run; its attribute `nixos`, if any, is the
  # rest of the host's configuration (virtualisation.docker.enable, …).
  eval =
    package: cfg:
    lib.evalModules {
      modules = [
        ./nixos-stubs.nix
        ../../nix/module.nix
        {
          _module.args.pkgs = stubPkgs package;
          services.knotless-run = removeAttrs cfg [ "nixos" ];
        }
        (cfg.nixos or { })
      ];
    };

  # The configuration of docs/guide/nixos.md.
  docs = {
    enable = true;
    settings = {
      did = "did:plc:7u2ld3ffgzqvezmv6wxgxiix";
      pds = "https://pds.example.com";
      "plc-url" = "https://plc.example.com";
      concurrency = 2;
      "stop-wait" = "15m";
    };
    repos = [ "did:plc:ewvi7nxzyoun6zhxrhs64oiz/hello" ];
    appPasswordFile = "/run/secrets/knotless-run/app-password";
    secretsFile = "/run/secrets/knotless-run/secrets.json";
    environmentFile = "/run/secrets/knotless-run/env";
    kubeconfigRefresh = {
      enable = true;
      adminKubeconfigFile = "/etc/rancher/k3s/k3s.yaml";
    };
  };

  # deploy/: the same units for a host without NixOS (deploy/install puts
  # them in /etc/systemd/system): the operator's files under
  # /etc/knotless-run, the DID and repositories from its environment file.
  deploy = {
    enable = true;
    settings.pds = "https://pds.example.com";
    appPasswordFile = "/etc/knotless-run/app-password";
    environmentFiles = [ "/etc/knotless-run/env" ];
    extraArgs = [
      "--did=\${KNOTLESS_DID}"
      "$KNOTLESS_REPOS"
    ];
    kubeconfigRefresh = {
      enable = true;
      adminKubeconfigFile = "/etc/knotless-run/admin-kubeconfig";
    };
  };

  # deploy/'s runner unit for the docker and the shell executor
  # (deploy/install --executor): the same host, the refresh off (it is for
  # the Kubernetes executor alone), Docker's own daemon for docker.
  deployExecutor =
    executor:
    deploy
    // {
      settings = deploy.settings // {
        inherit executor;
      };
      kubeconfigRefresh.enable = false;
    }
    // lib.optionalAttrs (executor == "docker") { nixos.virtualisation.docker.enable = true; };

  # deploy/'s instances (deploy/install --instance NAME): instance
  # INSTANCE, which install names, beside the default runner, its
  # operator's files under /etc/knotless-run/INSTANCE. Upper case, which
  # the module refuses in a name (an assertion), so that no other word of
  # the units is taken for it.
  deployInstance =
    executor:
    let
      dir = "/etc/knotless-run/INSTANCE";
    in
    deploy
    // {
      instances.INSTANCE =
        removeAttrs (deployExecutor executor) [ "nixos" ]
        // {
          appPasswordFile = "${dir}/app-password";
          environmentFiles = [ "${dir}/env" ];
          kubeconfigRefresh = {
            enable = executor == "kubernetes";
            adminKubeconfigFile = "${dir}/admin-kubeconfig";
          };
        };
    }
    // lib.optionalAttrs (executor == "docker") { nixos.virtualisation.docker.enable = true; };

  # deploy/'s output service: the service's DID and the runners' are the
  # host's (deploy/output.env.example): render-units.sh puts variables
  # in place of these.
  deployOutput = deploy // {
    package = withLive;
    outputService = {
      enable = true;
      serviceDid = "did:web:output.example.com";
      runners = [ "did:plc:7u2ld3ffgzqvezmv6wxgxiix" ];
    };
  };

  # The least that passes the module's assertions (for the kubernetes
  # executor it still lacks a kubeconfig: `kube` adds one).
  minimal =
    extra:
    lib.recursiveUpdate {
      enable = true;
      appPasswordFile = "/run/secrets/knotless-run/app-password";
      settings.did = "did:plc:7u2ld3ffgzqvezmv6wxgxiix";
      repos = [ "did:plc:ewvi7nxzyoun6zhxrhs64oiz/hello" ];
    } extra;
  kube = extra: minimal (lib.recursiveUpdate { settings.kubeconfig = "/etc/knotless/kubeconfig"; } extra);

  # Two instances beside the default runner (docs'): one more Kubernetes
  # runner with its own refresh timer, one shell runner with tools.
  withInstances = docs // {
    instances = {
      alpha = minimal {
        kubeconfigRefresh = {
          enable = true;
          adminKubeconfigFile = "/etc/rancher/k3s/k3s.yaml";
        };
        # The merge queue's lander (docs/guide/nixos.md), its token bound
        # to one host and two prefixes, its key to another host.
        settings.queue = true;
        pushCredentials = [
          {
            host = "git.example.org";
            paths = [
              "your-org"
              "you/site.git"
            ];
            file = "/run/secrets/knotless-run-alpha/push-token";
          }
          {
            host = "ssh.example.org:2222";
            file = "/run/secrets/knotless-run-alpha/push-key";
          }
        ];
      };
      beta = minimal {
        settings.executor = "shell";
        extraPackages = [ (stubPackage "nodejs" { }) ];
      };
      off = { };
    };
  };

  inherit (import ./render.nix { inherit lib; }) toOption renderService renderTimer;

  scenario =
    package: cfg:
    let
      c = (eval package cfg).config;
      services = c.systemd.services;
      execStart = services.knotless-run.serviceConfig.ExecStart or "";
      configMatch = builtins.match ".*(/nix/store/[a-z0-9]+-knotless-run\\.json).*" execStart;
      configPath = if configMatch == null then throw "ExecStart names no settings file" else lib.head configMatch;
      # Every runner's settings file (knotless-run.json, knotless-run-NAME.json).
      placeholders =
        text:
        concatStrings (
          map (x: if builtins.isList x then "@config@" else x) (
            builtins.split "/nix/store/[a-z0-9]+-knotless-run[A-Za-z0-9-]*\\.json" text
          )
        );
      settingsOf =
        unit:
        let
          m = builtins.match ".*(/nix/store/[a-z0-9]+-knotless-run[A-Za-z0-9-]*\\.json).*" services.${unit}.serviceConfig.ExecStart;
        in
        builtins.fromJSON (builtins.readFile (lib.head m));
      units =
        lib.mapAttrs' (n: u: lib.nameValuePair "${n}.service" (placeholders (renderService u))) services
        // lib.mapAttrs' (n: u: lib.nameValuePair "${n}.timer" (renderTimer u)) c.systemd.timers;
    in
    {
      failedAssertions = map (a: a.message) (lib.filter (a: !a.assertion) c.assertions);
      inherit units;
      inherit (c) warnings;
      firewall = c.networking.firewall.allowedTCPPorts;
      groups = builtins.attrNames c.users.groups;
      settingsJSON = if services ? knotless-run then builtins.readFile configPath else "{}";
      rulesFile = (eval package cfg).config.services.knotless-run.metrics.rulesFile;
      service = lib.mapAttrs (_: placeholders) (
        lib.mapAttrs (_: v: if builtins.isList v then concatStringsSep "\n" (map toOption v) else toOption v)
          services.knotless-run.serviceConfig
      );
      serviceUnit = {
        inherit (services.knotless-run) wants after wantedBy restartIfChanged environment;
        path = map toString services.knotless-run.path;
      };
      refresh = lib.mapAttrs (_: toOption) (
        lib.mapAttrs (_: v: if builtins.isList v then concatStringsSep "\n" v else v) (
          services.knotless-run-kubeconfig.serviceConfig or { }
        )
      );
      timer = c.systemd.timers.knotless-run-kubeconfig.timerConfig or { };
      users = c.users.users;
      # Per runner unit (not the refresh units): what it may write.
      runners = lib.mapAttrs (
        unit: u:
        let
          sc = u.serviceConfig;
          refreshUnit = "${unit}-kubeconfig";
          rsc = services.${refreshUnit}.serviceConfig or { };
          settings = settingsOf unit;
        in
        {
          user = sc.User;
          refreshUser = rsc.User or null;
          stateDirectory = sc.StateDirectory;
          cacheDirectory = sc.CacheDirectory;
          refreshStateDirectory = rsc.StateDirectory or null;
          readWritePaths = toList (sc.ReadWritePaths or [ ]) ++ toList (rsc.ReadWritePaths or [ ]);
          privateTmp = sc.PrivateTmp;
          settingsDirs = [
            settings."state-dir"
            settings."cache-dir"
          ];
          kubeconfig = settings.kubeconfig or null;
          refreshOutput = if rsc ? ExecStartPost then lib.last (lib.splitString " " rsc.ExecStartPost) else null;
          timer = c.systemd.timers ? ${refreshUnit};
          path = map toString u.path;
          inherit settings;
        }
      ) (filterAttrs (n: u: lib.hasPrefix "knotless-run" n && !lib.hasSuffix "-kubeconfig" n) services);
    };

  # Whether evaluating the configuration fails (a type error, for example).
  fails =
    cfg:
    !(builtins.tryEval (builtins.deepSeq (scenario withCommand cfg).service true)).success;
in
{
  scenarios = {
    docs = scenario withCommand docs;
    deploy = scenario withCommand deploy;
    deploy-docker = scenario withCommand (deployExecutor "docker");
    deploy-shell = scenario withCommand (deployExecutor "shell");
    deploy-output = scenario withLive deployOutput;
    deploy-instance = scenario withCommand (deployInstance "kubernetes");
    deploy-instance-docker = scenario withCommand (deployInstance "docker");
    deploy-instance-shell = scenario withCommand (deployInstance "shell");
    no-kubeconfig-command = scenario withoutCommand docs;
    docker = scenario withoutCommand (minimal {
      settings.executor = "docker";
      nixos.virtualisation.docker.enable = true;
    });
    # Docker enabled nowhere; Podman with its Docker socket, or through
    # DOCKER_HOST; a daemon elsewhere.
    docker-nothing = scenario withoutCommand (minimal { settings.executor = "docker"; });
    docker-podman-alone = scenario withoutCommand (minimal {
      settings.executor = "docker";
      nixos.virtualisation.podman.enable = true;
    });
    docker-podman-socket = scenario withoutCommand (minimal {
      settings.executor = "docker";
      nixos.virtualisation.podman = {
        enable = true;
        dockerSocket.enable = true;
      };
    });
    docker-podman-host = scenario withoutCommand (minimal {
      settings.executor = "docker";
      environment.DOCKER_HOST = "unix:///run/podman/podman.sock";
      nixos.virtualisation.podman.enable = true;
    });
    docker-remote = scenario withoutCommand (minimal {
      settings.executor = "docker";
      settings."docker-host" = "tcp://docker.example.com:2376";
    });
    # The peers' conveniences: user, group, extra groups, environment,
    # overrides of the unit, the firewall, a kubeconfig credential.
    own-user = scenario withCommand (
      docs
      // {
        user = "ci";
        group = "ci-group";
        extraGroups = [ "ci-data" ];
      }
    );
    environment = scenario withoutCommand (kube {
      environment = {
        GOMAXPROCS = "4";
        HTTPS_PROXY = "http://proxy.example.com:3128";
        # A path value: its store copy.
        STUBS = ./nixos-stubs.nix;
      };
    });
    # Rendered into tests/nix/golden/knotless-run.podman.service: the
    # docker executor on Podman, as another user, with the conveniences.
    podman = scenario withoutCommand (minimal {
      settings.executor = "docker";
      user = "ci";
      group = "ci";
      extraGroups = [ "ci-data" ];
      environment = {
        DOCKER_HOST = "unix:///run/podman/podman.sock";
        HTTPS_PROXY = "http://proxy.example.com:3128";
      };
      serviceOverrides = {
        CPUQuota = "200%";
        ProtectHome = "read-only";
      };
      nixos.virtualisation.podman.enable = true;
    });
    environment-path = scenario withoutCommand (kube { environment.PATH = "/usr/bin"; });
    # With the refresh unit, which the overrides leave alone.
    overrides = scenario withCommand (
      docs
      // {
        serviceOverrides = {
          Restart = "on-failure";
          ProtectHome = "read-only";
          RestrictAddressFamilies = [ "AF_UNIX" ];
          CPUQuota = "200%";
        };
      }
    );
    firewall = scenario withLive (
      kube {
        metrics = {
          enable = true;
          listen = "[::]:9100";
          openFirewall = true;
        };
        liveOutput = {
          listen = "0.0.0.0:8788";
          openFirewall = true;
        };
      }
      // {
        package = withLive // {
          hasMetricsListen = true;
        };
        outputService = {
          enable = true;
          listen = "[::]:8789";
          openFirewall = true;
          serviceDid = "did:web:output.example.com";
          runners = [ "did:plc:7u2ld3ffgzqvezmv6wxgxiix" ];
        };
      }
    );
    firewall-loopback = scenario withLive (
      kube {
        metrics = {
          enable = true;
          openFirewall = true;
        };
        liveOutput.openFirewall = true;
      }
      // {
        package = withLive // {
          hasMetricsListen = true;
        };
        outputService = {
          enable = true;
          openFirewall = true;
          serviceDid = "did:web:output.example.com";
          runners = [ "did:plc:7u2ld3ffgzqvezmv6wxgxiix" ];
        };
      }
    );
    firewall-metrics-off = scenario withoutCommand (kube { metrics.openFirewall = true; });
    kubeconfig-credential = scenario withoutCommand (minimal { kubeconfigFile = "/etc/rancher/k3s/k3s.yaml"; });
    kubeconfig-credential-and-refresh = scenario withCommand (docs // { kubeconfigFile = "/etc/rancher/k3s/k3s.yaml"; });
    kubeconfig-credential-and-setting = scenario withoutCommand (kube { kubeconfigFile = "/etc/rancher/k3s/k3s.yaml"; });
    token-short = scenario withCommand (docs // { kubeconfigRefresh = docs.kubeconfigRefresh // { duration = "9m"; interval = "5m"; }; });
    token-under-interval = scenario withCommand (docs // { kubeconfigRefresh = docs.kubeconfigRefresh // { duration = "12h"; }; });
    token-calendar = scenario withCommand (
      docs // { kubeconfigRefresh = docs.kubeconfigRefresh // { interval = "Mon *-*-* 03:00:00"; }; }
    );
    shared-user = scenario withCommand (
      withInstances
      // {
        instances = withInstances.instances // {
          beta = withInstances.instances.beta // { user = "knotless"; };
        };
      }
    );
    shell = scenario withoutCommand (minimal {
      settings.executor = "shell";
      extraPackages = [ (stubPackage "nodejs" { }) ];
    });
    no-app-password = scenario withoutCommand (
      kube { }
      // {
        appPasswordFile = null;
      }
    );
    nothing = scenario withoutCommand { enable = true; };
    no-did = scenario withoutCommand (kube { settings.did = null; });
    did-in-args = scenario withoutCommand (
      kube {
        settings.did = null;
        extraArgs = [ "--did=\${RUNNER_DID}" ];
      }
    );
    no-repos = scenario withoutCommand (kube { } // { repos = [ ]; });
    discover = scenario withoutCommand (kube { settings.discover = true; } // { repos = [ ]; });
    repo-in-args = scenario withoutCommand (
      kube { extraArgs = [ "\${REPO}" ]; }
      // {
        repos = [ ];
      }
    );
    kube-nothing = scenario withoutCommand (minimal { });
    kube-in-cluster = scenario withoutCommand (minimal { inCluster = true; });
    instances = scenario withCommand withInstances;
    shared-output = scenario withCommand (
      withInstances
      // {
        instances = withInstances.instances // {
          alpha = withInstances.instances.alpha // {
            kubeconfigRefresh = withInstances.instances.alpha.kubeconfigRefresh // {
              output = "/var/lib/knotless/kubeconfig";
            };
          };
        };
      }
    );
    bad-instance-name = scenario withoutCommand (
      kube { }
      // {
        instances.x-kubeconfig = kube { };
      }
    );
    odd-interval = scenario withCommand (
      docs // { kubeconfigRefresh = docs.kubeconfigRefresh // { interval = "7h"; }; }
    );
    env-args = scenario withoutCommand (kube {
      extraArgs = [
        "--did=\${RUNNER_DID}"
        "--poll=50%"
      ];
    });
    # The older, unbound push credential fails evaluation, saying what
    # to write.
    push-credential-file = scenario withoutCommand (kube {
      settings.queue = true;
      pushCredentialFile = "/run/secrets/knotless-run/push-key";
    });
    metrics = scenario withMetrics (kube { metrics.enable = true; });
    metrics-listen = scenario withMetrics (kube {
      metrics = {
        enable = true;
        listen = "[::]:9100";
      };
    });
    metrics-unsupported = scenario withoutCommand (kube { metrics.enable = true; });
    # Live output: the runner's listener and an output service.
    live = scenario withLive (kube {
      liveOutput = {
        listen = "127.0.0.1:8788";
        publicUrl = "https://ci.example.com";
        service = "https://output.example.com";
        serviceDid = "did:web:output.example.com";
      };
    });
    live-unsupported = scenario withoutCommand (kube { liveOutput.listen = "127.0.0.1:8788"; });
    live-no-service-did = scenario withLive (kube { liveOutput.service = "https://output.example.com"; });
    live-public-url-alone = scenario withLive (kube { liveOutput.publicUrl = "https://ci.example.com"; });
    # The output service beside a runner (tests/nix/golden/knotless-output.service).
    output-service = scenario withLive (
      kube { }
      // {
        outputService = {
          enable = true;
          serviceDid = "did:web:output.example.com";
          runners = [
            "did:plc:7u2ld3ffgzqvezmv6wxgxiix"
            "did:plc:ewvi7nxzyoun6zhxrhs64oiz"
          ];
          plcUrl = "https://plc.example.com";
          extraArgs = [ "--max-subscribers=100" ];
        };
      }
    );
    output-service-incomplete = scenario withLive (kube { } // { outputService.enable = true; });
    output-service-unsupported = scenario withoutCommand (
      kube { }
      // {
        outputService = {
          enable = true;
          serviceDid = "did:web:output.example.com";
          runners = [ "did:plc:7u2ld3ffgzqvezmv6wxgxiix" ];
        };
      }
    );
    output-service-instance-clash = scenario withLive (
      kube { }
      // {
        instances.output = kube { };
        outputService = {
          enable = true;
          serviceDid = "did:web:output.example.com";
          runners = [ "did:plc:7u2ld3ffgzqvezmv6wxgxiix" ];
        };
      }
    );
    minutes = scenario withCommand (
      docs // { kubeconfigRefresh = docs.kubeconfigRefresh // { interval = "30m"; }; }
    );
    # The refresh mints a policy that allows what the runner builds.
    refresh-policy = scenario withCommand (
      docs
      // {
        settings = docs.settings // {
          "allow-root-steps" = true;
          "image-pull-secret" = [
            "ci-pull=registry.example/team/*"
            "ci-pull=registry.example/other/*,untrusted"
            "mirror-pull=mirror.example/*"
          ];
        };
      }
    );
    # Replicas (serve --replicas): the host's name, or one given, and
    # the sealing key as a credential copied into the state directory.
    replicas = scenario withReplicas (kube { replicas.enable = true; });
    replicas-named = scenario withReplicas (kube {
      replicas = {
        enable = true;
        name = "ci-2";
        sealingKeyFile = "/run/secrets/knotless-run/secrets-key.json";
      };
    });
    replicas-no-host-name = scenario withReplicas (kube {
      replicas.enable = true;
      nixos.networking.hostName = "";
    });
    replicas-shell = scenario withReplicas (minimal {
      settings.executor = "shell";
      replicas.enable = true;
    });
    replicas-queue = scenario withReplicas (kube {
      settings.queue = true;
      replicas.enable = true;
    });
    replicas-warm-pods = scenario withReplicas (kube {
      settings."warm-pods" = 2;
      replicas.enable = true;
    });
    replicas-key-alone = scenario withReplicas (kube { replicas.sealingKeyFile = "/run/secrets/knotless-run/secrets-key.json"; });
    replicas-unsupported = scenario withoutCommand (kube { replicas.enable = true; });
    egress = scenario withoutCommand (kube {
      settings.egress = "deny";
      settings."egress-untrusted" = "allow-dns";
    });
  };

  # The options as the NixOS manual renders them (optionAttrSetToDocList,
  # as nixos/lib/make-options-doc does): names, descriptions, defaults.
  optionDocs = map (o: {
    inherit (o) name;
    description = o.description or "";
    default = o.default or null;
  }) (lib.filter (o: lib.hasPrefix "services.knotless-run" o.name && o.visible && !o.internal) (lib.optionAttrSetToDocList (eval withCommand { }).options));

  # Every refresh interval of these forms: the OnCalendar= the module
  # gives it, or null where an assertion refuses it. check.sh has the
  # host's systemd-analyze parse each accepted one.
  intervals =
    lib.genAttrs
      (
        map (n: "${toString n}h") (lib.range 1 25 ++ [ 48 ])
        ++ map (n: "${toString n}m") (lib.range 1 61 ++ [ 90 120 ])
        ++ [
          "30min"
          "daily"
          "hourly"
          "*-*-* 03:00:00"
          "1d"
          "90s"
          "0h"
        ]
      )
      (
        i:
        let
          # A token outlasting every interval: only the calendar decides.
          sc = scenario withCommand (
            docs
            // {
              kubeconfigRefresh = docs.kubeconfigRefresh // {
                interval = i;
                duration = "1000h";
              };
            }
          );
        in
        if lib.any (lib.hasInfix ".interval") sc.failedAssertions then null else sc.timer.OnCalendar
      );

  # Whether the token-lifetime assertion lets each duration and interval
  # pass: { "DURATION INTERVAL" = bool; }.
  tokenLifetimes =
    lib.listToAttrs (
      map
        (
          x:
          let
            sc = scenario withCommand (
              docs
              // {
                kubeconfigRefresh = docs.kubeconfigRefresh // {
                  duration = lib.head x;
                  interval = lib.last x;
                };
              }
            );
          in
          lib.nameValuePair "${lib.head x} ${lib.last x}" (!lib.any (lib.hasInfix ".duration") sc.failedAssertions)
        )
        [
          [ "24h" "12h" ]
          [ "24h" "24h" ]
          [ "25h" "daily" ]
          [ "24h" "daily" ]
          [ "24h" "*-*-* 03:00:00" ]
          [ "169h" "weekly" ]
          [ "168h" "weekly" ]
          [ "2h" "*-*-* 00/1:00:00" ]
          [ "1h" "*-*-* 00/1:00:00" ]
          [ "10m" "5m" ]
          [ "9m59s" "1m" ]
          [ "599s" "1m" ]
          [ "600s" "1m" ]
          [ "31m" "30min" ]
          [ "30m" "*-*-* *:00/30:00" ]
        ]
    );

  # Both environment options, in order.
  environmentFiles =
    (scenario withoutCommand (
      kube {
        environmentFile = "/run/secrets/knotless-run/env";
        environmentFiles = [
          "/run/secrets/knotless-run/more"
          "/etc/knotless-run/site.env"
        ];
      }
    )).service.EnvironmentFile;

  stopWait = lib.genAttrs [ "1h30m" "90s" "1.5m" "500ms" "0" "2h45m10s" ] (
    d: (scenario withoutCommand (kube { settings."stop-wait" = d; })).service.TimeoutStopSec
  );

  rejected = {
    storeAppPassword = fails (minimal {
      appPasswordFile = "/nix/store/00000000000000000000000000000000-app-password";
    });
    pathLiteralSecrets = fails (minimal { secretsFile = ./eval.nix; });
    relativeEnvironmentFile = fails (minimal { environmentFile = "secrets/env"; });
    badStopWait = fails (minimal { settings."stop-wait" = "10 minutes"; });
    badExecutor = fails (minimal { settings.executor = "podman"; });
    stateDirSet = fails (minimal { settings."state-dir" = "/srv/knotless"; });
    badReplicaName = fails (minimal {
      replicas = {
        enable = true;
        name = "-ci";
      };
    });
    storeSealingKey = fails (minimal { replicas.sealingKeyFile = ./eval.nix; });
    badEgressUntrusted = fails (minimal { settings."egress-untrusted" = "everything"; });
  };
}
