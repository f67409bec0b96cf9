# knotless-run, built from this repository with the Go that matches go.mod.
#
# The builder is chosen by go.mod's `go` line: `go 1.26.0` needs Go 1.26, so
# this takes buildGo126Module. When go.mod moves to a new minor release,
# change the argument below (tests/nix/check.sh fails until they agree).
{
  lib,
  callPackage,
  gitMinimal,
  testers,
  buildGo126Module ?
    throw "knotless-run: go.mod asks for Go 1.26 and this nixpkgs has no buildGo126Module; use a nixpkgs that ships Go 1.26 (the flake's pinned one does)",
  version ? "0-unstable",
}:

let
  # buildGoModule runs with GOTOOLCHAIN=local: a go line above the Go that
  # builds it fails deep inside the build. Say so at evaluation instead.
  goLineMatch = builtins.match ".*\ngo ([0-9.]+)\n.*" ("\n" + builtins.readFile ../go.mod + "\n");
  goLine =
    if goLineMatch == null then
      throw "knotless-run: no go line found in go.mod"
    else
      lib.head goLineMatch;

  package = buildGo126Module {
    pname = "knotless-run";
    inherit version;

    # The repository minus Nix files, docs and leftovers (nix/source.nix),
    # so editing those does not rebuild the package.
    src = lib.fileset.toSource {
      root = ../.;
      fileset = lib.fileset.difference ../. (
        lib.fileset.unions (
          map (p: lib.fileset.maybeMissing (../. + "/${p}")) (import ./source.nix).exclude
        )
      );
    };

    # The NAR hash of `go mod vendor` for the source above.
    # tests/nix/vendor-hash.sh prints it; `--write` updates this line.
    vendorHash = "sha256-Famk9f29X7tL8GFMJNKedRwkZ0LFt6bfl8tIfX42ss8=";

    subPackages = [ "cmd/knotless-run" ];

    env.CGO_ENABLED = 0;

    ldflags = [
      "-s"
      "-X knotless.dev/run/internal/lib/version.Version=${version}"
    ];

    # The alert rules, for services.prometheus.ruleFiles (the module's
    # services.knotless-run.metrics.rulesFile names this file).
    postInstall = ''
      install -Dm444 monitoring/knotless-run.rules.yml $out/share/knotless-run/knotless-run.rules.yml
    '';

    # What the unit tests call besides Go and stdenv's tools: git
    # (internal/mirror runs it). tests/nix/check.sh runs the tests in an
    # emulated sandbox with only these on PATH.
    nativeCheckInputs = [ gitMinimal ];

    # -short: every test that cannot run in the build sandbox (no network
    # but loopback, no root, no FHS userland, no cluster, PDS or Docker)
    # skips itself under -short and says why.
    checkFlags = [ "-short" ];

    # subPackages would limit the tests to cmd/knotless-run, which has
    # none: run every package's unit tests.
    checkPhase = ''
      runHook preCheck
      export GOFLAGS=''${GOFLAGS//-trimpath/}
      go test ''${checkFlags[@]} -vet=off -p "$NIX_BUILD_CORES" ./...
      runHook postCheck
    '';

    passthru = {
      inherit goLine;
      # What nixpkgs' CI and `nix build .#knotless-run.tests.version` run.
      tests.version = testers.testVersion {
        inherit package;
        command = "knotless-run version";
        inherit version;
      };
      # The NixOS VM test (nix/tests/k3s.nix: the module on a k3s server, a
      # PDS, an agent that joins only when a run needs it), wired as nixpkgs
      # packages wire theirs: `nix build .#knotless-run.tests.vm-k3s`. The
      # flake's checks.vm-k3s is this one.
      tests.vm-k3s = callPackage ./tests/k3s.nix {
        inherit package;
        module = ./module.nix;
      };
      # `serve --metrics-listen` exists (issue 33): the module's
      # metrics.enable asserts on this.
      hasMetricsListen = true;
      # `knotless-run kubeconfig` exists (issue 7): the module's
      # kubeconfigRefresh asserts on this, and the VM test needs it.
      hasKubeconfigCommand = true;
      # serve's live output (--listen, --output-service) and the
      # output-service command exist (issue 31): the module's liveOutput
      # and outputService assert on this.
      hasLiveOutput = true;
      # serve --replicas and --replica-name exist (issue 48): the
      # module's replicas.enable asserts on this.
      hasReplicas = true;
    };

    meta = {
      description = "CI runner of knotless: runs workflows as Kubernetes Jobs";
      longDescription = ''
        knotless-run watches repositories on an atproto PDS, runs their
        workflows as Kubernetes Jobs (or in Docker, or as local processes),
        and publishes each run's result as a check record.
      '';
      license = lib.licenses.mit;
      mainProgram = "knotless-run";
      platforms = lib.platforms.linux;
    };
  };
in
lib.throwIfNot (lib.versionAtLeast package.go.version goLine)
  "knotless-run: go.mod says go ${goLine} but buildGo126Module has Go ${package.go.version}; lower the go line or use a newer nixpkgs"
  package
