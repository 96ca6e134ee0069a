//go:build unix

package sqllock_test

import (
	"net"
	"testing"
)

// bindAndAbandon leaves a socket file at path that nobody is bound to, as
// a process that died does.
func bindAndAbandon(t *testing.T, path string) {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
}
