package redlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// ErrValidityElapsed is returned (wrapped) by Acquire when a quorum of nodes
// granted the lock but the grant took so long that nothing of its validity
// was left: TTL − elapsed − drift ≤ 0. Nothing is granted: the grants are
// released on every node. The client may simply try again.
var ErrValidityElapsed = errors.New("redlock: validity elapsed before the quorum was won")

// QuorumError reports that an operation could not reach a quorum of nodes
// because some of them failed or did not answer in time. Nodes that answered
// "held by another" or "not held" are not failures: those answers lead to a
// normal result with a nil error.
type QuorumError struct {
	Op     string // "acquire", "renew", "release", "subscribe", "inspect", "list", "force release", "ping"
	Key    string // the lock's key, the prefix for "list", "" for "ping"
	Nodes  int    // how many nodes the Backend has
	Quorum int    // how many had to agree
	OK     int    // how many did
	// Errs has one *NodeError for each node that failed, in node order.
	Errs []error

	// transient: the caller's context was live and the nodes whose failure
	// will not heal leave enough nodes for a quorum (see Is).
	transient bool
}

// Error says how many nodes agreed against the quorum and what went wrong
// on each failed node. The operation and the key are the caller's to name
// (Op and Key keep them), except for Ping's.
func (e *QuorumError) Error() string {
	var b strings.Builder
	b.WriteString("redlock: ")
	if e.Op == "ping" {
		b.WriteString("ping: ") // a call of the user's own: it names itself
	}
	fmt.Fprintf(&b, "%d of %d nodes agreed, quorum is %d", e.OK, e.Nodes, e.Quorum)
	for i, err := range e.Errs {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(err.Error())
	}
	return b.String()
}

// Unwrap returns the node errors, so that errors.Is and errors.As look into
// each of them (for example errors.Is(err, context.DeadlineExceeded)).
func (e *QuorumError) Unwrap() []error { return e.Errs }

// Is reports whether target is driver.ErrTransient and the quorum was
// missed for failures that may heal: every node whose failure will not
// heal (credentials refused, a foreign value, an eviction policy) still
// leaves a quorum of nodes, and the caller's context was live. A waiting
// Lock then tries again.
func (e *QuorumError) Is(target error) bool { return target == driver.ErrTransient && e.transient }

// NodeError is the failure of one node in a QuorumError.
type NodeError struct {
	Node int    // the node's index in the slice given to New
	Addr string // the node's address from its client's options, or ""
	Err  error  // what went wrong, without a transient mark (see QuorumError.Is)

	transient bool // the failure may heal
}

// Error names the node and its error, and the node's address unless the
// error names it already (redislock's errors say "redis ADDR: ...").
func (e *NodeError) Error() string {
	msg := fmt.Sprint(e.Err)
	if e.Addr == "" || strings.Contains(msg, e.Addr) {
		return fmt.Sprintf("node %d: %s", e.Node, msg)
	}
	return fmt.Sprintf("node %d (%s): %s", e.Node, e.Addr, msg)
}

// Unwrap returns the node's error.
func (e *NodeError) Unwrap() error { return e.Err }

// errNotRaised is a node's error when RaiseFence found the grant gone.
var errNotRaised = errors.New("grant gone before its fence could be raised")

// noAnswer is the error of a node that did not answer within d.
func noAnswer(d time.Duration) error {
	return fmt.Errorf("no answer within %v: %w", d, context.DeadlineExceeded)
}
