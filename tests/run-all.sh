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

phase "cluster up"
cluster_up=1
tests/cluster/up
eval "$(tests/cluster/env)"

# Tests that disrupt the shared cluster (they call clustertest.StartExclusive:
# an API server restart, say) run in a phase of their own after the others,
# so no test depends on another package not running beside it.
disruptive=$(grep -rl --exclude-dir=node_modules --include='*_test.go' 'clustertest.StartExclusive(t)' . |
	xargs awk '/^func Test/ { name = $2; sub(/\(.*/, "", name) } /clustertest.StartExclusive\(t\)/ { print name }' |
	sort -u | paste -sd'|')
disruptive_pkgs=$(grep -rl --exclude-dir=node_modules --include='*_test.go' 'clustertest.StartExclusive(t)' . | xargs -n1 dirname | sort -u)

# Tests on two nodes (they call clustertest.StartTwoNodes or
# StartTwoNodesExclusive, and fail on a cluster without its second node)
# run last, after tests/cluster/add-node changes the cluster's shape.
twonode_files=$(grep -rlE --exclude-dir=node_modules --include='*_test.go' 'clustertest\.StartTwoNodes(Exclusive)?\(t\)' . || true)
twonode=$(echo "$twonode_files" | xargs -r awk '/^func Test/ { name = $2; sub(/\(.*/, "", name) } /clustertest\.StartTwoNodes(Exclusive)?\(t\)/ { print name }' |
	sort -u | paste -sd'|')
twonode_pkgs=$(echo "$twonode_files" | xargs -r -n1 dirname | sort -u)

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
