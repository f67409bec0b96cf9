package archtest

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestEveryPackageHasADocComment walks the module's source tree: every
// directory of Go files (commands, internal packages and the test
// suites, whose only files may be tests) has a package doc comment that
// says what it is for.
func TestEveryPackageHasADocComment(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	// directory -> package name -> has a doc comment
	docs := map[string]map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "testdata" || name == "vendor" || name == "node_modules" ||
				strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || !strings.HasSuffix(name, ".go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		dir, _ := filepath.Rel(root, filepath.Dir(path))
		// An external test package (foo_test beside foo) is documented
		// by foo; a directory of tests alone documents its _test package.
		pkg := strings.TrimSuffix(f.Name.Name, "_test")
		if docs[dir] == nil {
			docs[dir] = map[string]bool{}
		}
		docs[dir][pkg] = docs[dir][pkg] || (f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) < 10 {
		t.Fatalf("found Go files in %d directories under %s; is the walk rooted at the module?", len(docs), root)
	}
	var missing []string
	for dir, pkgs := range docs {
		for pkg, ok := range pkgs {
			if !ok {
				missing = append(missing, dir+" (package "+pkg+")")
			}
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("%s: no package doc comment; add one that says what the package is for", m)
	}
}
