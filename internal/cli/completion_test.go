package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestCompletionBash: the script of dlock completion bash loads in a real
// bash, registers itself for dlock, and completes commands, flags, the
// values of --log-format and top --sort, the arguments of help and
// completion, and held lock names, by asking the dlock binary.
func TestCompletionBash(t *testing.T) {
	t.Parallel()
	bash, err := exec.LookPath("bash")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("no bash:", err)
		}
		t.Skip("no bash:", err)
	}
	ready := filepath.Join(t.TempDir(), "ready")
	e := newEnv(t, sqliteURL(t), "READY="+ready)
	holder := e.start("run", "orders-42", "--", "sh", "-c", `echo x > "$READY"; sleep 30`)
	waitFile(t, ready, holder)
	r := e.run("completion", "bash")
	expect(t, r, 0)
	script := filepath.Join(t.TempDir(), "dlock.bash")
	if err := os.WriteFile(script, []byte(r.stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	// complete runs the completion function bash would run for line, with
	// the cursor at its end, and returns what it offers. The script takes
	// its word splitting from the bash-completion package when loaded; the
	// stand-in below is the plain split, which is all these lines need.
	complete := func(line string) []string {
		t.Helper()
		prog := `
_get_comp_words_by_ref() { cur=${COMP_WORDS[COMP_CWORD]}; prev=${COMP_WORDS[COMP_CWORD-1]}; words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD; }
source "$SCRIPT" || exit 3
complete -p dlock >/dev/null || exit 4
read -r -a COMP_WORDS <<< "$LINE"
[[ $LINE == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
COMP_LINE=$LINE
COMP_POINT=${#LINE}
fn=$(complete -p dlock | sed -E 's/.* -F ([^ ]+) .*/\1/')
"$fn" dlock "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
`
		cmd := exec.Command(bash, "--norc", "--noprofile", "-c", prog)
		cmd.Env = append(e.vars, "SCRIPT="+script, "LINE="+line, "PATH="+filepath.Dir(dlockBin)+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("bash completing %q: %v\n%s", line, err, out)
		}
		var got []string
		for _, w := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if w = strings.TrimSpace(w); w != "" {
				got = append(got, w)
			}
		}
		return got
	}
	for _, c := range []struct {
		line string
		want []string // each offered
		not  []string // none offered
	}{
		{"dlock ", []string{"run", "ls", "inspect", "release", "bench", "completion", "version", "help"}, []string{"__complete"}},
		{"dlock l", []string{"ls"}, []string{"run"}},
		{"dlock r", []string{"run", "release"}, []string{"ls"}},
		{"dlock run --tt", []string{"--ttl"}, []string{"--wait"}},
		{"dlock run --w", []string{"--wait"}, nil},
		{"dlock ls --j", []string{"--json"}, nil},
		{"dlock --back", []string{"--backend"}, nil},
		{"dlock completion ", []string{"bash", "zsh", "fish"}, nil},
		{"dlock help in", []string{"inspect"}, nil},
		// Lock names come from the store, as dlock ls lists them.
		{"dlock inspect ord", []string{"orders-42"}, nil},
		{"dlock release --force ", []string{"orders-42"}, nil},
		{"dlock inspect x", nil, []string{"orders-42"}},
		{"dlock run ord", []string{"orders-42"}, nil},
		{"dlock run --wait 1m ", []string{"orders-42"}, nil},
		{"dlock run orders-42 -- ", nil, []string{"orders-42"}},
		// Flags that take one of a few words.
		{"dlock top --sort ", []string{"hold", "wait"}, nil},
		{"dlock top --sort w", []string{"wait"}, []string{"hold"}},
		{"dlock --log-format ", []string{"text", "json"}, nil},
		{"dlock run --log-format j", []string{"json"}, []string{"text"}},
	} {
		got := complete(c.line)
		for _, w := range c.want {
			if !slices.Contains(got, w) {
				t.Errorf("completing %q: %q, want %q among them", c.line, got, w)
			}
		}
		for _, w := range c.not {
			if slices.Contains(got, w) {
				t.Errorf("completing %q: %q, do not want %q", c.line, got, w)
			}
		}
	}
}

// TestCompletionOtherShells: zsh and fish get scripts of their own, and an
// unknown shell is a usage error.
func TestCompletionOtherShells(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sqliteURL(t))
	r := e.run("completion", "zsh")
	expect(t, r, 0)
	if !strings.HasPrefix(r.stdout, "#compdef dlock") {
		t.Errorf("completion zsh: %.80q, want a #compdef dlock script", r.stdout)
	}
	r = e.run("completion", "fish")
	expect(t, r, 0)
	if !strings.Contains(r.stdout, "complete -c dlock") {
		t.Errorf("completion fish: %.200q, want complete -c dlock", r.stdout)
	}
	expect(t, e.run("completion", "tcsh"), 64, "want one shell: bash, zsh, fish", "usage: dlock completion")
	expect(t, e.run("completion"), 64, "want one shell")
}

// TestVersionFromBuildInfo: dlock version prints the module version the Go
// toolchain recorded in the binary, as go version -m reads it.
func TestVersionFromBuildInfo(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "version", "-m", dlockBin).Output()
	if err != nil {
		t.Fatal(err)
	}
	var version string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "mod" && f[1] == "github.com/dlock-go/dlock" {
			version = f[2]
		}
	}
	if version == "" {
		t.Fatalf("go version -m: no module version:\n%s", out)
	}
	e := newEnv(t, "")
	for _, args := range [][]string{{"version"}, {"--version"}} {
		r := e.run(args...)
		expect(t, r, 0)
		if !strings.HasPrefix(r.stdout, "dlock "+version+" ") {
			t.Errorf("dlock %s: %q, want dlock %s first", args[0], r.stdout, version)
		}
	}
}
