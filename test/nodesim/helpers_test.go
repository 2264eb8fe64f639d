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

// testNode is a node of the test clusters: its k8sd and kubelet at the usual ports, certificates
// valid thirty days.
func testNode(name, machine, role, addr string) NodeConfig {
	return NodeConfig{Name: name, Machine: machine, Role: role, Address: addr, KubeletPort: 10250,
		MicroclusterPort: 2380, ProxyPod: "k8sd-proxy-" + machine, KubeletCert: "unused", KubeletKey: "unused",
		InitialCertLifetimeSeconds: thirtyDay}
}

func testConfig(t *testing.T) *Config {
	t.Helper()
	cp1 := testNode("alpha-cp-1-vm", "alpha-cp-1", roleControlPlane, "127.23.1.2")
	cp1.ApproveMode = approveGetOnce
	w1 := testNode("alpha-w-1-vm", "alpha-w-1", roleWorker, "127.23.1.4")
	w1.RunAnswersDuration = true
	cfg := &Config{
		Control: "127.0.0.1:0", KubeletClientCA: "unused", ManagementKubeconfig: "unused",
		Clusters: []ClusterConfig{{
			Name: "alpha", Namespace: "fleet", Kubeconfig: "alpha.kubeconfig",
			Nodes: []NodeConfig{
				testNode("alpha-cp-0-vm", "alpha-cp-0", roleControlPlane, "127.23.1.1"),
				cp1,
				testNode("alpha-w-0-vm", "alpha-w-0", roleWorker, "127.23.1.3"),
				w1,
			},
		}},
	}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// clusterTokenSecret is a cluster's `<cluster>-token` Secret: the CAPI token, and the node
// token of each machine.
func clusterTokenSecret(cluster string, nodeTokens map[string]string) *corev1.Secret {
	data := map[string][]byte{"value": []byte(tokCAPI)}
	for machine, token := range nodeTokens {
		data["node-token-"+machine] = []byte(token)
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: cluster + "-token", Namespace: "fleet"},
		Data:       data,
	}
}

func tokenSecret() *corev1.Secret {
	return clusterTokenSecret("alpha", map[string]string{
		"alpha-cp-0": tokCP0, "alpha-cp-1": tokCP1, "alpha-w-0": tokW0, "alpha-w-1": tokW1,
	})
}

// soloConfig is a cluster with a single control plane (its run restarts the API server).
func soloConfig() ClusterConfig {
	return ClusterConfig{
		Name: "solo", Namespace: "fleet", Kubeconfig: "solo.kubeconfig",
		Nodes: []NodeConfig{
			testNode("solo-cp-0-vm", "solo-cp-0", roleControlPlane, "127.23.2.1"),
			testNode("solo-w-0-vm", "solo-w-0", roleWorker, "127.23.2.2"),
		},
	}
}

const (
	tokSoloCP = "0123456789abcdef0123456789abcd20"
	tokSoloW  = "0123456789abcdef0123456789abcd21"
)

func soloTokenSecret() *corev1.Secret {
	return clusterTokenSecret("solo", map[string]string{"solo-cp-0": tokSoloCP, "solo-w-0": tokSoloW})
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

// await returns the response sent on ch, failing the test when none comes within d.
func await(t *testing.T, ch <-chan response, d time.Duration, what string) response {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(d):
		t.Fatalf("%s: no answer within %v", what, d)
		return response{}
	}
}

// do sends one request to a node's k8sd. headers alternate name, value.
func (e *testEnv) do(t *testing.T, node, method, path, body string, headers ...string) response {
	t.Helper()
	return e.doCtx(t, context.Background(), node, method, path, body, headers...)
}

func (e *testEnv) doCtx(t *testing.T, ctx context.Context, node, method, path, body string, headers ...string) response {
	t.Helper()
	resp, err := http.DefaultClient.Do(e.request(t, ctx, node, method, path, body, headers...))
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

// request is a request to a node's k8sd. headers alternate name, value.
func (e *testEnv) request(t *testing.T, ctx context.Context, node, method, path, body string, headers ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, e.servers[node].URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return req
}

// abandon sends a request to a node's k8sd whose client gives up after wait; an answer
// before then fails the test.
func (e *testEnv) abandon(t *testing.T, wait time.Duration, node, method, path, body string, headers ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if resp, err := http.DefaultClient.Do(e.request(t, ctx, node, method, path, body, headers...)); err == nil {
		resp.Body.Close()
		t.Errorf("%s %s answered %d before the client left", method, path, resp.StatusCode)
	}
}

// callsDone counts the recorded calls to node ("": any) and those of them that have ended.
func (e *testEnv) callsDone(node string) (done, total int) {
	e.sim.calls.mu.Lock()
	defer e.sim.calls.mu.Unlock()
	for _, c := range e.sim.calls.entries {
		if node != "" && c.rec.Node != node {
			continue
		}
		total++
		if c.done {
			done++
		}
	}
	return done, total
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
