#!/usr/bin/env bash
# The whole test suite, as `make test` and CI run it: checks, then every
# Go test with the real servers the integration tests need, each phase
# timed. Everything it starts it stops, also on failure.
set -euo pipefail
cd "$(dirname "$0")/.."

phase_start=0
phase() {
  local now
  now=$(date +%s)
  if [ "$phase_start" != 0 ]; then
    echo "=== phase done in $((now - phase_start))s"
  fi
  phase_start=$now
  echo "=== $*"
}

phase "format and vet"
bad=$(gofmt -l $(git ls-files '*.go') 2>/dev/null || true)
if [ -n "$bad" ]; then
  echo "gofmt would change:"; echo "$bad"; exit 1
fi
go vet ./...

phase "go test"
go test -count=1 ./... 2>&1 | tee /tmp/knotless-go-test.log
phase "done"
