package locking

import (
	"errors"
	"fmt"
)

// Sentinel errors. Check them with errors.Is: the errors this package returns
// wrap or join them with the cause (ctx.Err(), NodeErrors).
var (
	// ErrNotObtained: the lock could not be acquired before the wait ended.
	// A wait ended by its context is reported as
	// errors.Join(ErrNotObtained, ctx.Err()), so both errors.Is checks work.
	ErrNotObtained = errors.New("locking: lock not obtained")

	// ErrLockLost: the lock stopped being ours while we believed we held it
	// (it expired, a renewal failed, or a majority of Redlock nodes no longer
	// confirm it). It is the cause of a Lease's cancelled context and the
	// error of a Release that came too late.
	ErrLockLost = errors.New("locking: lock lost")

	// ErrNotHeld: the Lease was already released.
	ErrNotHeld = errors.New("locking: lock not held")

	// ErrClosed: the Locker or Redlock was closed.
	ErrClosed = errors.New("locking: closed")
)

// NodeError is a failure of one Redis server. Several of them (Redlock) are
// joined with errors.Join.
type NodeError struct {
	Node string // the server's address
	Err  error
}

func (e *NodeError) Error() string { return fmt.Sprintf("locking: node %s: %v", e.Node, e.Err) }

func (e *NodeError) Unwrap() error { return e.Err }
