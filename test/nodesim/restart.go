package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// What follows a run, as in released k8sd: the new certificate is written to disk, the
// answer goes out, and only a delivered answer is followed by the service restart that
// makes the node serve the new certificate. The restart takes the node's k8sd and kubelet
// away for restartSeconds; on a cluster with a single control plane, a control-plane
// restart also takes the whole workload API away (the harness restarts that cluster's
// kube-apiserver when asked through the restart hook), and so does the first control-plane
// restart of a cluster whose API server certificate expired (the harness starts it again with a
// valid one).

const (
	// How long the kubelet waits for the port-forward relays of an answered run to end
	// before its connections close (the answer must travel back through them first).
	relayDrainLimit = 2 * time.Second
	// Extra time for the relayed bytes to leave after the relays ended.
	relayFlushGrace = 100 * time.Millisecond
	// Timeout of one restart-hook call.
	restartHookTimeout = 10 * time.Second
)

// writeToDisk records a run's new certificate as written (not yet served).
func (n *node) writeToDisk(cert *x509.Certificate, seed int) {
	n.mu.Lock()
	n.onDisk = cert
	n.seedsRun = append(n.seedsRun, int64(seed))
	n.mu.Unlock()
}

func (n *node) holdListeners() {
	n.k8sd.hold()
	n.kubelet.hold()
}

func (n *node) releaseListeners() {
	n.k8sd.release()
	n.kubelet.release()
}

// relayStarted and relayEnded count the port-forward relays into this node's k8sd.
func (n *node) relayStarted() { n.relays.Add(1) }
func (n *node) relayEnded()   { n.relays.Add(-1) }

// waitRelays waits until no relay is open, at most limit.
func (n *node) waitRelays(limit time.Duration) {
	deadline := time.Now().Add(limit)
	for n.relays.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
}

// serveFromDisk is the state change of a restart: the services load what is on disk. It
// returns a function that undoes it.
func (n *node) serveFromDisk() (undo func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	prev, prevExpired := n.current, n.kubeletExpired
	n.current = n.onDisk
	// Every run (control plane or worker) renews the kubelet's serving certificate too.
	n.kubeletExpired = false
	n.restarts++
	return func() {
		n.mu.Lock()
		n.current, n.kubeletExpired = prev, prevExpired
		n.restarts--
		n.mu.Unlock()
	}
}

// restartNode acts out the service restart after a delivered run answer (the node state
// changed already, see serveFromDisk): k8sd goes down at once, the kubelet once the answer
// has been relayed, and a lone control plane takes the cluster's API server with it.
func (s *Simulator) restartNode(n *node) {
	until := time.Now().Add(s.restartDelay)
	s.log.Printf("node %s/%s: restarting services, down for %s", n.cluster.cfg.Name, n.cfg.Name, s.restartDelay)
	n.k8sd.restartUntil(until)
	if n.kubelet != nil {
		go func() {
			n.waitRelays(relayDrainLimit)
			time.Sleep(relayFlushGrace)
			n.kubelet.restartUntil(until)
		}()
	}
	if n.cfg.Role == roleControlPlane && (n.cluster.controlPlanes() == 1 || n.cluster.takeExpiredAPI()) {
		s.restartAPIServer(n.cluster)
	}
}

// takeExpiredAPI reports whether the cluster's API server serves an expired certificate, and
// clears it: one control plane's refresh renews the certificate the API server serves (the
// harness runs one API server per cluster, standing for all its control planes'). A server the
// harness shares between clusters is renewed for all of them at once.
func (c *cluster) takeExpiredAPI() bool {
	sharing := []*cluster{c}
	if c.server != nil {
		c.server.renewMu.Lock()
		defer c.server.renewMu.Unlock()
		sharing = c.server.clusters
	}
	c.mu.Lock()
	expired := c.apiCertificateExpired
	c.mu.Unlock()
	if !expired {
		return false
	}
	for _, other := range sharing {
		other.mu.Lock()
		other.apiCertificateExpired = false
		other.mu.Unlock()
	}
	return true
}

func (c *cluster) controlPlanes() int {
	count := 0
	for _, n := range c.nodes {
		if n.cfg.Role == roleControlPlane {
			count++
		}
	}
	return count
}

// restartAPIServer asks the harness, shortly after the answer (so that it can travel back
// through the tunnel), to restart the cluster's kube-apiserver.
func (s *Simulator) restartAPIServer(cl *cluster) {
	cl.mu.Lock()
	cl.apiserverRestarts++
	cl.mu.Unlock()
	if s.cfg.RestartHook == "" {
		s.log.Printf("cluster %s: its only control plane restarted; no restartHook configured, the API server stays up", cl.cfg.Name)
		return
	}
	target := s.cfg.RestartHook + "/clusters/" + url.PathEscape(cl.cfg.Name) + "/restart-apiserver"
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if !waitTick(s.ctx, s.apiserverRestartAfter) {
			return
		}
		// The CSR cache goes stale now: killing the API server ends its watch with a plain
		// EOF (not taken as a watch error), and the informer then backs off before it lists
		// again. Released k8sd's approve watches the API server itself (k8sd-protocol.md,
		// item 4) and sees new CSRs as soon as it is back: the waits read it meanwhile.
		cl.server.degrade()
		if err := postHook(s.ctx, s.hookClient, target); err != nil {
			s.log.Printf("cluster %s: restart hook %s: %v", cl.cfg.Name, target, err)
			return
		}
		s.log.Printf("cluster %s: asked the harness to restart the kube-apiserver", cl.cfg.Name)
	}()
}

func postHook(ctx context.Context, client *http.Client, target string) error {
	ctx, cancel := context.WithTimeout(ctx, restartHookTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader([]byte("{}")))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(body))
	}
	return nil
}
