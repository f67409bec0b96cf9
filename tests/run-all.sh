#!/usr/bin/env bash
# The whole test suite, as `make test` and CI run it: static checks, then
# every Go test with the real servers the integration tests need (the
# Kubernetes test cluster from tests/cluster), each phase timed. What it
# starts it stops, also on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

phase_name="" phase_start=0
phase() {
	local now
	now=$(date +%s)
	[[ -z $phase_name ]] || echo "=== $phase_name: $((now - phase_start))s"
	phase_name=$1 phase_start=$now
	[[ $phase_name == done ]] || echo "=== $phase_name"
}

cluster_up=0
cleanup() {
	local rc=$?
	if ((cluster_up)); then
		phase "cluster down"
		"$root/tests/cluster/down" || rc=1
	fi
	phase done
	exit "$rc"
}
trap cleanup EXIT

phase "format and vet"
bad=$(gofmt -l $(git ls-files '*.go') 2>/dev/null || true)
if [[ -n $bad ]]; then
	echo "gofmt would change:"; echo "$bad"; exit 1
fi
go vet ./...

phase "test PDS packages (npm ci, cached by lockfile)"
bash tests/pds/install.sh

phase "docker packages for the private test dockerd"
sh tests/dockerd/install

phase "docker-registry for the private test registry"
sh tests/registry/install

phase "systemd-nspawn for the appliance tests under a real systemd"
sh tests/systemd/install

phase "prometheus for the alert rules' tests and the Prometheus harness"
sh tests/prometheus/install

phase "curl and jq for the first-hour guide's commands"
sh tests/guide/install

phase "chromium for the browser test"
sh tests/browser/install

phase "nix-bin for the VM test's script run here (tests/vmscript evaluates nix/tests/k3s.nix)"
bash -c '. tests/nix/lib.sh && ensure_nix'

phase "cluster up"
cluster_up=1
tests/cluster/up
eval "$(tests/cluster/env)"

# tests_calling ERE prints the Test functions whose own body matches ERE
# (a phase's tests are picked by that call), and fails naming the place
# when a function that is not a Test makes the call: its tests would run
# in the wrong phase.
tests_calling() {
	{ grep -rlE --exclude-dir=node_modules --include='*_test.go' "$1" . || true; } |
		RE=$1 xargs -r awk '
			/^func / { name = ($0 ~ /^func Test/) ? $2 : ""; sub(/\(.*/, "", name) }
			$0 ~ ENVIRON["RE"] {
				if (name == "") { printf "%s:%d: %s outside a Test function'"'"'s own body: tests/run-all.sh cannot pick its tests\n", FILENAME, FNR, ENVIRON["RE"] > "/dev/stderr"; bad = 1 }
				else print name
			}
			END { exit bad }' | sort -u
}
# packages_calling ERE prints the directories of the test files matching ERE.
packages_calling() {
	{ grep -rlE --exclude-dir=node_modules --include='*_test.go' "$1" . || true; } | xargs -r -n1 dirname | sort -u
}

# Tests that disrupt the shared cluster (they call clustertest.StartExclusive:
# an API server restart, say; or clustertest.StartKwok: the capacity rig's
# hundreds of fake nodes) run in a phase of their own after the others,
# so no test depends on another package not running beside it.
exclusive_call='clustertest\.(StartExclusive\(t\)|StartKwok\(t, )'
disruptive=$(tests_calling "$exclusive_call" | paste -sd'|')
disruptive_pkgs=$(packages_calling "$exclusive_call")

# Tests on two nodes (they call clustertest.StartTwoNodes or
# StartTwoNodesExclusive, and fail on a cluster without its second node)
# run last, after tests/cluster/add-node changes the cluster's shape; so
# do the tests of the tenant pool (clustertest.StartNodePool), which
# remove and add the second node as their scaler decides.
twonode_call='clustertest\.(StartTwoNodes(Exclusive)?|StartNodePool)\(t\)'
twonode=$(tests_calling "$twonode_call" | paste -sd'|')
twonode_pkgs=$(packages_calling "$twonode_call")

phase "go test"
go test -count=1 -timeout 25m -skip "^(${disruptive}${twonode:+|$twonode})\$" ./...

phase "go test: tests that disrupt the shared cluster ($disruptive)"
# shellcheck disable=SC2086
go test -count=1 -timeout 10m -run "^($disruptive)\$" $disruptive_pkgs

if [[ -n $twonode ]]; then
	phase "go test: tests on two nodes, after adding the cluster's second node ($twonode)"
	tests/cluster/add-node
	eval "$(tests/cluster/env)"
	# shellcheck disable=SC2086
	go test -count=1 -timeout 10m -run "^($twonode)\$" $twonode_pkgs
fi

phase "nix: offline checks of the flake, package and module"
bash tests/nix/check.sh
