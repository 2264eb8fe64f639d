package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"sync"
	"time"
)

// svcListener owns one listening socket of a simulated node service (k8sd, kubelet). It is
// up unless stopped, held (a run is answering: no new connections), inside a simulated
// restart, or covered by a refuse fault; "down" means connection refused.
//
// Every accepted connection is tracked, hijacked ones included (the drop fault, the
// kubelet's SPDY/websocket port-forwards), because http.Server.Close forgets those: a
// restart must break port-forward tunnels as a real kubelet restart does.
type svcListener struct {
	addr     string
	handler  http.Handler
	tlsConf  *tls.Config
	refused  func() bool // nil: never refused
	log      func(format string, args ...any)
	errorLog *log.Logger
	// idleTimeout of the HTTP server (0: none).
	idleTimeout time.Duration

	mu        sync.Mutex
	srv       *http.Server   // nil while down
	ln        net.Listener   // the socket of srv
	old       []*http.Server // servers whose socket was closed by hold; their connections live on
	holds     int
	downUntil time.Time
	stopped   bool
	retrying  bool

	// connMu guards conns apart from mu: http.Server.Close (called under mu) closes
	// connections, and closing one unregisters it.
	connMu sync.Mutex
	conns  map[*trackedConn]struct{}
}

type trackedListener struct {
	net.Listener
	owner *svcListener
}

func (t trackedListener) Accept() (net.Conn, error) {
	c, err := t.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, owner: t.owner}
	t.owner.connMu.Lock()
	if t.owner.conns == nil {
		t.owner.conns = map[*trackedConn]struct{}{}
	}
	t.owner.conns[tc] = struct{}{}
	t.owner.connMu.Unlock()
	return tc, nil
}

type trackedConn struct {
	net.Conn
	owner *svcListener
	once  sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.owner.connMu.Lock()
		delete(c.owner.conns, c)
		c.owner.connMu.Unlock()
	})
	return c.Conn.Close()
}

// start binds the listener for the first time; failure is fatal for the simulator.
func (l *svcListener) start() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refused != nil && l.refused() {
		return nil
	}
	return l.listenLocked()
}

func (l *svcListener) listenLocked() error {
	ln, err := net.Listen("tcp", l.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           l.handler,
		ErrorLog:          l.errorLog,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       l.idleTimeout,
		// HTTP/1.1 only: faults hijack connections, port-forwards upgrade them.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	l.srv, l.ln = srv, ln
	go func() {
		err := srv.Serve(tls.NewListener(trackedListener{Listener: ln, owner: l}, l.tlsConf))
		if err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			l.log("serve: %v", err)
		}
	}()
	return nil
}

func (l *svcListener) wantLocked() bool {
	return !l.stopped && l.holds == 0 && !time.Now().Before(l.downUntil) && (l.refused == nil || !l.refused())
}

// reconcile opens or closes the listener to match the wanted state.
func (l *svcListener) reconcile() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	want := l.wantLocked()
	switch {
	case want && l.srv == nil:
		if err := l.listenLocked(); err != nil {
			// The port can be briefly busy; keep trying until it binds.
			l.log("reopen failed, retrying: %v", err)
			if !l.retrying {
				l.retrying = true
				time.AfterFunc(200*time.Millisecond, func() {
					l.mu.Lock()
					l.retrying = false
					l.mu.Unlock()
					l.reconcile()
				})
			}
			return
		}
		l.log("listening on %s", l.addr)
	case !want && l.srv != nil:
		// Down drops the listener and every connection: clients see refused/reset.
		l.closeAllLocked()
		l.log("down (connections refused)")
	}
}

// closeAllLocked closes the socket, every server and every connection.
func (l *svcListener) closeAllLocked() {
	if l.srv != nil {
		l.srv.Close()
	}
	for _, srv := range l.old {
		srv.Close()
	}
	l.srv, l.ln, l.old = nil, nil, nil
	l.connMu.Lock()
	conns := make([]*trackedConn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.connMu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// change applies f to the listener's state under its lock, then opens or closes the socket
// to match. A node served without this listener (nil) ignores it.
func (l *svcListener) change(f func()) {
	if l == nil {
		return
	}
	l.mu.Lock()
	f()
	l.mu.Unlock()
	l.reconcile()
}

// hold stops accepting connections (the socket closes) while the open ones carry on:
// nobody may connect between a run's answer and the restart that follows it.
func (l *svcListener) hold() {
	l.change(func() {
		l.holds++
		if l.srv != nil {
			l.ln.Close()
			l.old = append(l.old, l.srv)
			l.srv, l.ln = nil, nil
		}
	})
}

// release ends a hold without a restart (the answer was not delivered).
func (l *svcListener) release() {
	l.change(func() {
		if l.holds > 0 {
			l.holds--
		}
	})
}

// restartUntil ends a hold with a restart: every connection closes now and the
// listener comes back at until.
func (l *svcListener) restartUntil(until time.Time) {
	if l == nil {
		return
	}
	l.mu.Lock()
	if l.holds > 0 {
		l.holds--
	}
	if until.After(l.downUntil) {
		l.downUntil = until
	}
	l.closeAllLocked()
	l.mu.Unlock()
	l.log("restarting: down until %s", until.Format("15:04:05.000"))
	if d := time.Until(until); d > 0 {
		time.AfterFunc(d, l.reconcile)
	} else {
		l.reconcile()
	}
}

// bounce drops every connection and listens again at once (after a reinstall).
func (l *svcListener) bounce() { l.change(func() { l.closeAllLocked() }) }

func (l *svcListener) stop() {
	l.change(func() {
		l.stopped = true
		l.closeAllLocked()
	})
}

// openConns counts the connections currently open (tests).
func (l *svcListener) openConns() int {
	l.connMu.Lock()
	defer l.connMu.Unlock()
	return len(l.conns)
}

func (l *svcListener) String() string { return fmt.Sprintf("listener %s", l.addr) }
