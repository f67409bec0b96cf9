package quantity_test

import (
	"math/big"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"knotless.dev/run/internal/lib/quantity"
)

// TestParseAgreesWithKubernetes: every quantity apimachinery reads
// reads to the same number here, so the workflow parser and the limits,
// which use this package, agree with what the cluster will be sent.
func TestParseAgreesWithKubernetes(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"1", "2", "500m", "1.5", "0.25", "100m", "1001m", "4Gi", "512Mi", "1Ki", "1k", "512M",
		"1G", "2T", "1P", "1E", "1Ei", "1e3", "1E3", "5e-1", "0.5Gi", "1.5M", "+3", "123456789"} {
		t.Run(s, func(t *testing.T) {
			t.Parallel()
			got, err := quantity.Parse(s)
			if err != nil {
				t.Fatalf("Parse(%q): %v", s, err)
			}
			q := resource.MustParse(s)
			want := new(big.Rat).SetFrac(q.AsDec().UnscaledBig(), big.NewInt(1))
			if scale := int64(q.AsDec().Scale()); scale > 0 {
				want.Quo(want, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(scale), nil)))
			} else if scale < 0 {
				want.Mul(want, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(-scale), nil)))
			}
			if got.Cmp(want) != 0 {
				t.Errorf("Parse(%q) = %s, want %s (apimachinery)", s, got.RatString(), want.RatString())
			}
		})
	}
}

func TestParseRefuses(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "m", "Gi", "1.2.3", "1x", "1gi", "1e", "1e99", "one", "1 Gi", "0x10"} {
		if got, err := quantity.Parse(s); err == nil {
			t.Errorf("Parse(%q) = %s, want an error", s, got.RatString())
		}
	}
}

func TestMilliCPUAndBytes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in    string
		milli int64
		bytes int64
	}{
		{"500m", 500, 1}, {"2", 2000, 2}, {"1.0001", 1001, 2}, {"4Gi", 4 << 30 * 1000, 4 << 30}, {"1e3", 1000000, 1000},
	} {
		if got, err := quantity.MilliCPU(tc.in); err != nil || got != tc.milli {
			t.Errorf("MilliCPU(%q) = %d, %v, want %d", tc.in, got, err, tc.milli)
		}
		if got, err := quantity.Bytes(tc.in); err != nil || got != tc.bytes {
			t.Errorf("Bytes(%q) = %d, %v, want %d", tc.in, got, err, tc.bytes)
		}
	}
	for _, s := range []string{"0", "-1", "0m"} {
		if _, err := quantity.MilliCPU(s); err == nil {
			t.Errorf("MilliCPU(%q): want an error", s)
		}
	}
}
