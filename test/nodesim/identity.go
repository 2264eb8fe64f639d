package main

import (
	"fmt"
	"net/http"
	"sync"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
)

// A worker's run creates its CSRs with the node's own kubelet.conf client, so the API server
// records them as made by system:node:<name> in group system:nodes (spec.username and
// spec.groups), which is what a careful approver checks. The simulator has no node
// certificates the API server trusts; it acts as the node by impersonation instead, over its
// server client's connections (one pool, however many nodes).

// nodeIdentity makes (and keeps) a client per node name that acts as that node.
type nodeIdentity struct {
	config    *rest.Config
	transport http.RoundTripper

	mu      sync.Mutex
	clients map[string]kubernetes.Interface
}

// nodeIdentities maps a workload server's client to how to act as its nodes.
type nodeIdentities map[kubernetes.Interface]*nodeIdentity

func newNodeIdentity(rc *rest.Config) (*nodeIdentity, error) {
	rt, err := rest.TransportFor(rc)
	if err != nil {
		return nil, fmt.Errorf("transport for %s: %w", rc.Host, err)
	}
	return &nodeIdentity{config: rest.CopyConfig(rc), transport: rt, clients: map[string]kubernetes.Interface{}}, nil
}

// client acts as node name.
func (id *nodeIdentity) client(name string) (kubernetes.Interface, error) {
	id.mu.Lock()
	defer id.mu.Unlock()
	if c := id.clients[name]; c != nil {
		return c, nil
	}
	rt := transport.NewImpersonatingRoundTripper(transport.ImpersonationConfig{
		UserName: "system:node:" + name,
		Groups:   []string{"system:nodes"},
	}, id.transport)
	c, err := kubernetes.NewForConfigAndClient(id.config, &http.Client{Transport: rt})
	if err != nil {
		return nil, err
	}
	id.clients[name] = c
	return c, nil
}
