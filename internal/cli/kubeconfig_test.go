package cli

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// An API server older than 1.30 serves admissionregistration.k8s.io/v1
// with webhooks only. `kubeconfig` then fails before it makes anything,
// naming the requirement and the flag that goes without the policy.
func TestKubeconfigNeedsAdmissionPolicy(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var writes []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			mu.Lock()
			writes = append(writes, r.Method+" "+r.URL.Path)
			mu.Unlock()
		}
		if r.URL.Path != "/apis/admissionregistration.k8s.io/v1" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&metav1.APIResourceList{
			TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
			GroupVersion: "admissionregistration.k8s.io/v1",
			APIResources: []metav1.APIResource{
				{Name: "mutatingwebhookconfigurations", Kind: "MutatingWebhookConfiguration", Verbs: []string{"create", "get"}},
				{Name: "validatingwebhookconfigurations", Kind: "ValidatingWebhookConfiguration", Verbs: []string{"create", "get"}},
			},
		})
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	admin := filepath.Join(dir, "admin.kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: srv.URL}
	kc.AuthInfos["a"] = &clientcmdapi.AuthInfo{Token: "admin"}
	kc.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "a"}
	kc.CurrentContext = "x"
	if err := clientcmd.WriteToFile(*kc, admin); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "runner.kubeconfig")
	r := runCLI(t, nil, "kubeconfig", "--admin-kubeconfig", admin, "--out", out)
	if r.code == 0 {
		t.Fatalf("kubeconfig against an API server without ValidatingAdmissionPolicy succeeded:\n%s", r.stdout)
	}
	for _, want := range []string{"does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (Kubernetes 1.30 or later)", "--skip-admission-policy"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, r.stderr)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(writes) > 0 {
		t.Errorf("kubeconfig made objects before finding the policy unserved: %v", writes)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("--out written: %v", err)
	}
}

func TestKubeconfigRefusesBadPullSecret(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "kubeconfig", "--admin-kubeconfig", "/nonexistent", "--out", filepath.Join(t.TempDir(), "k"), "--allow-image-pull-secret", "Not_A_Name")
	if r.code == 0 || !strings.Contains(r.stderr, `--allow-image-pull-secret "Not_A_Name"`) {
		t.Errorf("exit %d, stderr %q; want an error naming --allow-image-pull-secret", r.code, r.stderr)
	}
}
