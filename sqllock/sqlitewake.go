// SQLiteBackend, which wakes waiters in every process on the host that
// uses the same database file: NewSQLite, its listener and the sender that
// its releases use (the transport, Unix datagram sockets, is in
// wakesock_unix.go).

package sqllock

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	dldriver "github.com/dlock-go/dlock/driver"
)

var _ dldriver.Notifier = (*SQLiteBackend)(nil)

// SQLiteBackend is a Backend on a SQLite file that also wakes waiters in
// every process of the host that uses the file through a SQLiteBackend: it
// implements driver.Notifier. Each listening dlock Client binds a Unix
// datagram socket in a directory beside the database file (the file's path
// with "-wake" added, created with mode 0700), and every release that may
// let a waiter in, once committed, sends a datagram of a few bytes (the
// lock's name, and the head of its fair queue when it has one) to each
// socket there. A socket whose process died is removed by the first
// release that finds nobody bound to it.
//
// The wake-up is a hint, never a grant: a waiter that it misses (a full
// socket buffer, a socket removed by hand, a process of another user that
// cannot write to the directory) still polls, at the slower pace the
// client uses when it expects notifications, capped by the holder's TTL.
// Listen fails, and the client polls as with New(db, SQLite), for an
// in-memory database, a directory that cannot be made or written, or a
// socket path over the system's limit (about 100 bytes).
type SQLiteBackend struct {
	*Backend
}

// NewSQLite returns a Backend on a SQLite file, as New(db, SQLite, opts...)
// does, with release wake-ups between the processes of the host.
func NewSQLite(db *sql.DB, opts ...Option) *SQLiteBackend {
	b := New(db, SQLite, opts...)
	if b.err == nil {
		b.wake = &localWake{db: db}
		b.gate = newWriteGate(b.wake)
		b.tx.committed = b.wake.send
	}
	return &SQLiteBackend{b}
}

// wakeDirSuffix is added to the database file's path to name the directory
// of the sockets.
const wakeDirSuffix = "-wake"

// wakeHeartbeat is how often a listener checks that its socket file is
// still there (a variable for tests).
var wakeHeartbeat = 5 * time.Second

// localWake finds the directory of the sockets and sends the wake-ups.
type localWake struct {
	db *sql.DB

	mu  sync.Mutex
	dir string // "" until found
	err error  // why there is none (an in-memory database), once known
}

// directory returns the sockets' directory, reading the database file's
// path the first time.
func (w *localWake) directory(ctx context.Context) (string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dir != "" || w.err != nil {
		return w.dir, w.err
	}
	rows, err := w.db.QueryContext(ctx, "PRAGMA database_list")
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var file string
	for rows.Next() {
		var seq int
		var name string
		var path sql.NullString
		if err := rows.Scan(&seq, &name, &path); err != nil {
			return "", err
		}
		if name == "main" {
			file = path.String
		}
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	if file == "" {
		w.err = errors.New("the database has no file (in memory or temporary)")
		return "", w.err
	}
	w.dir = file + wakeDirSuffix
	return w.dir, nil
}

// send wakes the listeners of the host after a committed change to key
// that may let a waiter in (next is the one it lets in, or "" for all). It
// is best effort: a failure costs the waiters a poll.
func (w *localWake) send(key, next string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	dir, err := w.directory(ctx)
	if err != nil || wakeDirTrusted(dir) != nil {
		return
	}
	sendWakes(dir, []byte(encodePayload(key, next)))
}

// Listen binds this Client's socket in the directory beside the database
// file (making the directory if needed) and starts one goroutine that reads
// the wake-ups and calls fn with the key of each release that is
// subscribed, and the token of the waiter it names, if any. A wake-up sent
// after Listen returned reaches it, unless the socket's buffer is full. The
// goroutine checks every few seconds that the socket file is still there,
// and binds it anew, with fn("", ""), when it is not. Close removes the
// socket.
func (b *SQLiteBackend) Listen(ctx context.Context, fn func(key, next string)) (dldriver.Listener, error) {
	if fn == nil {
		return nil, errors.New("sqllock: listen: nil callback")
	}
	if b.err != nil {
		return nil, fmt.Errorf("sqllock: listen: %w", b.err)
	}
	if err := b.ready(ctx); err != nil {
		return nil, fmt.Errorf("sqllock: listen: %w", err)
	}
	dir, err := b.wake.directory(ctx)
	if err != nil {
		return nil, fmt.Errorf("sqllock: listen: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("sqllock: listen: %w", err)
	}
	if err := wakeDirTrusted(dir); err != nil {
		return nil, fmt.Errorf("sqllock: listen: %w", err)
	}
	path := filepath.Join(dir, socketName())
	sock, err := bindWake(path)
	if err != nil {
		return nil, fmt.Errorf("sqllock: listen: %w", err)
	}
	l := &wakeListener{fn: fn, path: path, sock: sock, subs: make(map[string]int), done: make(chan struct{})}
	l.wg.Add(1)
	go l.run()
	return l, nil
}

// socketName is a new socket's file name: the process id and 48 random
// bits, so that no two listeners share one, even across PID reuse.
func socketName() string {
	var r [6]byte
	_, _ = rand.Read(r[:])
	return strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(r[:]) + ".sock"
}

// wakeListener is the driver.Listener of a SQLiteBackend.
type wakeListener struct {
	fn   func(key, next string)
	path string
	wg   sync.WaitGroup // the run goroutine
	done chan struct{}  // closed by Close

	mu     sync.Mutex
	sock   wakeSocket
	subs   map[string]int // key → Subscribe calls not yet undone
	closed bool
}

// Subscribe counts one more waiter on key. The socket has been bound since
// Listen returned, so a release after Subscribe returns is never missed,
// unless the socket's buffer is full (the waiter then polls). It fails only
// after Close.
func (l *wakeListener) Subscribe(_ context.Context, key string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("sqllock: subscribe %q: listener closed", key)
	}
	l.subs[key]++
	return nil
}

// Unsubscribe drops one waiter on key. After Close it does nothing.
func (l *wakeListener) Unsubscribe(_ context.Context, key string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.subs[key]--; l.subs[key] <= 0 {
		delete(l.subs, key)
	}
	return nil
}

// Close stops the goroutine, waits for it and removes the socket; fn is
// not called after Close returns. Closing twice is a no-op.
func (l *wakeListener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	sock := l.sock
	l.mu.Unlock()
	close(l.done)
	_ = sock.close() // ends a read in progress
	l.wg.Wait()
	_ = os.Remove(l.path)
	return nil
}

// run reads wake-ups until Close. A read that times out checks that the
// socket file is still there, and binds it anew when it is not.
func (l *wakeListener) run() {
	defer l.wg.Done()
	buf := make([]byte, 4096)
	pause := time.NewTimer(time.Hour)
	pause.Stop()
	for {
		l.mu.Lock()
		sock := l.sock
		l.mu.Unlock()
		n, err := sock.read(buf, wakeHeartbeat)
		select {
		case <-l.done:
			return
		default:
		}
		switch {
		case err == nil:
			l.deliver(string(buf[:n]))
		case errors.Is(err, os.ErrDeadlineExceeded):
			if _, err := os.Stat(l.path); err == nil {
				continue
			}
			l.rebind()
		default:
			// The socket failed: bind it anew after a pause.
			pause.Reset(100 * time.Millisecond)
			select {
			case <-l.done:
				pause.Stop()
				return
			case <-pause.C:
			}
			l.rebind()
		}
	}
}

// rebind replaces the socket, and tells fn that wake-ups may have been
// missed.
func (l *wakeListener) rebind() {
	_ = os.MkdirAll(filepath.Dir(l.path), 0o700)
	if wakeDirTrusted(filepath.Dir(l.path)) != nil {
		return
	}
	_ = os.Remove(l.path)
	sock, err := bindWake(l.path)
	if err != nil {
		return // the next read fails again, and tries again
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		_ = sock.close()
		return
	}
	old := l.sock
	l.sock = sock
	l.mu.Unlock()
	_ = old.close()
	l.fn("", "")
}

// deliver calls fn with the payload's key and next waiter if someone waits
// on the key.
func (l *wakeListener) deliver(payload string) {
	key, next := decodePayload(payload)
	l.mu.Lock()
	wanted := l.subs[key] > 0 && !l.closed
	l.mu.Unlock()
	if wanted {
		l.fn(key, next)
	}
}
