# The NixOS options the VM test's server (nix/tests/k3s.nix) sets besides
# services.knotless-run and the systemd, users and environment options of
# tests/nix/nixos-stubs.nix, declared so that the server's configuration
# evaluates with nixpkgs' lib alone. What they become on the stand-in's
# machine:
#
#   - services.bluesky-pds: the unit nixpkgs' module writes (its settings
#     and their defaults as Environment=, ExecStart the package's `pds`,
#     user pds, StateDirectory=pds, its hardening, wanted by
#     multi-user.target); the package is the npm @atproto/pds of tests/pds.
#   - services.k3s: its package on the system PATH (k3s kubectl), as
#     nixpkgs' module puts it there; the rest is k3s's own configuration,
#     which the stand-in does not run (its cluster is the test cluster).
#   - virtualisation, networking.firewall: the VM's, of no use here
#     (declared, free-form, in tests/nix/nixos-stubs.nix).
{
  config,
  lib,
  pkgs,
  ...
}:
let
  inherit (lib) mkIf mkOption types;
  pds = config.services.bluesky-pds;
in
{
  options = {
    networking = {
      primaryIPAddress = mkOption {
        type = types.str;
        default = "192.168.1.2";
      };
    };
    services.k3s = mkOption {
      default = { };
      type = types.submodule {
        freeformType = types.attrsOf types.anything;
        options.enable = mkOption {
          type = types.bool;
          default = false;
        };
        options.package = mkOption {
          type = types.package;
          default = pkgs.k3s;
        };
      };
    };
    services.bluesky-pds = {
      enable = mkOption {
        type = types.bool;
        default = false;
      };
      package = mkOption {
        type = types.package;
        default = pkgs.bluesky-pds;
      };
      environmentFiles = mkOption {
        type = types.listOf types.str;
        default = [ ];
      };
      settings = mkOption {
        default = { };
        type = types.submodule {
          freeformType = types.attrsOf (types.nullOr (types.either types.str types.port));
          # nixpkgs' defaults, all of them. The app view's and the report
          # service's URLs are public hosts: the npm PDS only builds clients
          # for them at start, and calls them only to proxy app.bsky.*, to
          # resolve a handle it does not host, for registerPush or a report,
          # which the VM test never does. k3s.nix sets the PLC URL and the
          # crawlers, as in the VM.
          options = lib.mapAttrs (_: default: mkOption { inherit default; type = types.nullOr (types.either types.str types.port); }) {
            LOG_ENABLED = "true";
            PDS_BLOBSTORE_DISK_LOCATION = "/var/lib/pds/blocks";
            PDS_BLOB_UPLOAD_LIMIT = "104857600";
            PDS_BSKY_APP_VIEW_DID = "did:web:api.bsky.app";
            PDS_BSKY_APP_VIEW_URL = "https://api.bsky.app";
            PDS_CRAWLERS = "https://bsky.network";
            PDS_DATA_DIRECTORY = "/var/lib/pds";
            PDS_DID_PLC_URL = "https://plc.directory";
            PDS_PORT = 3000;
            PDS_REPORT_SERVICE_DID = "did:plc:ar7c4by46qjdydhdevvrndac";
            PDS_REPORT_SERVICE_URL = "https://mod.bsky.app";
          };
        };
      };
    };
  };

  config = {
    environment.systemPackages = mkIf config.services.k3s.enable [ config.services.k3s.package ];

    systemd.services.bluesky-pds = mkIf pds.enable {
      description = "bluesky pds";
      after = [ "network-online.target" ];
      wants = [ "network-online.target" ];
      wantedBy = [ "multi-user.target" ];
      serviceConfig = {
        Environment = lib.mapAttrsToList (k: v: "${k}=${toString v}") (lib.filterAttrs (_: v: v != null) pds.settings);
        EnvironmentFile = pds.environmentFiles;
        ExecStart = lib.getExe pds.package;
        User = "pds";
        Group = "pds";
        StateDirectory = "pds";
        StateDirectoryMode = "0755";
        Restart = "always";

        # nixpkgs' hardening of the unit, every key of it: systemd 252 in
        # the stand-in's machine knows them all, so a PDS that needs what
        # they forbid fails here as in the VM.
        RemoveIPC = true;
        CapabilityBoundingSet = [ "CAP_NET_BIND_SERVICE" ];
        NoNewPrivileges = true;
        PrivateDevices = true;
        ProtectClock = true;
        ProtectKernelLogs = true;
        ProtectControlGroups = true;
        ProtectKernelModules = true;
        PrivateMounts = true;
        SystemCallArchitectures = [ "native" ];
        MemoryDenyWriteExecute = false; # V8's JIT
        RestrictNamespaces = true;
        RestrictSUIDSGID = true;
        ProtectHostname = true;
        LockPersonality = true;
        ProtectKernelTunables = true;
        RestrictAddressFamilies = [
          "AF_UNIX"
          "AF_INET"
          "AF_INET6"
        ];
        RestrictRealtime = true;
        DeviceAllow = [ "" ];
        ProtectSystem = "strict";
        ProtectProc = "invisible";
        ProcSubset = "pid";
        ProtectHome = true;
        PrivateUsers = true;
        PrivateTmp = true;
        UMask = "0077";
      };
    };
    users.users.pds = mkIf pds.enable {
      group = "pds";
      isSystemUser = true;
    };
    users.groups.pds = mkIf pds.enable { };
  };
}
