# The NixOS options the VM test's server (nix/tests/k3s.nix) sets besides
# services.knotless-run and the systemd, users and environment options of
# tests/nix/nixos-stubs.nix, declared so that the server's configuration
# evaluates with nixpkgs' lib alone. What they become on the stand-in's
# machine:
#
#   - services.bluesky-pds: the unit nixpkgs' module writes (its settings
#     as Environment=, ExecStart the package's `pds`, user pds,
#     StateDirectory=pds, wanted by multi-user.target), without its
#     hardening; the package is the npm @atproto/pds of tests/pds.
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
      # nixpkgs' defaults for what the VM test does not set.
      settings = mkOption {
        default = { };
        type = types.submodule {
          freeformType = types.attrsOf (types.nullOr (types.either types.str types.port));
          options = lib.mapAttrs (_: default: mkOption { inherit default; type = types.nullOr (types.either types.str types.port); }) {
            LOG_ENABLED = "true";
            PDS_BLOBSTORE_DISK_LOCATION = "/var/lib/pds/blocks";
            PDS_DATA_DIRECTORY = "/var/lib/pds";
            PDS_PORT = 3000;
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
      };
    };
    users.users.pds = mkIf pds.enable {
      group = "pds";
      isSystemUser = true;
    };
    users.groups.pds = mkIf pds.enable { };
  };
}
