"""Offline check of the VM test's Python script (nix/tests/k3s.nix's
testScript, with its store paths already interpolated by eval-flake.nix).

The NixOS test driver runs the script with its own names in scope: one
Machine per node, subtest, start_all and a few more. This compiles the
script (py_compile), then walks its symbol tables (symtable) and fails on:

  - a global name that is neither assigned in the script, nor a builtin,
    nor a name the driver provides (so `sever.succeed` or an undefined
    helper fails here, not 20 minutes into a VM run);
  - an attribute of a node that is no method of the driver's Machine
    (`server.wait_until_succeed`);

  python3 check-vm-script.py SCRIPT.py NODE...
Prints one line per finding; exits 1 if there is any.
"""

import ast
import builtins
import py_compile
import symtable
import sys

# What the test driver puts in the script's globals besides the machines
# (nixos/lib/test-driver: Driver.test_symbols).
DRIVER_NAMES = {
    "start_all",
    "test_script",
    "machines",
    "vlans",
    "driver",
    "log",
    "os",
    "create_machine",
    "subtest",
    "run_tests",
    "join_all",
    "retry",
    "serial_stdout_off",
    "serial_stdout_on",
    "polling_condition",
    "Machine",
    "t",
}

# Methods of the driver's Machine the script may call (a subset of
# nixos/lib/test-driver's Machine; extend it when the script needs more).
MACHINE_METHODS = {
    "start",
    "shutdown",
    "crash",
    "reboot",
    "succeed",
    "fail",
    "execute",
    "systemctl",
    "wait_for_unit",
    "wait_until_succeeds",
    "wait_until_fails",
    "wait_for_open_port",
    "wait_for_closed_port",
    "wait_for_file",
    "wait_for_console_text",
    "require_unit_state",
    "get_unit_info",
    "get_unit_property",
    "copy_from_host",
    "copy_from_vm",
    "copy_from_host_via_shell",
    "sleep",
    "block",
    "unblock",
    "send_chars",
    "send_key",
    "send_monitor_command",
    "screenshot",
    "log",
    "nested",
    "name",
}


def findings(path, nodes):
    out = []
    try:
        py_compile.compile(path, doraise=True)
    except py_compile.PyCompileError as e:
        return [f"does not compile: {e.msg}"]
    source = open(path).read()
    top = symtable.symtable(source, path, "exec")
    known = set(dir(builtins)) | DRIVER_NAMES | set(nodes)
    defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}

    tree = ast.parse(source, path)
    first_use = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            first_use[node.id] = min(first_use.get(node.id, node.lineno), node.lineno)

    def walk(table):
        for sym in table.get_symbols():
            name = sym.get_name()
            # A name read in this scope that resolves to the globals (the
            # module scope itself, or an implicit global in a function).
            is_global = table is top or sym.is_global()
            if sym.is_referenced() and is_global and name not in defined and name not in known:
                out.append(f"line {first_use.get(name, '?')}: {name} is used in {table.get_name()} but defined nowhere")
        for child in table.get_children():
            walk(child)

    walk(top)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in nodes
            and node.attr not in MACHINE_METHODS
        ):
            out.append(f"line {node.lineno}: {node.value.id}.{node.attr} is no method of the test driver's Machine")
    return out


def main():
    path, nodes = sys.argv[1], sys.argv[2:]
    found = findings(path, nodes)
    for f in found:
        print(f)
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
