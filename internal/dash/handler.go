package dash

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"strings"
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
//
// It answers GET and HEAD only. Unless anyHost, it answers only requests
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
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "dlock dash is read-only", http.StatusMethodNotAllowed)
			return
		}
		if !anyHost && !loopbackHost(r.Host) {
			http.Error(w, "dlock dash answers requests for localhost or a loopback address only", http.StatusForbidden)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

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
