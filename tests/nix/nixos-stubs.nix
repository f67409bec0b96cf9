# Stand-in declarations of the few NixOS options nix/module.nix sets, so
# the module can be evaluated with nixpkgs' lib alone (lib.evalModules),
# without a nixpkgs checkout. The types follow NixOS where it matters:
# unit settings merge like NixOS's `unitOption` (lists concatenate, other
# values must agree after mkDefault/mkForce are applied).
{ lib, ... }:
let
  inherit (lib) mkOption types;

  unitOption = lib.mkOptionType {
    name = "systemd option";
    merge =
      loc: defs:
      if lib.any (d: builtins.isList d.value) defs then
        lib.concatMap (d: lib.toList d.value) defs
      else
        lib.mergeEqualOption loc defs;
  };

  unitList = mkOption {
    type = types.listOf types.str;
    default = [ ];
  };

  unitCommon = {
    description = mkOption {
      type = types.str;
      default = "";
    };
    wantedBy = unitList;
    wants = unitList;
    requires = unitList;
    after = unitList;
    before = unitList;
    partOf = unitList;
    bindsTo = unitList;
    unitConfig = mkOption {
      type = types.attrsOf unitOption;
      default = { };
    };
  };

  service = types.submodule {
    options = unitCommon // {
      serviceConfig = mkOption {
        type = types.attrsOf unitOption;
        default = { };
      };
      environment = mkOption {
        type = types.attrsOf (types.nullOr types.str);
        default = { };
      };
      path = mkOption {
        type = types.listOf types.unspecified;
        default = [ ];
      };
      restartIfChanged = mkOption {
        type = types.bool;
        default = true;
      };
      stopIfChanged = mkOption {
        type = types.bool;
        default = true;
      };
      restartTriggers = mkOption {
        type = types.listOf types.unspecified;
        default = [ ];
      };
    };
  };

  timer = types.submodule {
    options = unitCommon // {
      timerConfig = mkOption {
        type = types.attrsOf unitOption;
        default = { };
      };
    };
  };

  anyAttrs = mkOption {
    type = types.attrsOf (types.attrsOf types.anything);
    default = { };
  };
in
{
  options = {
    systemd.services = mkOption {
      type = types.attrsOf service;
      default = { };
    };
    systemd.timers = mkOption {
      type = types.attrsOf timer;
      default = { };
    };
    users.users = anyAttrs;
    users.groups = anyAttrs;
    assertions = mkOption {
      type = types.listOf types.unspecified;
      default = [ ];
    };
    warnings = mkOption {
      type = types.listOf types.str;
      default = [ ];
    };
    environment.systemPackages = mkOption {
      type = types.listOf types.package;
      default = [ ];
    };
    # The default of replicas.name; NixOS's own default.
    networking.hostName = mkOption {
      type = types.str;
      default = "nixos";
    };
    # The module opens its listeners' ports here (openFirewall) and reads
    # whether Docker or Podman is on (the docker executor). Anything else
    # set under these (a VM test's firewall or VM size) is taken as is.
    networking.firewall = mkOption {
      default = { };
      type = types.submodule {
        freeformType = types.attrsOf types.anything;
        options.allowedTCPPorts = mkOption {
          type = types.listOf types.port;
          default = [ ];
        };
      };
    };
    virtualisation = mkOption {
      default = { };
      type = types.submodule {
        freeformType = types.attrsOf types.anything;
        options = {
          docker.enable = lib.mkEnableOption "Docker";
          podman.enable = lib.mkEnableOption "Podman";
          podman.dockerSocket.enable = lib.mkEnableOption "Podman's socket at /run/docker.sock";
        };
      };
    };
  };
}
