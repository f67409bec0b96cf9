package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"knotless.dev/run/internal/forge"
)

type keyFile struct {
	Version int    `json:"version"`
	Public  string `json:"public"`
	Private string `json:"private"`
}

// LoadKey reads dir/secrets-key.json, making a new key pair when the file
// does not exist. created tells which.
func LoadKey(dir string) (kp *forge.KeyPair, created bool, err error) {
	name := filepath.Join(dir, KeyFile)
	b, err := os.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		kp, err := forge.NewKeyPair()
		if err != nil {
			return nil, false, err
		}
		out, _ := json.MarshalIndent(keyFile{Version: Version, Public: kp.PublicString(), Private: forge.EncodeKey(kp.Private)}, "", "  ")
		if err := WriteFile(name, append(out, '\n')); err != nil {
			return nil, false, err
		}
		return kp, true, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read key %s: %w", name, err)
	}
	var kf keyFile
	if err := json.Unmarshal(b, &kf); err != nil {
		return nil, false, fmt.Errorf("key file %s is corrupt: %v", name, err)
	}
	if kf.Version != Version {
		return nil, false, fmt.Errorf("key file %s has version %d; this knotless-run reads version %d only", name, kf.Version, Version)
	}
	pub, err := forge.DecodeKey(kf.Public)
	if err != nil {
		return nil, false, fmt.Errorf("key file %s: public: %v", name, err)
	}
	priv, err := forge.DecodeKey(kf.Private)
	if err != nil {
		return nil, false, fmt.Errorf("key file %s: private: %v", name, err)
	}
	return &forge.KeyPair{Public: pub, Private: priv}, false, nil
}
