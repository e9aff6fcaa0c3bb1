// Package testproxy puts a TCP proxy on a free loopback port between a test's
// client and a real server, so that a test can pause one client's traffic
// (as a stopped process, a long GC pause or a partition would) without
// touching the server or the other clients.
package testproxy

import (
	"net"
	"sync"
	"testing"
)

// Proxy forwards every connection made to Addr to the target.
type Proxy struct {
	Addr   string
	target string
	ln     net.Listener

	mu     sync.Mutex
	cond   *sync.Cond
	frozen bool
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// Start listens on a free 127.0.0.1 port and forwards to target until tb
// ends.
func Start(tb testing.TB, target string) *Proxy {
	tb.Helper()
	p, err := Listen(target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p
}

// Listen starts a proxy to target outside any test, on a free 127.0.0.1
// port. Stop it with Close.
func Listen(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: make(map[net.Conn]struct{})}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(c, s) {
			return
		}
		p.wg.Add(2)
		go p.pipe(s, c)
		go p.pipe(c, s)
	}
}

func (p *Proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

// pipe copies from src to dst, holding what it read while the proxy is
// frozen; it closes both when either side ends.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.frozen && !p.closed {
				p.cond.Wait()
			}
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // io.EOF or a closed connection: either way, done
		}
	}
}

// Freeze stops forwarding in both directions; connections stay open and
// what is sent meanwhile is delivered after Thaw, as a paused process's
// traffic would be.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	p.frozen = true
	p.mu.Unlock()
}

// Thaw forwards again.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	p.frozen = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Cut closes every connection through the proxy (new ones are accepted),
// as a crashed client's would be.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
}

// Close stops the proxy and waits for its goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}

// Group is the proxies of one client that talks to several servers (a
// Redlock's): they freeze, thaw and cut together.
type Group []*Proxy

// Freeze freezes every proxy of the group.
func (g Group) Freeze() {
	for _, p := range g {
		p.Freeze()
	}
}

// Thaw thaws every proxy of the group.
func (g Group) Thaw() {
	for _, p := range g {
		p.Thaw()
	}
}

// Cut cuts every proxy's connections.
func (g Group) Cut() {
	for _, p := range g {
		p.Cut()
	}
}
