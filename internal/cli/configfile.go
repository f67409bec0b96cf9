package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/alecthomas/kong"
)

// ConfigFile is the --config flag: before the other flags are resolved
// it adds a resolver reading the file's JSON object, keyed by long flag
// name.
type ConfigFile string

// BeforeResolve reads the file and adds its resolver.
func (c ConfigFile) BeforeResolve(kctx *kong.Context, trace *kong.Path) error {
	name, _ := kctx.FlagValue(trace.Flag).(ConfigFile)
	if name == "" {
		return nil
	}
	r, err := configResolver(kctx, string(name))
	if err != nil {
		return err
	}
	kctx.AddResolver(r)
	return nil
}

func configResolver(kctx *kong.Context, name string) (kong.Resolver, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	var values map[string]any
	if err := json.Unmarshal(b, &values); err != nil {
		return nil, fmt.Errorf("--config %s: %w", name, err)
	}
	known := map[string]bool{}
	for _, f := range kctx.Flags() {
		known[f.Name] = true
	}
	var unknown []string
	for k := range values {
		if !known[k] || k == "config" || k == "help" {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("--config %s: unknown keys %s (keys are long flag names)", name, strings.Join(unknown, ", "))
	}
	if _, ok := values["app-password"]; ok {
		return nil, fmt.Errorf("--config %s: the app password is read from a file only (app-password-file)", name)
	}
	return kong.ResolverFunc(func(_ *kong.Context, _ *kong.Path, flag *kong.Flag) (any, error) {
		v, ok := values[flag.Name]
		if !ok {
			return nil, nil
		}
		if m, isMap := v.(map[string]any); isMap {
			// KEY=VALUE flags (node-selector) take a JSON object.
			parts := make([]string, 0, len(m))
			for k, x := range m {
				parts = append(parts, fmt.Sprintf("%s=%v", k, x))
			}
			sort.Strings(parts)
			return strings.Join(parts, ";"), nil
		}
		return v, nil
	}), nil
}
