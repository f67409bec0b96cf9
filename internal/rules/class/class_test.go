package class

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func mustSet(t *testing.T, specs ...string) Set {
	t.Helper()
	var cs []Class
	for _, s := range specs {
		c, err := Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	s, err := NewSet(cs)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestParse(t *testing.T) {
	t.Parallel()
	got, err := Parse("large:cpu=4,memory=8Gi,ephemeral-storage=20Gi,pids=2048,node-selector=pool=big,node-selector=disk=ssd,toleration=dedicated=ci:NoSchedule,toleration=gpu:NoExecute,untrusted")
	if err != nil {
		t.Fatal(err)
	}
	want := Class{
		Name: "large", CPU: "4", Memory: "8Gi", EphemeralStorage: "20Gi", Pids: 2048,
		NodeSelector: map[string]string{"pool": "big", "disk": "ssd"},
		Tolerations:  []Toleration{{Key: "dedicated", Value: "ci", Effect: "NoSchedule"}, {Key: "gpu", Effect: "NoExecute"}},
		Untrusted:    true,
	}
	if d := cmp.Diff(got, want); d != "" {
		t.Errorf("Parse (-got +want):\n%s", d)
	}
}

func TestParseRefuses(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ spec, want string }{
		{"", `--class "": class name "": want 1 to 63 characters`},
		{"Large:cpu=1", `--class "Large:cpu=1": class name "Large": want lower-case letters, digits and dashes, starting with a letter`},
		{"large:cpu=lots", "--class large: cpu=lots: "},
		{"large:cpu=0", "--class large: cpu=0: must be more than 0"},
		{"large:pids=-1", "--class large: pids=-1: want a count above 0"},
		{"large:disk=1Gi", "--class large: disk=1Gi: unknown key disk"},
		{"large:untrusted=yes", "--class large: untrusted=yes: untrusted takes no value"},
		{"large:node-selector=pool", "--class large: node-selector=pool: want node-selector=LABEL=VALUE"},
		{"large:toleration=gpu:Never", `--class large: toleration=gpu:Never: toleration "gpu:Never": effect must be`},
		{"large:memory", "--class large: memory: want KEY=VALUE"},
	} {
		_, err := Parse(tt.spec)
		if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("Parse(%q) = %v, want an error starting %q", tt.spec, err, tt.want)
		}
	}
}

func TestNewSetDefault(t *testing.T) {
	t.Parallel()
	s := mustSet(t, "large:cpu=4", "tiny:ephemeral-storage=1Gi")
	if d := cmp.Diff(s.Names(), []string{"default", "large", "tiny"}); d != "" {
		t.Errorf("Names (-got +want):\n%s", d)
	}
	for _, tt := range []struct{ name, storage string }{{"", DefaultEphemeralStorage}, {"large", DefaultEphemeralStorage}, {"tiny", "1Gi"}} {
		c, err := s.Pick(tt.name, true)
		if err != nil {
			t.Fatal(err)
		}
		if c.EphemeralStorage != tt.storage {
			t.Errorf("class %q: ephemeral storage %q, want %q", tt.name, c.EphemeralStorage, tt.storage)
		}
	}
	// The operator's default sets the others' disk, and is open to
	// pulls though it does not say untrusted.
	s = mustSet(t, "default:ephemeral-storage=2Gi,cpu=1", "large:cpu=4")
	c, err := s.Pick("large", true)
	if err != nil || c.EphemeralStorage != "2Gi" {
		t.Errorf("large: %+v, %v; want the default's 2Gi", c, err)
	}
	if c, err := s.Pick("", false); err != nil || c.Name != Default || c.CPU != "1" {
		t.Errorf("an untrusted run naming no class: %+v, %v; want the operator's default", c, err)
	}
	// The zero Set is the built-in default alone.
	if c, err := (Set{}).Pick("", false); err != nil || c.EphemeralStorage != DefaultEphemeralStorage {
		t.Errorf("zero Set: %+v, %v", c, err)
	}
	if _, err := NewSet([]Class{{Name: "a"}, {Name: "a"}}); err == nil || err.Error() != "class a is defined twice" {
		t.Errorf("a class twice: %v", err)
	}
}

func TestPick(t *testing.T) {
	t.Parallel()
	s := mustSet(t, "large:cpu=4", "small:cpu=1,untrusted")
	for _, tt := range []struct {
		name    string
		trusted bool
		want    string // the class picked, or the error
	}{
		{"", true, "default"},
		{"", false, "default"},
		{"large", true, "large"},
		{"small", false, "small"},
		{"large", false, "class large is not open to untrusted runs (pulls); their classes on this runner: default, small"},
		{"huge", true, "class huge is not one of this runner's classes: default, large, small"},
		{"huge", false, "class huge is not one of this runner's classes: default, large, small"},
	} {
		c, err := s.Pick(tt.name, tt.trusted)
		got := c.Name
		if err != nil {
			got = err.Error()
		}
		if got != tt.want {
			t.Errorf("Pick(%q, trusted %v) = %q, want %q", tt.name, tt.trusted, got, tt.want)
		}
	}
}

func TestClamp(t *testing.T) {
	t.Parallel()
	c := Class{Name: "small", CPU: "1", Memory: "2Gi"}
	for _, tt := range []struct {
		cpu, memory         string
		wantCPU, wantMemory string
		notes               []string
	}{
		{"", "", "", "", nil},
		{"500m", "1Gi", "500m", "1Gi", nil},
		{"1000m", "2048Mi", "1000m", "2048Mi", nil},
		{"4", "3Gi", "1", "2Gi", []string{
			"resources.cpu 4 lowered to 1, the bound of class small",
			"resources.memory 3Gi lowered to 2Gi, the bound of class small",
		}},
		{"1001m", "", "1", "", []string{"resources.cpu 1001m lowered to 1, the bound of class small"}},
	} {
		cpu, memory, notes := c.Clamp(tt.cpu, tt.memory)
		if d := cmp.Diff([]any{cpu, memory, notes}, []any{tt.wantCPU, tt.wantMemory, tt.notes}); d != "" {
			t.Errorf("Clamp(%q, %q) (-got +want):\n%s", tt.cpu, tt.memory, d)
		}
	}
	// A class with no bounds lowers nothing.
	if cpu, mem, notes := (Class{Name: "any"}).Clamp("64", "1Ti"); cpu != "64" || mem != "1Ti" || notes != nil {
		t.Errorf("unbounded class: %q %q %v", cpu, mem, notes)
	}
}
