# How NixOS writes a unit file from systemd.services.<name> and
# systemd.timers.<name>: one `Key=value` line per value (lists give one line
# per item), booleans as true/false, keys sorted. Shared by tests/nix/eval.nix
# (the golden units) and tests/vmscript/eval.nix (the VM test's machine).
{ lib }:
let
  inherit (lib)
    concatLists
    concatStrings
    filterAttrs
    mapAttrsToList
    toList
    ;
  toOption =
    x:
    if x == true then
      "true"
    else if x == false then
      "false"
    else
      toString x;
  section =
    attrs:
    concatStrings (
      concatLists (mapAttrsToList (k: v: map (x: "${k}=${toOption x}\n") (toList v)) attrs)
    );
  unitSection =
    u:
    section (
      filterAttrs (_: v: v != "") {
        Description = u.description;
        Wants = toString u.wants;
        Requires = toString u.requires;
        After = toString u.after;
        Before = toString u.before;
        PartOf = toString u.partOf;
        BindsTo = toString u.bindsTo;
      }
      // u.unitConfig
      // lib.optionalAttrs (u ? restartIfChanged && !u.restartIfChanged) { X-RestartIfChanged = false; }
    );
  install = u: lib.optionalString (u.wantedBy != [ ]) "\n[Install]\n${section { WantedBy = u.wantedBy; }}";

  # NixOS also puts its default packages (coreutils, findutils, grep, sed,
  # systemd) on PATH; only the unit's own `path` is rendered here.
  environment =
    u:
    u.environment
    // lib.optionalAttrs (u.path != [ ]) {
      PATH = "${lib.makeBinPath u.path}:${lib.makeSearchPathOutput "bin" "sbin" u.path}";
    };
  renderService =
    u:
    "[Unit]\n"
    + unitSection u
    + "\n[Service]\n"
    + concatStrings (mapAttrsToList (k: v: "Environment=${builtins.toJSON "${k}=${v}"}\n") (environment u))
    + section u.serviceConfig
    + install u;
  renderTimer = u: "[Unit]\n" + unitSection u + "\n[Timer]\n" + section u.timerConfig + install u;

in
{
  inherit toOption renderService renderTimer;
}
