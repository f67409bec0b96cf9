#!/usr/bin/env bash
# Installs the test PDS's npm packages (npm ci from package-lock.json),
# once per lockfile: a stamp holding the lockfile's hash makes a second
# call a no-op. better-sqlite3 is compiled here against the machine's Node
# headers (/usr/include/node), so nothing is downloaded but the packages.
set -euo pipefail
cd "$(dirname "$0")"
want=$(sha256sum package-lock.json | cut -d' ' -f1)
stamp=node_modules/.knotless-stamp
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "tests/pds: npm packages up to date"
  exit 0
fi
echo "tests/pds: npm ci (compiles better-sqlite3; takes about two minutes)"
export npm_config_nodedir=/usr
export npm_config_build_from_source=better-sqlite3
npm ci --no-audit --no-fund --loglevel=warn
echo "$want" > "$stamp"
