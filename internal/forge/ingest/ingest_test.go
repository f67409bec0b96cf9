package ingest

import "testing"

func TestParseTarget(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"did:plc:ewvi7nxzyoun6zhxrhs64oiz/hello":                            "did:plc:ewvi7nxzyoun6zhxrhs64oiz/hello",
		"alice.example.com/hello":                                           "alice.example.com/hello",
		"at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.repo/hello":     "did:plc:ewvi7nxzyoun6zhxrhs64oiz/hello",
		"at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.pull/3n3pa7x34": "",
		"hello":          "",
		"a/b/c":          "",
		"not a handle/x": "",
		"alice.test/":    "",
	} {
		got, err := ParseTarget(in)
		switch {
		case want == "" && err == nil:
			t.Errorf("%q: parsed as %s, want an error", in, got)
		case want != "" && (err != nil || got.String() != want):
			t.Errorf("%q: got %s, %v; want %s", in, got, err, want)
		}
	}
}
