package dlock_test

import (
	"archive/zip"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// adapterModules are the modules of this repository that users install
// apart from the root module.
var adapterModules = []string{"observe/prometheus", "observe/otel"}

const rootModule = "github.com/dlock-go/dlock"

// rootRequire finds the version of the root module that a go.mod requires.
var rootRequire = regexp.MustCompile(`(?m)^\s*(?:require\s+)?` + regexp.QuoteMeta(rootModule) + `\s+(v\S+)`)

// TestAdapterModulesBuildOutsideTheRepository builds a copy of each adapter
// module as a user's `go get` would: without the workspace, without a
// replace directive, fetching the root module at the version its go.mod
// requires from a module proxy. The proxy is a directory made from this
// tree; every other module comes from the local module cache, so the test
// needs no network once the adapters' dependencies have been downloaded.
func TestAdapterModulesBuildOutsideTheRepository(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed: %v", err)
	}
	out, err := exec.Command(gobin, "env", "GOMODCACHE", "GOPROXY").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	goenv := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(goenv) != 2 {
		t.Fatalf("go env GOMODCACHE GOPROXY printed %q", out)
	}
	proxy := t.TempDir()
	proxies := []string{fileURL(proxy), fileURL(filepath.Join(goenv[0], "cache", "download"))}
	if goenv[1] != "" && goenv[1] != "off" {
		proxies = append(proxies, goenv[1]) // what the local cache lacks
	}
	env := append(os.Environ(),
		"GOWORK=off",
		"GOFLAGS=-mod=mod -modcacherw",
		"GOPROXY="+strings.Join(proxies, ","),
		"GOMODCACHE="+t.TempDir(), // the root module's zip stays out of the user's cache
		"GONOSUMDB="+rootModule,
		"GOSUMDB=off",
		"GONOPROXY=",
		"GOPRIVATE=",
		"GOTOOLCHAIN=local",
	)

	served := map[string]bool{}
	for _, dir := range adapterModules {
		t.Run(dir, func(t *testing.T) {
			gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
			if err != nil {
				t.Fatal(err)
			}
			if regexp.MustCompile(`(?m)^\s*replace\b`).Match(gomod) {
				t.Errorf("%s/go.mod has a replace directive, which go ignores in a dependency", dir)
			}
			m := rootRequire.FindSubmatch(gomod)
			if m == nil {
				t.Fatalf("%s/go.mod does not require %s", dir, rootModule)
			}
			version := string(m[1])
			if !served[version] {
				if err := serveRootModule(proxy, version); err != nil {
					t.Fatalf("module proxy for %s@%s: %v", rootModule, version, err)
				}
				served[version] = true
			}
			work := filepath.Join(t.TempDir(), filepath.Base(dir))
			if err := os.CopyFS(work, os.DirFS(dir)); err != nil {
				t.Fatal(err)
			}
			build := exec.Command(gobin, "build", "-trimpath", "./...")
			build.Dir = work
			build.Env = env
			if out, err := build.CombinedOutput(); err != nil {
				t.Errorf("go build ./... of %s outside the repository: %v\n%s", dir, err, out)
			}
		})
	}
}

func fileURL(dir string) string {
	return "file://" + filepath.ToSlash(dir)
}

// serveRootModule writes the root module, as this tree has it, into the
// module proxy directory proxy under the given version: @v/list and the
// version's .info, .mod and .zip.
func serveRootModule(proxy, version string) error {
	at, err := pseudoVersionTime(version)
	if err != nil {
		return err
	}
	vdir := filepath.Join(proxy, filepath.FromSlash(rootModule), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		return err
	}
	info := fmt.Sprintf(`{"Version":%q,"Time":%q}`, version, at.Format(time.RFC3339))
	for name, data := range map[string][]byte{
		"list":            []byte(version + "\n"),
		version + ".info": []byte(info),
		version + ".mod":  gomod,
	} {
		if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
			return err
		}
	}
	f, err := os.Create(filepath.Join(vdir, version+".zip"))
	if err != nil {
		return err
	}
	if err := zipModule(f, rootModule+"@"+version+"/"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// pseudoVersionTime is the commit time that a pseudo-version such as
// v0.0.0-20060102150405-abcdefabcdef names.
func pseudoVersionTime(version string) (time.Time, error) {
	m := regexp.MustCompile(`-(?:0\.)?(\d{14})-[0-9a-f]{12}$`).FindStringSubmatch(version)
	if m == nil {
		return time.Time{}, fmt.Errorf("%s is not a pseudo-version", version)
	}
	return time.Parse("20060102150405", m[1])
}

// zipModule writes the files of the root module, the current directory, as
// a module zip whose entries start with prefix. Like the zips the Go module
// proxy makes, it leaves out the directories of other modules (those with a
// go.mod of their own), version control directories and anything that is
// not a regular file.
func zipModule(w *os.File, prefix string) error {
	z := zip.NewWriter(w)
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Name() == ".git" { // a directory, or a worktree's file
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			if path == "." {
				return nil
			}
			if d.Name() == "vendor" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		zw, err := z.Create(prefix + filepath.ToSlash(path))
		if err != nil {
			return err
		}
		_, err = zw.Write(data)
		return err
	})
	if err != nil {
		return err
	}
	return z.Close()
}
