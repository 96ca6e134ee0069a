package browsertest

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

// dlockEnv is the environment of the dlock processes of a test: this
// process's, without DLOCK_ settings, with backend as the store.
func dlockEnv(t *testing.T, backend string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DLOCK_") {
			env = append(env, kv)
		}
	}
	return append(env, "DLOCK_BACKEND="+backend, "XDG_STATE_HOME="+t.TempDir())
}

// postRelease is the JavaScript for a POST /api/release made by the page,
// with auth in its Authorization header (none when ""), of the lock named
// name in the page's last state, with the fence of its grant plus
// fenceDelta (another grant's when not 0); it gives the response's status.
func postRelease(name, auth string, fenceDelta int) string {
	return fmt.Sprintf(`fetch('/api/state').then(r => r.json()).then(s => {
		const l = s.locks.find(l => l.name === %q);
		const h = { 'Content-Type': 'application/json' };
		if (%q) h['Authorization'] = %q;
		const fence = String(BigInt((l && l.fence_dec) || '1') + BigInt(%d));
		return fetch('/api/release', { method: 'POST', headers: h, body: JSON.stringify({ key_hex: (l && l.key_hex) || '6a6f62', fence: fence }) });
	}).then(r => r.status)`, name, auth, auth, fenceDelta)
}

// evalAwait evaluates js, a promise, and returns what it resolves to.
func evalAwait[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	var v T
	await := func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) }
	if err := chromedp.Run(ctx, chromedp.Evaluate(js, &v, await)); err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// TestForceReleaseInChromium: a lock held by dlock run is released from the
// page of dlock dash --allow-release opened with the token it printed, the
// button sending the fence of the grant it shows; a request with another
// fence is refused (409) and releases nothing; the page opened without the
// token has no button and its requests are refused, and a dash without
// --allow-release refuses them whatever they carry.
func TestForceReleaseInChromium(t *testing.T) {
	ctx := browser(t)
	srv := testserver.StartRedis(t)
	env := dlockEnv(t, "redis://"+srv.Addr()+"/0")

	holder := start(t, env, "run", "--ttl", "3s", "shop:orders")
	holder.waitOut(t, &holder.stdout, regexp.MustCompile(`\d+\n`))

	// Without --allow-release: no button, and a POST is refused even with
	// a token.
	ro := start(t, env, "dash", "--listen", "127.0.0.1:0", "--interval", "100ms")
	roURL := ro.waitOut(t, &ro.stderr, regexp.MustCompile(`on (http://127\.0\.0\.1:\d+/)`))[1]
	if err := chromedp.Run(ctx, chromedp.Navigate(roURL+"#token=guess")); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the held lock", 5*time.Second, rowJS("shop:orders")+" !== null")
	eval[bool](t, ctx, `(document.querySelector('#locks tbody tr[data-name="shop:orders"]').click(), true)`)
	poll(t, ctx, "the lock's detail", 3*time.Second, `!document.getElementById('detail').hidden`)
	if eval[bool](t, ctx, `!document.getElementById('d-release').hidden`) {
		t.Error("a dash without --allow-release shows the force-release button")
	}
	if code := evalAwait[int](t, ctx, postRelease("shop:orders", "Bearer guess", 0)); code != 405 {
		t.Errorf("POST /api/release to a dash without --allow-release: %d, want 405", code)
	}

	// With --allow-release, opened without the token: no button, and
	// requests without it or with another are refused.
	d := start(t, env, "dash", "--listen", "127.0.0.1:0", "--interval", "100ms", "--allow-release")
	m := d.waitOut(t, &d.stderr, regexp.MustCompile(`from (http://127\.0\.0\.1:\d+/)#token=([0-9a-f]+) `))
	url, token := m[1], m[2]
	if err := chromedp.Run(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the held lock", 5*time.Second, rowJS("shop:orders")+" !== null")
	eval[bool](t, ctx, `(document.querySelector('#locks tbody tr[data-name="shop:orders"]').click(), true)`)
	poll(t, ctx, "the lock's detail", 3*time.Second, `!document.getElementById('detail').hidden`)
	if eval[bool](t, ctx, `!document.getElementById('d-release').hidden`) {
		t.Error("the page opened without the token shows the force-release button")
	}
	for _, auth := range []string{"", "Bearer " + strings.Repeat("0", len(token))} {
		if code := evalAwait[int](t, ctx, postRelease("shop:orders", auth, 0)); code != 403 {
			t.Errorf("POST /api/release with Authorization %q: %d, want 403", auth, code)
		}
	}
	if eval[[]string](t, ctx, rowJS("shop:orders")) == nil {
		t.Fatal("a refused request released the lock")
	}

	// Opened with the token: a request with the fence of another grant
	// than the holder's (the lock changed hands since the page's sample)
	// breaks nothing; the button releases the grant it shows.
	if err := chromedp.Run(ctx, chromedp.Navigate(url+"#token="+token)); err != nil {
		t.Fatal(err)
	}
	if h := eval[string](t, ctx, `location.hash`); h != "" {
		t.Errorf("the token stays in the address: %q", h)
	}
	poll(t, ctx, "the held lock", 5*time.Second, rowJS("shop:orders")+" !== null")
	for _, delta := range []int{1, 2} { // fences of later grants (the first grant has fence 1)
		if code := evalAwait[int](t, ctx, postRelease("shop:orders", "Bearer "+token, delta)); code != 409 {
			t.Errorf("POST /api/release with the holder's fence %+d: %d, want 409", delta, code)
		}
	}
	if n, err := srv.Client(t).Exists(t.Context(), "dlock:{shop:orders}").Result(); err != nil || n != 1 {
		t.Fatalf("the lock's key after releases of other fences: %d, %v; want it held still", n, err)
	}
	poll(t, ctx, "the held lock", 5*time.Second, rowJS("shop:orders")+" !== null")
	eval[bool](t, ctx, `(document.querySelector('#locks tbody tr[data-name="shop:orders"]').click(), true)`)
	poll(t, ctx, "the force-release button", 3*time.Second, `!document.getElementById('d-release').hidden`)
	eval[bool](t, ctx, `(window.confirm = () => true, document.getElementById('d-release').click(), true)`)
	poll(t, ctx, "the release's result", 3*time.Second, `document.getElementById('d-release-result').textContent === 'released'`)
	if took := poll(t, ctx, "the lock gone", 3*time.Second, rowJS("shop:orders")+" === null"); took > time.Second {
		t.Errorf("the released lock left the page %v after the button's answer, want within 1s", took)
	}
	if n, err := srv.Client(t).Exists(t.Context(), "dlock:{shop:orders}").Result(); err != nil || n != 0 {
		t.Errorf("the lock's key after the release: %d, %v", n, err)
	}

	// The holder learns of it at its next renewal and ends (dlock run
	// exits with a failure when its lock is lost).
	if code := holder.wait(t); code == 0 {
		t.Errorf("dlock run exited 0 after its lock was broken; stderr: %s", holder.stderr.String())
	}
	for _, p := range []*proc{ro, d} {
		_ = p.cmd.Process.Signal(syscall.SIGINT)
		if code := p.wait(t); code != 0 {
			t.Errorf("dlock dash exited %d after SIGINT: %s", code, p.stderr.String())
		}
	}
}
