package etcdlock_test

import (
	"errors"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/testserver"
)

// A namespace is a directory: names follow it directly, so a namespace
// that does not end with '/' would share keys with another namespace's
// names ("app/x" + "y" is "app/" + "xy"). Such a backend grants nothing,
// and says why; "" (no prefix at all) and "app/x/" work.
func TestNamespaceMustEndWithSlash(t *testing.T) {
	srv := testserver.StartEtcd(t)
	cli := srv.Client(t)
	c := dlock.New(etcdlock.New(cli, etcdlock.WithNamespace("app/x")))
	defer c.Close()
	if l, err := c.Mutex("y").TryLock(t.Context()); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("TryLock under namespace app/x: lease %v, err %v; want ErrInvalid", l, err)
	}
	for _, ns := range []string{"app/x/", ""} {
		c := dlock.New(etcdlock.New(cli, etcdlock.WithNamespace(ns)))
		l, err := c.Mutex("y").TryLock(t.Context())
		if err != nil {
			t.Fatalf("TryLock under namespace %q: %v", ns, err)
		}
		if err := l.Unlock(t.Context()); err != nil {
			t.Fatalf("Unlock under namespace %q: %v", ns, err)
		}
		c.Close()
	}
}
