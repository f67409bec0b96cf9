package workflow

import (
	"errors"
	"fmt"
	"testing"
)

// TestFileName: the workflow an Errors names, wrapped or not.
func TestFileName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want string
	}{
		{Errors{{Position: Position{File: ".knotless/workflows/ci.yaml"}}}, "ci"},
		{fmt.Errorf("read: %w", Errors{{Position: Position{File: ".knotless/workflows/deploy.yml"}}}), "deploy"},
		{Errors{}, ""},
		{errors.New("not a workflow's"), ""},
	} {
		if got := FileName(tc.err); got != tc.want {
			t.Errorf("FileName(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
