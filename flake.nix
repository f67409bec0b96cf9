{
  description = "knotless-run, the CI runner of knotless";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs =
    { self, nixpkgs }:
    let
      inherit (nixpkgs) lib;
      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      forAllSystems = f: lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});

      version = "0-unstable-${
        lib.substring 0 8 (self.lastModifiedDate or "19700101")
      }-${self.shortRev or self.dirtyShortRev or "dirty"}";
    in
    {
      overlays.default = final: _prev: {
        knotless-run = final.callPackage ./nix/package.nix { inherit version; };
      };

      packages = forAllSystems (pkgs: rec {
        knotless-run = pkgs.callPackage ./nix/package.nix { inherit version; };
        default = knotless-run;
        # The runner's image for a cluster, knotless-run:VERSION.
        image = pkgs.callPackage ./nix/image.nix { package = knotless-run; };
      });

      apps = forAllSystems (pkgs: {
        default = {
          type = "app";
          program = lib.getExe self.packages.${pkgs.stdenv.hostPlatform.system}.default;
          meta.description = "knotless-run, the CI runner of knotless (e.g. `nix run <flake> -- run --executor shell --workflow FILE`)";
        };
      });

      # Nix 2.8 refuses a bare path here ("module must be a function or an
      # attribute set"), so the module is wrapped. From the flake, the
      # package defaults to the flake's own build (a user's setting wins).
      nixosModules.default = {
        imports = [
          ./nix/module.nix
          (
            { lib, pkgs, ... }:
            {
              services.knotless-run.package = lib.mkDefault self.packages.${pkgs.stdenv.hostPlatform.system}.default;
            }
          )
        ];
      };

      checks = forAllSystems (
        pkgs:
        let
          package = self.packages.${pkgs.stdenv.hostPlatform.system}.default;
        in
        {
          # Builds the binary and runs the -short unit tests (checkPhase).
          inherit package;
          # The package's own tests (passthru.tests, as nixpkgs runs them):
          # its version, and the NixOS VM test (nix/tests/k3s.nix).
          inherit (package.tests) version vm-k3s;
        }
      );

      devShells = forAllSystems (pkgs: {
        default = pkgs.mkShell {
          packages = [
            # The Go that builds the package, so go.mod's go line holds here too.
            self.packages.${pkgs.stdenv.hostPlatform.system}.default.go
            pkgs.gopls
            pkgs.kubectl
          ];
          # Use the shell's Go, never a downloaded toolchain.
          env.GOTOOLCHAIN = "local";
        };
      });

      formatter = forAllSystems (pkgs: pkgs.nixfmt-tree or pkgs.nixfmt-rfc-style);
    };
}
