//go:build unix

// The wake-ups' transport on Unix: datagram sockets in a directory.

package sqllock

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// wakeSocket is a bound datagram socket that receives wake-ups.
type wakeSocket struct{ c *net.UnixConn }

// bindWake binds a datagram socket at path.
func bindWake(path string) (wakeSocket, error) {
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return wakeSocket{}, err
	}
	return wakeSocket{c}, nil
}

// read waits at most wait for one datagram; a timeout is an error that
// matches os.ErrDeadlineExceeded.
func (s wakeSocket) read(buf []byte, wait time.Duration) (int, error) {
	if err := s.c.SetReadDeadline(time.Now().Add(wait)); err != nil {
		return 0, err
	}
	n, _, err := s.c.ReadFromUnix(buf)
	return n, err
}

func (s wakeSocket) close() error { return s.c.Close() }

// sendWakes sends msg to every socket in dir, without waiting: a socket
// whose buffer is full misses it. A socket file that nobody is bound to
// any more (its process died) is removed.
func sendWakes(dir string, msg []byte) {
	f, err := os.Open(dir)
	if err != nil {
		return
	}
	names, _ := f.Readdirnames(-1)
	_ = f.Close()
	if len(names) == 0 {
		return
	}
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_DGRAM, 0)
	if err != nil {
		return
	}
	defer syscall.Close(fd)
	syscall.CloseOnExec(fd)
	if err := syscall.SetNonblock(fd, true); err != nil {
		return
	}
	for _, name := range names {
		if !strings.HasSuffix(name, ".sock") {
			continue
		}
		path := filepath.Join(dir, name)
		err := syscall.Sendto(fd, msg, 0, &syscall.SockaddrUnix{Name: path})
		if errors.Is(err, syscall.ECONNREFUSED) {
			// Bound by nobody: binding makes the file and the binding at
			// once, so a live listener never answers this. Only a socket
			// file is removed.
			if st, err := os.Lstat(path); err == nil && st.Mode()&os.ModeSocket != 0 {
				_ = os.Remove(path)
			}
		}
	}
}

// wakeDirTrusted checks the sockets' directory before dlock binds, sends or
// removes anything there: a directory itself (not a symlink to elsewhere),
// owned by this user, that nobody else may write. Another user's or a
// planted directory would let them receive the names of the locks released
// and the waiters' tokens, send false wake-ups, or lead dlock to send to,
// and remove, files elsewhere; the waiters then poll instead.
func wakeDirTrusted(dir string) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	switch {
	case !st.IsDir():
		return fmt.Errorf("%s is not a directory (a symlink?)", dir)
	case !ok || int(sys.Uid) != os.Geteuid():
		return fmt.Errorf("%s belongs to another user", dir)
	case st.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("%s is writable by others (%v)", dir, st.Mode().Perm())
	}
	return nil
}
