package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// Log formats of dlock's own messages (--log-format).
const (
	logText = "text"
	logJSON = "json"
)

// msgs returns where dlock's own messages go: stderr as lines of text, or,
// with --log-format json, one JSON object per message on stderr. What a
// command run under dlock writes to its stderr never goes through it.
func (a *app) msgs() io.Writer {
	if a.logFormat != logJSON {
		return a.stderr
	}
	a.jsonOnce.Do(func() { a.json = newJSONLines(a.stderr) })
	return a.json
}

// jsonLines turns each line written to it (one of dlock's messages,
// "dlock: ...") into a JSON log record on w: time, level (WARN for a
// warning, else INFO), msg without the "dlock: " prefix.
type jsonLines struct {
	mu  sync.Mutex
	log *slog.Logger
	buf []byte
}

func newJSONLines(w io.Writer) *jsonLines {
	return &jsonLines{log: slog.New(slog.NewJSONHandler(w, nil))}
}

// Write implements io.Writer; a partial line waits for its end.
func (j *jsonLines) Write(p []byte) (int, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.buf = append(j.buf, p...)
	for {
		i := bytes.IndexByte(j.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(j.buf[:i])
		j.buf = j.buf[i+1:]
		j.record(slog.LevelInfo, line)
	}
}

// record logs one message line at level (raised to WARN for a warning).
func (j *jsonLines) record(level slog.Level, line string, attrs ...slog.Attr) {
	msg := strings.TrimSpace(line)
	if msg == "" {
		return
	}
	for _, p := range []string{"dlock: ", "dlock dash: ", "dlock top: "} {
		if rest, ok := strings.CutPrefix(msg, p); ok {
			msg = rest
			break
		}
	}
	if rest, ok := strings.CutPrefix(msg, "warning: "); ok && level < slog.LevelWarn {
		msg, level = rest, slog.LevelWarn
	}
	j.log.LogAttrs(context.Background(), level, msg, attrs...)
}

// failure logs the message a command ended with, and its usage line.
func (j *jsonLines) failure(msg, usage string, code int) {
	j.mu.Lock()
	defer j.mu.Unlock()
	attrs := []slog.Attr{slog.Int("exit", code)}
	if usage != "" {
		attrs = append(attrs, slog.String("usage", usage))
	}
	j.record(slog.LevelError, msg, attrs...)
}

// libLogger is the logger of the store's library (redislock's warning of a
// maxmemory-policy it cannot read): its warnings are dlock's own messages
// ("dlock: warning: MSG (KEY=VALUE, ...)" on stderr, or WARN records with
// --log-format json), not lines of Go's default logger in another format.
func (a *app) libLogger() *slog.Logger {
	return slog.New(&msgHandler{w: a.msgs()})
}

// msgHandler writes records of level Warn and above as dlock's message
// lines on w, one Write each.
type msgHandler struct {
	w     io.Writer
	attrs []slog.Attr
}

func (h *msgHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *msgHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString("dlock: warning: ")
	b.WriteString(oneLine(r.Message))
	attrs := append([]slog.Attr(nil), h.attrs...)
	r.Attrs(func(at slog.Attr) bool {
		attrs = append(attrs, at)
		return true
	})
	for i, at := range attrs {
		if i == 0 {
			b.WriteString(" (")
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s=%s", at.Key, oneLine(at.Value.String()))
	}
	if len(attrs) > 0 {
		b.WriteString(")")
	}
	b.WriteString("\n")
	_, err := io.WriteString(h.w, b.String())
	return err
}

func (h *msgHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &msgHandler{w: h.w, attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

// WithGroup keeps the attributes unqualified: the messages are for people.
func (h *msgHandler) WithGroup(string) slog.Handler { return h }
