package run

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path"
	"time"

	"knotless.dev/run/internal/engine/cache"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/lib/tarstream"
)

// Caches is the store a run's caches are restored from and saved to
// (cache.Store). Base's secrets says the run was granted a secret.
type Caches interface {
	Base(k cache.Key, secrets bool) (*os.File, cache.Layer, error)
	Save(ctx context.Context, k cache.Key, run string, meta cache.Layer, r io.Reader) (cache.Layer, error)
	Promote(k cache.Key, run string) (bool, error)
	Evict(spare string) ([]cache.Evicted, error)
}

// CacheScope says whose caches a run uses.
type CacheScope struct {
	// Repo names the repository: with the workflow's name and a cache
	// path it keys a cache. Empty means the run keeps no cache.
	Repo string
	// Order ranks trusted pushes: when two pass, the base is the upper
	// of the higher order (the later record key of the push).
	Order string
}

// cachePath is where a workflow's cache path is inside the session: an
// absolute path as it is, a relative one under the work directory.
func cachePath(dirs executor.Dirs, p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	return path.Join(dirs.Work, p)
}

// sessionCaches are the absolute cache paths a session must provide.
func sessionCaches(paths []string) []string {
	var out []string
	for _, p := range paths {
		if path.IsAbs(p) {
			out = append(out, path.Clean(p))
		}
	}
	return out
}

func (r *runState) cacheKey(p string) cache.Key {
	return cache.Key{Repo: r.req.Cache.Repo, Workflow: r.req.Workflow.Name, Path: p}
}

// cachesOn says whether the run keeps its caches, and logs why not.
func (r *runState) cachesOn() bool {
	if len(r.req.Workflow.Cache) == 0 {
		return false
	}
	if r.eng.cfg.Caches == nil || r.req.Cache.Repo == "" {
		r.logf("knotless-run: caches not kept: this runner has no cache store (--cache-dir)")
		return false
	}
	return true
}

// restoreCaches streams each cache's base into the session before the
// steps; a cold cache becomes an empty directory. A run granted a secret
// starts from the base, any other from the apart base, which holds only
// clean layers (cache.Clean). Each layer restored is remembered: its
// taint passes to every layer the run saves. A cache that cannot be
// restored is logged, and the run goes on without it.
func (r *runState) restoreCaches(ctx context.Context, sess executor.Session, dirs executor.Dirs) {
	if !r.cachesOn() {
		return
	}
	secrets := len(r.granted) > 0
	for _, p := range r.req.Workflow.Cache {
		dir := cachePath(dirs, p)
		start := time.Now()
		f, base, err := r.eng.cfg.Caches.Base(r.cacheKey(p), secrets)
		switch {
		case errors.Is(err, cache.ErrCold):
			r.eng.cfg.Observer.CacheRestored(false, 0)
			if err := sess.Put(ctx, dir, bytes.NewReader(emptyTar)); err != nil {
				r.cacheWarn(p, "not created", err)
				continue
			}
			why := "no earlier run saved it"
			switch {
			case errors.Is(err, cache.ErrNotClean):
				why = cache.ErrNotClean.Error()
			case !secrets:
				why = "no clean layer yet (one a passing push granted no secret saved)"
			}
			r.logf("knotless-run: cache %s: cold: %s", p, why)
			r.log.Info("cache cold", "cache", p)
			continue
		case err != nil:
			r.eng.cfg.Observer.CacheRestored(false, 0)
			r.cacheWarn(p, "not restored", err)
			continue
		}
		// Counted before the transfer: a restore that fails half-way
		// may have left part of the layer in the session.
		r.restored = append(r.restored, base)
		n, err := r.retryCorrupt("cache "+p, func() (int64, error) {
			if _, err := f.Seek(0, io.SeekStart); err != nil {
				return 0, err
			}
			counted := &tarstream.CountingReader{R: f}
			err := sess.Put(ctx, dir, counted)
			return counted.N, err
		})
		f.Close()
		if err != nil {
			r.eng.cfg.Observer.CacheRestored(false, 0)
			r.cacheWarn(p, "not restored", err)
			continue
		}
		r.eng.cfg.Observer.CacheRestored(true, n)
		took := time.Since(start).Round(time.Millisecond)
		r.logf("knotless-run: cache %s: restored %d bytes in %s (saved by run %s)", p, n, took, base.Run)
		r.log.Info("cache restored", "cache", p, "bytes", n, "duration", took, "from", base.Run)
	}
}

// saveCaches streams each cache path back into the run's upper layer,
// after the steps and before the session stops, and promotes it. Only a
// trusted run that passed saves: any other run's layer would be dropped.
func (r *runState) saveCaches(ctx context.Context, sess executor.Session, dirs executor.Dirs) {
	if len(r.req.Workflow.Cache) == 0 || r.eng.cfg.Caches == nil || r.req.Cache.Repo == "" {
		return
	}
	switch {
	case r.res.Status == Cancelled || r.res.Status == Detached:
		return
	case r.res.Status != Success:
		r.logf("knotless-run: caches not saved: the run did not pass")
		return
	case !r.req.Trusted:
		r.logf("knotless-run: caches not saved: untrusted run (it started from the apart base, and its layer is never kept)")
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.eng.cfg.CleanupTimeout)
	defer cancel()
	secrets := len(r.granted) > 0
	meta := cache.Layer{Order: r.req.Cache.Order, Secrets: secrets, Clean: r.cachesClean(secrets)}
	for _, p := range r.req.Workflow.Cache {
		k := r.cacheKey(p)
		start := time.Now()
		saved, err := r.retryCorrupt("cache "+p, func() (int64, error) {
			return transfer(ctx, func(w io.Writer) error { return sess.Get(ctx, cachePath(dirs, p), w) },
				func(rd io.Reader) error {
					_, err := r.eng.cfg.Caches.Save(ctx, k, r.req.RunID, meta, rd)
					return err
				})
		})
		if err != nil {
			r.cacheWarn(p, "not saved", err)
			continue
		}
		r.eng.cfg.Observer.CacheSaved(saved)
		took := time.Since(start).Round(time.Millisecond)
		promoted, err := r.eng.cfg.Caches.Promote(k, r.req.RunID)
		switch {
		case err != nil:
			r.cacheWarn(p, "saved but not promoted", err)
		case promoted && !meta.Clean:
			r.logf("knotless-run: cache %s: saved %d bytes in %s, tainted: only runs granted a secret read it (%s)", p, saved, took, r.taintReason(secrets))
		case promoted:
			r.logf("knotless-run: cache %s: saved %d bytes in %s", p, saved, took)
		default:
			r.logf("knotless-run: cache %s: saved %d bytes in %s, not kept: a newer push's cache is the base", p, saved, took)
		}
		r.log.Info("cache saved", "cache", p, "bytes", saved, "duration", took, "promoted", promoted, "clean", meta.Clean)
	}
	evicted, err := r.eng.cfg.Caches.Evict(r.req.RunID)
	for _, e := range evicted {
		r.log.Info("cache evicted (--cache-max-total)", "repo", e.Key.Repo, "workflow", e.Key.Workflow, "cache", e.Key.Path, "run", e.Layer.Run, "bytes", e.Layer.Bytes, "share", e.Share)
	}
	if err != nil {
		r.log.Warn("cache eviction", "err", err)
	}
}

// cachesClean says whether the layers this run saves are clean: it was
// granted no secret and every layer it restored was clean. An adopted
// run whose handover did not say so counts as tainted.
func (r *runState) cachesClean(secrets bool) bool {
	return !r.restoreUnrecorded && cache.Clean(secrets, r.restored)
}

// taintReason says why the run's layers are tainted, for its log.
func (r *runState) taintReason(secrets bool) string {
	switch {
	case secrets:
		return "the run was granted a secret"
	case r.restoreUnrecorded:
		return "it was adopted from a runner process that did not record what it restored"
	default:
		return "it restored a tainted layer"
	}
}

// cacheWarn logs a cache that could not be used: a cache never fails a
// run.
func (r *runState) cacheWarn(p, what string, err error) {
	r.logf("knotless-run: warning: cache %s %s: %v", p, what, err)
	r.log.Warn("cache "+what, "cache", p, "err", err)
}

// emptyTar is a tar stream of no entries: it makes a cold cache's
// directory.
var emptyTar = func() []byte {
	var b bytes.Buffer
	_ = tar.NewWriter(&b).Close()
	return b.Bytes()
}()
