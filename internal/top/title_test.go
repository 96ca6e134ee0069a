package top_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/top"
)

// TestTitleEscaped: the title line prints Config.Where raw, while
// dash escapes the same string (dash.New: safetext.Escape(cfg.Where)).
// dlock top 'sqlite:///tmp/x%1b]0;pwned%07.db' sets the terminal's title
// (checked under script(1)): the path is URL-decoded into "SQLite file PATH".
func TestTitleEscaped(t *testing.T) {
	v := top.New(top.Config{
		List:     func(context.Context) ([]driver.LockInfo, error) { return nil, nil },
		HeldFor:  func(driver.LockInfo, time.Time) (time.Duration, bool) { return 0, false },
		Duration: time.Duration.String,
		Where:    "SQLite file /tmp/x\x1b]0;pwned\x07.db",
	})
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Millisecond)
	defer cancel()
	var out bytes.Buffer
	if err := v.Live(ctx, &out, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "\x1b]0;pwned\x07") {
		t.Errorf("the title line holds the store's name raw: %q", out.String())
	}
}
