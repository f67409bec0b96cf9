# What stays out of the package's source: the repository minus these paths
# (relative to its root; missing ones are fine). Everything else is in, so
# a new Go package needs no edit here. nix/package.nix turns this into a
# lib.fileset; tests/nix/lib.sh copies the same selection to compute
# vendorHash, so the two cannot drift apart.
{
  exclude = [
    # Nix and docs: editing them must not rebuild the package.
    "flake.nix"
    "flake.lock"
    "default.nix"
    "nix"
    "tests/nix"
    "docs"
    # deploy/: the units and scripts for hosts without NixOS, and the
    # image script (its tests skip in the build sandbox).
    "deploy"
    ".ci"
    "README.md"
    # Never source: version control and build or install leftovers
    # (.gitignore); a git flake leaves them out anyway, a path does not.
    ".git"
    "vendor"
    "result"
    "bin"
    "out"
    "node_modules"
    "tests/pds/node_modules"
  ];
}
