package cli

import (
	"errors"
	"fmt"
	"path/filepath"
	"text/tabwriter"
	"time"

	"knotless.dev/run/internal/engine/cache"
	"knotless.dev/run/internal/lib/termsafe"
)

// CacheFlags bound the store of workflow caches; run and serve share
// them. Sizes are in bytes; 0 means no bound.
type CacheFlags struct {
	CacheMax      int64 `help:"Most bytes of one cache as one run saves it (its tar stream, and its files' sizes summed); past it the run's cache is not saved, with a warning. 0: 2 GiB." default:"2147483648" placeholder:"BYTES" group:"caches"`
	CacheMaxTotal int64 `help:"Most bytes of all caches together; past it layers of the repository holding the most are removed, least recently used first, so a repository within its fair share keeps its caches. 0: no bound." default:"21474836480" placeholder:"BYTES" group:"caches"`
	DiskFloor     int64 `help:"Free bytes the cache directory's file system keeps: below it no cache is saved, with a warning (the run goes on). 0: none." default:"1073741824" placeholder:"BYTES" group:"caches"`
}

// cachesDir is where the store lives under a --cache-dir.
func cachesDir(cacheDir string) string { return filepath.Join(cacheDir, "caches") }

// openCaches opens the store under cacheDir with the flags' bounds.
func (f CacheFlags) openCaches(cacheDir string) (*cache.Store, error) {
	for name, v := range map[string]int64{"--cache-max": f.CacheMax, "--cache-max-total": f.CacheMaxTotal, "--disk-floor": f.DiskFloor} {
		if v < 0 {
			return nil, usageError{fmt.Errorf("%s %d: want 0 or more bytes", name, v)}
		}
	}
	s, err := cache.Open(cache.Config{Dir: cachesDir(cacheDir), MaxBytes: f.CacheMax, MaxTotal: f.CacheMaxTotal, DiskFloor: f.DiskFloor})
	if err != nil {
		return nil, fmt.Errorf("--cache-dir: %w", err)
	}
	return s, nil
}

// CacheCmd shows and clears the store of workflow caches.
type CacheCmd struct {
	Ls CacheLsCmd `cmd:"" help:"List the caches: repository, workflow, path, size, last use and the runs that made them (tainted: a run granted no secret does not read it)."`
	Rm CacheRmCmd `cmd:"" help:"Remove caches: those of --repo (and --workflow, --path), or --all."`
}

// CacheLsCmd lists the caches.
type CacheLsCmd struct {
	CacheDir string `help:"The runner's cache directory (serve's --cache-dir)." default:"/var/cache/knotless" placeholder:"DIR"`
}

// Run prints one line per cache to stdout.
func (c *CacheLsCmd) Run(env *Env) error {
	s, err := CacheFlags{}.openCaches(c.CacheDir)
	if err != nil {
		return err
	}
	entries, err := s.List()
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REPOSITORY\tWORKFLOW\tPATH\tBYTES\tLAST USE\tBASE (RUN)\tAPART BASE (RUN)\tUPPERS")
	for _, e := range entries {
		var used time.Time
		for _, l := range append([]cache.Layer{deref(e.Base), deref(e.Apart)}, e.Uppers...) {
			if l.Used.After(used) {
				used = l.Used
			}
		}
		lastUse := "-"
		if !used.IsZero() {
			lastUse = used.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d\n", termsafe.Line(e.Key.Repo), termsafe.Line(e.Key.Workflow), termsafe.Line(e.Key.Path), e.Bytes, lastUse, runOf(e.Base), runOf(e.Apart), len(e.Uppers))
	}
	return tw.Flush()
}

func deref(l *cache.Layer) cache.Layer {
	if l == nil {
		return cache.Layer{}
	}
	return *l
}

// runOf names the run that saved l, and says "tainted" when l is not
// clean (cache.Clean): saved by a run granted a secret, or from a
// tainted layer, or by an older store. Runs granted no secret do not
// read it.
func runOf(l *cache.Layer) string {
	switch {
	case l == nil:
		return "-"
	case !l.Clean:
		return l.Run + " tainted"
	}
	return l.Run
}

// CacheRmCmd removes caches.
type CacheRmCmd struct {
	CacheDir string `help:"The runner's cache directory (serve's --cache-dir)." default:"/var/cache/knotless" placeholder:"DIR"`
	Repo     string `help:"Remove the caches of this repository (as cache ls shows it)." placeholder:"REPO" xor:"what" required:""`
	All      bool   `help:"Remove every cache." xor:"what" required:""`
	Workflow string `help:"Only this workflow's caches (with --repo)." placeholder:"NAME"`
	Path     string `help:"Only the cache of this path (with --repo)." placeholder:"PATH"`
}

// Run removes the matching caches and prints each one removed.
func (c *CacheRmCmd) Run(env *Env) error {
	if c.All && (c.Workflow != "" || c.Path != "") {
		return usageError{errors.New("cache rm: --workflow and --path go with --repo, not --all")}
	}
	s, err := CacheFlags{}.openCaches(c.CacheDir)
	if err != nil {
		return err
	}
	removed, err := s.Remove(cache.Key{Repo: c.Repo, Workflow: c.Workflow, Path: c.Path})
	for _, k := range removed {
		fmt.Fprintf(env.Stdout, "removed %s %s %s\n", termsafe.Line(k.Repo), termsafe.Line(k.Workflow), termsafe.Line(k.Path))
	}
	if err != nil {
		return fmt.Errorf("cache rm: %w", err)
	}
	if len(removed) == 0 {
		fmt.Fprintln(env.Stdout, "no cache matched")
	}
	return nil
}
