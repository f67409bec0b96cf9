# Evaluates the VM test (nix/tests/k3s.nix) for its stand-in: the test's
# Python script as Nix interpolates it, and the server node's NixOS
# configuration through the real module system (nixpkgs' lib, the
# declarations of tests/nix/nixos-stubs.nix and ./nixos.nix), rendered into
# the unit files the stand-in's machine boots with.
#
# Run with --read-write-mode and a --store of a temporary directory: every
# store object the script and the units name (forge.py, plc.py, the pushed
# trees, probe.yaml, the settings file) is written there, and the stand-in
# shows that store as the machine's /nix/store. Packages are not built:
# those of the host (hostPackages) are directories hostPath/NAME whose bin
# the stand-in fills with links to that package's tools of the host's /usr
# (and only those), knotless-run is the binary at optPath, and k3s and
# bluesky-pds are the stand-in's (optPath/k3s, optPath/bluesky-pds).
#
# Every service's PATH is rendered as NixOS writes it: the unit's `path`,
# then coreutils, findutils, grep, sed and systemd.
#
#   nix-instantiate --eval --strict --json --read-write-mode --store DIR \
#     tests/vmscript/eval.nix --arg lib 'import LIB' --arg k3s ./nix/tests/k3s.nix \
#     --arg module ./nix/module.nix --argstr runsNamespace NS --argstr optPath /opt/knotless-test \
#     --argstr hostPath /opt/knotless-host
{
  lib,
  k3s ? ../../nix/tests/k3s.nix,
  module ? ../../nix/module.nix,
  # The runs' namespace: the stand-in's own on the shared test cluster, in
  # place of the module's default (knotless-runs), which k3s kubectl maps.
  runsNamespace ? null,
  optPath ? "/opt/knotless-test",
  # Where the host's packages are (a directory per package, hostPackages).
  hostPath ? "/opt/knotless-host",
}:
let
  render = import ../nix/render.nix { inherit lib; };

  host =
    name:
    {
      type = "derivation";
      inherit name;
      outPath = "${hostPath}/${name}";
      meta.mainProgram = name;
    };
  standin =
    name: mainProgram: extra:
    {
      type = "derivation";
      inherit name;
      outPath = "${optPath}/${name}";
      meta = { inherit mainProgram; };
    }
    // extra;
  stub = name: {
    type = "derivation";
    inherit name;
    outPath = throw "the VM script's stand-in has no ${name}";
  };

  package = standin "knotless-run" "knotless-run" { hasKubeconfigCommand = true; } // {
    outPath = optPath;
  };

  # The host's packages by their nixpkgs names; the stand-in makes each
  # one's bin (tests/vmscript, hostPackages).
  hostPackages = [
    "python3"
    "git"
    "jq"
    "coreutils"
    "findutils"
    "gnugrep"
    "gnused"
    "systemd"
  ];

  # What NixOS appends to every service's path (its systemd module).
  defaultPath = map (n: pkgs.${n}) [
    "coreutils"
    "findutils"
    "gnugrep"
    "gnused"
    "systemd"
  ];

  pkgs = lib.genAttrs hostPackages host // {
    inherit lib;
    tini = stub "tini";
    busybox = stub "busybox";
    k3s = standin "k3s" "k3s" { };
    bluesky-pds = standin "bluesky-pds" "pds" { };
    knotless-run = package;
    buildEnv = args: stub args.name;
    dockerTools.buildImage = args: stub args.name;
    writeText = name: text: builtins.toFile name text;
    # A directory in the real store; here a file holding its one file's
    # path and text, which the stand-in unpacks into a directory of the
    # same store path when it fills the machine's /nix/store.
    writeTextDir =
      path: text:
      {
        type = "derivation";
        name = baseNameOf path;
        outPath = builtins.toFile "${baseNameOf path}.textdir" (builtins.toJSON { inherit path text; });
      };
    formats.json =
      { }:
      {
        type = lib.types.attrsOf lib.types.anything;
        generate = name: value: builtins.toFile name (builtins.toJSON value);
      };
    testers.runNixOSTest = args: args;
    callPackage = _: _: throw "the VM script's stand-in builds no package";
  };

  test = import k3s {
    inherit lib pkgs package module;
  };

  server = lib.evalModules {
    modules = [
      ../nix/nixos-stubs.nix
      ./nixos.nix
      test.nodes.server
      {
        _module.args = {
          inherit pkgs;
          nodes = { };
        };
      }
      (lib.optionalAttrs (runsNamespace != null) { services.knotless-run.settings.namespace = runsNamespace; })
    ];
  };
  c = server.config;
  settingsFile =
    let
      m = builtins.match ".*--config (/nix/store/[^ ]+\\.json).*" c.systemd.services.knotless-run.serviceConfig.ExecStart;
    in
    if m == null then throw "knotless-run.service names no settings file" else lib.head m;
in
{
  inherit (test) name testScript;
  nodes = builtins.attrNames test.nodes;
  inherit hostPackages;
  server = {
    failedAssertions = map (a: a.message) (lib.filter (a: !a.assertion) c.assertions);
    units =
      lib.mapAttrs' (
        n: u: lib.nameValuePair "${n}.service" (render.renderService (u // { path = u.path ++ defaultPath; }))
      ) c.systemd.services
      // lib.mapAttrs' (n: u: lib.nameValuePair "${n}.timer" (render.renderTimer u)) c.systemd.timers;
    # What the boot starts: units wanted by multi-user.target.
    bootUnits = lib.attrNames (
      lib.filterAttrs (_: u: lib.elem "multi-user.target" u.wantedBy) c.systemd.services
    );
    users = lib.mapAttrs (_: u: { group = u.group or ""; home = u.home or "/var/empty"; }) c.users.users;
    groups = builtins.attrNames c.users.groups;
    systemPackages = lib.unique (map toString c.environment.systemPackages);
    # Read from the store by the caller (this evaluation cannot: the
    # store is not at /nix/store).
    inherit settingsFile;
  };
}
