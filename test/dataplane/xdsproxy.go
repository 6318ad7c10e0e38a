package dataplane

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// xdsProxy is the stable address of a cluster's istiod, as its Service is
// in a real cluster: workloads' bootstraps name the proxy, and the proxy
// forwards each connection to the istiod that is current when it is
// accepted. Restarting istiod then works as a Deployment's rolling update
// does: the new istiod takes new connections, and the old one's streams end
// when it stops, so the workloads' xDS clients reconnect to the new one.
type xdsProxy struct {
	lis net.Listener

	mu     sync.Mutex
	target string
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// newXDSProxy listens on a free loopback port and forwards to target.
func newXDSProxy(target string) (*xdsProxy, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("xds proxy: %w", err)
	}
	p := &xdsProxy{lis: lis, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	return p, nil
}

// Addr is the address workloads dial.
func (p *xdsProxy) Addr() string { return p.lis.Addr().String() }

// SetTarget sends new connections to target; open ones stay where they are.
func (p *xdsProxy) SetTarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

func (p *xdsProxy) serve() {
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return
		}
		target := p.target
		p.conns[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go func() {
			defer p.wg.Done()
			p.forward(c, target)
		}()
	}
}

// forward copies both ways between c and a new connection to target, and
// closes both once either side ends.
func (p *xdsProxy) forward(c net.Conn, target string) {
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
		c.Close()
	}()
	up, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		up.Close()
		return
	}
	p.conns[up] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, up)
		p.mu.Unlock()
		up.Close()
	}()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
	// One side ended: end the other, so the copy still running returns.
	c.Close()
	up.Close()
	<-done
}

// Close stops listening and closes every forwarded connection.
func (p *xdsProxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	err := p.lis.Close()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
