package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubelet/pkg/cri/streaming/portforward"
)

// The simulated kubelet serves only what kube-apiserver needs for pods/portforward
// to the node's k8sd-proxy pod, which relays to the node's k8sd (like socat).

const (
	proxyNamespace = "kube-system"
	proxyPort      = 2380
	// Same values as the kubelet's streaming server.
	pfIdleTimeout           = 4 * time.Hour
	pfStreamCreationTimeout = 30 * time.Second
	// After one direction ends, how long the other may still drain (socat's -t, containerd's 1s).
	pfDrainTimeout = time.Second
)

// newKubeletListener builds the node's kubelet server (TLS, client certificates of the
// cluster CA, as the API server's kubelet client presents).
func (s *Simulator) newKubeletListener(n *node, cert *tls.Certificate, clientCAs *x509.CertPool) *svcListener {
	name := n.cluster.cfg.Name + "/" + n.cfg.Name
	return &svcListener{
		addr:    net.JoinHostPort(n.cfg.Address, strconv.Itoa(n.cfg.KubeletPort)),
		handler: s.kubeletHandler(n),
		tlsConf: &tls.Config{
			// What the node's kubelet serves now: the expired certificate while the node's
			// certificates are expired (the API server then refuses to port-forward to it).
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
				n.mu.Lock()
				defer n.mu.Unlock()
				if n.kubeletExpired && n.expiredKubelet != nil {
					return n.expiredKubelet, nil
				}
				return cert, nil
			},
			ClientAuth: tls.RequireAndVerifyClientCert,
			ClientCAs:  clientCAs,
			// HTTP/1.1 only: SPDY and websocket both upgrade an HTTP/1.1 connection.
			NextProtos: []string{"http/1.1"},
			MinVersion: tls.VersionTLS12,
		},
		log:      func(f string, a ...any) { s.log.Printf("kubelet %s: "+f, append([]any{name}, a...)...) },
		errorLog: s.log,
	}
}

func (s *Simulator) kubeletHandler(n *node) http.Handler {
	mux := http.NewServeMux()
	pf := func(w http.ResponseWriter, r *http.Request) {
		ns, pod := r.PathValue("namespace"), r.PathValue("pod")
		if ns != proxyNamespace || pod != n.cfg.ProxyPod {
			s.log.Printf("kubelet %s/%s: port-forward to %s/%s refused: pod does not exist", n.cluster.cfg.Name, n.cfg.Name, ns, pod)
			http.Error(w, "pod does not exist", http.StatusNotFound)
			return
		}
		// Websocket requests (kube-rs) carry their ports in the query; SPDY ones (kubectl)
		// in the stream headers. Without options the websocket path panics.
		opts, err := portforward.NewV4Options(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fwd := &forwarder{sim: s, node: n}
		portforward.ServePortForward(w, r, fwd, pod, types.UID(r.PathValue("uid")), opts,
			pfIdleTimeout, pfStreamCreationTimeout, portforward.SupportedProtocols)
	}
	mux.HandleFunc("/portForward/{namespace}/{pod}", pf)
	mux.HandleFunc("/portForward/{namespace}/{pod}/{uid}", pf)
	mux.HandleFunc("/", http.NotFound)
	return mux
}

// forwarder implements portforward.PortForwarder for one node.
type forwarder struct {
	sim  *Simulator
	node *node
}

func (f *forwarder) PortForward(_ context.Context, pod string, _ types.UID, port int32, stream io.ReadWriteCloser) error {
	n := f.node
	label := fmt.Sprintf("portforward %s/%s pod=%s port=%d", n.cluster.cfg.Name, n.cfg.Name, pod, port)
	if port != proxyPort {
		f.sim.log.Printf("%s: refused (only %d is forwarded)", label, proxyPort)
		return fmt.Errorf("port %d is not served by pod %s (only %d)", port, pod, proxyPort)
	}
	target := net.JoinHostPort(n.cfg.Address, strconv.Itoa(n.cfg.MicroclusterPort))
	conn, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		f.sim.log.Printf("%s: dial k8sd %s: %v", label, target, err)
		return fmt.Errorf("failed to connect to %s: %w", target, err)
	}
	defer conn.Close()
	n.relayStarted()
	defer n.relayEnded()
	started := time.Now()
	f.sim.log.Printf("%s: connected to k8sd %s", label, target)

	// The simulator's shutdown ends the relay too.
	stopOnExit := context.AfterFunc(f.sim.ctx, func() { conn.Close() })
	defer stopOnExit()

	var up, down atomic.Int64
	errCh := make(chan error, 2)
	go func() { // client -> k8sd
		c, err := io.Copy(conn, stream)
		up.Add(c)
		// Pass the client's end of data on, so that k8sd sees EOF (half close).
		if tcp, ok := conn.(*net.TCPConn); ok {
			tcp.CloseWrite()
		}
		errCh <- err
	}()
	go func() { // k8sd -> client
		c, err := io.Copy(stream, conn)
		down.Add(c)
		// k8sd closed: tell the client now (SPDY half close; for a websocket this
		// also ends our read of the stream so the upgraded connection can close).
		stream.Close()
		errCh <- err
	}()
	// Like containerd: once one direction ends, give the other a moment to drain.
	first := <-errCh
	select {
	case <-errCh:
	case <-time.After(pfDrainTimeout):
	}
	f.sim.log.Printf("%s: closed after %s (%d bytes up, %d down)", label, time.Since(started).Round(time.Millisecond), up.Load(), down.Load())
	if first != nil && !errors.Is(first, net.ErrClosed) && !errors.Is(first, io.ErrClosedPipe) {
		return first
	}
	return nil
}
