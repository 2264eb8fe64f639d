package main

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

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

// expired acts as node name with a kubelet.conf whose client certificate expired a day ago: the
// API server refuses it (401 Unauthorized) as it refuses a real one past its NotAfter. Issued by
// the cluster's simulated CA, which the API server does not trust either: refused both ways.
func (id *nodeIdentity) expired(name string, ca *authority) (kubernetes.Interface, error) {
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	cert, err := ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "system:node:" + name, Organization: []string{"system:nodes"}},
		NotBefore:   now.AddDate(-1, 0, -1),
		NotAfter:    now.AddDate(0, 0, -1),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, key.Public())
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	rc := rest.CopyConfig(id.config)
	rc.BearerToken, rc.BearerTokenFile = "", ""
	rc.Impersonate = rest.ImpersonationConfig{}
	rc.CertFile, rc.KeyFile = "", ""
	rc.CertData = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
	rc.KeyData = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	return kubernetes.NewForConfig(rc)
}

// expiredNodeClient is nodeClient with an expired kubelet.conf (see nodeIdentity.expired).
func (srv *apiServer) expiredNodeClient(name string, ca *authority) (kubernetes.Interface, error) {
	if srv.asNode == nil {
		// The tests' fake clientsets authenticate nobody: answer as the API server would.
		return nil, errors.New("Unauthorized")
	}
	return srv.asNode.expired(name, ca)
}
