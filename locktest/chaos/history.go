package chaos

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/anishathalye/porcupine"
)

// WriteHistory writes events to w, one line per event, times as offsets
// from the first event: what each client did, when, and what came of it.
func WriteHistory(w io.Writer, events []Event) error {
	if len(events) == 0 {
		_, err := fmt.Fprintln(w, "(no events)")
		return err
	}
	t0 := events[0].Start
	for _, e := range events {
		t0 = min(t0, e.Start)
	}
	at := func(t int64) string { return time.Duration(t - t0).Round(time.Microsecond).String() }
	for _, e := range events {
		line := fmt.Sprintf("%12s %-9s %-13s %s", at(e.Start), e.Client, e.Kind, e.Name)
		if e.Kind == KindNote {
			line = fmt.Sprintf("%12s %-9s %-13s %s", at(e.Start), e.Client, e.Kind, e.Text)
			if _, err := fmt.Fprintln(w, line); err != nil {
				return err
			}
			continue
		}
		if e.Lease != "" {
			line += " lease=" + e.Lease
		}
		if e.Token != "" {
			line += " token=" + e.Token
		}
		if e.Mode != Exclusive {
			line += " mode=" + e.Mode.String()
		}
		if e.Fence != 0 {
			line += fmt.Sprintf(" fence=%d", e.Fence)
		}
		switch e.Kind {
		case KindRead, KindWrite, KindInit:
			line += " " + describeValue(Value{Stock: e.Value, Members: e.Members})
		}
		if e.Outcome != 0 {
			line += " " + e.Outcome.String()
		}
		if e.End != e.Start {
			line += " took=" + time.Duration(e.End-e.Start).Round(time.Microsecond).String()
		}
		if e.Deadline != 0 {
			line += " deadline=" + at(e.Deadline)
		}
		if e.Err != "" {
			line += fmt.Sprintf(" err=%q", e.Err)
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}

var unsafeFileChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// WriteFiles writes what a failure needs to be understood into dir
// (created if missing): history.txt (WriteHistory), report.txt (String and
// every overlap), and for each name porcupine rejected, porcupine-NAME.html,
// porcupine's interactive view of the longest linearizable prefixes. It
// returns the paths written.
func (r *Report) WriteFiles(dir string, events []Event) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("chaos: write files: %w", err)
	}
	var paths []string
	write := func(name string, fn func(w io.Writer) error) error {
		p := filepath.Join(dir, name)
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		err = errors.Join(fn(f), f.Close())
		if err == nil {
			paths = append(paths, p)
		}
		return err
	}
	err := write("history.txt", func(w io.Writer) error { return WriteHistory(w, events) })
	if err == nil {
		err = write("report.txt", func(w io.Writer) error {
			if _, err := io.WriteString(w, r.String()); err != nil {
				return err
			}
			for _, o := range r.Overlaps {
				if _, err := fmt.Fprintf(w, "overlap: %s\n", r.describeOverlap(o)); err != nil {
					return err
				}
			}
			return nil
		})
	}
	for _, name := range r.NonLinearizable {
		if err != nil {
			break
		}
		model := registerModel(r.Names[name].Initial)
		_, info := porcupine.CheckOperationsVerbose(model, porcupineOps(r.linear[name]), time.Minute)
		p := filepath.Join(dir, "porcupine-"+unsafeFileChars.ReplaceAllString(name, "_")+".html")
		if err = porcupine.VisualizePath(model, info, p); err == nil {
			paths = append(paths, p)
		}
	}
	if err != nil {
		return paths, fmt.Errorf("chaos: write files: %w", err)
	}
	return paths, nil
}
