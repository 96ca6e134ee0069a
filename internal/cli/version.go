// The dlock version command and the version string from the build info.

package cli

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/pflag"
)

// versionCommand returns what runs version, which has no flags of its own.
func versionCommand(a *app, _ *pflag.FlagSet) runner {
	return func(_ context.Context, args []string, _ int) error {
		if len(args) > 0 {
			return usageErr("version", "version takes no arguments")
		}
		fmt.Fprintln(a.stdout, versionString())
		return nil
	}
}

// versionString is "dlock VERSION (commit REV[, modified]) GOVERSION OS/ARCH",
// from what the Go toolchain recorded in the binary.
func versionString() string {
	version, rev, modified := "(devel)", "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := bi.Main.Version; v != "" {
			version = v
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	out := "dlock " + version
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		out += " (commit " + rev
		if modified {
			out += ", modified"
		}
		out += ")"
	}
	return fmt.Sprintf("%s %s %s/%s", out, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
