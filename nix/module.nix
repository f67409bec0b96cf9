# services.knotless-run: the knotless CI runner as a NixOS service.
#
# The daemon reads its settings from one JSON file in the store (keys are
# the long flag names of `knotless-run serve`); secrets never go there:
# they reach the daemon as systemd credentials in $CREDENTIALS_DIRECTORY.
{
  config,
  lib,
  pkgs,
  ...
}:

let
  inherit (lib)
    concatMapStringsSep
    concatStringsSep
    elemAt
    getExe
    hasPrefix
    literalExpression
    mapAttrs
    mkDefault
    mkEnableOption
    mkIf
    mkMerge
    mkOption
    mkPackageOption
    optional
    optionals
    types
    ;

  cfg = config.services.knotless-run;
  refresh = cfg.kubeconfigRefresh;

  stateDir = "/var/lib/knotless";
  cacheDir = "/var/cache/knotless";
  user = "knotless";

  settingsFormat = pkgs.formats.json { };

  # A file that holds a secret: an absolute path given as a string, never a
  # Nix path value, which would be copied into the world-readable store.
  secretPath = types.pathWith {
    inStore = false;
    absolute = true;
  };

  # A Go duration (time.ParseDuration): "90s", "10m", "1h30m", "1.5h".
  goDuration = types.strMatching "0|([0-9]+(\\.[0-9]*)?(ns|us|µs|ms|h|m|s))+";

  # durationSeconds "1h30m" == 5400: a Go duration in whole seconds, rounded up.
  durationSeconds =
    s:
    let
      unit = {
        ns = 1.0e-9;
        us = 1.0e-6;
        "µs" = 1.0e-6;
        ms = 1.0e-3;
        s = 1;
        m = 60;
        h = 3600;
      };
      sum =
        rest: acc:
        if rest == "" then
          acc
        else
          let
            m = builtins.match "([0-9]+)(\\.[0-9]*)?(ns|us|µs|ms|h|m|s)(.*)" rest;
            frac = elemAt m 1;
            value =
              lib.toIntBase10 (elemAt m 0)
              + (if frac == null || frac == "." then 0 else builtins.fromJSON "0${frac}");
          in
          if m == null then
            throw "knotless-run: ${s} is not a Go duration"
          else
            sum (elemAt m 3) (acc + value * unit.${elemAt m 2});
    in
    if s == "0" then 0 else builtins.ceil (sum s 0);

  # The refresh interval as an OnCalendar= expression: a realtime timer,
  # so a suspended or powered-off machine catches up at once (Persistent=)
  # instead of letting a 24 h token run out, as a monotonic timer would.
  # "12h" becomes "*-*-* 00/12:00:00"; anything else is taken as a calendar
  # expression already.
  intervalParts = builtins.match "([0-9]+)(h|m|min)" refresh.interval;
  intervalCalendar =
    if intervalParts == null then
      refresh.interval
    else
      let
        n = lib.toIntBase10 (elemAt intervalParts 0);
        hours = elemAt intervalParts 1 == "h";
      in
      if hours && n > 0 && lib.mod 24 n == 0 then
        "*-*-* 00/${toString n}:00:00"
      else if !hours && n > 0 && lib.mod 60 n == 0 then
        "*-*-* *:00/${toString n}:00"
      else
        null;

  # What systemd needs to see an argument of ExecStart= as one word, with no
  # specifier (%) inside it; `$` is escaped too unless the argument is meant
  # to take ''${NAME} from the environment (extraArgs).
  quoteExecArg =
    s: if builtins.match "[][A-Za-z0-9_./:@=,+-]+" s != null then s else builtins.toJSON s;
  escapeExecArg = arg: quoteExecArg (lib.replaceStrings [ "%" "$" ] [ "%%" "$$" ] (toString arg));
  escapeExecArgKeepVars = arg: quoteExecArg (lib.replaceStrings [ "%" ] [ "%%" ] (toString arg));
  execLine = args: concatMapStringsSep " " escapeExecArg args;

  settings = lib.filterAttrs (_: v: v != null) cfg.settings;
  configFile = settingsFormat.generate "knotless-run.json" settings;

  executor = if cfg.settings.executor == "kube" then "kubernetes" else cfg.settings.executor;

  # Started runs get stop-wait to finish after SIGTERM; systemd waits that
  # long plus a margin before it kills what is left.
  stopMargin = 30;
  timeoutStopSec = durationSeconds cfg.settings."stop-wait" + stopMargin;

  # Hardening shared by both units, each overridable (mkDefault). The shell
  # executor's steps are ordinary processes of this unit: they get a wider
  # system call filter and may map writable memory executable (JITs).
  hardening = mapAttrs (_: mkDefault) {
    NoNewPrivileges = true;
    ProtectSystem = "strict";
    ProtectHome = true;
    PrivateTmp = true;
    PrivateDevices = true;
    DevicePolicy = "closed";
    # A user namespace hides the docker group's id: off for the docker executor.
    PrivateUsers = executor != "docker";
    ProtectHostname = true;
    ProtectClock = true;
    ProtectKernelTunables = true;
    ProtectKernelModules = true;
    ProtectKernelLogs = true;
    ProtectControlGroups = true;
    ProtectProc = "invisible";
    ProcSubset = "pid";
    RestrictAddressFamilies = [
      "AF_UNIX"
      "AF_INET"
      "AF_INET6"
    ];
    RestrictNamespaces = true;
    RestrictRealtime = true;
    RestrictSUIDSGID = true;
    RemoveIPC = true;
    LockPersonality = true;
    MemoryDenyWriteExecute = executor != "shell";
    SystemCallArchitectures = "native";
    SystemCallFilter =
      [ "@system-service" ]
      ++ optionals (executor != "shell") [
        "~@privileged"
        "~@resources"
      ];
    SystemCallErrorNumber = "EPERM";
    CapabilityBoundingSet = "";
    AmbientCapabilities = "";
    UMask = "0077";
  };

  refreshUnit = "knotless-run-kubeconfig";
  refreshTemp = "${refresh.output}.new";
in
{
  options.services.knotless-run = {
    enable = mkEnableOption "knotless-run, the CI runner of knotless";

    package =
      mkPackageOption
        {
          # Outside this flake's overlay, build the package from this
          # repository with the system's nixpkgs.
          knotless-run = pkgs.knotless-run or (pkgs.callPackage ./package.nix { });
        }
        "knotless-run"
        {
          pkgsText = "pkgs";
          extraDescription = ''
            Where `pkgs` has no `knotless-run`, the default builds this
            repository's nix/package.nix with the system's nixpkgs, which
            must ship Go 1.26.
          '';
        };

    settings = mkOption {
      description = ''
        Settings of `knotless-run serve`, written to a JSON file in the store
        and passed with `--config`. Keys are the command's long flag names;
        see `knotless-run serve --help`. Secrets do not belong here: use
        {option}`appPasswordFile`, {option}`secretsFile` or
        {option}`environmentFile`.
      '';
      default = { };
      example = literalExpression ''
        {
          executor = "kubernetes";
          namespace = "ci";
          did = "did:plc:7u2ld3ffgzqvezmv6wxgxiix";
          pds = "https://pds.example.com";
          concurrency = 4;
          "stop-wait" = "20m";
          "log-level" = "debug";
        }
      '';
      type = types.submodule {
        freeformType = settingsFormat.type;
        options = {
          executor = mkOption {
            type = types.enum [
              "kubernetes"
              "kube"
              "docker"
              "shell"
            ];
            default = "kubernetes";
            description = ''
              Where runs execute: Kubernetes Jobs, Docker containers, or
              local processes of this service (trusted code only). Changing
              it is a rollback-safe settings change; the module adjusts the
              unit's sandbox to the executor.
            '';
          };

          namespace = mkOption {
            type = types.str;
            default = "knotless-runs";
            description = "Kubernetes namespace of the run Jobs.";
          };

          kubeconfig = mkOption {
            type = types.nullOr secretPath;
            default = if refresh.enable then refresh.output else null;
            defaultText = literalExpression ''
              if config.services.knotless-run.kubeconfigRefresh.enable
              then config.services.knotless-run.kubeconfigRefresh.output
              else null
            '';
            description = ''
              Kubeconfig of the cluster that runs the Jobs. It must be
              readable by the `${user}` user; the refresh timer
              ({option}`kubeconfigRefresh`) keeps a scoped one there.
            '';
          };

          did = mkOption {
            type = types.nullOr (types.strMatching "did:[a-z]+:.+");
            default = null;
            example = "did:plc:7u2ld3ffgzqvezmv6wxgxiix";
            description = "DID of the runner's account.";
          };

          pds = mkOption {
            type = types.nullOr types.str;
            default = null;
            example = "https://pds.example.com";
            description = "URL of the PDS that hosts the runner's account.";
          };

          concurrency = mkOption {
            type = types.ints.positive;
            default = 1;
            description = "How many runs execute at once.";
          };

          "stop-wait" = mkOption {
            type = goDuration;
            default = "10m";
            example = "30m";
            description = ''
              How long started runs may take to finish after SIGTERM
              (waiting runs are dropped at once; the Kubernetes executor
              hands its runs over and exits without waiting). The unit's
              `TimeoutStopSec=` is this plus ${toString stopMargin} s.
            '';
          };

          "state-dir" = mkOption {
            type = types.str;
            default = stateDir;
            readOnly = true;
            description = "State directory; fixed, it is the unit's `StateDirectory=`.";
          };

          "cache-dir" = mkOption {
            type = types.str;
            default = cacheDir;
            readOnly = true;
            description = "Cache directory; fixed, it is the unit's `CacheDirectory=`.";
          };
        };
      };
    };

    repos = mkOption {
      type = types.listOf types.str;
      default = [ ];
      example = [ "did:plc:7u2ld3ffgzqvezmv6wxgxiix/hello" ];
      description = "Repositories to watch, passed as the positional arguments of `serve`.";
    };

    appPasswordFile = mkOption {
      type = types.nullOr secretPath;
      default = null;
      example = "/run/secrets/knotless-run/app-password";
      description = ''
        File holding the app password of the runner's account. systemd
        hands it to the daemon as the credential `app-password`; it never
        enters the store or the unit file.
      '';
    };

    secretsFile = mkOption {
      type = types.nullOr secretPath;
      default = null;
      example = "/run/secrets/knotless-run/secrets.json";
      description = ''
        JSON object of secret name to value that workflows may be granted,
        handed to the daemon as the credential `secrets`.
      '';
    };

    environmentFile = mkOption {
      type = types.nullOr secretPath;
      default = null;
      example = "/run/secrets/knotless-run/env";
      description = ''
        `EnvironmentFile=` of the daemon, for values known only on the host
        (see {manpage}`systemd.exec(5)`).
      '';
    };

    extraArgs = mkOption {
      type = types.listOf types.str;
      default = [ ];
      example = [
        "--did=\${RUNNER_DID}"
        "\${REPO}"
      ];
      description = ''
        Extra arguments of `knotless-run serve`, each one word. systemd
        replaces `''${NAME}` in them with NAME from {option}`environmentFile`
        (write `$$` for a literal `$`): the way to pass values known only on
        the host, such as a DID made at install time.
      '';
    };

    kubeconfigRefresh = {
      enable = mkEnableOption ''
        a timer that mints the runner's kubeconfig from an admin kubeconfig:
        a service account token limited to the runs' namespace, valid for
        {option}`kubeconfigRefresh.duration`. Needs a knotless-run with the
        `kubeconfig` command'';

      adminKubeconfigFile = mkOption {
        type = types.nullOr secretPath;
        default = null;
        example = "/etc/rancher/k3s/k3s.yaml";
        description = ''
          Admin kubeconfig, handed to the refresh unit alone as the
          credential `admin-kubeconfig`; the runner never sees it.
        '';
      };

      interval = mkOption {
        type = types.str;
        default = "12h";
        example = "6h";
        description = ''
          How often to mint a new kubeconfig: hours or minutes that divide a
          day or an hour (`12h`, `30m`), or any systemd calendar expression.
          Keep it well under {option}`kubeconfigRefresh.duration`.
        '';
      };

      output = mkOption {
        type = secretPath;
        default = "${stateDir}/kubeconfig";
        description = ''
          Where the kubeconfig is written (mode 0600, owner `${user}`,
          replaced atomically).
        '';
      };

      namespace = mkOption {
        type = types.str;
        default = cfg.settings.namespace;
        defaultText = literalExpression "config.services.knotless-run.settings.namespace";
        description = "Namespace the minted credentials are limited to.";
      };

      serviceAccount = mkOption {
        type = types.str;
        default = "knotless-runner";
        description = "Service account whose token the kubeconfig carries.";
      };

      duration = mkOption {
        type = goDuration;
        default = "24h";
        description = "Lifetime of each minted token.";
      };
    };
  };

  config = mkIf cfg.enable {
    assertions = [
      {
        assertion = cfg.appPasswordFile != null;
        message = "services.knotless-run.appPasswordFile must be set: the runner signs in to its PDS with that app password.";
      }
      {
        assertion = refresh.enable -> (cfg.package.hasKubeconfigCommand or false);
        message = "services.knotless-run.kubeconfigRefresh needs a knotless-run with the kubeconfig command (issue 7)";
      }
      {
        assertion = refresh.enable -> refresh.adminKubeconfigFile != null;
        message = "services.knotless-run.kubeconfigRefresh.adminKubeconfigFile must be set when the refresh timer is enabled.";
      }
      {
        assertion = refresh.enable -> intervalCalendar != null;
        message = "services.knotless-run.kubeconfigRefresh.interval = \"${refresh.interval}\" does not divide a day (hours) or an hour (minutes); give a calendar expression instead.";
      }
      {
        assertion = refresh.enable -> executor == "kubernetes";
        message = "services.knotless-run.kubeconfigRefresh is for the kubernetes executor; settings.executor is ${executor}.";
      }
    ];

    users.users.${user} = {
      isSystemUser = true;
      group = user;
      home = stateDir;
      description = "knotless-run daemon";
    };
    users.groups.${user} = { };

    systemd.services.knotless-run = {
      description = "knotless-run CI runner";
      wantedBy = [ "multi-user.target" ];
      wants =
        [ "network-online.target" ]
        ++ optional refresh.enable "${refreshUnit}.service"
        ++ optional (executor == "docker") "docker.service";
      after =
        [ "network-online.target" ]
        ++ optional refresh.enable "${refreshUnit}.service"
        ++ optional (executor == "docker") "docker.service";

      # The daemon mirrors repositories with git.
      path = [ pkgs.git ];

      # A restart is a handover: the old daemon finishes or hands over its
      # started runs on SIGTERM and the new one adopts them, so a switch
      # that changes the unit loses no run.
      restartIfChanged = true;

      serviceConfig = mkMerge [
        {
          Type = "notify";
          NotifyAccess = "main";
          ExecStart = concatStringsSep " " (
            [
              (execLine [
                (getExe cfg.package)
                "serve"
                "--config"
                configFile
              ])
            ]
            ++ map escapeExecArgKeepVars cfg.extraArgs
            ++ optional (cfg.repos != [ ]) (execLine ([ "--" ] ++ cfg.repos))
          );
          Restart = "always";
          RestartSec = "5s";
          # The daemon pings at half this interval.
          WatchdogSec = mkDefault "2min";
          # SIGTERM to the daemon alone: the steps it started keep running
          # while it finishes them; whatever is left when it exits or when
          # TimeoutStopSec= runs out gets SIGKILL.
          KillSignal = "SIGTERM";
          KillMode = "mixed";
          TimeoutStopSec = toString timeoutStopSec;

          User = user;
          Group = user;
          StateDirectory = "knotless";
          StateDirectoryMode = "0700";
          CacheDirectory = "knotless";
          CacheDirectoryMode = "0700";
          WorkingDirectory = stateDir;

          LoadCredential =
            optional (cfg.appPasswordFile != null) "app-password:${toString cfg.appPasswordFile}"
            ++ optional (cfg.secretsFile != null) "secrets:${toString cfg.secretsFile}";
          EnvironmentFile = optional (cfg.environmentFile != null) (toString cfg.environmentFile);

          StandardOutput = "journal";
          StandardError = "journal";
          SyslogIdentifier = "knotless-run";
        }
        (mkIf (executor == "docker") {
          SupplementaryGroups = [ "docker" ];
        })
        hardening
      ];
    };

    systemd.services.${refreshUnit} = mkIf refresh.enable {
      description = "Mint the scoped kubeconfig of knotless-run";
      wants = [ "network-online.target" ];
      after = [ "network-online.target" ] ++ optional (config.services.k3s.enable or false) "k3s.service";
      restartIfChanged = false;

      serviceConfig = mkMerge [
        {
          Type = "oneshot";
          # Written beside the target, then renamed over it: the runner sees
          # the old file or the new one, never half of one.
          # %d is systemd's credentials directory: left unescaped.
          ExecStart = execLine [
            (getExe cfg.package)
            "kubeconfig"
          ]
          + " --admin-kubeconfig %d/admin-kubeconfig "
          + execLine [
            "--out"
            refreshTemp
            "--namespace"
            refresh.namespace
            "--service-account"
            refresh.serviceAccount
            "--duration"
            refresh.duration
          ];
          ExecStartPost = execLine [
            "${pkgs.coreutils}/bin/mv"
            "-fT"
            refreshTemp
            refresh.output
          ];
          # The API server may still be starting at boot.
          Restart = "on-failure";
          RestartSec = "30s";

          User = user;
          Group = user;
          StateDirectory = "knotless";
          StateDirectoryMode = "0700";
          LoadCredential = optional (
            refresh.adminKubeconfigFile != null
          ) "admin-kubeconfig:${toString refresh.adminKubeconfigFile}";

          StandardOutput = "journal";
          StandardError = "journal";
          SyslogIdentifier = refreshUnit;
        }
        (mkIf (!hasPrefix "${stateDir}/" refresh.output) {
          ReadWritePaths = [ (dirOf refresh.output) ];
        })
        hardening
      ];
    };

    systemd.timers.${refreshUnit} = mkIf refresh.enable {
      description = "Refresh the scoped kubeconfig of knotless-run";
      wantedBy = [ "timers.target" ];
      timerConfig = {
        OnCalendar = if intervalCalendar == null then refresh.interval else intervalCalendar;
        Persistent = true;
        RandomizedDelaySec = mkDefault "5min";
      };
    };
  };
}
