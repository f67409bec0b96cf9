package clustertest_test

import (
	"bytes"
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"

	"knotless.dev/run/tests/clustertest"
)

// onNode is job pinned to one node.
func onNode(j *batchv1.Job, node string) *batchv1.Job {
	j.Spec.Template.Spec.NodeName = node
	return j
}

// The second node: its pods and the first node's reach each other, and
// its egress guard still drops what its pods send anywhere else (here
// the API server).
func TestSecondNodeNetwork(t *testing.T) {
	t.Parallel()
	c, node2 := clustertest.StartTwoNodes(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	server := runJob(ctx, t, c, onNode(job(c, "server", c.Image, "exec nc -ll -p 8080 -e echo pong"), c.Info.NodeName))
	client := runJob(ctx, t, c, onNode(job(c, "client", c.Image, "exec sleep 3600"), node2.Name))
	probe := func(target string) (string, int) {
		var out bytes.Buffer
		code, err := c.Exec(ctx, c.Namespace, client.Name, "run",
			[]string{"sh", "-c", "(sleep 1 | nc -w 2 " + target + ") 2>&1"}, nil, &out, &out)
		if err != nil {
			t.Fatalf("probe %s: %v", target, err)
		}
		return strings.TrimSpace(out.String()), code
	}
	var out string
	var code int
	for try := 1; try <= 5; try++ {
		if out, code = probe(server.Status.PodIP + " 8080"); code == 0 && out == "pong" {
			break
		}
		t.Logf("pod on %s -> pod on %s, try %d: %q, exit %d", node2.Name, c.Info.NodeName, try, out, code)
		time.Sleep(time.Second)
	}
	if code != 0 || out != "pong" {
		t.Fatalf("a pod on %s does not reach a pod on %s: %q, exit %d", node2.Name, c.Info.NodeName, out, code)
	}

	api, err := url.Parse(c.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	before, err := node2.GuardDrops(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, code = probe(api.Hostname() + " " + api.Port())
	after, err := node2.GuardDrops(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pod on %s -> API server %s: exit %d %q; guard drops %d -> %d", node2.Name, api.Host, code, out, before, after)
	if code == 0 {
		t.Errorf("a pod on %s reached the API server %s", node2.Name, api.Host)
	}
	if after <= before {
		t.Errorf("the egress guard of %s did not drop the probe (%d -> %d)", node2.Name, before, after)
	}
}
