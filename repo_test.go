package dlock_test

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// notesPatterns are words that mean something only to the people who wrote
// a file: the rounds of checks a change went through, issue numbers, paths
// on a machine where work was done.
var notesPatterns = []struct {
	re   *regexp.Regexp
	what string
}{
	{regexp.MustCompile(`(?i)\brev` + `iew`), "a rev" + "iew"},
	{regexp.MustCompile(`(?i)\brev[0-9]`), "a round of checks"},
	{regexp.MustCompile(`(?i)\bissue #?[0-9]+`), "an issue number"},
	{regexp.MustCompile(`(^|[\s"'(` + "`" + `])/(work|home/[a-z]+|root)/`), "a path on a work machine"},
}

// TestFilesSpeakOfTheProjectAlone reads every text file of the repository
// for words that name a round of checks, an issue number or a work
// machine's paths.
func TestFilesSpeakOfTheProjectAlone(t *testing.T) {
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if name := d.Name(); name == ".git" || name == "node_modules" {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil // a worktree's .git file names where its repository is
		}
		if d.IsDir() {
			return nil
		}
		if d.Name() == ".git" {
			return nil // a worktree's pointer to its repository
		}
		info, err := d.Info()
		if err != nil || !info.Mode().IsRegular() || info.Size() > 1<<20 {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.IndexByte(data, 0) >= 0 {
			return nil // binary
		}
		for i, line := range strings.Split(string(data), "\n") {
			for _, p := range notesPatterns {
				if m := p.re.FindString(line); m != "" {
					t.Errorf("%s:%d names %s (%q)", path, i+1, p.what, strings.TrimSpace(m))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestArchitectureMapIsComplete checks that docs/ARCHITECTURE.md, the map of
// the code, names every package of the repository (its directory) and
// every interface of package driver, and that every Go file it names
// exists.
func TestArchitectureMapIsComplete(t *testing.T) {
	raw, err := os.ReadFile("docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	packages := map[string]bool{}
	goFiles := map[string]bool{}
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".go") {
			goFiles[name] = true
			if !strings.HasSuffix(name, "_test.go") && filepath.Dir(path) != "." {
				packages[filepath.ToSlash(filepath.Dir(path))] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir := range packages {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(dir) + `\s`).MatchString(doc) {
			t.Errorf("docs/ARCHITECTURE.md's package list lacks %s", dir)
		}
	}

	fset := token.NewFileSet()
	files, err := filepath.Glob("driver/*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok {
				continue
			}
			for _, spec := range gd.Specs {
				ts, ok := spec.(*ast.TypeSpec)
				if !ok || !ts.Name.IsExported() {
					continue
				}
				if _, ok := ts.Type.(*ast.InterfaceType); ok && !regexp.MustCompile(`\b`+ts.Name.Name+`\b`).MatchString(doc) {
					t.Errorf("docs/ARCHITECTURE.md does not name driver.%s", ts.Name.Name)
				}
			}
		}
	}

	for _, m := range regexp.MustCompile("`([a-z0-9_]+\\.go)`").FindAllStringSubmatch(doc, -1) {
		if !goFiles[m[1]] {
			t.Errorf("docs/ARCHITECTURE.md names %s, which no directory has", m[1])
		}
	}
}
