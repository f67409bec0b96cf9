package forge

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"golang.org/x/crypto/nacl/box"
)

// KeyPair is a runner's sealing key pair: owners seal secret values to
// its public key; only the runner opens them.
type KeyPair struct {
	Public  [32]byte
	Private [32]byte
}

// NewKeyPair makes a fresh key pair.
func NewKeyPair() (*KeyPair, error) {
	pub, priv, err := box.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate sealing key: %w", err)
	}
	return &KeyPair{Public: *pub, Private: *priv}, nil
}

// PublicString is the public key as base64, as records and the seal
// helper spell it.
func (k *KeyPair) PublicString() string { return EncodeKey(k.Public) }

// EncodeKey spells a key as standard base64.
func EncodeKey(k [32]byte) string { return base64.StdEncoding.EncodeToString(k[:]) }

// DecodeKey reads a key spelled by EncodeKey.
func DecodeKey(s string) ([32]byte, error) {
	var k [32]byte
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != len(k) {
		return k, errors.New("want 32 bytes as base64")
	}
	copy(k[:], b)
	return k, nil
}

// Seal seals value to the runner public key pub with an anonymous box:
// only the holder of the private key can open it, and the sealer keeps no
// key.
func Seal(pub [32]byte, value []byte) ([]byte, error) {
	out, err := box.SealAnonymous(nil, value, &pub, rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	return out, nil
}

// Open opens a value sealed to k.
func (k *KeyPair) Open(sealed []byte) ([]byte, error) {
	out, ok := box.OpenAnonymous(nil, sealed, &k.Public, &k.Private)
	if !ok {
		return nil, errors.New("open sealed value: not sealed to this runner's key, or corrupted")
	}
	return out, nil
}

// EnvelopeVersion is the version of the sealed secret envelope.
const EnvelopeVersion = 1

// Envelope is what a dev.knotless.secret record's sealed bytes hold: the
// value bound to the repository, the name, the runner and the scope it
// was sealed for. The record's own fields are public and written by
// whoever holds the record; only the envelope, sealed by the owner,
// says what the value is for.
type Envelope struct {
	V      int    `json:"v"`
	Repo   string `json:"repo"`
	Name   string `json:"name"`
	Runner string `json:"runner"`
	Scope  string `json:"scope"`
	Value  []byte `json:"value"`
}

// SealSecret seals e (its version set here) to the runner public key
// pub.
func SealSecret(pub [32]byte, e Envelope) ([]byte, error) {
	e.V = EnvelopeVersion
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	return Seal(pub, b)
}

// ErrOldSeal is a sealed value of the old form, the value alone: it is
// bound to nothing and is never used.
var ErrOldSeal = errors.New("sealed in the old form (the value alone, bound to no repository): refused; seal it again with knotless-run secret seal")

// OpenSecret opens the sealed value of s for a run of the repository
// repo (an AT-URI) on the runner runner (a DID). Every field of the
// envelope must match the record and the run: a value sealed for
// another repository, name, runner or scope is refused, whatever the
// record says.
func (k *KeyPair) OpenSecret(s Secret, repo, runner string) ([]byte, error) {
	plain, err := k.Open(s.Sealed)
	if err != nil {
		return nil, err
	}
	var e Envelope
	dec := json.NewDecoder(bytes.NewReader(plain))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || dec.More() || e.V == 0 {
		return nil, ErrOldSeal
	}
	if e.V != EnvelopeVersion {
		return nil, fmt.Errorf("sealed envelope version %d: this runner knows %d", e.V, EnvelopeVersion)
	}
	for _, f := range []struct{ field, sealed, record, run string }{
		{"repo", e.Repo, s.Repo, repo},
		{"name", e.Name, s.Name, s.Name},
		{"runner", e.Runner, s.Runner, runner},
		{"scope", e.Scope, s.Scope, ScopePush},
	} {
		if f.sealed != f.record || f.sealed != f.run {
			return nil, fmt.Errorf("sealed for %s %q, but the record says %q and the run is %q: refused", f.field, f.sealed, f.record, f.run)
		}
	}
	return e.Value, nil
}
