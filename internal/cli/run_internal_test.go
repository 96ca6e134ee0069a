package cli

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// TestRunHoldingLostBeforeStart: a lease lost before the command starts
// means exit 76, and the command is not run.
func TestRunHoldingLostBeforeStart(t *testing.T) {
	be := memlock.New()
	c := dlock.New(be)
	defer c.Close()
	lease, err := c.Mutex("early").TryLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := be.ForceRelease(t.Context(), "early"); !ok || err != nil {
		t.Fatalf("ForceRelease: %v %v", ok, err)
	}
	if err := lease.Refresh(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh after ForceRelease: %v", err)
	}

	ran := filepath.Join(t.TempDir(), "ran")
	var stdout, stderr bytes.Buffer
	a := &app{stdout: &stdout, stderr: &stderr, connectTimeout: defaultConnectTimeout}
	o := &runOptions{name: "early", command: []string{"touch", ran}, ttl: dlock.DefaultTTL, killGrace: defaultKillGrace}
	err = runHolding(a, o, &store{where: "memory"}, lease, make(chan os.Signal))
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != exitLost || !strings.Contains(ee.msg, "lost before the command started") {
		t.Errorf("runHolding = %v, want exit %d, lost before the command started", err, exitLost)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("the command ran on a lost lease")
	}
}

// TestTimeoutFlagTakesBareSecondsOfAnySize: --timeout takes flock's bare
// seconds however many there are (a minute, an hour), not only up to nine,
// and refuses only a number too large for a duration.
func TestTimeoutFlagTakesBareSecondsOfAnySize(t *testing.T) {
	for s, want := range map[string]time.Duration{
		"0.5":  500 * time.Millisecond,
		"9":    9 * time.Second,
		"10":   10 * time.Second,
		"60":   time.Minute,
		"3600": time.Hour,
	} {
		w := &waitFlag{}
		if err := (timeoutFlag{w}).Set(s); err != nil || w.d != want {
			t.Errorf("--timeout %s: %v, %v; want %v", s, w.d, err, want)
		}
	}
	if err := (timeoutFlag{&waitFlag{}}).Set("99999999999"); err == nil {
		t.Error("--timeout 99999999999 (over 290 years) accepted")
	}
}
