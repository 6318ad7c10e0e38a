package ha

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// proxy forwards TCP connections accepted in the store namespace to the
// management apiserver on loopback in the root namespace: the replicas reach
// the apiserver at the store's address, through their own links, so a cut of
// one replica's link is a cut between it and the store. TLS passes through
// untouched (the replicas verify the apiserver's certificate).
type proxy struct {
	l        net.Listener
	upstream string

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// startProxy listens on listen inside the network namespace at nsPath and
// forwards to upstream.
func startProxy(nsPath, listen, upstream string) (*proxy, error) {
	p := &proxy{upstream: upstream, conns: map[net.Conn]struct{}{}}
	err := inNetns(nsPath, func() error {
		l, err := net.Listen("tcp", listen)
		p.l = l
		return err
	})
	if err != nil {
		return nil, err
	}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.forward(c)
		}()
	}
}

// track remembers c so Close can end it; false once closed.
func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *proxy) forward(down net.Conn) {
	defer down.Close()
	if !p.track(down) {
		return
	}
	defer p.untrack(down)
	up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	if !p.track(up) {
		return
	}
	defer p.untrack(up)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(up, down)
	go pipe(down, up)
	<-done
	<-done
}

// Close stops accepting, ends every forwarded connection and waits for the
// goroutines.
func (p *proxy) Close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.l.Close()
	p.wg.Wait()
}
