package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"knotless.dev/run/internal/kube/kubeclient"
	"knotless.dev/run/internal/kube/kubecred"
)

// KubeconfigCmd mints the runner's scoped kubeconfig, or checks one.
type KubeconfigCmd struct {
	AdminKubeconfig string        `help:"Kubeconfig with rights to create the namespace, ServiceAccount, Role and RoleBinding, to request tokens, and to apply the (cluster-wide) admission policy and its binding." placeholder:"FILE"`
	Out             string        `help:"Where to write the runner's kubeconfig (atomically, mode 0600)." placeholder:"FILE"`
	Namespace       string        `help:"Namespace of the runs." default:"knotless-runs"`
	ServiceAccount  string        `help:"The runner's ServiceAccount." default:"knotless-runner"`
	Duration        time.Duration `help:"Life of the token." default:"24h"`
	Context         string        `help:"Context of the admin kubeconfig."`
	PodSecurity     string        `help:"Pod Security level the namespace enforces: restricted, or baseline for runners with --allow-root-steps." enum:"restricted,baseline" default:"restricted"`
	Check           string        `help:"Check an existing kubeconfig instead: print its access answers and token expiry; exit non-zero when expired or within --warn." placeholder:"FILE"`
	Warn            time.Duration `help:"With --check: how close to expiry counts as a failure." default:"1h"`
	InCluster       bool          `name:"check-in-cluster" help:"Check the pod's own service account instead (inside a pod: its projected token, the runs namespace from --namespace), as --check does a file."`

	AllowImagePullSecret []string `help:"Secret the admission policy lets run pods name in imagePullSecrets (repeatable): the Secrets the runner's --image-pull-secret names. Run pods may name no other." placeholder:"NAME"`
	SkipAdmissionPolicy  bool     `help:"Install no admission policy (for API servers older than Kubernetes 1.30, which do not serve ValidatingAdmissionPolicy). A stolen runner credential can then mount the runs namespace's Secrets in a Job."`
}

// Run mints or checks.
func (c *KubeconfigCmd) Run(ctx context.Context, env *Env) error {
	if c.Check != "" || c.InCluster {
		return c.check(ctx, env)
	}
	if c.AdminKubeconfig == "" || c.Out == "" {
		return usageError{errors.New("kubeconfig: --admin-kubeconfig and --out are required (or --check FILE)")}
	}
	if err := checkSecretNames("--allow-image-pull-secret", c.AllowImagePullSecret); err != nil {
		return err
	}
	admin, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: c.AdminKubeconfig},
		&clientcmd.ConfigOverrides{CurrentContext: c.Context}).ClientConfig()
	if err != nil {
		return fmt.Errorf("--admin-kubeconfig %s: %w", c.AdminKubeconfig, err)
	}
	unthrottled(admin)
	cs, err := kubeclient.NewForConfig(admin)
	if err != nil {
		return fmt.Errorf("--admin-kubeconfig %s: %w", c.AdminKubeconfig, err)
	}
	opts := kubecred.Options{Namespace: c.Namespace, ServiceAccount: c.ServiceAccount, Duration: c.Duration, PodSecurity: c.PodSecurity, ImagePullSecrets: c.AllowImagePullSecret}
	policy := kubecred.PolicyOf(opts)
	// Checked before anything is made: an API server without the policy
	// fails here, not after the credential exists.
	if !c.SkipAdmissionPolicy {
		if _, _, err := kubecred.AdmissionPolicy(policy); err != nil {
			return fmt.Errorf("kubeconfig: %w", err)
		}
		if err := kubecred.RequireAdmissionPolicy(ctx, cs); err != nil {
			if errors.Is(err, kubecred.ErrNoAdmissionPolicy) {
				return fmt.Errorf("%w; the runner's admission policy (which keeps its Jobs from the namespace's Secrets) needs it: upgrade the cluster, or pass --skip-admission-policy to go without it", err)
			}
			return fmt.Errorf("--admin-kubeconfig %s: %w", c.AdminKubeconfig, err)
		}
	}
	if err := kubecred.Ensure(ctx, cs, opts); err != nil {
		return err
	}
	policyName := kubecred.PolicyName(c.Namespace, c.ServiceAccount)
	if c.SkipAdmissionPolicy {
		env.Logger.Warn("no admission policy installed (--skip-admission-policy): a stolen runner credential can mount the runs namespace's Secrets in a Job", "namespace", c.Namespace)
	} else if err := kubecred.EnsureAdmissionPolicy(ctx, cs, policy); err != nil {
		return fmt.Errorf("%w (or pass --skip-admission-policy to go without it)", err)
	}
	kc, expiry, err := kubecred.Mint(ctx, cs, admin, opts)
	if err != nil {
		return err
	}
	cfg, err := clientcmd.NewDefaultClientConfig(*kc, nil).ClientConfig()
	if err != nil {
		return fmt.Errorf("new kubeconfig: %w", err)
	}
	unthrottled(cfg)
	// The old file stays until the new credential has proved itself.
	if _, err := kubecred.VerifySettled(ctx, cfg, c.Namespace, 15*time.Second); err != nil {
		return fmt.Errorf("%w; %s left as it was", err, c.Out)
	}
	if !c.SkipAdmissionPolicy {
		if err := kubecred.VerifyAdmission(ctx, cfg, c.Namespace, policyName, 15*time.Second); err != nil {
			return fmt.Errorf("%w; %s left as it was", err, c.Out)
		}
	}
	if err := kubecred.WriteKubeconfig(c.Out, kc); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	installed := "admission policy " + policyName
	if c.SkipAdmissionPolicy {
		installed = "no admission policy"
	}
	env.Logger.Info("kubeconfig written", "file", c.Out, "namespace", c.Namespace, "service_account", c.ServiceAccount, "expires", expiry.UTC().Format(time.RFC3339), "policy", installed)
	fmt.Fprintf(env.Stdout, "wrote %s: %s/%s, token expires %s, %s\n", c.Out, c.Namespace, c.ServiceAccount, expiry.UTC().Format(time.RFC3339), installed)
	return nil
}

// checked is the configuration --check or --check-in-cluster checks, its
// namespace, and the flag to name in errors.
func (c *KubeconfigCmd) checked() (*rest.Config, string, string, error) {
	if c.InCluster {
		if c.Check != "" {
			return nil, "", "", usageError{errors.New("kubeconfig: --check FILE or --check-in-cluster, not both")}
		}
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, "", "", fmt.Errorf("--check-in-cluster: %w", err)
		}
		return cfg, c.Namespace, "--check-in-cluster", nil
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: c.Check}, &clientcmd.ConfigOverrides{CurrentContext: c.Context})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", "", fmt.Errorf("--check %s: %w", c.Check, err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, "", "", fmt.Errorf("--check %s: %w", c.Check, err)
	}
	return cfg, ns, "--check " + c.Check, nil
}

func (c *KubeconfigCmd) check(ctx context.Context, env *Env) error {
	cfg, ns, what, err := c.checked()
	if err != nil {
		return err
	}
	unthrottled(cfg)
	token, expErr := kubecred.Token(cfg)
	var exp time.Time
	if expErr == nil {
		exp, expErr = kubecred.TokenExpiry(token)
	}
	if expErr != nil {
		return fmt.Errorf("%s: %w", what, expErr)
	}
	left := time.Until(exp).Round(time.Second)
	fmt.Fprintf(env.Stdout, "token expires %s (in %s)\n", exp.Format(time.RFC3339), left)
	if left <= 0 {
		return fmt.Errorf("%s: %w at %s", what, kubecred.ErrExpired, exp.Format(time.RFC3339))
	}
	checks, verr := kubecred.Verify(ctx, cfg, ns)
	for _, ch := range checks {
		fmt.Fprintf(env.Stdout, "%-28s allowed=%-5v want=%v\n", ch.String(), ch.Got, ch.Want)
	}
	if verr != nil {
		return fmt.Errorf("%s: %w", what, verr)
	}
	if left < c.Warn {
		return fmt.Errorf("%s: token expires in %s, within --warn %s", what, left, c.Warn)
	}
	return nil
}

// checkSecretNames refuses a value of flag that cannot name a Secret.
func checkSecretNames(flag string, names []string) error {
	for _, name := range names {
		if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
			return usageError{fmt.Errorf("%s %q: not a Secret name: %s", flag, name, strings.Join(msgs, "; "))}
		}
	}
	return nil
}

// unthrottled lifts client-go's default client-side limit (5 requests a
// second, 10 at once) off a one-shot command's config: minting and
// checking a credential asks a few dozen questions (an access review a
// right), which that limit spread over seconds at every start of the
// runner's unit that pulls the refresh in.
func unthrottled(cfg *rest.Config) {
	cfg.QPS, cfg.Burst = 100, 100
}
