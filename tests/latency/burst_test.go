package latency

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/parts/intake"
	"knotless.dev/run/tests/clustertest"
	"knotless.dev/run/tests/forgeworld"
	"knotless.dev/run/tests/gitrepo"
	"knotless.dev/run/tests/pds"
)

// burstN is how many repositories the burst pushes to at once: as many
// as the intake considers at once.
const burstN = intake.ConsiderAtOnce

// BenchmarkBurstToRunning measures the bounded parallel intake through
// `serve` on the Kubernetes executor: burstN repositories each get one
// push at the same moment (the refUpdate records written concurrently),
// and, in the same run, one repository gets one push alone. From the
// daemon's own records it reports the medians, in milliseconds, of the
// event received (the first refUpdate's hint) to the last of the
// pushes' `running` checks written (the daemon logs "run started" once
// the running check is written, beside the Job's creation), for the
// burst and for the single push, and the ratio of the two medians
// (burst-over-one; the goal is ≤ 1.5). serve runs burstN runs at once
// (--concurrency), so every running check is written although the
// cluster's one node takes one run at a time (the other pods wait
// Pending). Each iteration waits for every final check and for every
// Job deleted before the next.
//
// It runs twice: with the PDS on the loopback (pds=loopback), where the
// PDS, the cluster and the daemon share the machine's processors, and
// with the daemon reaching the PDS over a link of 50 ms round trip
// (pds=50ms, farLink), as a runner reaches a hosted PDS: its event
// stream, its reads and its writes.
//
//	go test ./tests/latency -run XXX -bench BurstToRunning -benchtime 5x
func BenchmarkBurstToRunning(b *testing.B) {
	for _, link := range []struct {
		name string
		rtt  time.Duration
	}{{"pds=loopback", 0}, {"pds=50ms", 50 * time.Millisecond}} {
		b.Run(link.name, func(b *testing.B) { benchBurst(b, link.rtt) })
	}
}

// benchBurst is BenchmarkBurstToRunning with the PDS rtt away (on the
// loopback when 0).
func benchBurst(b *testing.B, rtt time.Duration) {
	c := clustertest.Start(b)
	var srv *pds.Server
	if rtt > 0 {
		srv = startFarPDS(b, rtt)
	} else {
		srv = startPDS(b)
	}
	w := forgeworld.New(b, srv, forgeworld.Options{App: "latency"})
	repos, extra := reposAtOnce(b, w, burstN)
	d := startServe(b, w, c, "", extra)

	n := 0
	// The first burst: every repository's mirror made, the network
	// policies made, the image warm.
	d.burst(b, w, repos, &n, nil)
	var one, many []time.Duration
	for b.Loop() {
		one = append(one, d.burst(b, w, repos[:1], &n, nil))
		many = append(many, d.burst(b, w, repos, &n, nil))
	}
	b.ReportMetric(ms(median(one)), "one-event-to-running-ms")
	b.ReportMetric(ms(median(many)), fmt.Sprintf("burst%d-event-to-last-running-ms", burstN))
	b.ReportMetric(float64(median(many))/float64(median(one)), "burst-over-one")
}

// reposAtOnce is forgeworld's repository and n-1 more of its owner,
// and the arguments of a serve that watches them all and runs n at
// once.
func reposAtOnce(tb testing.TB, w *forgeworld.World, n int) ([]repo, []string) {
	tb.Helper()
	repos := []repo{mainRepo(w)}
	extra := []string{"--concurrency", strconv.Itoa(n)}
	for i := 1; i < n; i++ {
		r := addRepo(tb, w, fmt.Sprintf("%s-%d", forgeworld.RepoName, i+1))
		repos = append(repos, r)
		extra = append(extra, w.Owner.DID.String()+"/"+r.uri.RecordKey().String())
	}
	return repos, extra
}

// addRepo makes another repository of w's owner, named name, that
// names w's runner, with a git source of its own.
func addRepo(tb testing.TB, w *forgeworld.World, name string) repo {
	tb.Helper()
	r := repo{uri: forge.RepoURI(w.Owner.DID, name), src: gitrepo.New(tb)}
	w.Put(w.Owner, forge.CollectionRepo, name, forge.Repo{
		Type: forge.CollectionRepo, Name: name, Source: "file://" + r.src.Dir, DefaultBranch: "main",
		Runners: []string{w.Runner.DID.String()}, CreatedAt: forge.Now(),
	})
	return r
}

// burst pushes one commit to each of repos at once (their refUpdate
// records written concurrently), returns the time from the first event
// the daemon received to the last of their running checks written, and
// waits for their final checks and their Jobs' clean-up. n counts the
// pushes, for distinct commits. allRunning, when set, is called once
// every running check is written, before the final checks are waited
// for.
func (d *daemon) burst(tb testing.TB, w *forgeworld.World, repos []repo, n *int, allRunning func()) time.Duration {
	tb.Helper()
	type pushed struct {
		old, commit string
		rkey        syntax.TID
		uri         syntax.ATURI
		err         error
	}
	ps := make([]pushed, len(repos))
	for i, r := range repos {
		ps[i].old, ps[i].commit = r.commit(*n)
		*n++
		// Distinct record keys although written in the same microsecond.
		ps[i].rkey = syntax.NewTIDNow(uint(i))
	}
	timeline := os.Getenv(envTimeline) != ""
	var cpu0 map[string]int64
	if timeline {
		cpu0 = cpuTimes()
	}
	t0 := time.Now()
	var wg sync.WaitGroup
	for i, r := range repos {
		wg.Go(func() {
			p := &ps[i]
			p.uri, p.err = w.Owner.Put(context.Background(), forge.CollectionRefUpdate, p.rkey.String(), forge.RefUpdate{
				Type: forge.CollectionRefUpdate, Repo: r.uri.String(), Ref: "refs/heads/main", Old: p.old, New: p.commit, CreatedAt: forge.Now(),
			})
		})
	}
	wg.Wait()
	keys := make([]string, len(repos))
	for i, r := range repos {
		if ps[i].err != nil {
			tb.Fatal(ps[i].err)
		}
		keys[i] = r.checkKey(ps[i].commit, ps[i].uri)
	}
	find := func(what string, match func(record) bool) time.Time {
		r, ok := d.logs.wait(t0, 3*time.Minute, match)
		if !ok {
			tb.Fatalf("burst of %d: no %s in the serve log\n%s", len(repos), what, d.logs.text())
		}
		return r.Time
	}
	event := find("event", func(r record) bool {
		return r.Msg == "records changed" && r.Fields["collection"] == forge.CollectionRefUpdate
	})
	var last time.Time
	for _, key := range keys {
		started := find("running check of "+key, func(r record) bool {
			return r.Msg == "run started" && r.Fields["check"] == key
		})
		if started.After(last) {
			last = started
		}
	}
	var cpu string
	if timeline {
		// What the machine's processes used from the refUpdate writes
		// to the last running check seen.
		cpu = cpuBetween(cpu0, cpuTimes())
	}
	if allRunning != nil {
		allRunning()
	}
	if timeline {
		d.logs.timeline(tb, fmt.Sprintf("burst of %d", len(repos)), event, last)
		tb.Logf("burst of %d, processor time from the writes to the last running check: %s", len(repos), cpu)
	}
	for i, key := range keys {
		d.settle(tb, w, key, i, t0, t0)
	}
	return last.Sub(event)
}
