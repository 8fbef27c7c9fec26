package e2e

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageDocs: every Go package of the module says what it owns in a
// doc.go with a package comment (commands: in their main file).
func TestPackageDocs(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dirs := map[string]bool{}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") && p != root {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
			dirs[filepath.Dir(p)] = true
		}
		return nil
	})
	for dir := range dirs {
		rel, _ := filepath.Rel(root, dir)
		pkgs, err := parser.ParseDir(token.NewFileSet(), dir, func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			continue
		}
		for name, pkg := range pkgs {
			documented := false
			for fname, f := range pkg.Files {
				if f.Doc != nil && len(strings.TrimSpace(f.Doc.Text())) > 20 {
					documented = true
					if name != "main" && filepath.Base(fname) != "doc.go" {
						t.Errorf("%s: package comment is in %s; keep it in doc.go", rel, filepath.Base(fname))
					}
				}
			}
			if !documented {
				t.Errorf("%s: package %s has no package comment (doc.go saying what it owns)", rel, name)
			}
			if name != "main" {
				if _, err := os.Stat(filepath.Join(dir, "doc.go")); err != nil {
					t.Errorf("%s: no doc.go", rel)
				}
			}
		}
	}
	if len(dirs) < 10 {
		t.Fatalf("found only %d package directories under %s", len(dirs), root)
	}
}
