package backoff

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestAfter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		p    Policy
		want []time.Duration
	}{
		{"2 s doubling to 5 min", Policy{First: 2 * time.Second, Max: 5 * time.Minute},
			[]time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second,
				64 * time.Second, 128 * time.Second, 256 * time.Second, 5 * time.Minute, 5 * time.Minute}},
		{"a first wait over the most", Policy{First: time.Hour, Max: time.Minute},
			[]time.Duration{time.Minute, time.Minute, time.Minute, time.Minute, time.Minute,
				time.Minute, time.Minute, time.Minute, time.Minute, time.Minute}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got []time.Duration
			for tries := 1; tries <= 10; tries++ {
				got = append(got, tc.p.After(tries))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("waits (-want +got):\n%s", diff)
			}
		})
	}
}
