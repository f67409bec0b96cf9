package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/parts/scheduler"
)

// operatorSecretsFile is the operator secrets file's format:
//
//	{"secrets": [{"name": "DEPLOY_TOKEN", "value": "…" or "file": "token",
//	  "repos": ["at://DID/dev.knotless.repo/NAME", …] or ["*"],
//	  "workflows": ["deploy"], "refs": ["refs/heads/main"]}]}
//
// The older form, a JSON object of name to string value, is read as
// secrets for every repository ("*").
type operatorSecretsFile struct {
	Secrets []operatorSecretEntry `json:"secrets"`
}

type operatorSecretEntry struct {
	Name      string   `json:"name"`
	Value     *string  `json:"value"`
	File      string   `json:"file"`
	Repos     []string `json:"repos"`
	Workflows []string `json:"workflows"`
	Refs      []string `json:"refs"`
}

// parseOperatorSecrets reads the operator secrets file name, whose
// content is b; a "file" entry is read relative to name's directory.
func parseOperatorSecrets(name string, b []byte) ([]scheduler.OperatorSecret, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		return nil, fmt.Errorf("want a JSON object: %w", err)
	}
	if raw, ok := top["secrets"]; ok && bytes.HasPrefix(bytes.TrimSpace(raw), []byte("[")) {
		return parseScopedSecrets(name, b)
	}
	// The older form: every value a string, every secret unscoped.
	var out []scheduler.OperatorSecret
	for k, raw := range top {
		var v string
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf(`want {"secrets": [...]} or an object of name to string value: %s is not a string`, k)
		}
		out = append(out, scheduler.OperatorSecret{Name: k, Value: v, Repos: []string{scheduler.AnyRepo}})
	}
	return out, nil
}

func parseScopedSecrets(name string, b []byte) ([]scheduler.OperatorSecret, error) {
	var f operatorSecretsFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, err
	}
	var out []scheduler.OperatorSecret
	for i, e := range f.Secrets {
		where := fmt.Sprintf("secrets[%d]", i)
		if e.Name == "" {
			return nil, fmt.Errorf("%s: no name", where)
		}
		where += " (" + e.Name + ")"
		if (e.Value == nil) == (e.File == "") {
			return nil, fmt.Errorf(`%s: want exactly one of "value" and "file"`, where)
		}
		value := ""
		if e.Value != nil {
			value = *e.Value
		} else {
			p := e.File
			if !filepath.IsAbs(p) {
				p = filepath.Join(filepath.Dir(name), p)
			}
			v, err := os.ReadFile(p)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			value = strings.TrimSuffix(string(v), "\n")
		}
		if len(e.Repos) == 0 {
			return nil, fmt.Errorf(`%s: no "repos": name the repositories (at://DID/%s/NAME) it is for, or "*" for every one`, where, forge.CollectionRepo)
		}
		for _, r := range e.Repos {
			if r == scheduler.AnyRepo {
				if len(e.Repos) > 1 {
					return nil, fmt.Errorf(`%s: "*" stands alone in "repos"`, where)
				}
				continue
			}
			if err := checkRepoURI(r); err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
		}
		for _, ref := range e.Refs {
			if !strings.HasPrefix(ref, "refs/") {
				return nil, fmt.Errorf("%s: ref %q: want a full ref name, refs/heads/…", where, ref)
			}
		}
		for _, w := range e.Workflows {
			if w == "" {
				return nil, fmt.Errorf("%s: an empty workflow name", where)
			}
		}
		out = append(out, scheduler.OperatorSecret{Name: e.Name, Value: value, Repos: e.Repos, Workflows: e.Workflows, Refs: e.Refs})
	}
	return out, nil
}

// checkRepoURI accepts a repository's canonical AT-URI, the form runs
// are compared with: at://DID/dev.knotless.repo/NAME.
func checkRepoURI(s string) error {
	uri, err := syntax.ParseATURI(s)
	if err == nil {
		did, derr := uri.Authority().AsDID()
		if derr == nil && uri.Collection().String() == forge.CollectionRepo && forge.RepoURI(did, uri.RecordKey().String()).String() == s {
			return nil
		}
	}
	return fmt.Errorf("repo %q: want at://DID/%s/NAME", s, forge.CollectionRepo)
}
