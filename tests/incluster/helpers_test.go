package incluster

import (
	"bufio"
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/types"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/tests/clustertest"
	"knotless.dev/run/tests/gitrepo"
	"knotless.dev/run/tests/pds"
)

func catalog(t *testing.T) *pdsclient.Catalog {
	t.Helper()
	cat, err := pdsclient.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	return cat
}

// ruleSet lists rules as rights sorts them.
func ruleSet(rules []rbacv1.PolicyRule) []string {
	var out []string
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					out = append(out, g+" "+res+" "+v)
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// world is the owner's repository (served over HTTP from src) and the
// runner's account.
type world struct {
	t       *testing.T
	owner   *pds.Account
	runner  *pds.Account
	src     *gitrepo.Repo
	repoURI syntax.ATURI
	reader  *pdsclient.Reader
}

func (w *world) put(a *pds.Account, collection, rkey string, v any) syntax.ATURI {
	w.t.Helper()
	uri, err := a.Put(context.Background(), collection, rkey, v)
	if err != nil {
		w.t.Fatal(err)
	}
	return uri
}

// push commits files on main and writes the refUpdate.
func (w *world) push(files map[string]string) (syntax.ATURI, string) {
	w.t.Helper()
	old := w.src.Head("refs/heads/main")
	commit := w.src.Commit("main", files)
	uri := w.put(w.owner, forge.CollectionRefUpdate, "", forge.RefUpdate{
		Type: forge.CollectionRefUpdate, Repo: w.repoURI.String(), Ref: "refs/heads/main", Old: old, New: commit, CreatedAt: forge.Now(),
	})
	return uri, commit
}

func (w *world) checks(ctx context.Context) []forge.Record[forge.Check] {
	recs, bad, err := pdsclient.List[forge.Check](ctx, w.reader, w.runner.DID, forge.CollectionCheck)
	if err != nil {
		w.t.Fatal(err)
	}
	if len(bad) > 0 {
		w.t.Fatalf("invalid check records: %v", bad)
	}
	return recs
}

// waitFinal waits for the final check of workflow on commit.
func (w *world) waitFinal(ctx context.Context, workflow, commit string) forge.Check {
	w.t.Helper()
	for {
		var seen []forge.Check
		for _, r := range w.checks(ctx) {
			if r.Value.Workflow == workflow && r.Value.Subject.Commit == commit {
				if r.Value.Final() {
					return r.Value
				}
				seen = append(seen, r.Value)
			}
		}
		select {
		case <-ctx.Done():
			w.t.Fatalf("no final check of %s on %s: %v; seen %+v", workflow, commit, ctx.Err(), seen)
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// watchFinals polls the check of workflow on commit until ctx ends and
// returns a count of the distinct final versions (record CIDs) seen.
func (w *world) watchFinals(ctx context.Context, workflow, commit string) func() int {
	var mu sync.Mutex
	finals := map[string]bool{}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			recs, _, err := pdsclient.List[forge.Check](ctx, w.reader, w.runner.DID, forge.CollectionCheck)
			if err == nil {
				for _, r := range recs {
					if r.Value.Workflow == workflow && r.Value.Subject.Commit == commit && r.Value.Final() {
						mu.Lock()
						finals[r.CID] = true
						mu.Unlock()
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	w.t.Cleanup(func() { cancel(); <-done })
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(finals)
	}
}

func (w *world) blob(ctx context.Context, ch forge.Check) string {
	w.t.Helper()
	if ch.Log == nil {
		w.t.Fatal("the check has no log blob")
	}
	b, err := w.reader.GetBlob(ctx, w.runner.DID, ch.Log.Ref.String())
	if err != nil {
		w.t.Fatal(err)
	}
	return string(b)
}

// podLogs follows the runner container's log of each runner pod (a
// deleted pod's log goes with it), each line after the kubelet's time
// stamp.
type podLogs struct {
	c  *clustertest.Cluster
	ns string
	wg sync.WaitGroup

	mu     sync.Mutex
	logs   map[types.UID]*bytes.Buffer
	order  []types.UID
	cancel []context.CancelFunc
}

func (l *podLogs) follow(ctx context.Context, p *corev1.Pod) {
	ctx, cancel := context.WithCancel(ctx)
	buf := &bytes.Buffer{}
	l.mu.Lock()
	l.logs[p.UID] = buf
	l.order = append(l.order, p.UID)
	l.cancel = append(l.cancel, cancel)
	l.mu.Unlock()
	l.wg.Go(func() {
		rc, err := l.c.Clientset.CoreV1().Pods(l.ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: "runner", Follow: true, Timestamps: true}).Stream(ctx)
		if err != nil {
			l.mu.Lock()
			buf.WriteString("follow the log: " + err.Error() + "\n")
			l.mu.Unlock()
			return
		}
		defer rc.Close()
		sc := bufio.NewScanner(rc)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			l.mu.Lock()
			buf.WriteString(sc.Text() + "\n")
			l.mu.Unlock()
		}
	})
}

func (l *podLogs) text(uid types.UID) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if b := l.logs[uid]; b != nil {
		return b.String()
	}
	return ""
}

func (l *podLogs) all() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var s strings.Builder
	for _, uid := range l.order {
		s.WriteString("=== pod " + string(uid) + "\n" + l.logs[uid].String())
	}
	return s.String()
}

// waitFor waits until the pod's log has a line containing s and returns
// the line's time stamp (zero when ctx ends first).
func (l *podLogs) waitFor(ctx context.Context, uid types.UID, s string) time.Time {
	for {
		for _, line := range strings.Split(l.text(uid), "\n") {
			if stamp, rest, ok := strings.Cut(line, " "); ok && strings.Contains(rest, s) {
				at, err := time.Parse(time.RFC3339Nano, stamp)
				if err != nil {
					return time.Time{}
				}
				return at
			}
		}
		select {
		case <-ctx.Done():
			return time.Time{}
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (l *podLogs) stop() {
	l.mu.Lock()
	for _, c := range l.cancel {
		c()
	}
	l.mu.Unlock()
	l.wg.Wait()
}
