package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestKubeletRejectsOtherPodsAndPaths(t *testing.T) {
	e := newTestEnv(t)
	n := e.sim.findNode("alpha", "alpha-w-0-vm")
	srv := httptest.NewServer(e.sim.kubeletHandler(n))
	defer srv.Close()
	for _, path := range []string{
		"/portForward/default/" + n.cfg.ProxyPod,
		"/portForward/kube-system/other-pod",
		"/portForward/kube-system/" + e.sim.findNode("alpha", "alpha-w-1-vm").cfg.ProxyPod,
		"/exec/kube-system/" + n.cfg.ProxyPod + "/c",
		"/pods",
	} {
		resp, err := http.Post(srv.URL+path, "text/plain", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Errorf("%s: %d, want 404", path, resp.StatusCode)
		}
	}
}

// TestForwarderRelays checks the socat-like relay: bytes both ways, k8sd's close
// reaches the client, other ports are refused.
func TestForwarderRelays(t *testing.T) {
	e := newTestEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		buf := make([]byte, 4)
		io.ReadFull(c, buf)
		c.Write([]byte(strings.ToUpper(string(buf))))
		c.Close()
	}()
	n := e.sim.findNode("alpha", "alpha-w-0-vm")
	n.cfg.Address = "127.0.0.1"
	n.cfg.MicroclusterPort = ln.Addr().(*net.TCPAddr).Port
	fwd := &forwarder{sim: e.sim, node: n}

	client, stream := net.Pipe()
	done := make(chan error, 1)
	go func() { done <- fwd.PortForward(t.Context(), n.cfg.ProxyPod, "", proxyPort, stream) }()
	client.Write([]byte("ping"))
	got, _ := io.ReadAll(client)
	if string(got) != "PING" {
		t.Errorf("relayed %q", got)
	}
	client.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("PortForward: %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("PortForward did not return")
	}

	_, stream2 := net.Pipe()
	if err := fwd.PortForward(t.Context(), n.cfg.ProxyPod, "", 6443, stream2); err == nil {
		t.Error("port 6443 forwarded")
	}
	ln.Close()
	_, stream3 := net.Pipe()
	if err := fwd.PortForward(t.Context(), n.cfg.ProxyPod, "", proxyPort, stream3); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("k8sd down: %v", err)
	}
}
