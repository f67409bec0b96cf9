"""Lint of the VM test (nix/tests/k3s.nix): a repository source on the
server's own disk (a file:// URL or an absolute path handed to the forge)
is refused by knotless-run unless the runner allows local sources, so the
test would wait in vain for its first run. Reads tests/vmscript/eval.nix's
JSON and the runner's settings file it names.

  python3 check-vm-sources.py EVAL.json SETTINGS.json
Prints one line per finding; exits 1 if there is any.
"""

import json
import re
import sys

# A source on the machine: file://..., or an absolute path as the source
# argument of `forge repo` (forge.py repo DID PASSWORD NAME SOURCE RUNNER).
LOCAL = re.compile(r"""["'](file://[^"']*)["']|forge\("repo",\s*[^,]+,\s*[^,]+,\s*[^,]+,\s*["'](/[^"']*)["']""")


def findings(script, settings, exec_start=""):
    allowed = settings.get("allow-local-sources") is True or "--allow-local-sources" in exec_start.split()
    if allowed:
        return []
    out = []
    for n, line in enumerate(script.splitlines(), 1):
        for m in LOCAL.finditer(line):
            out.append(
                f"line {n}: the source {m.group(1) or m.group(2)} is local, and services.knotless-run.settings"
                '."allow-local-sources" is not true: the runner refuses it (--allow-local-sources)'
            )
    return out


def main():
    ev = json.load(open(sys.argv[1]))
    settings = json.load(open(sys.argv[2]))
    exec_start = next((line for line in ev["server"]["units"]["knotless-run.service"].splitlines() if line.startswith("ExecStart=")), "")
    found = findings(ev["testScript"], settings, exec_start)
    for f in found:
        print(f)
    # The lint itself: without the setting, the script's source is found.
    if not found and not findings(ev["testScript"], {k: v for k, v in settings.items() if k != "allow-local-sources"}):
        print("check-vm-sources.py finds no local source in the script even without allow-local-sources: the lint is blind")
        sys.exit(1)
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
