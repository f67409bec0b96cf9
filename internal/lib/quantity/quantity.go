// Package quantity reads resource quantities as Kubernetes writes them
// (500m, 2, 1.5, 4Gi, 512M, 1e3) into exact numbers, so that the core
// can compare a workflow's requests with the operator's maximums without
// importing Kubernetes. It is pure.
package quantity

import (
	"fmt"
	"math/big"
	"strconv"
	"strings"
)

// Parse reads a quantity: a decimal number with an optional suffix, one
// of the decimal SI suffixes (m, k, M, G, T, P, E), the binary ones (Ki,
// Mi, Gi, Ti, Pi, Ei) or a decimal exponent (e3, E-2). CPU is in cores
// (500m is 1/2), memory in bytes.
func Parse(s string) (*big.Rat, error) {
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	digits := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
		if s[i] != '.' {
			digits++
		}
		i++
	}
	num, suffix := s[:i], s[i:]
	if digits == 0 || strings.Count(num, ".") > 1 {
		return nil, fmt.Errorf("quantity %q: want a number like 500m, 2 or 4Gi", s)
	}
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return nil, fmt.Errorf("quantity %q: want a number like 500m, 2 or 4Gi", s)
	}
	m, err := multiplier(suffix)
	if err != nil {
		return nil, fmt.Errorf("quantity %q: %w", s, err)
	}
	return r.Mul(r, m), nil
}

func multiplier(suffix string) (*big.Rat, error) {
	pow := func(base, exp int64) *big.Rat {
		return new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(base), big.NewInt(exp), nil))
	}
	switch suffix {
	case "":
		return big.NewRat(1, 1), nil
	case "m":
		return big.NewRat(1, 1000), nil
	case "k":
		return pow(10, 3), nil
	case "M":
		return pow(10, 6), nil
	case "G":
		return pow(10, 9), nil
	case "T":
		return pow(10, 12), nil
	case "P":
		return pow(10, 15), nil
	case "E":
		return pow(10, 18), nil
	case "Ki":
		return pow(2, 10), nil
	case "Mi":
		return pow(2, 20), nil
	case "Gi":
		return pow(2, 30), nil
	case "Ti":
		return pow(2, 40), nil
	case "Pi":
		return pow(2, 50), nil
	case "Ei":
		return pow(2, 60), nil
	}
	if len(suffix) > 1 && (suffix[0] == 'e' || suffix[0] == 'E') {
		n, err := strconv.Atoi(suffix[1:])
		if err == nil && n >= -30 && n <= 30 {
			if n < 0 {
				return new(big.Rat).Inv(pow(10, int64(-n))), nil
			}
			return pow(10, int64(n)), nil
		}
	}
	return nil, fmt.Errorf("unknown suffix %q (want m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei or an exponent like e3)", suffix)
}

// MilliCPU reads a CPU quantity as whole millicores, rounding up (as
// Kubernetes does), and refuses one that is not positive.
func MilliCPU(s string) (int64, error) {
	r, err := Parse(s)
	if err != nil {
		return 0, err
	}
	return positiveCeil(s, r.Mul(r, big.NewRat(1000, 1)))
}

// Bytes reads a memory quantity as whole bytes, rounding up, and refuses
// one that is not positive.
func Bytes(s string) (int64, error) {
	r, err := Parse(s)
	if err != nil {
		return 0, err
	}
	return positiveCeil(s, r)
}

func positiveCeil(s string, r *big.Rat) (int64, error) {
	if r.Sign() <= 0 {
		return 0, fmt.Errorf("quantity %q: want a positive quantity", s)
	}
	q, rem := new(big.Int).QuoRem(r.Num(), r.Denom(), new(big.Int))
	if rem.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() {
		return 0, fmt.Errorf("quantity %q: too large", s)
	}
	return q.Int64(), nil
}
