package browsertest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

// dlockBin is the dlock binary under test, built by TestMain.
var dlockBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dlock-browsertest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dlockBin = filepath.Join(dir, "dlock")
	// Built in dlock's own module, with its go.mod and go.sum: the binary
	// users get, not one resolved through this module's requirements.
	build := exec.Command("go", "build", "-o", dlockBin, "./cmd/dlock")
	build.Dir = filepath.Join("..", "..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build ./cmd/dlock: %v\n%s", err, out)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { _ = os.RemoveAll(dir) }))
}

// syncBuffer is a bytes.Buffer that may be read while a process writes it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// proc is a dlock process.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr syncBuffer
	done           chan struct{}
	code           int
}

// start starts dlock with args and env; the test's clean-up ends it.
func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(dlockBin, args...), done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// waitOut waits until the process's stdout or stderr (which) matches re,
// and returns the match.
func (p *proc) waitOut(t *testing.T, which *syncBuffer, re *regexp.Regexp) []string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(which.String()); m != nil {
			return m
		}
		select {
		case <-p.done:
			t.Fatalf("dlock %v exited (%d); stderr: %s", p.cmd.Args[1:], p.code, p.stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("dlock %v: no %v within 30s; stderr: %s", p.cmd.Args[1:], re, p.stderr.String())
	return nil
}

func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(30 * time.Second):
		t.Fatalf("dlock %v still running after 30s", p.cmd.Args[1:])
	}
	return 0
}

// chromium finds the browser: Debian's chromium, else another Chromium or
// Chrome. Under CI=true a missing browser fails the test.
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium on PATH (scripts/test installs Debian's chromium)")
	}
	t.Skip("no chromium on PATH; apt-get install chromium")
	return ""
}

// browser starts headless Chromium with a fresh profile.
func browser(t *testing.T) context.Context {
	t.Helper()
	// Not t.TempDir: Chromium's helper processes may still write to the
	// profile for a moment after the browser has exited, and t.TempDir's
	// removal then fails the test ("directory not empty").
	profile, err := os.MkdirTemp("", "dlock-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1280, 1000),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
		for i := 0; ; i++ {
			err := os.RemoveAll(profile)
			if err == nil {
				return
			}
			if i == 50 {
				t.Logf("chromium's profile %s left behind: %v", profile, err)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	if err := chromedp.Run(ctx); err != nil {
		t.Fatalf("start chromium: %v", err) // installed but not starting: a failure, in CI or not
	}
	return ctx
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	var v T
	if err := chromedp.Run(ctx, chromedp.Evaluate(js, &v)); err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// poll evaluates js until it returns true, at most within.
func poll(t *testing.T, ctx context.Context, what string, within time.Duration, js string) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < within {
		if eval[bool](t, ctx, js) {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the page did not show %s within %v; body: %s", what, within, eval[string](t, ctx, "document.body.innerText"))
	return 0
}

// rowJS returns the JavaScript for the cells' texts of the row of the lock
// named name, or null.
func rowJS(name string) string {
	return fmt.Sprintf(`(() => { const r = [...document.querySelectorAll('#locks tbody tr')].find(r => r.dataset.name === %q); return r ? [...r.cells].map(c => c.textContent) : null })()`, name)
}

// pixelsJS counts the timeline canvas's pixels of one colour.
func pixelsJS(r, g, b int) string {
	return fmt.Sprintf(`(() => { const c = document.getElementById('timeline'); const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i] === %d && d[i+1] === %d && d[i+2] === %d && d[i+3] === 255) n++; return n })()`, r, g, b)
}

// TestDashInChromium: the page served by dlock dash, on a real redis-server,
// shows a lock taken by dlock run within a second, its fair waiter in the
// queue and in the lock's detail, a hostile owner string as inert escaped
// text, draws the timeline, and drops the lock after its release. A
// screenshot is written to $DLOCK_ARTIFACTS (else the test's temporary
// directory).
func TestDashInChromium(t *testing.T) {
	ctx := browser(t)
	srv := testserver.StartRedis(t)
	env := dlockEnv(t, "redis://"+srv.Addr()+"/0")

	d := start(t, env, "dash", "--listen", "127.0.0.1:0", "--interval", "100ms")
	url := d.waitOut(t, &d.stderr, regexp.MustCompile(`on (http://127\.0\.0\.1:\d+/)`))[1]
	if err := chromedp.Run(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "its first sample", 5*time.Second, `document.getElementById('status').textContent.startsWith('sampled')`)
	// Redis announces releases: dash listens (it subscribes to the locks
	// it sees held).
	poll(t, ctx, "notifications on", 5*time.Second, `document.getElementById('status').textContent.endsWith('at each release the store announces')`)

	const meta = `<script>window.pwned=1</script><img src=x onerror="window.pwned=2">`
	holder := start(t, env, "run", "--fair", "--metadata", meta, "shop:orders")
	holder.waitOut(t, &holder.stdout, regexp.MustCompile(`\d+\n`))
	took := poll(t, ctx, "the held lock", 3*time.Second, rowJS("shop:orders")+" !== null")
	if took > time.Second {
		t.Errorf("the lock appeared on the page %v after dlock run held it, want within 1s", took)
	}
	cells := eval[[]string](t, ctx, rowJS("shop:orders"))
	if len(cells) != 7 || cells[1] != "exclusive" || !strings.HasSuffix(cells[3], "|"+meta) {
		t.Errorf("row %q: want kind exclusive and the holder's metadata as text", cells)
	}

	waiter := start(t, env, "run", "--fair", "--wait", "1m", "shop:orders", "--", "true")
	poll(t, ctx, "the waiter in the queue", 5*time.Second, rowJS("shop:orders")+"?.[6] === '1 queued'")
	eval[bool](t, ctx, `(document.querySelector('#locks tbody tr[data-name="shop:orders"]').click(), true)`)
	poll(t, ctx, "the lock's detail", 3*time.Second, `!document.getElementById('detail').hidden && document.getElementById('d-fields').textContent.includes('queued waiters1')`)

	// A hostile owner and name written straight into Redis, as another
	// program could.
	rdb := srv.Client(t)
	const evilKey = "dlock:{evil<script>\x1b[31m}"
	const hostile = "host\x1b]0;pwned\x07|pid 1|<img src=x onerror=\"window.pwned=3\">\u202eexe.txt"
	if err := rdb.HSet(t.Context(), evilKey, "tok", 1, "owner", hostile, "fence", 7).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.PExpire(t.Context(), evilKey, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	const evilName = `"evil<script>\x1b[31m"`
	poll(t, ctx, "the hostile lock", 5*time.Second, rowJS(evilName)+" !== null")
	cells = eval[[]string](t, ctx, rowJS(evilName))
	if want := `"host\x1b]0;pwned\a|pid 1|<img src=x onerror=\"window.pwned=3\">\u202eexe.txt"`; len(cells) != 7 || cells[3] != want {
		t.Errorf("hostile row %q: holder want %s", cells, want)
	}
	if pwned := eval[string](t, ctx, `String(window.pwned)`); pwned != "undefined" {
		t.Errorf("a stored string ran as script: window.pwned = %s", pwned)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll('script').length + document.querySelectorAll('img').length`); n != 1 {
		t.Errorf("the page has %d script and img elements, want only app.js", n)
	}

	// The timeline draws the grants.
	poll(t, ctx, "grant bars on the timeline", 5*time.Second, pixelsJS(0x2e, 0x9d, 0x4c)+" > 0")

	shot := screenshot(t, ctx)
	t.Logf("screenshot: %s", shot)

	if err := rdb.Del(t.Context(), evilKey).Err(); err != nil {
		t.Fatal(err)
	}
	_ = holder.cmd.Process.Signal(syscall.SIGTERM)
	if code := holder.wait(t); code != 0 {
		t.Errorf("holder exited %d: %s", code, holder.stderr.String())
	}
	if code := waiter.wait(t); code != 0 {
		t.Errorf("waiter exited %d: %s", code, waiter.stderr.String())
	}
	if took := poll(t, ctx, "the lock gone", 3*time.Second, rowJS("shop:orders")+" === null && !document.getElementById('empty').hidden"); took > time.Second {
		t.Errorf("the lock left the page %v after its release, want within 1s", took)
	}
	poll(t, ctx, "release bars on the timeline", 5*time.Second, pixelsJS(0x3b, 0x6f, 0xd1)+" > 0")

	_ = d.cmd.Process.Signal(syscall.SIGINT)
	if code := d.wait(t); code != 0 {
		t.Errorf("dlock dash exited %d after SIGINT: %s", code, d.stderr.String())
	}
}

// screenshot writes a PNG of the whole page to $DLOCK_ARTIFACTS, or to the
// test's temporary directory, and returns its path.
func screenshot(t *testing.T, ctx context.Context) string {
	t.Helper()
	var png []byte
	if err := chromedp.Run(ctx, chromedp.FullScreenshot(&png, 100)); err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("DLOCK_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "dash.png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
