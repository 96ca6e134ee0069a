package dlock_test

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// notesPatterns are words that mean something only to the people who wrote
// a file: the rounds of reviews, issue numbers, paths on a machine where
// work was done. Code, tests and docs speak of the project alone.
var notesPatterns = []struct {
	re   *regexp.Regexp
	what string
}{
	{regexp.MustCompile(`(?i)\breview-?[0-9]`), "a round of reviews"},
	{regexp.MustCompile(`Test` + `Review`), "a test named after a review"},
	{regexp.MustCompile(`(?i)\b(adversarial|code)[ ]review\b|\breview[ ]round`), "a review"},
	{regexp.MustCompile(`(?i)\bissue #?[0-9]+`), "an issue number"},
	{regexp.MustCompile(`(^|[\s"'(` + "`" + `])/(work|home/[a-z]+|root)/`), "a path on a work machine"},
}

// TestFilesSpeakOfTheProjectAlone reads every text file of the repository
// for words that name a round of reviews, an issue number or a work
// machine's paths.
func TestFilesSpeakOfTheProjectAlone(t *testing.T) {
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && (strings.HasPrefix(name, ".") || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
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
