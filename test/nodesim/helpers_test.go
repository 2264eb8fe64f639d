package main

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const (
	tokCP0    = "0123456789abcdef0123456789abcd00"
	tokCP1    = "0123456789abcdef0123456789abcd01"
	tokW0     = "0123456789abcdef0123456789abcd10"
	tokW1     = "0123456789abcdef0123456789abcd11"
	tokCAPI   = "fedcba9876543210fedcba9876543210"
	thirtyDay = 30 * 24 * 3600
)

// testEnv serves every node's k8sd handler over plain HTTP (httptest), backed by fake
// clientsets: no API server needed.
type testEnv struct {
	sim     *Simulator
	mgmt    *fake.Clientset
	wl      *fake.Clientset            // alpha's workload cluster
	wls     map[string]*fake.Clientset // every cluster's
	servers map[string]*httptest.Server
	cancel  context.CancelFunc
}

func testConfig(t *testing.T) *Config {
	t.Helper()
	node := func(name, machine, role, addr string) NodeConfig {
		return NodeConfig{Name: name, Machine: machine, Role: role, Address: addr, KubeletPort: 10250,
			MicroclusterPort: 2380, ProxyPod: "k8sd-proxy-" + machine, KubeletCert: "unused", KubeletKey: "unused",
			InitialCertLifetimeSeconds: thirtyDay}
	}
	cp1 := node("alpha-cp-1-vm", "alpha-cp-1", roleControlPlane, "127.23.1.2")
	cp1.ApproveMode = approveGetOnce
	w1 := node("alpha-w-1-vm", "alpha-w-1", roleWorker, "127.23.1.4")
	w1.RunAnswersDuration = true
	cfg := &Config{
		Control: "127.0.0.1:0", KubeletClientCA: "unused", ManagementKubeconfig: "unused",
		Clusters: []ClusterConfig{{
			Name: "alpha", Namespace: "fleet", Kubeconfig: "alpha.kubeconfig",
			Nodes: []NodeConfig{
				node("alpha-cp-0-vm", "alpha-cp-0", roleControlPlane, "127.23.1.1"),
				cp1,
				node("alpha-w-0-vm", "alpha-w-0", roleWorker, "127.23.1.3"),
				w1,
			},
		}},
	}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func tokenSecret() *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "alpha-token", Namespace: "fleet"},
		Data: map[string][]byte{
			"value":                 []byte(tokCAPI),
			"node-token-alpha-cp-0": []byte(tokCP0),
			"node-token-alpha-cp-1": []byte(tokCP1),
			"node-token-alpha-w-0":  []byte(tokW0),
			"node-token-alpha-w-1":  []byte(tokW1),
		},
	}
}

// soloConfig is a cluster with a single control plane (its run restarts the API server).
func soloConfig() ClusterConfig {
	node := func(name, machine, role, addr string) NodeConfig {
		return NodeConfig{Name: name, Machine: machine, Role: role, Address: addr, KubeletPort: 10250,
			MicroclusterPort: 2380, ProxyPod: "k8sd-proxy-" + machine, KubeletCert: "unused", KubeletKey: "unused",
			InitialCertLifetimeSeconds: thirtyDay}
	}
	return ClusterConfig{
		Name: "solo", Namespace: "fleet", Kubeconfig: "solo.kubeconfig",
		Nodes: []NodeConfig{
			node("solo-cp-0-vm", "solo-cp-0", roleControlPlane, "127.23.2.1"),
			node("solo-w-0-vm", "solo-w-0", roleWorker, "127.23.2.2"),
		},
	}
}

const (
	tokSoloCP = "0123456789abcdef0123456789abcd20"
	tokSoloW  = "0123456789abcdef0123456789abcd21"
)

func soloTokenSecret() *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "solo-token", Namespace: "fleet"},
		Data: map[string][]byte{
			"value":                []byte(tokCAPI),
			"node-token-solo-cp-0": []byte(tokSoloCP),
			"node-token-solo-w-0":  []byte(tokSoloW),
		},
	}
}

// validateLikeAPIServer makes the fake clientset reject what kube-apiserver's CSR
// validation rejects on the approval subresource: a condition type twice, or Approved
// together with Denied (k8s.io/kubernetes pkg/apis/certificates/validation).
func validateLikeAPIServer(c *fake.Clientset) {
	c.PrependReactor("update", "certificatesigningrequests", func(action k8stesting.Action) (bool, runtime.Object, error) {
		update, ok := action.(k8stesting.UpdateAction)
		if !ok || update.GetSubresource() != "approval" {
			return false, nil, nil
		}
		csr, ok := update.GetObject().(*certv1.CertificateSigningRequest)
		if !ok {
			return false, nil, nil
		}
		var errs field.ErrorList
		seen := map[certv1.RequestConditionType]bool{}
		path := field.NewPath("status", "conditions")
		for i, c := range csr.Status.Conditions {
			if seen[c.Type] {
				errs = append(errs, field.Duplicate(path.Index(i).Child("type"), c.Type))
			}
			seen[c.Type] = true
		}
		if seen[certv1.CertificateApproved] && seen[certv1.CertificateDenied] {
			errs = append(errs, field.Invalid(path, certv1.CertificateDenied, "Approved and Denied conditions are mutually exclusive"))
		}
		if len(errs) > 0 {
			return true, nil, apierrors.NewInvalid(schema.GroupKind{Group: "certificates.k8s.io", Kind: "CertificateSigningRequest"}, csr.Name, errs)
		}
		return false, nil, nil
	})
}

func testLogger(t *testing.T) *log.Logger {
	if testing.Verbose() {
		return log.New(os.Stderr, "nodesim-test ", log.Lmicroseconds)
	}
	return log.New(io.Discard, "", 0)
}

func newTestEnvWith(t *testing.T, cfg *Config) *testEnv {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	mgmt := fake.NewClientset(tokenSecret(), soloTokenSecret())
	// Clusters with the same kubeconfig share an API server, as in nodesim's run.
	wls := map[string]*fake.Clientset{}
	byKubeconfig := map[string]*fake.Clientset{}
	clients := map[string]kubernetes.Interface{}
	for _, cc := range cfg.Clusters {
		wl := byKubeconfig[cc.Kubeconfig]
		if wl == nil {
			wl = fake.NewClientset()
			validateLikeAPIServer(wl)
			byKubeconfig[cc.Kubeconfig] = wl
		}
		wls[cc.Name] = wl
		clients[cc.Name] = wl
	}
	sim, err := newSimulator(ctx, cfg, mgmt, clients, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	sim.pollInterval = 10 * time.Millisecond
	sim.apiserverRestartAfter = 20 * time.Millisecond
	e := &testEnv{sim: sim, mgmt: mgmt, wl: wls["alpha"], wls: wls, servers: map[string]*httptest.Server{}, cancel: cancel}
	for _, n := range sim.allNodes() {
		srv := httptest.NewServer(sim.k8sdHandler(n))
		e.servers[n.cfg.Name] = srv
	}
	t.Cleanup(func() {
		cancel()
		for _, srv := range e.servers {
			srv.CloseClientConnections()
			srv.Close()
		}
	})
	return e
}

func newTestEnv(t *testing.T) *testEnv { return newTestEnvWith(t, testConfig(t)) }

// startSigner runs every API server's CSR informer and signer on the fake clientsets.
func (e *testEnv) startSigner(t *testing.T) {
	t.Helper()
	for _, srv := range e.sim.servers {
		go e.sim.runServer(e.sim.ctx, srv)
	}
}

type response struct {
	status int
	close  bool // the server asked to close the connection
	header http.Header
	body   string
}

// do sends one request to a node's k8sd. headers alternate name, value.
func (e *testEnv) do(t *testing.T, node, method, path, body string, headers ...string) response {
	t.Helper()
	return e.doCtx(t, context.Background(), node, method, path, body, headers...)
}

func (e *testEnv) doCtx(t *testing.T, ctx context.Context, node, method, path, body string, headers ...string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, e.servers[node].URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: resp.StatusCode, close: resp.Close, header: resp.Header, body: string(b)}
}

const (
	pathExpiry  = "/1.0/x/capi/certificates-expiry"
	pathPlan    = "/1.0/x/capi/refresh-certs/plan"
	pathRun     = "/1.0/x/capi/refresh-certs/run"
	pathApprove = "/1.0/x/capi/refresh-certs/approve"
)

// errorBody is the exact error envelope k8sd sends (json.Encoder adds the newline).
func errorBody(code int, msg string) string {
	m, _ := json.Marshal(msg)
	return `{"type":"error","status":"","status_code":0,"operation":"","error_code":` +
		strconv.Itoa(code) + `,"error":` + string(m) + `,"metadata":null}` + "\n"
}
