package cli

import (
	"fmt"

	"knotless.dev/run/internal/kube/manifests"
)

// ManifestsCmd prints what an operator applies to run the runner inside
// the cluster it runs Jobs on.
type ManifestsCmd struct {
	Repos             []string `arg:"" optional:"" name:"repo" help:"Repositories the runner watches (as for serve)."`
	Namespace         string   `help:"The runner's own namespace (it must exist and hold --app-password-secret)." default:"knotless"`
	RunsNamespace     string   `help:"Namespace of the runs, created labelled Pod Security restricted." default:"knotless-runs"`
	Name              string   `help:"Name of the ServiceAccount, Role, RoleBinding and StatefulSet." default:"knotless-runner"`
	Image             string   `help:"The runner's image (with knotless-run, git and a CA bundle): the flake's packages.image, or deploy/image's, as published to your registry; the default is the name and tag they give, for a node that has it loaded." default:"${image_default}" placeholder:"IMAGE"`
	StorageClass      string   `help:"StorageClass of the state and cache volume (default: the cluster's default)." placeholder:"CLASS"`
	StorageSize       string   `help:"Size of the state and cache volume." default:"10Gi"`
	DID               string   `name:"did" help:"The runner's DID." required:"" placeholder:"DID"`
	PDS               string   `name:"pds" help:"The runner's PDS URL (default: from its DID document)." placeholder:"URL"`
	ServeFlag         []string `help:"One more argument for serve, repeatable and in order (e.g. --serve-flag=--plc-url --serve-flag=URL); not the flags the manifests set." placeholder:"ARG"`
	AppPasswordSecret string   `help:"Secret in --namespace holding the app password under the key app-password (the one Secret you create)." default:"knotless-app-password" placeholder:"NAME"`

	AllowImagePullSecret []string `help:"Secret the admission policy lets run pods name in imagePullSecrets (repeatable): the Secrets given to serve's --image-pull-secret. Run pods may name no other." placeholder:"NAME"`
	SkipAdmissionPolicy  bool     `help:"Leave out the admission policy (for API servers older than Kubernetes 1.30, which do not serve ValidatingAdmissionPolicy). A stolen runner credential can then mount the runs namespace's Secrets in a Job."`
	EgressUntrusted      string   `help:"serve's --egress-untrusted: what pulls' run pods may send out (public: DNS and the public internet only)." enum:"open,public,deny,allow-dns" default:"public"`

	Replicas         int    `help:"How many pods run the runner: more than 1 run serve --replicas, each named after its pod, with a PodDisruptionBudget (one down at a time) and spread across nodes; they need --sealing-key-secret. Not with --serve-flag --queue or --warm-pods." default:"1" placeholder:"N"`
	SealingKeySecret string `help:"Secret in --namespace holding the runner's sealing key pair (a state directory's secrets-key.json) under the key secrets-key.json, mounted into every pod; required with --replicas above 1 (default: each pod keeps the key it made)." placeholder:"NAME"`
}

// Run prints the manifests as YAML to stdout.
func (c *ManifestsCmd) Run(env *Env) error {
	if err := checkSecretNames("--allow-image-pull-secret", c.AllowImagePullSecret); err != nil {
		return err
	}
	if c.Replicas < 1 {
		return usageError{fmt.Errorf("manifests: --replicas %d: want 1 or more", c.Replicas)}
	}
	objs, err := manifests.Objects(manifests.Options{
		Namespace: c.Namespace, RunsNamespace: c.RunsNamespace, Name: c.Name,
		Image: c.Image, StorageClass: c.StorageClass, StorageSize: c.StorageSize,
		DID: c.DID, PDS: c.PDS, AppPasswordSecret: c.AppPasswordSecret, Repos: c.Repos,
		ServeFlags: c.ServeFlag, AllowImagePullSecrets: c.AllowImagePullSecret, SkipAdmissionPolicy: c.SkipAdmissionPolicy,
		EgressUntrusted: c.EgressUntrusted, Replicas: c.Replicas, SealingKeySecret: c.SealingKeySecret,
	})
	if err != nil {
		// Every refusal of Objects is of a flag's value.
		return usageError{fmt.Errorf("manifests: %w", err)}
	}
	out, err := manifests.YAML(objs)
	if err != nil {
		return fmt.Errorf("manifests: %w", err)
	}
	_, err = env.Stdout.Write(out)
	return err
}
