# services.knotless-run: the knotless CI runner as a NixOS service, and
# services.knotless-run.instances.<name> for more runners on one host.
#
# The daemon reads its settings from one JSON file in the store (keys are
# the long flag names of `knotless-run serve`); secrets never go there:
# they reach the daemon as systemd credentials in $CREDENTIALS_DIRECTORY.
#
# Each runner (the default one and every instance) has its own user,
# state and cache directories, units and refresh timer: they share nothing
# writable. The default runner is `knotless-run.service`, user `knotless`,
# /var/lib/knotless; instance NAME is `knotless-run-NAME.service`, user
# `knotless-NAME`, /var/lib/knotless-NAME (`user` names another; two
# runners with one user are refused).
{
  config,
  lib,
  pkgs,
  ...
}:

let
  inherit (lib)
    any
    attrNames
    concatMapStringsSep
    concatStringsSep
    elemAt
    filterAttrs
    getExe
    hasPrefix
    hasSuffix
    literalExpression
    mapAttrs
    mapAttrsToList
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

  # The default replica name (services.knotless-run.replicas.name): the
  # runner submodules' own `config` hides the host's.
  hostName = config.networking.hostName or "";

  # The names of a runner: instance null is the default runner.
  names =
    instance:
    let
      suffix = if instance == null then "" else "-${instance}";
    in
    rec {
      unit = "knotless-run${suffix}";
      refreshUnit = "${unit}-kubeconfig";
      user = "knotless${suffix}";
      dir = "knotless${suffix}";
      stateDir = "/var/lib/${dir}";
      cacheDir = "/var/cache/${dir}";
      # Where the options live, for messages and option docs.
      option = if instance == null then "services.knotless-run" else "services.knotless-run.instances.${instance}";
    };

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
  # "12h" becomes "*-*-* 00/12:00:00", "24h" "*-*-* 00:00:00", "30m"
  # "*-*-* *:00/30:00", "60m" "*-*-* *:00:00" (systemd refuses a repetition
  # of a whole day or hour: 00/24, 00/60); anything that does not start
  # with a number is taken as a calendar expression already. null (refused
  # by an assertion) for other durations: hours that do not divide a day,
  # minutes that do not divide an hour, other units ("1d", "90s").
  intervalCalendar =
    interval:
    let
      parts = builtins.match "([0-9]+)(h|m|min)" interval;
      n = lib.toIntBase10 (elemAt parts 0);
      hours = elemAt parts 1 == "h";
    in
    if parts == null then
      (if builtins.match "[0-9].*" interval != null then null else interval)
    else if hours && n == 24 then
      "*-*-* 00:00:00"
    else if hours && n > 0 && n < 24 && lib.mod 24 n == 0 then
      "*-*-* 00/${toString n}:00:00"
    else if !hours && n == 60 then
      "*-*-* *:00:00"
    else if !hours && n > 0 && n < 60 && lib.mod 60 n == 0 then
      "*-*-* *:00/${toString n}:00"
    else
      null;

  # How long one refresh interval is, in seconds, for the forms the module
  # can read: the durations above, systemd's named calendar shorthands,
  # the calendars intervalCalendar makes, and a fixed time of day
  # ("*-*-* 03:00:00", daily). null for any other calendar expression.
  intervalSeconds =
    interval:
    let
      parts = builtins.match "([0-9]+)(h|m|min)" interval;
      hourly = builtins.match "\\*-\\*-\\* 00/([0-9]+):00:00" interval;
      minutely = builtins.match "\\*-\\*-\\* \\*:00/([0-9]+):00" interval;
      named = {
        minutely = 60;
        hourly = 3600;
        daily = 86400;
        weekly = 7 * 86400;
        monthly = 31 * 86400;
        quarterly = 92 * 86400;
        semiannually = 184 * 86400;
        yearly = 366 * 86400;
        annually = 366 * 86400;
      };
      num = m: lib.toIntBase10 (lib.head m);
    in
    if parts != null then
      num parts * (if elemAt parts 1 == "h" then 3600 else 60)
    else if named ? ${interval} then
      named.${interval}
    else if hourly != null then
      num hourly * 3600
    else if minutely != null then
      num minutely * 60
    else if builtins.match "\\*-\\*-\\* [0-9]+:[0-9]+(:[0-9]+)?" interval != null then
      86400
    else
      null;

  # The TCP port of a listen address (HOST:PORT, [V6]:PORT), and whether
  # the address is loopback only, where opening the firewall reaches nobody.
  listenPort =
    listen:
    let
      m = builtins.match ".*:([0-9]+)" listen;
    in
    if m == null then null else lib.toIntBase10 (lib.head m);
  loopbackListen =
    listen: builtins.match "(127\\.[0-9.]+|\\[::1]|localhost):[0-9]+" listen != null;

  # What systemd needs to see an argument of ExecStart= as one word, with no
  # specifier (%) inside it; `$` is escaped too unless the argument is meant
  # to take ''${NAME} from the environment (extraArgs).
  quoteExecArg =
    s: if builtins.match "[][A-Za-z0-9_./:@=,+-]+" s != null then s else builtins.toJSON s;
  escapeExecArg = arg: quoteExecArg (lib.replaceStrings [ "%" "$" ] [ "%%" "$$" ] (toString arg));
  escapeExecArgKeepVars = arg: quoteExecArg (lib.replaceStrings [ "%" ] [ "%%" ] (toString arg));
  execLine = args: concatMapStringsSep " " escapeExecArg args;

  # Started runs get stop-wait to finish after SIGTERM; systemd waits that
  # long plus a margin before it kills what is left.
  stopMargin = 30;

  # The Kubernetes executor's egress modes (--egress, --egress-untrusted).
  egressModes = [
    "open"
    "public"
    "deny"
    "allow-dns"
  ];

  # The admission policy the refresh installs must allow what the runner
  # builds: root steps need the namespace's baseline level, and each pull
  # Secret of --image-pull-secret NAME=PATTERN must be named to it.
  refreshPolicyArgs =
    icfg:
    let
      pullSecrets = icfg.settings."image-pull-secret" or [ ];
      names = lib.unique (map (v: builtins.head (lib.splitString "=" v)) pullSecrets);
      args =
        optionals (icfg.settings."allow-root-steps" or false) [
          "--pod-security"
          "baseline"
        ]
        ++ lib.concatMap (n: [
          "--allow-image-pull-secret"
          n
        ]) names;
    in
    lib.optionalString (args != [ ]) (" " + execLine args);

  executorOf = icfg: if icfg.settings.executor == "kube" then "kubernetes" else icfg.settings.executor;

  # Hardening shared by a runner's units, each overridable (mkDefault). The
  # shell executor's steps are ordinary processes of the runner's unit:
  # they get a wider system call filter and may map writable memory
  # executable (JITs). groups are the unit's SupplementaryGroups=;
  # extraFamilies are address families one unit needs beyond these.
  hardening =
    executor: groups: extraFamilies:
    mapAttrs (_: mkDefault) {
      NoNewPrivileges = true;
      ProtectSystem = "strict";
      ProtectHome = true;
      PrivateTmp = true;
      PrivateDevices = true;
      DevicePolicy = "closed";
      # A user namespace maps only root and the unit's user and group:
      # the docker group's id (and any other supplementary group's) would
      # be unmapped and its files refused. Off when the unit has any.
      PrivateUsers = groups == [ ];
      ProtectHostname = true;
      ProtectClock = true;
      ProtectKernelTunables = true;
      ProtectKernelModules = true;
      ProtectKernelLogs = true;
      ProtectControlGroups = true;
      ProtectProc = "invisible";
      ProcSubset = "pid";
      # AF_NETLINK: listing the host's addresses (--egress allow-dns
      # keeps DNS off them) is a netlink request.
      RestrictAddressFamilies = [
        "AF_UNIX"
        "AF_INET"
        "AF_INET6"
      ] ++ extraFamilies;
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

  # The options of one runner: the default one (instance = null, at
  # services.knotless-run) or instance NAME (services.knotless-run.instances.NAME).
  runnerModule =
    instance:
    { config, ... }:
    let
      n = names instance;
      # Option names in the docs, where the manual links them: an
      # instance's options are services.knotless-run.instances.<name>.*
      # (the module system's own placeholder, ‹name›, is no option name).
      opt =
        o: "${if instance == null then "services.knotless-run" else "services.knotless-run.instances.<name>"}.${o}";
      refresh = config.kubeconfigRefresh;
    in
    {
      options = {
        enable = mkEnableOption (
          if instance == null then
            "knotless-run, the CI runner of knotless"
          else
            "this knotless-run instance"
        );

        package =
          if instance == null then
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
                  Imported from the flake (`nixosModules.default`), the
                  default is the flake's own build of knotless-run. Otherwise,
                  where `pkgs` has no `knotless-run`, the default builds this
                  repository's nix/package.nix with the system's nixpkgs, which
                  must ship Go 1.26.
                '';
              }
          else
            mkOption {
              type = types.package;
              default = cfg.package;
              defaultText = literalExpression "config.services.knotless-run.package";
              description = "The knotless-run package of this instance.";
            };

        settings = mkOption {
          description = ''
            Settings of `knotless-run serve`, written to a JSON file in the store
            and passed with `--config`. Keys are the command's long flag names;
            see `knotless-run serve --help`. Secrets do not belong here: use
            {option}`${opt "appPasswordFile"}`, {option}`${opt "secretsFile"}` or
            {option}`${opt "environmentFile"}`.
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

              egress = mkOption {
                type = types.enum egressModes;
                default = "open";
                description = ''
                  What the run pods of trusted runs (the owner's pushes) may
                  send out (Kubernetes executor): `open` (as the cluster
                  allows), `public` (DNS and the public internet only),
                  `deny` (nothing) or `allow-dns` (DNS only). See
                  {option}`${opt "settings.egress-untrusted"}`.
                '';
              };

              "egress-untrusted" = mkOption {
                type = types.enum egressModes;
                default = "public";
                description = ''
                  What the run pods of untrusted runs (pulls, merge-queue
                  batches: strangers' code) may send out (Kubernetes
                  executor), one of the modes of
                  {option}`${opt "settings.egress"}`. `public` lets them
                  resolve names and reach the public internet, and nothing
                  else: no link-local address (cloud metadata), no private,
                  shared or loopback range (nodes, Services, your network),
                  not the API server, not this host, nor any `egress-block`
                  CIDR.
                '';
              };

              kubeconfig = mkOption {
                type = types.nullOr secretPath;
                default = if refresh.enable then refresh.output else null;
                defaultText = literalExpression ''
                  if config.${opt "kubeconfigRefresh.enable"}
                  then config.${opt "kubeconfigRefresh.output"}
                  else null
                '';
                description = ''
                  Kubeconfig of the cluster that runs the Jobs. It must be
                  readable by the runner's user; the refresh timer
                  ({option}`${opt "kubeconfigRefresh.enable"}`) keeps a scoped
                  one there.
                '';
              };

              did = mkOption {
                type = types.nullOr (types.strMatching "did:[a-z]+:.+");
                default = null;
                example = "did:plc:7u2ld3ffgzqvezmv6wxgxiix";
                description = ''
                  DID of the runner's account. Required, here or as
                  `--did=…` in {option}`${opt "extraArgs"}`.
                '';
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

              class = mkOption {
                type = types.nullOr (types.listOf types.str);
                default = null;
                example = [
                  "large:cpu=8,memory=16Gi,ephemeral-storage=50Gi,node-selector=pool=big"
                  "small:cpu=1,memory=2Gi,untrusted"
                  "default:ephemeral-storage=20Gi"
                ];
                description = ''
                  Resource classes a workflow names with `class:`, each
                  `NAME:KEY=VALUE,...` (`--class`): bounds `cpu`, `memory`,
                  `ephemeral-storage` (Kubernetes) and `pids` (Docker),
                  placement `node-selector=LABEL=VALUE` and
                  `toleration=KEY[=VALUE]:EFFECT` (Kubernetes), and
                  `untrusted` when pulls may name the class. The class
                  `default` is a run's that names none; without one here it
                  bounds only the disk, at 10Gi. A key the executor cannot
                  apply stops the daemon at start, naming the class.
                '';
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
                default = n.stateDir;
                readOnly = true;
                description = "State directory; fixed, it is the unit's `StateDirectory=`.";
              };

              "cache-dir" = mkOption {
                type = types.str;
                default = n.cacheDir;
                readOnly = true;
                description = ''
                  Cache directory; fixed, it is the unit's `CacheDirectory=`.
                  It holds the git mirrors, the run checkouts and, in
                  `caches/`, the workflow caches (bounded by `cache-max`,
                  `cache-max-total` and `disk-floor`; `knotless-run cache ls
                  --cache-dir` shows them).
                '';
              };
            };
          };
        };

        repos = mkOption {
          type = types.listOf types.str;
          default = [ ];
          example = [ "did:plc:7u2ld3ffgzqvezmv6wxgxiix/hello" ];
          description = ''
            Repositories to watch, passed as the positional arguments of
            `serve`. Some are required, unless `settings.discover` is true
            (or {option}`${opt "extraArgs"}` names them).
          '';
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

        pushCredentials = mkOption {
          type = types.listOf (
            types.submodule {
              options = {
                host = mkOption {
                  type = types.strMatching "((https|http|ssh)://)?[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?";
                  example = "git.example.org";
                  description = ''
                    The git host the credential is offered to, and no other:
                    a lower-case host name, with `:PORT` when it is not the
                    scheme's default. A token goes to `https://` URLs of it, a
                    key to `ssh` ones; write `http://HOST` to let a token go
                    over plaintext http.
                  '';
                };
                paths = mkOption {
                  type = types.listOf (types.strMatching "[A-Za-z0-9._~@+-]+(/[A-Za-z0-9._~@+-]+)*");
                  default = [ ];
                  example = [ "your-org" ];
                  description = ''
                    Path prefixes on `host`, in whole segments
                    (`your-org` is `your-org/…`, not `your-organisation/…`),
                    of the repositories the lander may push to with it; empty:
                    every repository on the host. A repository's source is its
                    owner's to write: on a host shared with others, name the
                    prefixes, or any owner naming this runner can have it push
                    wherever the token can write.
                  '';
                };
                file = mkOption {
                  type = secretPath;
                  example = "/run/secrets/knotless-run/push-token";
                  description = ''
                    An SSH private key, or an HTTPS token (`TOKEN` or
                    `USER:TOKEN` on its first line). systemd hands it to the
                    daemon as a credential; it never enters the store, the unit
                    file, an argv or the journal.
                  '';
                };
              };
            }
          );
          default = [ ];
          example = literalExpression ''
            [
              {
                host = "git.example.org";
                paths = [ "your-org" ];
                file = "/run/secrets/knotless-run/push-token";
              }
            ]
          '';
          description = ''
            What the merge queue's lander (`settings.queue = true`) pushes to
            repository sources with, each credential bound to a host (and
            path prefixes): it is offered to a push to that host (and under
            those paths) only, and a push anywhere else offers nothing and
            fails. Each becomes `--push-credential HOST[/PATH]=FILE`.
          '';
        };

        pushCredentialFile = mkOption {
          type = types.nullOr secretPath;
          default = null;
          visible = false;
          description = ''
            Replaced by {option}`${opt "pushCredentials"}`: a push credential
            bound to no host would be offered to whatever host a repository
            record names. Setting it fails evaluation, saying what to write.
          '';
        };

        environmentFile = mkOption {
          type = types.nullOr secretPath;
          default = null;
          example = "/run/secrets/knotless-run/env";
          description = ''
            `EnvironmentFile=` of the daemon, for values known only on the host
            (see {manpage}`systemd.exec(5)`). One file; for more, use
            {option}`${opt "environmentFiles"}` (this one is read first).
          '';
        };

        environmentFiles = mkOption {
          type = types.listOf secretPath;
          default = [ ];
          example = [
            "/run/secrets/knotless-run/env"
            "/etc/knotless-run/site.env"
          ];
          description = ''
            `EnvironmentFile=` lines of the daemon, in order (a later file's
            value wins), for values known only on the host; see
            {manpage}`systemd.exec(5)`.
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
            replaces `''${NAME}` in them with NAME from
            {option}`${opt "environmentFile"}` (write `$$` for a literal `$`):
            the way to pass values known only on the host, such as a DID made
            at install time.
          '';
        };

        extraPackages = mkOption {
          type = types.listOf types.package;
          default = [ ];
          example = literalExpression "with pkgs; [ bash coreutils gnumake nodejs ]";
          description = ''
            Packages on the runner's PATH. The shell executor's steps get that
            PATH, so these are the tools its workflows can call. git is always
            there: `serve` mirrors repositories with it. They come before
            {option}`${opt "hostPackages"}`, so a tool here wins.
          '';
        };

        hostPackages = mkOption {
          type = types.listOf types.package;
          default = with pkgs; [
            bash
            coreutils
            findutils
            diffutils
            gnused
            gnugrep
            gawk
            gnutar
            gzip
            bzip2
            xz
            gnumake
            gnupatch
          ];
          defaultText = literalExpression ''
            with pkgs; [
              bash coreutils findutils diffutils gnused gnugrep gawk
              gnutar gzip bzip2 xz gnumake gnupatch
            ]
          '';
          example = literalExpression "with pkgs; [ bash coreutils gnugrep ]";
          description = ''
            Packages on the PATH of the shell executor's steps (after git and
            {option}`${opt "extraPackages"}`), only when
            {option}`${opt "settings.executor"}` is `shell`: the default is the
            tools a Nix build's sandbox has (stdenv's). Other executors' steps
            run in their images, and these are not on their daemon's PATH.
          '';
        };

        environment = mkOption {
          type = types.attrsOf (
            types.oneOf [
              types.str
              types.path
              types.package
            ]
          );
          default = { };
          example = {
            DOCKER_HOST = "unix:///run/podman/podman.sock";
            GOMAXPROCS = "4";
          };
          description = ''
            Environment variables of the runner's unit (`Environment=`): the
            daemon's, e.g. `DOCKER_HOST` for the docker executor or a proxy.
            The shell executor's steps do not get them: a step's environment
            is PATH, its own HOME and TMPDIR, and LANG (workflows set the
            rest). The values are in the world-readable store: a secret
            belongs in {option}`${opt "environmentFile"}`. Not `PATH`: the
            module sets it from {option}`${opt "extraPackages"}` and
            {option}`${opt "hostPackages"}`.
          '';
        };

        user = mkOption {
          type = types.str;
          default = n.user;
          example = "ci";
          description = ''
            User the runner's units run as. The module creates the default
            user (${if instance == null then "`knotless`" else "`knotless-<name>`"}) as a system user; another must
            be declared elsewhere (`users.users`). The state and cache
            directories are made its own.
          '';
        };

        group = mkOption {
          type = types.str;
          default = n.user;
          example = "ci";
          description = ''
            Primary group of the runner's units. The module creates the
            default group; another must be declared elsewhere
            (`users.groups`).
          '';
        };

        extraGroups = mkOption {
          type = types.listOf types.str;
          default = [ ];
          example = [ "ci-data" ];
          description = ''
            Supplementary groups of the runner's unit
            (`SupplementaryGroups=`), e.g. to read files a group owns. Any
            supplementary group turns `PrivateUsers=` off: in a user
            namespace systemd maps only root and the unit's own user and
            group, and the others' ids would be refused.
          '';
        };

        serviceOverrides = mkOption {
          type = types.attrsOf types.anything;
          default = { };
          example = {
            ProtectHome = "read-only";
            CPUQuota = "200%";
          };
          description = ''
            Settings merged into the runner unit's `serviceConfig`, each
            replacing the module's value (a list too), as nixpkgs'
            github-runner has it: the escape hatch for the sandbox and
            anything else (`lib.mkForce` in
            `systemd.services.<unit>.serviceConfig` still wins over it).
          '';
        };

        metrics = {
          enable = mkEnableOption ''
            the daemon's Prometheus metrics at `http://LISTEN/metrics`
            (`serve --metrics-listen`, set from
            {option}`${opt "metrics.listen"}`). docs/guide/operating.md lists
            them and gives a `services.prometheus.scrapeConfigs` entry; the
            alert rules are {option}`${opt "metrics.rulesFile"}`. Needs a
            knotless-run whose `serve` has `--metrics-listen`'';

          listen = mkOption {
            type = types.str;
            default = "127.0.0.1:9465";
            example = "[::]:9465";
            description = ''
              Address (`HOST:PORT`) the metrics are served on. The default is
              loopback: a Prometheus on this host. For one elsewhere, listen
              wider and open the port in the firewall to it alone.
            '';
          };

          openFirewall = mkOption {
            type = types.bool;
            default = false;
            description = ''
              Whether to open the TCP port of
              {option}`${opt "metrics.listen"}` in the firewall
              (`networking.firewall.allowedTCPPorts`), to every address:
              refused with a loopback listen address, which no other host can
              reach.
            '';
          };

          rulesFile = mkOption {
            type = types.str;
            readOnly = true;
            default = "${config.package}/share/knotless-run/knotless-run.rules.yml";
            defaultText = literalExpression ''"''${config.${opt "package"}}/share/knotless-run/knotless-run.rules.yml"'';
            description = ''
              The alert rules shipped with the package (the repository's
              monitoring/knotless-run.rules.yml), for
              `services.prometheus.ruleFiles`.
            '';
          };
        };

        liveOutput = {
          listen = mkOption {
            type = types.nullOr types.str;
            default = null;
            example = "127.0.0.1:8788";
            description = ''
              Address (`HOST:PORT`) the runner serves its runs' live output
              on (`serve --listen`): `dev.knotless.getRunOutput`,
              `subscribeRunOutput`, `getRunFile` and the page
              `/runs/DID/KEY`, plain HTTP. Put a TLS proxy in front of it for
              readers elsewhere and set
              {option}`${opt "liveOutput.publicUrl"}`. null: none.
            '';
          };

          publicUrl = mkOption {
            type = types.nullOr types.str;
            default = null;
            example = "https://ci.example.com";
            description = ''
              The base URL readers reach the live output at, written in each
              running check record (`serve --public-url`). Default:
              {option}`${opt "liveOutput.service"}` when set, else `http://`
              and {option}`${opt "liveOutput.listen"}`.
            '';
          };

          service = mkOption {
            type = types.nullOr types.str;
            default = null;
            example = "https://output.example.com";
            description = ''
              An output service (`knotless-run output-service`, e.g.
              {option}`services.knotless-run.outputService` on some host) the
              runner pushes each run's live output and files to, outbound
              only, with service-auth tokens from its PDS
              (`serve --output-service`): the way for a runner that takes no
              connections. null: none.
            '';
          };

          serviceDid = mkOption {
            type = types.nullOr (types.strMatching "did:[a-z]+:.+");
            default = null;
            example = "did:web:output.example.com";
            description = ''
              The output service's DID, the audience of the runner's tokens
              (`serve --output-service-did`); required with
              {option}`${opt "liveOutput.service"}`.
            '';
          };

          openFirewall = mkOption {
            type = types.bool;
            default = false;
            description = ''
              Whether to open the TCP port of
              {option}`${opt "liveOutput.listen"}` in the firewall
              (`networking.firewall.allowedTCPPorts`), to every address:
              refused without a listener or with a loopback one.
            '';
          };
        };

        replicas = {
          enable = mkEnableOption ''
            this runner as one of several processes of one runner (`serve
            --replicas`): the same DID and configuration on several hosts,
            each with its own state directory, sharing the events through
            Leases in the runs' namespace; each run is driven by one of them.
            Kubernetes executor only; not with the merge queue
            (`settings.queue`) or warm pods (`settings.warm-pods`).
            docs/guide/nixos.md, "Several replicas of one runner"'';

          name = mkOption {
            type = types.nullOr (types.strMatching "[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?");
            default = if hostName != "" then hostName else null;
            defaultText = literalExpression "config.networking.hostName";
            example = "ci-2";
            description = ''
              This process's name among the runner's replicas
              (`serve --replica-name`): its own, and the same across its
              restarts. null: the host's name when the daemon starts (with
              an empty `networking.hostName`, the one DHCP gave).
            '';
          };

          sealingKeyFile = mkOption {
            type = types.nullOr secretPath;
            default = null;
            example = "/run/secrets/knotless-run/secrets-key.json";
            description = ''
              The runner's sealing key pair, a copy of `secrets-key.json` from
              one replica's state directory (`/var/lib/knotless` or
              `/var/lib/knotless-<name>`). Every replica must hold the same
              key, since repositories seal their secrets to its public half.
              systemd hands it to the unit as the credential `secrets-key`,
              and it is copied into the state directory (mode 0600) at every
              start, replacing the key there. null: the state directory's own
              key (put the same file there on every host yourself).
            '';
          };
        };

        inCluster = mkOption {
          type = types.bool;
          default = false;
          description = ''
            Whether the daemon uses the in-cluster service account (it runs
            where Kubernetes mounts one, e.g. in a pod, with
            `KUBERNETES_SERVICE_HOST` set through
            {option}`${opt "environmentFile"}`) instead of a kubeconfig. The
            Kubernetes executor needs this, a kubeconfig, or the refresh
            timer.
          '';
        };

        kubeconfigFile = mkOption {
          type = types.nullOr secretPath;
          default = null;
          example = "/etc/rancher/k3s/k3s.yaml";
          description = ''
            A kubeconfig only root can read (k3s's own `k3s.yaml`, say),
            handed to the daemon as the credential `kubeconfig`
            (`LoadCredential=`, read when the unit starts) and passed as
            `--kubeconfig=%d/kubeconfig`: no refresh timer, no copy the
            runner's user can read outside its unit. The daemon then has
            that kubeconfig's rights (with k3s.yaml, the cluster's admin);
            {option}`${opt "kubeconfigRefresh.enable"}` gives it a token
            limited to the runs' namespace instead. Not with
            {option}`${opt "settings.kubeconfig"}` or the refresh timer.
          '';
        };

        kubeconfigRefresh = {
          enable = mkEnableOption ''
            a timer that mints the runner's kubeconfig from an admin kubeconfig:
            a service account token limited to the runs' namespace, valid for
            {option}`${opt "kubeconfigRefresh.duration"}`. Needs a knotless-run
            with the `kubeconfig` command'';

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
              How often to mint a new kubeconfig: hours that divide a day
              (`1h` … `12h`, `24h`), minutes that divide an hour (`1m` … `30m`,
              `60m`), or a systemd calendar expression (`daily`,
              `*-*-* 03:00:00`; see {manpage}`systemd.time(7)`).
              Keep it well under {option}`${opt "kubeconfigRefresh.duration"}`.
            '';
          };

          output = mkOption {
            type = secretPath;
            default = "${n.stateDir}/kubeconfig";
            defaultText = literalExpression (
              if instance == null then ''"/var/lib/knotless/kubeconfig"'' else ''"/var/lib/knotless-<name>/kubeconfig"''
            );
            description = ''
              Where the kubeconfig is written (mode 0600, owned by the
              runner's user, replaced atomically).
            '';
          };

          namespace = mkOption {
            type = types.str;
            default = config.settings.namespace;
            defaultText = literalExpression "config.${opt "settings.namespace"}";
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
            description = ''
              Lifetime of each minted token: at least `10m` (Kubernetes
              issues no shorter one) and longer than
              {option}`${opt "kubeconfigRefresh.interval"}`, or the runner
              is left with an expired token (both are asserted).
            '';
          };
        };
      };
    };

  # The NixOS configuration of one enabled runner.
  runnerConfig =
    instance: icfg:
    let
      n = names instance;
      inherit (n) unit refreshUnit;
      inherit (icfg) user group;
      refresh = icfg.kubeconfigRefresh;
      executor = executorOf icfg;
      calendar = intervalCalendar refresh.interval;
      tokenSeconds = durationSeconds refresh.duration;
      refreshSeconds = intervalSeconds refresh.interval;
      # The docker executor talks to Docker's socket (group docker), to
      # Podman's (group podman: its /run/docker.sock, or DOCKER_HOST), or
      # to a daemon elsewhere that docker-host or DOCKER_HOST names.
      dockerHost = icfg.settings."docker-host" or icfg.environment.DOCKER_HOST or null;
      dockerRemote = dockerHost != null && !hasPrefix "unix://" (toString dockerHost);
      docker = config.virtualisation.docker.enable;
      podman = config.virtualisation.podman.enable;
      dockerGroups = optionals (executor == "docker") (
        if docker then
          [ "docker" ]
        else if podman then
          [ "podman" ]
        else
          [ ]
      );
      dockerUnits = optionals (executor == "docker") (
        if docker then
          [ "docker.service" ]
        else if podman then
          [ "podman.socket" ]
        else
          [ ]
      );
      groups = dockerGroups ++ icfg.extraGroups;
      firewall =
        what: listen:
        if listen == null then
          "${p}.${what}.openFirewall is true but ${p}.${what}.listen is null: there is no listener whose port to open."
        else
          "${p}.${what}.openFirewall is true but ${p}.${what}.listen is \"${listen}\", ${
            if listenPort listen == null then "which names no port" else "loopback only: no other host could reach the port"
          }. Listen on a wider address (\"[::]:PORT\"), or leave the firewall closed.";
      openable = listen: listen != null && listenPort listen != null && !loopbackListen listen;
      live = icfg.liveOutput;
      rep = icfg.replicas;
      keyFile = "${n.stateDir}/secrets-key.json";
      liveOn = live.listen != null || live.service != null;
      settings =
        filterAttrs (_: v: v != null) icfg.settings
        // lib.optionalAttrs icfg.metrics.enable { "metrics-listen" = icfg.metrics.listen; }
        // lib.optionalAttrs rep.enable (
          { replicas = true; } // lib.optionalAttrs (rep.name != null) { "replica-name" = rep.name; }
        )
        // filterAttrs (_: v: v != null) {
          listen = live.listen;
          "public-url" = live.publicUrl;
          "output-service" = live.service;
          "output-service-did" = live.serviceDid;
        };
      configFile = settingsFormat.generate "${unit}.json" settings;
      refreshTemp = "${refresh.output}.new";
      # extraArgs can carry what the options leave unset (a DID or
      # repositories known only on the host, through environmentFile).
      argFlag = flag: any (a: a == flag || hasPrefix "${flag}=" a) icfg.extraArgs;
      argPositional = any (a: !hasPrefix "-" a) icfg.extraArgs;
      p = n.option;
      # --push-credential HOST[/PATH]=FILE for each credential and path,
      # FILE its credential (push-credential-N) in systemd's credentials
      # directory: %d is left for systemd to expand (host and paths hold
      # neither `%` nor `$`).
      pushCredentialArgs = lib.concatLists (
        lib.imap0 (
          i: c:
          map (path: quoteExecArg "--push-credential=${c.host}${lib.optionalString (path != "") "/${path}"}=%d/push-credential-${toString i}") (
            if c.paths == [ ] then [ "" ] else c.paths
          )
        ) icfg.pushCredentials
      );
    in
    {
      assertions = [
        {
          assertion = icfg.appPasswordFile != null;
          message = "${p}.appPasswordFile must be set: the runner signs in to its PDS with that app password.";
        }
        {
          assertion = icfg.settings.did != null || argFlag "--did";
          message = "${p}.settings.did must be set (or --did=… in ${p}.extraArgs): `knotless-run serve` needs the runner's DID.";
        }
        {
          assertion = icfg.repos != [ ] || (icfg.settings.discover or false) == true || argFlag "--discover" || argPositional;
          message = "${p}.repos is empty and ${p}.settings.discover is not true (nor --discover or a repository in ${p}.extraArgs): the runner would serve nothing.";
        }
        {
          assertion =
            executor == "kubernetes"
            -> (
              icfg.settings.kubeconfig != null
              || icfg.kubeconfigFile != null
              || argFlag "--kubeconfig"
              || refresh.enable
              || icfg.inCluster
            );
          message = "${p}.settings.executor is kubernetes but ${p}.settings.kubeconfig and ${p}.kubeconfigFile are null, ${p}.kubeconfigRefresh.enable is false and ${p}.inCluster is false: the daemon has no way to reach a cluster. Set one of them.";
        }
        {
          assertion = icfg.kubeconfigFile != null -> !refresh.enable && icfg.settings.kubeconfig == null;
          message = "${p}.kubeconfigFile is set together with ${p}.${
            if refresh.enable then "kubeconfigRefresh.enable" else "settings.kubeconfig"
          }: the daemon takes one kubeconfig. Keep the credential (kubeconfigFile) or the other.";
        }
        {
          assertion = refresh.enable -> tokenSeconds >= 600 && (refreshSeconds == null || tokenSeconds > refreshSeconds);
          message = "${p}.kubeconfigRefresh.duration = \"${refresh.duration}\" must be at least 10m (Kubernetes issues no token shorter than 600 s) and longer than ${p}.kubeconfigRefresh.interval = \"${refresh.interval}\": otherwise the token runs out before the next refresh and the runner loses the cluster.";
        }
        {
          assertion =
            executor == "docker" -> docker || (podman && (config.virtualisation.podman.dockerSocket.enable || dockerHost != null)) || dockerRemote;
          message = "${p}.settings.executor is docker but no Docker is enabled here: set virtualisation.docker.enable = true, or virtualisation.podman.enable with virtualisation.podman.dockerSocket.enable (or ${p}.environment.DOCKER_HOST = \"unix:///run/podman/podman.sock\"), or name a daemon elsewhere in ${p}.settings.docker-host.";
        }
        {
          assertion = !(icfg.environment ? PATH);
          message = "${p}.environment.PATH is set: the module sets PATH from ${p}.extraPackages and ${p}.hostPackages; add packages there.";
        }
        {
          assertion = icfg.metrics.openFirewall -> icfg.metrics.enable && openable icfg.metrics.listen;
          message =
            if !icfg.metrics.enable then
              "${p}.metrics.openFirewall is true but ${p}.metrics.enable is false: there is no metrics port to open."
            else
              firewall "metrics" icfg.metrics.listen;
        }
        {
          assertion = live.openFirewall -> openable live.listen;
          message = firewall "liveOutput" live.listen;
        }
        {
          assertion = refresh.enable -> (icfg.package.hasKubeconfigCommand or false);
          message = "${p}.kubeconfigRefresh needs a knotless-run with the kubeconfig command (issue 7)";
        }
        {
          assertion = icfg.metrics.enable -> (icfg.package.hasMetricsListen or false);
          message = "${p}.metrics.enable needs a knotless-run whose serve has --metrics-listen (issue 33)";
        }
        {
          assertion = liveOn -> (icfg.package.hasLiveOutput or false);
          message = "${p}.liveOutput needs a knotless-run whose serve has --listen and --output-service (issue 31)";
        }
        {
          assertion = live.service != null -> live.serviceDid != null;
          message = "${p}.liveOutput.service is set but ${p}.liveOutput.serviceDid is null: the runner's tokens must name the output service's DID.";
        }
        {
          assertion = live.publicUrl != null -> liveOn;
          message = "${p}.liveOutput.publicUrl is set, but neither ${p}.liveOutput.listen nor ${p}.liveOutput.service: there is no live output to read there.";
        }
        {
          assertion = refresh.enable -> refresh.adminKubeconfigFile != null;
          message = "${p}.kubeconfigRefresh.adminKubeconfigFile must be set when the refresh timer is enabled.";
        }
        {
          assertion = refresh.enable -> calendar != null;
          message = "${p}.kubeconfigRefresh.interval = \"${refresh.interval}\" is no interval the timer can keep: give hours that divide a day (1h to 12h, 24h), minutes that divide an hour (1m to 30m, 60m), or a calendar expression.";
        }
        {
          assertion = icfg.pushCredentialFile == null;
          message = "${p}.pushCredentialFile is a push credential bound to no host: the lander would offer it to whatever host a repository record names. Bind it to the host (and paths) it is for: ${p}.pushCredentials = [ { host = \"git.example.org\"; paths = [ \"your-org\" ]; file = \"${toString icfg.pushCredentialFile}\"; } ].";
        }
        {
          assertion = refresh.enable -> executor == "kubernetes";
          message = "${p}.kubeconfigRefresh is for the kubernetes executor; ${p}.settings.executor is ${executor}.";
        }
        # serve refuses these too (exit 78); the module says so at switch.
        {
          assertion = rep.enable -> executor == "kubernetes";
          message = "${p}.replicas.enable needs ${p}.settings.executor = \"kubernetes\" (it is ${executor}): replicas coordinate through the cluster, so only the Kubernetes executor runs as several processes of one runner.";
        }
        {
          assertion = rep.enable -> !((icfg.settings.queue or false) == true || argFlag "--queue");
          message = "${p}.replicas.enable with ${p}.settings.queue (--queue): the merge queue's bisection lives in one process's state; land the queue on a runner of its own, without replicas.";
        }
        {
          assertion = rep.enable -> (icfg.settings."warm-pods" or 0) == 0 && !argFlag "--warm-pods";
          message = "${p}.replicas.enable with ${p}.settings.warm-pods (--warm-pods): warm pods are one process's pool; use one or the other.";
        }
        {
          assertion = rep.sealingKeyFile != null -> rep.enable;
          message = "${p}.replicas.sealingKeyFile is set but ${p}.replicas.enable is false: the key is copied only for replicas.";
        }
        {
          assertion = rep.enable -> (icfg.package.hasReplicas or false);
          message = "${p}.replicas.enable needs a knotless-run whose serve has --replicas (issue 48)";
        }
      ];

      # The default user and group are the module's; another is the
      # operator's to declare.
      users.users = lib.optionalAttrs (user == n.user) {
        ${user} = {
          isSystemUser = true;
          inherit group;
          home = n.stateDir;
          description = "knotless-run daemon${lib.optionalString (instance != null) " (${instance})"}";
        };
      };
      users.groups = lib.optionalAttrs (group == n.user) { ${group} = { }; };

      networking.firewall.allowedTCPPorts =
        optional (icfg.metrics.enable && icfg.metrics.openFirewall && openable icfg.metrics.listen) (listenPort icfg.metrics.listen)
        ++ optional (live.openFirewall && openable live.listen) (listenPort live.listen);

      warnings = optional (refresh.enable && refreshSeconds == null) "${p}.kubeconfigRefresh.interval = \"${refresh.interval}\" is a calendar expression the module cannot read a period from: it cannot check that ${p}.kubeconfigRefresh.duration = \"${refresh.duration}\" outlasts it. Make sure it does.";

      systemd.services.${unit} = {
        description = "knotless-run CI runner${lib.optionalString (instance != null) " ${instance}"}";
        wantedBy = [ "multi-user.target" ];
        wants = [ "network-online.target" ] ++ optional refresh.enable "${refreshUnit}.service" ++ dockerUnits;
        after = [ "network-online.target" ] ++ optional refresh.enable "${refreshUnit}.service" ++ dockerUnits;

        # The daemon mirrors repositories with git; the shell executor's
        # steps get this PATH, with the host's tools after the operator's.
        path = [ pkgs.git ] ++ icfg.extraPackages ++ optionals (executor == "shell") icfg.hostPackages;

        # A path value becomes its store copy, a package its store path.
        environment = mapAttrs (_: v: "${v}") (removeAttrs icfg.environment [ "PATH" ]);

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
                  (getExe icfg.package)
                  "serve"
                  "--config"
                  configFile
                ])
              ]
              # %d is systemd's credentials directory: left unescaped.
              ++ optional (icfg.kubeconfigFile != null) "--kubeconfig=%d/kubeconfig"
              ++ pushCredentialArgs
              ++ map escapeExecArgKeepVars icfg.extraArgs
              ++ optional (icfg.repos != [ ]) (execLine ([ "--" ] ++ icfg.repos))
            );
            # A crash or a lost PDS or cluster: again after 5 s, then
            # backing off to 5 min (RestartSteps=, systemd 254 and later).
            # A configuration it refuses (exit 78, EX_CONFIG: an unknown
            # setting, a bad value) fails the unit instead: restarting would
            # not change it.
            Restart = "always";
            RestartSec = "5s";
            RestartSteps = 8;
            RestartMaxDelaySec = "5min";
            RestartPreventExitStatus = "78";
            # The daemon pings at half this interval.
            WatchdogSec = mkDefault "2min";
            # SIGTERM to the daemon alone: the steps it started keep running
            # while it finishes them; whatever is left when it exits or when
            # TimeoutStopSec= runs out gets SIGKILL.
            KillSignal = "SIGTERM";
            KillMode = "mixed";
            TimeoutStopSec = toString (durationSeconds icfg.settings."stop-wait" + stopMargin);

            User = user;
            Group = group;
            StateDirectory = n.dir;
            StateDirectoryMode = "0700";
            CacheDirectory = n.dir;
            CacheDirectoryMode = "0700";
            WorkingDirectory = n.stateDir;

            LoadCredential =
              optional (icfg.appPasswordFile != null) "app-password:${toString icfg.appPasswordFile}"
              ++ optional (icfg.secretsFile != null) "secrets:${toString icfg.secretsFile}"
              ++ lib.imap0 (i: c: "push-credential-${toString i}:${toString c.file}") icfg.pushCredentials
              ++ optional (icfg.kubeconfigFile != null) "kubeconfig:${toString icfg.kubeconfigFile}"
              ++ optional (rep.sealingKeyFile != null) "secrets-key:${toString rep.sealingKeyFile}";
            EnvironmentFile =
              optional (icfg.environmentFile != null) (toString icfg.environmentFile)
              ++ map toString icfg.environmentFiles;

            StandardOutput = "journal";
            StandardError = "journal";
            SyslogIdentifier = unit;
          }
          (mkIf (groups != [ ]) {
            SupplementaryGroups = groups;
          })
          (mkIf (rep.sealingKeyFile != null) {
            # Every replica opens what repositories sealed to the one key:
            # the operator's copy replaces the state directory's at each
            # start, written beside it and renamed over it.
            ExecStartPre = [
              ("${execLine [ "${pkgs.coreutils}/bin/install" "-m" "0600" "-T" ]} %d/secrets-key " + execLine [ "${keyFile}.new" ])
              (execLine [
                "${pkgs.coreutils}/bin/mv"
                "-fT"
                "${keyFile}.new"
                keyFile
              ])
            ];
          })
          # The Kubernetes executor reads this host's addresses (netlink)
          # to keep run pods of the public and allow-dns egress modes
          # from them.
          (hardening executor groups (optional (executor == "kubernetes") "AF_NETLINK"))
          (mapAttrs (_: lib.mkOverride 90) icfg.serviceOverrides)
        ];
      };

      systemd.services.${refreshUnit} = mkIf refresh.enable {
        description = "Mint the scoped kubeconfig of ${unit}";
        wants = [ "network-online.target" ];
        after = [ "network-online.target" ] ++ optional (config.services.k3s.enable or false) "k3s.service";
        restartIfChanged = false;

        serviceConfig = mkMerge [
          {
            Type = "oneshot";
            # Written beside the target, then renamed over it: the runner sees
            # the old file or the new one, never half of one.
            # %d is systemd's credentials directory: left unescaped.
            ExecStart =
              execLine [
                (getExe icfg.package)
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
              ]
              + refreshPolicyArgs icfg;
            ExecStartPost = execLine [
              "${pkgs.coreutils}/bin/mv"
              "-fT"
              refreshTemp
              refresh.output
            ];
            # The API server may still be starting at boot. A oneshot has no
            # start timeout by default, and the runner starts after this
            # unit: a hung API server must not hold the runner back. Flags
            # it refuses (exit 78, EX_CONFIG) fail the unit instead.
            Restart = "on-failure";
            RestartSec = "30s";
            RestartPreventExitStatus = "78";
            TimeoutStartSec = "2min";

            User = user;
            Group = group;
            StateDirectory = n.dir;
            StateDirectoryMode = "0700";
            LoadCredential = optional (
              refresh.adminKubeconfigFile != null
            ) "admin-kubeconfig:${toString refresh.adminKubeconfigFile}";

            StandardOutput = "journal";
            StandardError = "journal";
            SyslogIdentifier = refreshUnit;
          }
          (mkIf (!hasPrefix "${n.stateDir}/" refresh.output) {
            ReadWritePaths = [ (dirOf refresh.output) ];
          })
          (hardening executor [ ] [ ])
        ];
      };

      systemd.timers.${refreshUnit} = mkIf refresh.enable {
        description = "Refresh the scoped kubeconfig of ${unit}";
        wantedBy = [ "timers.target" ];
        timerConfig = {
          OnCalendar = if calendar == null then refresh.interval else calendar;
          Persistent = true;
          RandomizedDelaySec = mkDefault "5min";
        };
      };
    };

  instances = filterAttrs (_: i: i.enable) cfg.instances;

  # The output service (knotless-run output-service): runners push their
  # runs' live output to it, readers read it there.
  outputServiceModule = {
    options = {
      enable = mkEnableOption ''
        the output service (`knotless-run output-service`): it takes the
        live output and files the runners of
        {option}`services.knotless-run.outputService.runners` push to it
        (`serve --output-service`), each put checked against the runner's
        DID document, keeps each run's on disk (bounded, with retention) and
        serves it to readers: `dev.knotless.getRunOutput`,
        `subscribeRunOutput`, `getRunFile` and the page `/runs/DID/KEY`.
        Unit `knotless-output.service`, user `knotless-output`, data in
        `/var/lib/knotless-output`. Needs a knotless-run with the
        `output-service` command'';

      package = mkOption {
        type = types.package;
        default = cfg.package;
        defaultText = literalExpression "config.services.knotless-run.package";
        description = "The knotless-run package the output service runs.";
      };

      listen = mkOption {
        type = types.str;
        default = "127.0.0.1:8789";
        example = "[::]:8789";
        description = ''
          Address (`HOST:PORT`) the service listens on, plain HTTP: put a
          TLS proxy in front of it for runners and readers elsewhere.
        '';
      };

      openFirewall = mkOption {
        type = types.bool;
        default = false;
        description = ''
          Whether to open the TCP port of
          {option}`services.knotless-run.outputService.listen` in the
          firewall (`networking.firewall.allowedTCPPorts`), to every address:
          refused with a loopback listen address, which no other host can
          reach.
        '';
      };

      serviceDid = mkOption {
        type = types.nullOr (types.strMatching "did:[a-z]+:.+");
        default = null;
        example = "did:web:output.example.com";
        description = ''
          The service's own DID: the audience the runners' service-auth
          tokens must name (their `liveOutput.serviceDid`). Required.
        '';
      };

      runners = mkOption {
        type = types.listOf (types.strMatching "did:[a-z]+:.+");
        default = [ ];
        example = [ "did:plc:7u2ld3ffgzqvezmv6wxgxiix" ];
        description = ''
          The runner DIDs whose output the service takes; any other is
          refused. At least one.
        '';
      };

      plcUrl = mkOption {
        type = types.str;
        default = "https://plc.directory";
        description = "The did:plc directory the runners' DID documents (their signing keys) are resolved with.";
      };

      retention = mkOption {
        type = goDuration;
        default = "168h";
        description = "How long a run's output and files are kept after the run ended (or after its last put, when it never ended).";
      };

      extraArgs = mkOption {
        type = types.listOf types.str;
        default = [ ];
        example = [
          "--max-run-output=33554432"
          "--max-subscribers=1000"
        ];
        description = ''
          More arguments of `knotless-run output-service` (its bounds: see
          `knotless-run output-service --help`), each one word.
        '';
      };
    };
  };

  os = cfg.outputService;
  outputServiceConfig = {
    assertions = [
      {
        assertion = os.package.hasLiveOutput or false;
        message = "services.knotless-run.outputService needs a knotless-run with the output-service command (issue 31)";
      }
      {
        assertion = os.serviceDid != null;
        message = "services.knotless-run.outputService.serviceDid must be set: the runners' tokens name it.";
      }
      {
        assertion = os.runners != [ ];
        message = "services.knotless-run.outputService.runners is empty: the service would take no runner's output.";
      }
      {
        assertion = os.openFirewall -> listenPort os.listen != null && !loopbackListen os.listen;
        message = "services.knotless-run.outputService.openFirewall is true but services.knotless-run.outputService.listen is \"${os.listen}\", ${
          if listenPort os.listen == null then "which names no port" else "loopback only: no other host could reach the port"
        }. Listen on a wider address (\"[::]:8789\"), or leave the firewall closed.";
      }
      {
        # knotless-output is instance `output`'s user and directories.
        assertion = !(cfg.instances ? output && cfg.instances.output.enable);
        message = "services.knotless-run.instances.output would share the output service's user and directories (knotless-output): name the instance otherwise.";
      }
    ];
    users.users.knotless-output = {
      isSystemUser = true;
      group = "knotless-output";
      home = "/var/lib/knotless-output";
      # mkDefault: an instance `output` (refused above) would define it too.
      description = mkDefault "knotless-run output service";
    };
    users.groups.knotless-output = { };
    networking.firewall.allowedTCPPorts = optional (
      os.openFirewall && listenPort os.listen != null && !loopbackListen os.listen
    ) (listenPort os.listen);
    systemd.services.knotless-output = {
      description = "knotless-run output service";
      wantedBy = [ "multi-user.target" ];
      wants = [ "network-online.target" ];
      after = [ "network-online.target" ];
      serviceConfig = mkMerge [
        {
          ExecStart = concatStringsSep " " (
            [
              (execLine (
                [
                  (getExe os.package)
                  "output-service"
                  "--listen"
                  os.listen
                  "--data-dir"
                  "/var/lib/knotless-output"
                  "--service-did"
                  (toString os.serviceDid)
                  "--plc-url"
                  os.plcUrl
                  "--retention"
                  os.retention
                ]
                ++ lib.concatMap (r: [
                  "--runner"
                  r
                ]) os.runners
              ))
            ]
            ++ map escapeExecArg os.extraArgs
          );
          # Flags it refuses (exit 78, EX_CONFIG: a --service-did or
          # --runner that is no DID, a bound of 0 in extraArgs) fail the
          # unit: restarting would not change them.
          Restart = "on-failure";
          RestartSec = "5s";
          RestartPreventExitStatus = "78";
          User = "knotless-output";
          Group = "knotless-output";
          StateDirectory = "knotless-output";
          StateDirectoryMode = "0700";
          WorkingDirectory = "/var/lib/knotless-output";
          StandardOutput = "journal";
          StandardError = "journal";
          SyslogIdentifier = "knotless-output";
        }
        # No executor: the hardening of the Kubernetes runner's unit,
        # without its netlink.
        (hardening "kubernetes" [ ] [ ])
      ];
    };
  };
in
{
  options.services.knotless-run = mkOption {
    default = { };
    description = ''
      knotless-run, the CI runner of knotless: the default runner here, and
      more in {option}`services.knotless-run.instances`.
    '';
    type = types.submoduleWith {
      modules = [
        (runnerModule null)
        {
          options.instances = mkOption {
            default = { };
            example = literalExpression ''
              {
                trusted = {
                  enable = true;
                  settings = { executor = "shell"; did = "did:plc:…"; };
                  repos = [ "did:plc:…/site" ];
                  appPasswordFile = "/run/secrets/knotless-run-trusted";
                  extraPackages = [ pkgs.nodejs ];
                };
              }
            '';
            description = ''
              More runners on this host, each with the options of
              {option}`services.knotless-run` and its own user
              (`knotless-<name>`), state and cache directories
              (`/var/lib/knotless-<name>`, `/var/cache/knotless-<name>`),
              units (`knotless-run-<name>.service`) and refresh timer
              (`knotless-run-<name>-kubeconfig.timer`): they share nothing
              writable with each other or with the default runner.
            '';
            type = types.attrsOf (
              types.submodule (
                { name, ... }:
                {
                  imports = [ (runnerModule name) ];
                }
              )
            );
          };
          options.outputService = mkOption {
            default = { };
            description = ''
              The output service (`knotless-run output-service`), where
              runners that take no connections push their runs' live output
              ({option}`services.knotless-run.liveOutput.service`).
            '';
            type = types.submodule outputServiceModule;
          };
        }
      ];
    };
  };

  # Every attribute is set whether or not a runner is enabled: the
  # module system must know which options this module defines before it
  # evaluates services.knotless-run.
  config =
    let
      runners = optional cfg.enable (runnerConfig null cfg) ++ mapAttrsToList runnerConfig instances;
      # Each runner's refresh output, by option path: they must differ.
      outputs = lib.mapAttrsToList (p: r: { inherit p; o = r.kubeconfigRefresh.output; }) (
        filterAttrs (_: r: r.kubeconfigRefresh.enable) (
          lib.optionalAttrs cfg.enable { "services.knotless-run" = cfg; }
          // lib.mapAttrs' (name: lib.nameValuePair "services.knotless-run.instances.${name}") instances
        )
      );
      sharedOutputs = lib.filter (x: lib.count (y: y.o == x.o) outputs > 1) outputs;
      # Each runner's user, by option path: they must differ.
      runnerUsers = lib.mapAttrsToList (p: r: { inherit p; u = r.user; }) (
        lib.optionalAttrs cfg.enable { "services.knotless-run" = cfg; }
        // lib.mapAttrs' (name: lib.nameValuePair "services.knotless-run.instances.${name}") instances
      );
      sharedUsers = lib.filter (x: lib.count (y: y.u == x.u) runnerUsers > 1) runnerUsers;
      merged = f: mkMerge (map f runners);
    in
    {
      assertions = lib.concatMap (r: r.assertions) (runners ++ optional os.enable outputServiceConfig) ++ [
        {
          # knotless-run-NAME-kubeconfig must not be another instance's
          # runner unit, nor NAME=kubeconfig the default's refresh unit.
          assertion = lib.all (
            name: builtins.match "[a-z0-9][a-z0-9-]*" name != null && name != "kubeconfig" && !hasSuffix "-kubeconfig" name
          ) (attrNames instances);
          message = "services.knotless-run.instances: names must be lower-case letters, digits and dashes, and neither be nor end in `kubeconfig` (the refresh units' names); got ${concatStringsSep ", " (attrNames instances)}.";
        }
        {
          assertion = sharedOutputs == [ ];
          message = "knotless-run: two runners write the same kubeconfig: ${
            concatMapStringsSep ", " (x: "${x.p}.kubeconfigRefresh.output = ${x.o}") sharedOutputs
          }; give each its own (the default is under its own state directory).";
        }
        {
          assertion = sharedUsers == [ ];
          message = "knotless-run: two runners run as one user: ${
            concatMapStringsSep ", " (x: "${x.p}.user = ${x.u}") sharedUsers
          }; each runner needs its own (the defaults differ), or they would share their sealing keys and files.";
        }
      ];
      warnings = lib.concatMap (r: r.warnings) runners;
      networking.firewall.allowedTCPPorts = mkMerge [
        (merged (r: r.networking.firewall.allowedTCPPorts))
        (mkIf os.enable outputServiceConfig.networking.firewall.allowedTCPPorts)
      ];
      users.users = mkMerge [
        (merged (r: r.users.users))
        (mkIf os.enable outputServiceConfig.users.users)
      ];
      users.groups = mkMerge [
        (merged (r: r.users.groups))
        (mkIf os.enable outputServiceConfig.users.groups)
      ];
      systemd.services = mkMerge [
        (merged (r: r.systemd.services))
        (mkIf os.enable outputServiceConfig.systemd.services)
      ];
      systemd.timers = merged (r: r.systemd.timers);
    };
}
