package cli_test

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

var (
	storesDuration = flag.String("stores.duration", "2s", "BenchmarkStores: --duration of each dlock bench run")
	storesOnly     = flag.String("stores.only", "", "BenchmarkStores: comma list of stores to bench (redis, redlock3, redlock5, postgres, mysql, sqlite, etcd1, etcd3); all when empty")
	storesArgs     = flag.String("stores.args", "", "BenchmarkStores: more dlock bench flags, space-separated")
)

// BenchmarkStores runs `dlock bench` with its defaults on every kind of
// store, each started on this machine for the run, and prints the tables:
//
//	go test -run XXX -bench Stores -benchtime 1x ./internal/cli/ -stores.duration 2s
//
// It is how the per-store figures of docs/PERFORMANCE.md are made. A store
// kind can be picked with -stores.only.
func BenchmarkStores(b *testing.B) {
	stores := []struct {
		name  string
		start func(b *testing.B) []string
	}{
		{"redis", func(b *testing.B) []string { return []string{"redis://" + testserver.StartRedis(b).Addr() + "/0"} }},
		{"redlock3", func(b *testing.B) []string { return []string{startRedlockURL(b, 3)} }},
		{"redlock5", func(b *testing.B) []string { return []string{startRedlockURL(b, 5)} }},
		{"postgres", func(b *testing.B) []string {
			p := testserver.StartPostgres(b)
			p.CreateDatabase(b, "locks")
			return []string{p.URL("locks")}
		}},
		{"mysql", func(b *testing.B) []string {
			m := testserver.StartMariaDB(b)
			m.CreateDatabase(b, "locks")
			return []string{"mysql://root@" + m.Addr() + "/locks"}
		}},
		{"etcd1", func(b *testing.B) []string {
			return []string{"etcd://" + strings.Join(testserver.StartEtcd(b).Endpoints(), ",")}
		}},
		{"etcd3", func(b *testing.B) []string {
			return []string{"etcd://" + strings.Join(testserver.StartEtcdCluster(b, 3).Endpoints(), ",")}
		}},
		{"sqlite", func(b *testing.B) []string {
			return []string{"sqlite://" + filepath.Join(b.TempDir(), "locks.db")}
		}},
	}
	only := map[string]bool{}
	for _, s := range strings.Split(*storesOnly, ",") {
		if s = strings.TrimSpace(s); s != "" {
			only[s] = true
		}
	}
	for _, s := range stores {
		if len(only) > 0 && !only[s.name] {
			continue
		}
		b.Run(s.name, func(b *testing.B) {
			urls := s.start(b)
			for range b.N {
				args := append([]string{"bench", "--duration", *storesDuration}, strings.Fields(*storesArgs)...)
				cmd := exec.Command(dlockBin, append(args, urls...)...)
				cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
				if err := cmd.Run(); err != nil {
					b.Fatalf("dlock bench on %s: %v", s.name, err)
				}
			}
		})
	}
}

// startRedlockURL starts n redis-servers and returns the redlock:// URL of them.
func startRedlockURL(b *testing.B, n int) string {
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = testserver.StartRedis(b).Addr()
	}
	return "redlock://" + strings.Join(addrs, ",")
}
