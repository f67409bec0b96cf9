#!/usr/bin/env bash
# make demo: the example workflow as a Kubernetes Job on the repository's
# own local test cluster, with the runner's scoped credential.
#   1. bring up the test cluster (tests/cluster/up: built offline, cached)
#   2. mint the runner's scoped kubeconfig with `knotless-run kubeconfig`
#   3. `knotless-run run --executor kubernetes` on examples/hello
#   4. take the cluster down again (KEEP_CLUSTER=1 keeps it)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=bin/knotless-run
mkdir -p out

keep=${KEEP_CLUSTER:-0}
down() { ((keep)) || tests/cluster/down; }
trap down EXIT

tests/cluster/up
eval "$(tests/cluster/env)"

"$bin" kubeconfig --admin-kubeconfig "$KNOTLESS_TEST_KUBECONFIG" --out out/runner.kubeconfig \
	--namespace knotless-runs --service-account knotless-runner
rm -rf out/demo
"$bin" run --executor kubernetes --kubeconfig out/runner.kubeconfig --image "$KNOTLESS_TEST_IMAGE" \
	--workflow examples/hello/.knotless/workflows/build.yaml --workdir examples/hello \
	--outputs out/demo --result out/demo-result.json
echo "outputs in out/demo:"
ls -l out/demo
