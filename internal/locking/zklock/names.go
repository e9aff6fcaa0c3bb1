package zklock

import (
	"context"
	"errors"
	"strings"

	"github.com/go-zookeeper/zk"
)

// What this process remembers of each lock name, for how long, and the
// name's folder and fence node in ZooKeeper.

// nameState is what this process remembers of one lock, guarded by mu. It
// lives while the name has users (see use), and a while after as an idle
// name.
type nameState struct {
	// users counts the Acquires of the name in progress, the holders that
	// have not released it, and the Resets and AdvanceFences running: a
	// node of this process can be handed on only while one of them lasts.
	users      int
	ready      bool   // the folder and its fence node exist
	base       int64  // the fence node's data, as last read
	version    int32  // the fence node's version, as last read
	known      bool   // base and version are set
	generation int    // counts Resets: a hold of an older one is not handed on
	floor      int64  // AdvanceFence's highest atLeast: places handed on must be above it
	token      string // this process's token node
	tokenGen   uint64 // the session generation it was created in
}

// nameLocked returns name's state; l.mu is held. Every caller runs within
// a use of name (use, done), so the state is there; outside one, a
// detached state keeps nothing.
func (l *Locker) nameLocked(name string) *nameState {
	if ns := l.names[name]; ns != nil {
		return ns
	}
	return &nameState{}
}

// use counts one more user of name's state (nameState.users), creating it
// if need be. Every use ends with done.
func (l *Locker) use(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch ns := l.names[name]; {
	case ns == nil:
		l.names[name] = &nameState{users: 1}
	case ns.users == 0:
		l.idleNames--
		ns.users = 1
	default:
		ns.users++
	}
}

// done ends a use of name. A state left without users stays as an idle
// name (its folder, fence base and token node stay known: a SKU bought
// again soon costs no more round trips than a busy one); once there are
// more than WithIdleNames idle names, they are all forgotten at once, so
// that each sweep is paid for by as many uses as it looks at names.
// Forgetting is safe: a name without users has no node of this process
// that could be handed on, so its Reset generation and fence floor no
// longer matter, and what it caches is read again.
func (l *Locker) done(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ns := l.names[name]
	if ns == nil || ns.users == 0 {
		return
	}
	if ns.users--; ns.users > 0 {
		return
	}
	if l.idleNames++; l.idleNames <= l.cfg.idleNames {
		return
	}
	for n, s := range l.names {
		if s.users == 0 {
			delete(l.names, n)
		}
	}
	l.idleNames = 0
}

func (l *Locker) nameGeneration(name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nameLocked(name).generation
}

// ensure creates name's folder (and the prefix's) and its fence node, once
// per process while the process remembers the name (an existing one is
// left as it is).
func (l *Locker) ensure(wctx context.Context, name string) error {
	l.mu.Lock()
	ready := l.nameLocked(name).ready
	l.mu.Unlock()
	if ready {
		return nil
	}
	dir := l.dir(name)
	_, err := call(l, wctx, func() (struct{}, error) {
		parts := strings.Split(strings.TrimPrefix(dir, "/"), "/")
		path := ""
		for _, p := range parts {
			path += "/" + p
			if _, err := l.conn.Create(path, nil, 0, acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return struct{}{}, err
			}
		}
		_, err := l.conn.Create(dir+"/"+fenceNode, []byte("0"), 0, acl)
		if errors.Is(err, zk.ErrNodeExists) {
			err = nil
		}
		return struct{}{}, err
	}, nil)
	if err != nil {
		return l.nodeError(err)
	}
	l.mu.Lock()
	l.nameLocked(name).ready = true
	l.mu.Unlock()
	return nil
}

func (l *Locker) dir(name string) string { return l.cfg.prefix + "/" + name }

func (l *Locker) unready(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ns := l.nameLocked(name)
	ns.ready, ns.known, ns.token = false, false, ""
}
