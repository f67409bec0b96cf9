# knotless-run for users without flakes: `nix-build` builds the same package
# as the flake, from the nixpkgs that flake.lock pins.
#
#   nix-build                       # ./result/bin/knotless-run
#   nix-build --arg pkgs 'import <nixpkgs> { }'   # with another nixpkgs
{
  system ? builtins.currentSystem,
  nixpkgs ?
    let
      lock = builtins.fromJSON (builtins.readFile ./flake.lock);
      pinned = lock.nodes.${lock.nodes.${lock.root}.inputs.nixpkgs}.locked;
    in
    builtins.fetchTarball {
      url = "https://github.com/${pinned.owner}/${pinned.repo}/archive/${pinned.rev}.tar.gz";
      sha256 = pinned.narHash;
    },
  pkgs ? import nixpkgs {
    inherit system;
    config = { };
    overlays = [ ];
  },
}:

pkgs.callPackage ./nix/package.nix { }
