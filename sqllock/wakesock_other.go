//go:build !unix

// Without Unix datagram sockets, a SQLiteBackend's waiters poll.

package sqllock

import (
	"errors"
	"time"
)

type wakeSocket struct{}

func bindWake(string) (wakeSocket, error) {
	return wakeSocket{}, errors.New("no Unix datagram sockets on this system")
}

func (wakeSocket) read([]byte, time.Duration) (int, error) {
	return 0, errors.New("no Unix datagram sockets on this system")
}

func (wakeSocket) close() error { return nil }

func sendWakes(string, []byte) {}

func wakeDirTrusted(string) error { return errors.New("no Unix datagram sockets on this system") }
