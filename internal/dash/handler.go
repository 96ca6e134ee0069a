package dash

import (
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/dlock-go/dlock/internal/safetext"
)

//go:embed assets
var assets embed.FS

// contentSecurityPolicy lets the page run its own script and style only,
// and fetch from its own origin only: a stored string that reached the page
// as HTML by mistake could still run nothing.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler returns the dashboard's HTTP handler:
//
//	/               the page (index.html, app.js, style.css, embedded)
//	/api/state      the last sample (State) as JSON
//	/api/timeline   the timeline ([]Bucket, oldest first) as JSON
//	/metrics        store-level gauges and the sampler's counters, in the
//	                Prometheus text format
//	/api/release    POST {"key_hex": HEX, "fence": "N"}: breaks the lock's
//	                exclusive hold if its grant is still fence N (409 when
//	                not), only when Config.Release is set (dlock dash
//	                --allow-release) and the request carries
//	                "Authorization: Bearer TOKEN"
//
// It answers GET and HEAD only, and that one POST. The token travels in a
// header, which a page of another origin cannot set without a CORS
// preflight that the handler never grants, so another site cannot make a
// browser send it. Unless anyHost, it answers only requests
// whose Host is a loopback address or localhost, so that a web page
// elsewhere cannot read it through a DNS name rebound to 127.0.0.1.
func (d *Dash) Handler(anyHost bool) http.Handler {
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	mux := http.NewServeMux()
	mux.Handle("/", http.FileServerFS(static))
	mux.HandleFunc("/api/state", func(w http.ResponseWriter, r *http.Request) {
		st, _ := d.Snapshot()
		writeJSON(w, st)
	})
	mux.HandleFunc("/api/timeline", func(w http.ResponseWriter, r *http.Request) {
		_, tl := d.Snapshot()
		if tl == nil {
			tl = []Bucket{}
		}
		writeJSON(w, tl)
	})
	mux.HandleFunc("/api/release", d.release)
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		st, _ := d.Snapshot()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		writeMetrics(w, st)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		post := r.Method == http.MethodPost && r.URL.Path == "/api/release" && d.cfg.Release != nil
		if r.Method != http.MethodGet && r.Method != http.MethodHead && !post {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "dlock dash is read-only (force release needs --allow-release)", http.StatusMethodNotAllowed)
			return
		}
		if !anyHost && !loopbackHost(r.Host) {
			http.Error(w, "dlock dash answers requests for localhost or a loopback address only", http.StatusForbidden)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// release is POST /api/release: the page's force-release button. It breaks
// the exclusive hold of the grant the page showed, named by its fence, and
// no other: a lock that changed hands between the page's sample and the
// click keeps its new holder (Config.Release is driver.Breaker.BreakIf).
func (d *Dash) release(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || d.cfg.Release == nil {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "dlock dash is read-only (force release needs --allow-release)", http.StatusMethodNotAllowed)
		return
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(d.cfg.ReleaseToken)) != 1 {
		http.Error(w, "force release needs the token dlock dash printed", http.StatusForbidden)
		return
	}
	var req struct {
		KeyHex string `json:"key_hex"`
		// Fence is the fence of the grant shown, a JSON string of decimal
		// digits (the page's: JavaScript numbers are exact only up to
		// 2^53) or a JSON integer.
		Fence json.Number `json:"fence"`
	}
	err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req)
	key, herr := hex.DecodeString(req.KeyHex)
	if err != nil || herr != nil || len(key) == 0 {
		http.Error(w, `want {"key_hex": the name in hexadecimal, "fence": "the fence of the grant to break"}`, http.StatusBadRequest)
		return
	}
	fence, ferr := strconv.ParseUint(string(req.Fence), 10, 64)
	if ferr != nil || fence == 0 {
		http.Error(w, `want "fence": the fence of the grant to break, a positive integer (the button breaks a lock only while it is still the grant shown)`, http.StatusBadRequest)
		return
	}
	name := string(key)
	broken, err := d.cfg.Release(r.Context(), name, fence)
	switch {
	case errors.Is(err, ErrNoBreaker):
		http.Error(w, safetext.Escape(err.Error()), http.StatusNotImplemented)
		return
	case err != nil:
		http.Error(w, safetext.Escape(err.Error()), http.StatusBadGateway)
		return
	case broken:
		writeJSON(w, releaseAnswer{Released: true, Fence: strconv.FormatUint(fence, 10)})
		return
	}
	d.whyNotReleased(w, r, name, fence)
}

// releaseAnswer is /api/release's answer when it broke the grant, or when
// nobody held the lock any more.
type releaseAnswer struct {
	Released bool   `json:"released"`
	Fence    string `json:"fence"`
}

// whyNotReleased answers a release that broke nothing, saying why, as far
// as Config.Inspect tells: the lock may change again meanwhile, but nothing
// was broken whatever it says.
func (d *Dash) whyNotReleased(w http.ResponseWriter, r *http.Request, name string, fence uint64) {
	f := strconv.FormatUint(fence, 10)
	if d.cfg.Inspect == nil {
		http.Error(w, "not released: fence "+f+" no longer holds the lock, or it is in its lock-delay; reload", http.StatusConflict)
		return
	}
	info, held, err := d.cfg.Inspect(r.Context(), name)
	switch {
	case err != nil:
		http.Error(w, "not released (the grant of fence "+f+" was not found holding the lock; reload): "+safetext.Escape(err.Error()), http.StatusConflict)
	case !held:
		// The grant shown is gone, and nobody else holds the lock.
		writeJSON(w, releaseAnswer{Released: false, Fence: f})
	case info.Owner == "" || info.Fence != fence:
		now := "by shared holds"
		if info.Owner != "" {
			now = "by fence " + strconv.FormatUint(info.Fence, 10)
		}
		http.Error(w, "not released: the lock changed hands since (fence "+f+" is gone; it is held now "+now+"); reload", http.StatusConflict)
	case info.Delayed:
		http.Error(w, "not released: fence "+f+" is in its lock-delay (its lease ran out without a release, and its holder asked that the lock be kept from others for a while after a crash): the button never breaks that; the lock frees itself when the delay ends, or 'dlock release --force' breaks it now", http.StatusConflict)
	default:
		// BreakIf refuses a grant whose holder asked for a lock-delay even
		// while it is alive, and Inspect does not tell that option.
		http.Error(w, "not released: fence "+f+" still holds the lock, but its holder asked for a lock-delay (to keep others out after a crash), and the button never breaks such a grant; 'dlock release --force' does (or the grant changed meanwhile: reload and retry)", http.StatusConflict)
	}
}

// ErrNoBreaker is what Config.Release returns for a store that cannot break
// a lock on condition of its grant (no driver.Breaker): the button then
// breaks nothing rather than whoever holds the lock.
var ErrNoBreaker = errors.New("this store cannot break a lock only while it is still the grant shown (it has no BreakIf): the button breaks nothing; 'dlock release --force' breaks whoever holds it")

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	b, err := json.Marshal(v) // escapes <, > and & as \u003c...: safe in any context
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	_, _ = w.Write(b)
}

// loopbackHost reports whether a Host header names localhost or a loopback
// address.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// CheckListen refuses a listen address that is not on loopback (an empty
// host, as in ":8080", is every interface), unless anyAddr: the dashboard
// shows every holder's owner string, host names and process IDs included,
// to whoever can reach it, without authentication.
func CheckListen(addr string, anyAddr bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--listen %q: %v", addr, err)
	}
	if anyAddr || loopbackHost(host) {
		return nil
	}
	where := host + " is not a loopback address"
	if host == "" {
		where = "an empty host is every interface"
	}
	return fmt.Errorf("--listen %s: %s, and the dashboard has no authentication: give --listen-any to serve it there anyway", addr, where)
}
