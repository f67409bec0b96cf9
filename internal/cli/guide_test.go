package cli

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const guide = "../../docs/guide/kubernetes-runner.md"

// fences returns the bodies of the guide's fenced blocks of one language.
func fences(doc, lang string) []string {
	var out []string
	for _, part := range strings.Split(doc, "```"+lang+"\n")[1:] {
		body, _, _ := strings.Cut(part, "```")
		out = append(out, body)
	}
	return out
}

// TestGuideStatefulSet: the StatefulSet the Kubernetes runner guide shows
// is what the guide's own `knotless-run manifests` command prints.
func TestGuideStatefulSet(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("../../docs"); errors.Is(err, fs.ErrNotExist) {
		// The Nix package's source leaves docs out (nix/source.nix).
		t.Skip("no docs directory in this source tree: the guide is checked from a checkout")
	}
	b, err := os.ReadFile(guide)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	var args []string
	for _, sh := range fences(doc, "sh") {
		cmd, ok := strings.CutPrefix(sh, "knotless-run manifests ")
		if !ok {
			continue
		}
		cmd, _, _ = strings.Cut(cmd, ">")
		args = append([]string{"manifests"}, strings.Fields(strings.ReplaceAll(cmd, "\\\n", " "))...)
	}
	if args == nil {
		t.Fatalf("%s shows no `knotless-run manifests` command", guide)
	}
	r := runCLI(t, nil, args...)
	if r.code != 0 {
		t.Fatalf("%v: exit %d: %s", args, r.code, r.stderr)
	}
	var want string
	for _, d := range strings.Split(r.stdout, "---\n") {
		if strings.Contains(d, "\nkind: StatefulSet\n") {
			want = d
		}
	}
	var shown []string
	for _, y := range fences(doc, "yaml") {
		if strings.Contains(y, "\nkind: StatefulSet\n") {
			shown = append(shown, y)
		}
	}
	if len(shown) != 1 {
		t.Fatalf("%s shows %d StatefulSets, want 1", guide, len(shown))
	}
	if diff := cmp.Diff(want, shown[0]); diff != "" {
		t.Errorf("%s: the StatefulSet shown differs from what %v prints (-printed +shown):\n%s", guide, args, diff)
	}
}
