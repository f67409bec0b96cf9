package workflow

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseRetry(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, retry string
		want        *Retry
	}{
		{"infrastructure by default", "{max: 2}", &Retry{Max: 2, When: RetryInfrastructure}},
		{"infrastructure", "{max: 1, when: infrastructure}", &Retry{Max: 1, When: RetryInfrastructure}},
		{"always", "{max: 5, when: always}", &Retry{Max: 5, When: RetryAlways}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w, err := Parse("ci.yaml", []byte("on: push\nretry: "+tt.retry+"\nsteps: [{run: make}]\n"))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, w.Retry); diff != "" {
				t.Errorf("retry (-want +got):\n%s", diff)
			}
		})
	}
	w, err := Parse("ci.yaml", []byte("on: push\nsteps: [{run: make}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if w.Retry != nil {
		t.Errorf("a workflow without retry: %+v, want nil (tried once)", w.Retry)
	}
}

func TestParseRetryErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, retry, want string
	}{
		{"max zero", "{max: 0}", "ci.yaml:2:14: retry.max: want a whole number of retries from 1 to 5, got \"0\""},
		{"max too many", "{max: 6}", "ci.yaml:2:14: retry.max: want a whole number of retries from 1 to 5, got \"6\""},
		{"max not a number", "{max: two}", "ci.yaml:2:14: retry.max: want a whole number of retries from 1 to 5, got \"two\""},
		{"max a string", "{max: \"2\"}", "ci.yaml:2:14: retry.max: want a whole number of retries from 1 to 5, got \"2\""},
		{"max missing", "{when: always}", "ci.yaml:2:9: retry: missing field \"max\""},
		{"when unknown", "{max: 2, when: failure}", "ci.yaml:2:23: retry.when: want infrastructure or always, got \"failure\""},
		{"unknown field", "{max: 2, delay: 5s}", "ci.yaml:2:17: retry: unknown field \"delay\" (known: max, when)"},
		{"not a mapping", "3", "ci.yaml:2:8: retry: want a mapping, got \"3\""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse("ci.yaml", []byte("on: push\nretry: "+tt.retry+"\nsteps: [{run: make}]\n"))
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("err %v, want Errors", err)
			}
			if got := err.Error(); !strings.Contains(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestRetryAgain(t *testing.T) {
	t.Parallel()
	infra := &Retry{Max: 2, When: RetryInfrastructure}
	always := &Retry{Max: 2, When: RetryAlways}
	for _, tt := range []struct {
		name         string
		r            *Retry
		tries        int
		failed, lost bool
		want         bool
	}{
		{"no retry", nil, 1, true, true, false},
		{"lost, first try", infra, 1, true, true, true},
		{"lost, last retry", infra, 2, true, true, true},
		{"lost, retries spent", infra, 3, true, true, false},
		{"a failing step", infra, 1, true, false, false},
		{"a success", infra, 1, false, false, false},
		{"a failing step, always", always, 1, true, false, true},
		{"a failing step, always, spent", always, 3, true, false, false},
		{"a success, always", always, 1, false, false, false},
	} {
		if got := tt.r.Again(tt.tries, tt.failed, tt.lost); got != tt.want {
			t.Errorf("%s: Again(%d, %v, %v) = %v, want %v", tt.name, tt.tries, tt.failed, tt.lost, got, tt.want)
		}
	}
}

// TestReferenceRetryExamplesParse: the reference's examples with a
// retry parse, and say what they say.
func TestReferenceRetryExamplesParse(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../../docs/reference/workflow.md")
	if errors.Is(err, fs.ErrNotExist) {
		t.Skip("docs are left out of this source (the Nix package's)")
	}
	if err != nil {
		t.Fatal(err)
	}
	var got []Retry
	for i, block := range strings.Split(string(b), "```yaml\n")[1:] {
		src, _, _ := strings.Cut(block, "```")
		if !strings.Contains(src, "retry:") {
			continue
		}
		w, err := Parse("example.yaml", []byte(src))
		if err != nil {
			t.Errorf("yaml block %d of docs/reference/workflow.md: %v", i+1, err)
			continue
		}
		got = append(got, *w.Retry)
	}
	want := []Retry{{Max: 2, When: RetryInfrastructure}, {Max: 2, When: RetryInfrastructure}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the reference's retries (-want +got):\n%s", diff)
	}
}
