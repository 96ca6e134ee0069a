// The exit codes of dlock, and exitError, the error that carries one.

package cli

import (
	"fmt"
	"strings"
)

// Exit codes of dlock. The first ones follow sysexits.h, so that scripts and
// service managers that know those codes read them right; dlock run otherwise
// exits with its command's own status.
const (
	exitOK = 0
	// exitNotHeld is inspect's answer for a lock that nobody holds, like
	// grep's "no match".
	exitNotHeld = 1
	// exitUsage (EX_USAGE): bad flags, a bad --backend URL, a bad lock name,
	// a kind or permit count that conflicts with the name's holds.
	exitUsage = 64
	// exitUnavailable (EX_UNAVAILABLE): the store cannot be reached or
	// failed.
	exitUnavailable = 69
	// exitNotObtained (EX_TEMPFAIL): run did not get the lock within --wait;
	// trying again later may work.
	exitNotObtained = 75
	// exitIOErr (EX_IOERR): a hold without a command could not write its
	// fence on stdout (the reader went away); the lock was released. Also
	// bench's charts that could not be written.
	exitIOErr = 74
	// exitLost: the lock was lost while the command ran, and the command was
	// stopped. sysexits.h has nothing for this; 76 is EX_PROTOCOL there,
	// which no dlock path produces otherwise.
	exitLost = 76
	// exitNoPerm (EX_NOPERM): the store refused the credentials (a wrong
	// password, an unknown user, a user without access to the database).
	exitNoPerm = 77
	// exitConfig (EX_CONFIG): the configuration names what does not exist
	// or is unsafe: a database the store does not have, a Redis that may
	// evict lock keys, no HOME for the default store.
	exitConfig = 78
	// exitCannotExecute and exitNotFound follow the shell: the command exists
	// but cannot be run, or does not exist.
	exitCannotExecute = 126
	exitNotFound      = 127
	// exitSignalBase + N: the command, or dlock while it waited, was ended by
	// signal N.
	exitSignalBase = 128
)

// exitError ends a command with an exit code and a message for stderr. The
// message is one line; Main prefixes it with "dlock: ".
type exitError struct {
	code int
	msg  string
	// usage asks Main to print the command's usage after the message.
	usage string
}

func (e *exitError) Error() string { return e.msg }

// fail returns an exitError with a formatted message.
func fail(code int, format string, args ...any) *exitError {
	return &exitError{code: code, msg: fmt.Sprintf(format, args...)}
}

// usageErr returns an exit-64 error that prints the usage of cmd (a command
// name, or "" for dlock's own) after the message.
func usageErr(cmd, format string, args ...any) *exitError {
	e := fail(exitUsage, format, args...)
	e.usage = cmd
	if e.usage == "" {
		e.usage = "dlock"
	}
	return e
}

// oneLine makes a message fit on one line: store drivers sometimes put
// newlines in their errors, and a message must never look like a stack trace.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.Join(strings.Fields(s), " ")
}
