package forge

import (
	"crypto/rand"
	"encoding/base64"
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
