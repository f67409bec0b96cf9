package kubernetes

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestParseLedger: the pod's ledger is a stranger's text: only its two
// line shapes are read, and anything else is refused, never guessed.
func TestParseLedger(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, text string
		want       map[string]string // step id: "running" or its exit code
		err        string
	}{
		{name: "none", text: "", want: map[string]string{}},
		{name: "steps", text: "start 1\nexit 1 0\nstart 2\nexit 2 3\nstart 3\n",
			want: map[string]string{"1": "0", "2": "3", "3": "running"}},
		{name: "an exit without its start still ended", text: "exit 4 1\n", want: map[string]string{"4": "1"}},
		{name: "a second start does not undo an exit", text: "start 1\nexit 1 0\nstart 1\n", want: map[string]string{"1": "0"}},
		{name: "a code out of range", text: "start 1\nexit 1 256\n", err: `line 2: bad exit code "256"`},
		{name: "a negative code", text: "exit 1 -1\n", err: `bad exit code "-1"`},
		{name: "another shape", text: "start 1\nexit 1\n", err: `line 2: "exit 1" is neither`},
		{name: "a blank line inside", text: "start 1\n\nexit 1 0\n", err: "line 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseLedger(tc.text)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]string{}
			for id, r := range got {
				seen[id] = "running"
				if r.Exit != nil {
					seen[id] = strconv.Itoa(*r.Exit)
				}
			}
			if diff := cmp.Diff(tc.want, seen); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestLimitedBuffer: what is past the bound is dropped and noted, and
// the writer is told all was taken (the exec's copy goes on).
func TestLimitedBuffer(t *testing.T) {
	t.Parallel()
	lb := &limitedBuffer{b: new(bytes.Buffer), max: 4}
	if n, _ := lb.Write([]byte("abcdef")); n != 6 || !lb.over || lb.b.String() != "abcd" {
		t.Errorf("wrote %d, over %t, kept %q; want 6, true, abcd", n, lb.over, lb.b.String())
	}
}
