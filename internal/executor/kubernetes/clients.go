package kubernetes

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/kube/kubeclient"
	"knotless.dev/run/internal/kube/kubecred"
)

// Credentials says where the cluster credentials come from, in client-go's
// order: an explicit kubeconfig, else $KUBECONFIG, else the in-cluster
// service account, else ~/.kube/config.
type Credentials struct {
	Kubeconfig    string // --kubeconfig
	KubeconfigEnv string // $KUBECONFIG, as read by the CLI
	Home          string // for ~/.kube/config
	Context       string // --context
	Namespace     string // --namespace; default: the context's, else knotless-runs
	// InCluster loads the pod's service account; nil means rest.InClusterConfig.
	InCluster func() (*rest.Config, error)
}

// DefaultNamespace is used when neither a flag nor the context names one.
const DefaultNamespace = "knotless-runs"

// DefaultQPS and DefaultBurst are the runner's own rate limit on its
// requests to the API server when Config names none (--kube-qps,
// --kube-burst): 50 a second on average, 100 at once.
const (
	DefaultQPS   = 50
	DefaultBurst = 100
)

// clients holds the clientset built from the current credentials and
// rebuilds it when the kubeconfig file changes, so a refresh timer that
// replaces the file takes effect on the next Job without a restart.
type clients struct {
	creds Credentials
	// qps and burst are the client-side rate limit of every clientset
	// built (Config.QPS, Config.Burst).
	qps   float32
	burst int
	log   *slog.Logger
	obs   executor.Observer

	mu        sync.Mutex
	file      string // the kubeconfig in use; "" for in-cluster
	digest    [32]byte
	config    *rest.Config
	clientset *kubeclient.Clientset
	namespace string
	warned    time.Time
	observed  time.Time // the expiry last told to obs
}

// errNoCredentials names every place that was looked at.
var errNoCredentials = errors.New("no cluster credentials: give --kubeconfig, set KUBECONFIG, run inside a cluster, or create ~/.kube/config")

func (c *clients) files() []string {
	switch {
	case c.creds.Kubeconfig != "":
		return []string{c.creds.Kubeconfig}
	case c.creds.KubeconfigEnv != "":
		return filepath.SplitList(c.creds.KubeconfigEnv)
	}
	return nil
}

// get returns the current config, clientset and namespace, reloading them
// when the kubeconfig file's content changed. An expired token is an
// error every time until the file is replaced; one close to expiry is
// logged. The token's expiry goes to the observer whenever it changes.
func (c *clients) get() (*rest.Config, *kubeclient.Clientset, string, error) {
	cfg, cs, ns, err := c.load()
	if err != nil {
		return nil, nil, "", err
	}
	exp, err := kubecred.CheckExpiry(cfg, time.Now())
	c.observeExpiry(exp)
	if err != nil {
		return nil, nil, "", err
	}
	c.warnExpiry(exp)
	return cfg, cs, ns, nil
}

// observeExpiry tells the observer the token's expiry (zero: none known)
// when it differs from what it was last told.
func (c *clients) observeExpiry(exp time.Time) {
	c.mu.Lock()
	changed := !c.observed.Equal(exp)
	c.observed = exp
	c.mu.Unlock()
	if changed && c.obs != nil {
		c.obs.CredentialExpiry(Name, exp)
	}
}

// warnExpiry logs once per token when it has less than an hour left.
func (c *clients) warnExpiry(exp time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if exp.IsZero() || time.Until(exp) > expiryWarning || c.warned.Equal(exp) {
		return
	}
	c.warned = exp
	if c.log != nil {
		c.log.Warn("runner credentials expire soon", "expires", exp.Format(time.RFC3339), "in", time.Until(exp).Round(time.Second))
	}
}

// expiryWarning is how close to its expiry a token is logged.
const expiryWarning = time.Hour

func (c *clients) load() (*rest.Config, *kubeclient.Clientset, string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	files := c.files()
	source := "--kubeconfig"
	if c.creds.Kubeconfig == "" {
		source = "KUBECONFIG"
	}
	if len(files) == 0 {
		inCluster := c.creds.InCluster
		if inCluster == nil {
			inCluster = rest.InClusterConfig
		}
		if cfg, err := inCluster(); err == nil {
			if c.clientset == nil {
				return c.build(cfg, "", [32]byte{}, inClusterNamespace())
			}
			return c.config, c.clientset, c.namespace, nil
		}
		home := filepath.Join(c.creds.Home, ".kube", "config")
		if _, err := os.Stat(home); c.creds.Home == "" || err != nil {
			return nil, nil, "", errNoCredentials
		}
		files, source = []string{home}, home
	}
	var all []byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, nil, "", fmt.Errorf("%s: read %s: %w", source, f, err)
		}
		all = append(append(all, b...), 0)
	}
	digest := sha256.Sum256(all)
	if c.clientset != nil && digest == c.digest && c.file == files[0] {
		return c.config, c.clientset, c.namespace, nil
	}
	rules := &clientcmd.ClientConfigLoadingRules{Precedence: files}
	if c.creds.Kubeconfig != "" {
		rules = &clientcmd.ClientConfigLoadingRules{ExplicitPath: c.creds.Kubeconfig}
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: c.creds.Context})
	cfg, err := cc.ClientConfig()
	if err != nil {
		if c.creds.Context != "" {
			return nil, nil, "", fmt.Errorf("%s %s with --context %s: %w", source, files[0], c.creds.Context, err)
		}
		return nil, nil, "", fmt.Errorf("%s %s: %w", source, files[0], err)
	}
	ns, _, err := cc.Namespace()
	if err != nil || ns == "default" && !contextNamesNamespace(cc) {
		ns = ""
	}
	if c.clientset != nil {
		// A refresh replaced the file: the next Job runs with it.
		c.log.Info("kubeconfig changed: using the new credentials", "file", files[0])
	}
	c.file = files[0]
	return c.build(cfg, files[0], digest, ns)
}

func (c *clients) build(cfg *rest.Config, file string, digest [32]byte, ns string) (*rest.Config, *kubeclient.Clientset, string, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "knotless-run"
	if cfg.BearerTokenFile != "" {
		// In-cluster and kubeconfig tokenFile configs carry the token as
		// read at load as well as its file. Without the copy, client-go's
		// transport sends only what the file holds now (re-read every
		// minute), and expiry checks read the file too: a rotated
		// projected token is never reported expired.
		cfg.BearerToken = ""
	}
	// The limit counts requests, an exec stream (a whole checkout) as
	// one.
	cfg.QPS, cfg.Burst = c.qps, c.burst
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = DefaultQPS, DefaultBurst
	}
	cs, err := kubeclient.NewForConfig(cfg)
	if err != nil {
		return nil, nil, "", fmt.Errorf("client for %s: %w", cfg.Host, err)
	}
	switch {
	case c.creds.Namespace != "":
		ns = c.creds.Namespace
	case ns == "":
		ns = DefaultNamespace
	}
	c.config, c.clientset, c.namespace, c.digest, c.file = cfg, cs, ns, digest, file
	return cfg, cs, ns, nil
}

// contextNamesNamespace reports whether the current context sets a
// namespace itself (client-go reports "default" either way).
func contextNamesNamespace(cc clientcmd.ClientConfig) bool {
	raw, err := cc.RawConfig()
	if err != nil {
		return false
	}
	name := raw.CurrentContext
	ctx, ok := raw.Contexts[name]
	return ok && ctx.Namespace != ""
}

func inClusterNamespace() string {
	b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		return ""
	}
	return string(bytes.TrimSpace(b))
}
