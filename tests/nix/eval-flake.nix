# Evaluates flake.nix's outputs, nix/package.nix and default.nix against a
# stand-in nixpkgs (nixpkgs' real lib, stub builders that return their
# arguments), so their wiring is checked without a nixpkgs checkout: output
# names per system, the package's builder arguments, the Go version check,
# the app's program, the module's import.
#
#   nix-instantiate --eval --strict --json tests/nix/eval-flake.nix \
#     --arg lib 'import <nixpkgs/lib>'
{ lib }:
let
  stubDrv =
    name: attrs:
    {
      type = "derivation";
      inherit name;
      outPath = "@${name}@";
    }
    // attrs;

  stubPkgs =
    system: goVersion:
    let
      pkgs = {
        inherit lib;
        stdenv.hostPlatform.system = system;
        callPackage =
          f: args:
          let
            fn = if builtins.isFunction f then f else import f;
            wanted = builtins.functionArgs fn;
          in
          fn ((builtins.intersectAttrs wanted pkgs) // args);
        # buildGoModule's shape: the derivation carries its arguments,
        # passthru at the top level, and `go`.
        buildGo126Module =
          args:
          stubDrv "${args.pname}-${args.version}" (
            removeAttrs args [ "passthru" ]
            // args.passthru
            // {
              go = stubDrv "go-${goVersion}" { version = goVersion; };
              meta = args.meta;
            }
          );
        testers.testVersion = args: stubDrv "test-version" { testVersionArgs = removeAttrs args [ "package" ]; };
        runCommand = name: _: _: stubDrv name { };
        mkShell = args: stubDrv "shell" { inherit (args) packages; };
        gopls = stubDrv "gopls" { };
        kubectl = stubDrv "kubectl" { };
        nixfmt-tree = stubDrv "nixfmt-tree" { };
        # What nix/tests/k3s.nix uses; the test itself is the arguments.
        inherit pkgs;
        testers.runNixOSTest = args: stubDrv args.name { inherit (args) testScript nodes; };
        buildEnv = args: stubDrv args.name { };
        dockerTools.buildImage = args: stubDrv "image" { };
        dockerTools.streamLayeredImage = args: stubDrv "stream-${args.name}" { imageArgs = args; };
        cacert = stubDrv "cacert" { };
        writeText = name: _: stubDrv name { };
        writeTextDir = path: _: stubDrv "dir" { };
        python3 = stubDrv "python3" { };
        tini = stubDrv "tini" { };
        busybox = stubDrv "busybox" { };
        jq = stubDrv "jq" { };
        git = stubDrv "git" { };
        gitMinimal = stubDrv "gitMinimal" { };
      };
    in
    pkgs;

  flake = import ../../flake.nix;
  nixpkgs = {
    inherit lib;
    legacyPackages = lib.genAttrs [ "x86_64-linux" "aarch64-linux" ] (s: stubPkgs s "1.26.2");
  };
  self = flake.outputs {
    inherit self nixpkgs;
  } // {
    lastModifiedDate = "20260427123456";
    shortRev = "abc1234";
  };
  out = flake.outputs { inherit self nixpkgs; };
  pkg = out.packages.x86_64-linux.default;

  callWithGo =
    goVersion:
    builtins.tryEval (
      builtins.deepSeq ((stubPkgs "x86_64-linux" goVersion).callPackage ../../nix/package.nix { }).pname true
    );
  viaDefault = import ../../default.nix {
    system = "x86_64-linux";
    nixpkgs = throw "default.nix must not fetch nixpkgs when pkgs is given";
    pkgs = stubPkgs "x86_64-linux" "1.26.2";
  };
in
{
  systems = lib.mapAttrs (_: builtins.attrNames) {
    inherit (out)
      packages
      apps
      checks
      devShells
      formatter
      ;
  };
  formatterIsDrv = lib.all (s: lib.isDerivation out.formatter.${s}) (builtins.attrNames out.formatter);
  outputs = builtins.attrNames out;
  perSystem = {
    packages = builtins.attrNames out.packages.x86_64-linux;
    apps = builtins.attrNames out.apps.x86_64-linux;
    checks = builtins.attrNames out.checks.x86_64-linux;
    devShells = builtins.attrNames out.devShells.x86_64-linux;
  };
  app = out.apps.x86_64-linux.default;
  packageTests = builtins.attrNames pkg.tests;
  image =
    let
      a = out.packages.x86_64-linux.image.imageArgs;
    in
    {
      inherit (a) name tag config fakeRootCommands;
      contents = map (p: p.name) a.contents;
    };
  package = {
    inherit (pkg)
      pname
      version
      vendorHash
      subPackages
      ldflags
      hasKubeconfigCommand
      hasMetricsListen
      hasReplicas
      goLine
      ;
    mainProgram = pkg.meta.mainProgram;
    license = pkg.meta.license.spdxId;
    description = pkg.meta.description;
    inherit (pkg) checkFlags;
    # Attribute names (the stubs are named after them): tests/nix/lib.sh
    # maps each to a Debian stand-in for the sandbox check.
    nativeCheckInputs = map (p: p.name) pkg.nativeCheckInputs;
    checkPhaseRunsAll =
      lib.hasInfix "go test \${checkFlags[@]}" pkg.checkPhase && lib.hasInfix "./..." pkg.checkPhase;
  };
  devShellPackages = map (p: p.name) out.devShells.x86_64-linux.default.packages;
  versionCheck = out.checks.x86_64-linux.version.testVersionArgs;
  vmCheck = out.checks.x86_64-linux.vm-k3s.name;
  # passthru.tests.vm-k3s: the VM test, the same one as the flake's check.
  packageVmTest = {
    inherit (pkg.tests.vm-k3s) name;
    sameScript = pkg.tests.vm-k3s.testScript == out.checks.x86_64-linux.vm-k3s.testScript;
    nodes = builtins.attrNames pkg.tests.vm-k3s.nodes;
  };
  # The same through default.nix (no flake): nix-build -A tests.vm-k3s.
  defaultNixVmTest = viaDefault.tests.vm-k3s.name;
  moduleImports = map (m: if builtins.isFunction m then "<function>" else baseNameOf (toString m)) out.nixosModules.default.imports;
  # The flake's module evaluated with the real module system (the option
  # declarations of nix/module.nix, NixOS stubs): the package it defaults
  # to, and that a user's setting still wins.
  modulePackage =
    let
      pkgs = stubPkgs "x86_64-linux" "1.26.2" // {
        formats.json = _: {
          type = lib.types.attrsOf lib.types.anything;
          generate = name: _: stubDrv name { };
        };
        coreutils = stubDrv "coreutils" { };
      };
      eval =
        extra:
        (lib.evalModules {
          modules = [
            ./nixos-stubs.nix
            out.nixosModules.default
            { _module.args.pkgs = pkgs; }
            extra
          ];
        }).config.services.knotless-run.package.name;
    in
    {
      default = eval { };
      instance = (lib.evalModules {
        modules = [
          ./nixos-stubs.nix
          out.nixosModules.default
          { _module.args.pkgs = pkgs; }
          { services.knotless-run.instances.a = { }; }
        ];
      }).config.services.knotless-run.instances.a.package.name;
      userSet = eval { services.knotless-run.package = stubDrv "mine" { }; };
      # metrics.enable with the flake's package: its assertion about
      # --metrics-listen holds.
      metricsRefused = map (a: a.message) (
        lib.filter (a: !a.assertion && lib.hasInfix "--metrics-listen" a.message)
          (lib.evalModules {
            modules = [
              ./nixos-stubs.nix
              out.nixosModules.default
              { _module.args.pkgs = pkgs; }
              { services.knotless-run = { enable = true; metrics.enable = true; }; }
            ];
          }).config.assertions
      );
    };
  overlay = (out.overlays.default (stubPkgs "x86_64-linux" "1.26.2") { }).knotless-run.pname;
  defaultNix = {
    inherit (viaDefault) pname vendorHash;
  };
  # The VM test's Python script, with the store paths it interpolates
  # stubbed; check.sh compiles it.
  vmTestScript = out.checks.x86_64-linux.vm-k3s.testScript;
  vmNodes = builtins.attrNames out.checks.x86_64-linux.vm-k3s.nodes;
  goTooOld = (callWithGo "1.25.9").success;
  goNewer = (callWithGo "1.26.9").success;
}
