package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"math"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	certlisters "k8s.io/client-go/listers/certificates/v1"
	"k8s.io/client-go/tools/cache"
)

func TestRootEnvelopeBytes(t *testing.T) {
	e := newTestEnv(t)
	r := e.do(t, "alpha-cp-0-vm", "GET", "/", "")
	want := `{"type":"sync","status":"Success","status_code":200,"operation":"","error_code":0,"error":"","metadata":["/1.0"]}` + "\n"
	if r.status != 200 || r.body != want {
		t.Fatalf("GET / = %d %q, want 200 %q", r.status, r.body, want)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
}

func TestRoutingErrors(t *testing.T) {
	e := newTestEnv(t)
	for _, tc := range []struct {
		method, path string
		code         int
		msg          string
	}{
		{"POST", pathExpiry + "/", 404, "not found"},
		{"POST", "/1.0/x/capi/nothing", 404, "not found"},
		{"GET", "/1.0", 404, "not found"},
		{"GET", pathExpiry, 501, "method GET not implemented"},
		{"PUT", pathRun, 501, "method PUT not implemented"},
		{"POST", "/", 501, "method POST not implemented"},
	} {
		r := e.do(t, "alpha-cp-0-vm", tc.method, tc.path, "{}", "node-token", tokCP0)
		if want := errorBody(tc.code, tc.msg); r.status != tc.code || r.body != want {
			t.Errorf("%s %s = %d %q, want %d %q", tc.method, tc.path, r.status, r.body, tc.code, want)
		}
	}
}

func TestAuthentication(t *testing.T) {
	e := newTestEnv(t)
	cp := "alpha-cp-0-vm"
	check := func(name string, r response, code int, msg string) {
		t.Helper()
		if want := errorBody(code, msg); r.status != code || r.body != want {
			t.Errorf("%s: got %d %q, want %d %q", name, r.status, r.body, code, want)
		}
	}
	check("missing", e.do(t, cp, "POST", pathExpiry, "{}"), 401, `missing header "node-token"`)
	check("wrong", e.do(t, cp, "POST", pathPlan, "{}", "node-token", "nope"), 401, "invalid token")
	check("other machine", e.do(t, cp, "POST", pathRun, "{}", "node-token", tokW0), 401, "invalid token")
	check("capi token on node endpoint", e.do(t, cp, "POST", pathExpiry, "{}", "node-token", tokCAPI), 401, "invalid token")
	check("approve missing", e.do(t, cp, "POST", pathApprove, `{"seed":1}`, "node-token", tokCP0), 401, `missing header "capi-auth-token"`)
	check("approve wrong", e.do(t, cp, "POST", pathApprove, `{"seed":1}`, "capi-auth-token", tokCP0), 401, "invalid token")
	// Auth comes before decoding: a bad body with a bad token is a 401.
	check("auth before decode", e.do(t, cp, "POST", pathExpiry, "garbage", "node-token", "nope"), 401, "invalid token")

	// Header names are case-insensitive.
	if r := e.do(t, cp, "POST", pathExpiry, "{}", "Node-Token", tokCP0); r.status != 200 {
		t.Errorf("mixed-case header: %d %s", r.status, r.body)
	}

	// The Secret is read per request: a rotated token takes effect at once.
	s := tokenSecret()
	s.Data["node-token-alpha-cp-0"] = []byte("rotated")
	if _, err := e.mgmt.CoreV1().Secrets("fleet").Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	check("old token after rotation", e.do(t, cp, "POST", pathExpiry, "{}", "node-token", tokCP0), 401, "invalid token")
	if r := e.do(t, cp, "POST", pathExpiry, "{}", "node-token", "rotated"); r.status != 200 {
		t.Errorf("rotated token: %d %s", r.status, r.body)
	}

	// The Secret gone from the management cluster (`clusterctl move`): k8sd keeps the tokens
	// it had, like its own database.
	if err := e.mgmt.CoreV1().Secrets("fleet").Delete(context.Background(), "alpha-token", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := e.do(t, cp, "POST", pathExpiry, "{}", "node-token", "rotated"); r.status != 200 {
		t.Errorf("known token, no Secret: %d %s", r.status, r.body)
	}
	check("wrong token, no Secret", e.do(t, cp, "POST", pathExpiry, "{}", "node-token", tokCP0), 401, "invalid token")
	// A token never seen, and no Secret: 500.
	r := e.do(t, "alpha-w-0-vm", "POST", pathExpiry, "{}", "node-token", tokW0)
	if r.status != 500 || !strings.Contains(r.body, "alpha-token") {
		t.Errorf("no secret: %d %s", r.status, r.body)
	}
}

func TestStrictDecoding(t *testing.T) {
	e := newTestEnv(t)
	for _, tc := range []struct {
		path, body string
		msg        string
	}{
		{pathExpiry, "", "failed to parse request: EOF"},
		{pathExpiry, `{"x":1}`, `failed to parse request: json: unknown field "x"`},
		{pathPlan, `{"certificates":null,"seed":1}`, `failed to parse request: json: unknown field "seed"`},
		{pathRun, `{"seed":1,"expiration-seconds":10,"extra-sans":null,"ttl":"1y"}`, `failed to parse request: json: unknown field "ttl"`},
		{pathRun, `{"seed":"1"}`, "failed to parse request: json: cannot unmarshal string into Go struct field"},
		{pathRun, `{"seed":1.5}`, "failed to parse request: json: cannot unmarshal number 1.5"},
		{pathPlan, `{`, "failed to parse request: unexpected EOF"},
		{pathPlan, `{} {}`, "failed to parse request: unexpected data after the JSON object"},
	} {
		r := e.do(t, "alpha-cp-0-vm", "POST", tc.path, tc.body, "node-token", tokCP0)
		var env envelope
		if err := json.Unmarshal([]byte(r.body), &env); err != nil {
			t.Fatalf("%s %q: body %q: %v", tc.path, tc.body, r.body, err)
		}
		if r.status != 400 || env.ErrorCode != 400 || env.Type != "error" || !strings.HasPrefix(env.Error, tc.msg) {
			t.Errorf("%s %q = %d %q, want 400 %q...", tc.path, tc.body, r.status, env.Error, tc.msg)
		}
	}
	r := e.do(t, "alpha-cp-0-vm", "POST", pathApprove, `{"seed":1,"x":2}`, "capi-auth-token", tokCAPI)
	if want := errorBody(400, `failed to parse request: json: unknown field "x"`); r.status != 400 || r.body != want {
		t.Errorf("approve unknown field = %d %q", r.status, r.body)
	}
}

type planMeta struct {
	Seconds json.Number `json:"seconds"`
	CSRs    []string    `json:"certificate-signing-requests"`
}

func plan(t *testing.T, e *testEnv, node, token string) (int64, []string, string) {
	t.Helper()
	r := e.do(t, node, "POST", pathPlan, `{"certificates":null}`, "node-token", token)
	if r.status != 200 {
		t.Fatalf("plan: %d %s", r.status, r.body)
	}
	dec := json.NewDecoder(strings.NewReader(r.body))
	dec.UseNumber()
	var env struct {
		Metadata planMeta `json:"metadata"`
	}
	if err := dec.Decode(&env); err != nil {
		t.Fatal(err)
	}
	seed, err := env.Metadata.Seconds.Int64()
	if err != nil || seed < 0 {
		t.Fatalf("seed %q is not a non-negative int64: %v", env.Metadata.Seconds, err)
	}
	return seed, env.Metadata.CSRs, r.body
}

func TestPlan(t *testing.T) {
	e := newTestEnv(t)
	seed, csrs, body := plan(t, e, "alpha-w-0-vm", tokW0)
	want := []string{
		fmt.Sprintf("k8sd-%d-worker-kubelet-serving", seed),
		fmt.Sprintf("k8sd-%d-worker-kubelet-client", seed),
		fmt.Sprintf("k8sd-%d-worker-kube-proxy-client", seed),
	}
	if fmt.Sprint(csrs) != fmt.Sprint(want) {
		t.Errorf("worker CSRs %v, want %v", csrs, want)
	}
	if !strings.Contains(body, `"metadata":{"seconds":`) {
		t.Errorf("seed not under \"seconds\": %s", body)
	}
	seed2, _, _ := plan(t, e, "alpha-w-0-vm", tokW0)
	if seed2 == seed {
		t.Errorf("two plans gave the same seed %d", seed)
	}
	_, _, cpBody := plan(t, e, "alpha-cp-0-vm", tokCP0)
	if !strings.Contains(cpBody, `"certificate-signing-requests":null`) {
		t.Errorf("control-plane plan should list null CSRs: %s", cpBody)
	}
	// plan has no side effects.
	list, _ := e.wl.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
	if len(list.Items) != 0 {
		t.Errorf("plan created %d CSRs", len(list.Items))
	}
}

func expiryOf(t *testing.T, e *testEnv, node, token string) string {
	t.Helper()
	r := e.do(t, node, "POST", pathExpiry, "{}", "node-token", token)
	var env struct {
		Metadata map[string]string `json:"metadata"`
	}
	if r.status != 200 || json.Unmarshal([]byte(r.body), &env) != nil {
		t.Fatalf("expiry: %d %s", r.status, r.body)
	}
	return env.Metadata["expiry-date"]
}

type runMeta struct {
	Metadata struct {
		ExpirationSeconds int64 `json:"expiration-seconds"`
	} `json:"metadata"`
}

func TestControlPlaneRun(t *testing.T) {
	e := newTestEnv(t)
	cp := "alpha-cp-0-vm"
	before := expiryOf(t, e, cp, tokCP0)
	n := e.sim.findNode("alpha", cp)
	if want := n.initial.NotAfter.UTC().Format(time.RFC3339); before != want {
		t.Fatalf("expiry %s, want the initial certificate's %s", before, want)
	}
	if _, err := time.Parse(time.RFC3339, before); err != nil {
		t.Fatal(err)
	}

	r := e.do(t, cp, "POST", pathRun, `{"certificates":null,"seed":42,"expiration-seconds":86400,"extra-sans":["10.1.2.3","cp.example.com"]}`, "node-token", tokCP0)
	var m runMeta
	if r.status != 200 || json.Unmarshal([]byte(r.body), &m) != nil {
		t.Fatalf("run: %d %s", r.status, r.body)
	}
	if got, want := m.Metadata.ExpirationSeconds, time.Now().Unix()+86400; got < want-5 || got > want+5 {
		t.Errorf("expiration-seconds %d, want about %d (a Unix time)", got, want)
	}
	if !r.close {
		t.Errorf("run answer should close the connection (restart follows)")
	}
	st := n.status()
	for _, san := range []string{"10.1.2.3", "cp.example.com", "127.23.1.1", cp, "kubernetes.default.svc.cluster.local", "10.96.0.1"} {
		if !contains(st.CertSANs, san) {
			t.Errorf("SAN %s missing from %v", san, st.CertSANs)
		}
	}
	if notAfter, _ := time.Parse(time.RFC3339, st.CertNotAfter); notAfter.Unix() != m.Metadata.ExpirationSeconds {
		t.Errorf("certNotAfter %s != answer %d", st.CertNotAfter, m.Metadata.ExpirationSeconds)
	}
	if fmt.Sprint(st.SeedsRun) != "[42]" {
		t.Errorf("seedsRun %v", st.SeedsRun)
	}
	if after := expiryOf(t, e, cp, tokCP0); after != before {
		t.Errorf("certificates-expiry changed by run: %s -> %s", before, after)
	}
	roots := x509.NewCertPool()
	roots.AddCert(n.cluster.ca.cert)
	if _, err := n.current.Verify(x509.VerifyOptions{Roots: roots}); err != nil {
		t.Errorf("apiserver certificate does not chain to the cluster CA: %v", err)
	}

	for _, body := range []string{
		`{"seed":1,"expiration-seconds":0}`,
		`{"seed":1,"expiration-seconds":-5}`,
	} {
		r := e.do(t, cp, "POST", pathRun, body, "node-token", tokCP0)
		if r.status != 400 || !strings.Contains(r.body, "invalid expiration-seconds") {
			t.Errorf("run %s = %d %s", body, r.status, r.body)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// runAndApprove issues run (worker) and approve (control plane) concurrently, as a
// client must.
func runAndApprove(t *testing.T, e *testEnv, worker, wtoken, cp string, seed int64, expSeconds int64) (response, response) {
	t.Helper()
	runCh := make(chan response, 1)
	go func() {
		runCh <- e.do(t, worker, "POST", pathRun,
			fmt.Sprintf(`{"certificates":null,"seed":%d,"expiration-seconds":%d,"extra-sans":null}`, seed, expSeconds), "node-token", wtoken)
	}()
	approve := e.do(t, cp, "POST", pathApprove, fmt.Sprintf(`{"seed":%d}`, seed), "capi-auth-token", tokCAPI)
	return await(t, runCh, 10*time.Second, "run"), approve
}

func TestWorkerRefreshWatchApprove(t *testing.T) {
	e := newTestEnv(t)
	e.startSigner(t)
	seed := int64(math.MaxInt64 - 7) // must survive as an integer end to end
	run, approve := runAndApprove(t, e, "alpha-w-0-vm", tokW0, "alpha-cp-0-vm", seed, 90*86400)
	if approve.status != 200 || !strings.Contains(approve.body, `"metadata":{}`) {
		t.Fatalf("approve: %d %s", approve.status, approve.body)
	}
	var m runMeta
	if run.status != 200 || json.Unmarshal([]byte(run.body), &m) != nil {
		t.Fatalf("run: %d %s", run.status, run.body)
	}
	// Published k8sd signs for 10 years whatever was asked.
	tenY := tenYears(time.Now()).Unix()
	if got := m.Metadata.ExpirationSeconds; got < tenY-60 || got > tenY+60 {
		t.Errorf("expiration-seconds %d, want about %d (10 years)", got, tenY)
	}
	csrs := e.wl.CertificatesV1().CertificateSigningRequests()
	for i, c := range workerCSRs(e.sim.findNode("alpha", "alpha-w-0-vm").cfg, int(seed)) {
		csr, err := csrs.Get(context.Background(), c.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if csr.Spec.SignerName != c.signer || csr.Spec.ExpirationSeconds == nil || *csr.Spec.ExpirationSeconds != 90*86400 {
			t.Errorf("CSR %s: signer %s expirationSeconds %v", c.name, csr.Spec.SignerName, csr.Spec.ExpirationSeconds)
		}
		if !conditionTrue(csr, certv1.CertificateApproved) || csr.Status.Conditions[0].Reason != reasonApproved {
			t.Errorf("CSR %s conditions %+v", c.name, csr.Status.Conditions)
		}
		cert, err := parseCertPEM(csr.Status.Certificate)
		if err != nil {
			t.Fatalf("CSR %s certificate: %v", c.name, err)
		}
		wantCN := []string{"system:node:alpha-w-0-vm", "system:node:alpha-w-0-vm", "system:kube-proxy"}[i]
		if cert.Subject.CommonName != wantCN {
			t.Errorf("CSR %s CN %q, want %q", c.name, cert.Subject.CommonName, wantCN)
		}
	}
	st := e.sim.findNode("alpha", "alpha-w-0-vm").status()
	if fmt.Sprint(st.SeedsRun) != fmt.Sprint([]int64{seed}) || !contains(st.CertSANs, "127.23.1.3") {
		t.Errorf("worker status %+v", st)
	}

	if st.Restarts != 1 || st.DiskCertNotAfter != st.CertNotAfter {
		t.Errorf("after a delivered run the node serves what it wrote, once restarted: %+v", st)
	}

	// Released k8sd: a run cannot be repeated with the same seed (plain Create, keys gone).
	r := e.do(t, "alpha-w-0-vm", "POST", pathRun, fmt.Sprintf(`{"seed":%d,"expiration-seconds":7776000}`, seed), "node-token", tokW0)
	name := fmt.Sprintf("k8sd-%d-worker-kubelet-serving", seed)
	want := errorBody(500, fmt.Sprintf(`failed to get worker node certificates: failed to create CSR for %s: certificatesigningrequests.certificates.k8s.io %q already exists`, name, name))
	if r.status != 500 || r.body != want {
		t.Errorf("retried run: %d %q, want %q", r.status, r.body, want)
	}
	if again := e.sim.findNode("alpha", "alpha-w-0-vm").status(); fmt.Sprint(again.SeedsRun) != fmt.Sprint(st.SeedsRun) || again.Restarts != 1 {
		t.Errorf("a failed run changed the node: %+v", again)
	}
}

// A CSR cache gone stale without a watch error (a killed API server ends the watch with a
// plain EOF) holds no wait for ever: past the cache grace, run and approve read the API server.
// "missing": approve would wait for CSRs the cache never shows; "undecided": run would wait for
// an approval and a signature the cache never shows.
func TestWaitsReadTheAPIServerPastAStaleCache(t *testing.T) {
	const seed = 11
	for _, stale := range []string{"missing", "undecided"} {
		t.Run(stale, func(t *testing.T) {
			e := newTestEnv(t)
			e.sim.cacheGrace = 50 * time.Millisecond
			e.startSigner(t)
			srv := e.sim.byName["alpha"].server
			waitFor(t, func() bool {
				srv.mu.Lock()
				defer srv.mu.Unlock()
				return srv.lister != nil
			})
			// The informer goes on signing; the waits read a cache that never changes.
			indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
			if stale == "undecided" {
				for _, name := range workerCSRNames(seed) {
					if err := indexer.Add(&certv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
						t.Fatal(err)
					}
				}
			}
			srv.mu.Lock()
			srv.lister = certlisters.NewCertificateSigningRequestLister(indexer)
			srv.mu.Unlock()

			runCh := make(chan response, 1)
			go func() {
				runCh <- e.do(t, "alpha-w-0-vm", "POST", pathRun, fmt.Sprintf(`{"seed":%d,"expiration-seconds":3600}`, seed), "node-token", tokW0)
			}()
			// Approved once the CSRs exist (the stale cache claims they do from the start).
			csrs := e.wl.CertificatesV1().CertificateSigningRequests()
			waitFor(t, func() bool {
				list, err := csrs.List(context.Background(), metav1.ListOptions{})
				return err == nil && len(list.Items) == 3
			})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			approve := e.doCtx(t, ctx, "alpha-cp-0-vm", "POST", pathApprove, fmt.Sprintf(`{"seed":%d}`, seed), "capi-auth-token", tokCAPI)
			if approve.status != 200 {
				t.Fatalf("approve %d %s", approve.status, approve.body)
			}
			if run := await(t, runCh, 10*time.Second, "run"); run.status != 200 {
				t.Fatalf("run %d %s", run.status, run.body)
			}
		})
	}
}

func TestWorkerRunDurationAndHonouredTTL(t *testing.T) {
	cfg := testConfig(t)
	cfg.Clusters[0].HonourCSRExpiration = true
	e := newTestEnvWith(t, cfg)
	e.startSigner(t)
	run, approve := runAndApprove(t, e, "alpha-w-1-vm", tokW1, "alpha-cp-0-vm", 7, 86400)
	if approve.status != 200 {
		t.Fatalf("approve: %d %s", approve.status, approve.body)
	}
	var m runMeta
	if run.status != 200 || json.Unmarshal([]byte(run.body), &m) != nil {
		t.Fatalf("run: %d %s", run.status, run.body)
	}
	// runAnswersDuration: the lifetime in seconds, not a Unix time.
	if m.Metadata.ExpirationSeconds < 86400-2 || m.Metadata.ExpirationSeconds > 86400+2 {
		t.Errorf("expiration-seconds %d, want the duration 86400", m.Metadata.ExpirationSeconds)
	}
}

func TestWorkerRunValidation(t *testing.T) {
	e := newTestEnv(t)
	for _, exp := range []int64{0, -1, math.MaxInt32 + 1} {
		r := e.do(t, "alpha-w-0-vm", "POST", pathRun, fmt.Sprintf(`{"seed":1,"expiration-seconds":%d}`, exp), "node-token", tokW0)
		if r.status != 400 || !strings.Contains(r.body, "invalid expiration-seconds") {
			t.Errorf("expiration-seconds %d: %d %s", exp, r.status, r.body)
		}
	}
}

func TestWorkerRunStopsWhenClientLeaves(t *testing.T) {
	e := newTestEnv(t)
	// Without approval, run is still waiting when the client leaves.
	e.abandon(t, 300*time.Millisecond, "alpha-w-0-vm", "POST", pathRun, `{"seed":5,"expiration-seconds":3600}`, "node-token", tokW0)
	// The handler notices the disconnect, stops waiting and records no answer.
	waitFor(t, func() bool {
		done, total := e.callsDone("")
		return total == 1 && done == 1
	})
	if calls := e.sim.calls.list("", ""); calls[0].Status != 0 {
		t.Errorf("abandoned run recorded status %d", calls[0].Status)
	}
}

// waitFor polls cond for up to 5s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestApproveGetOnce(t *testing.T) {
	e := newTestEnv(t)
	cp1 := "alpha-cp-1-vm"
	r := e.do(t, cp1, "POST", pathApprove, `{"seed":9}`, "capi-auth-token", tokCAPI)
	if r.status != 500 || !strings.Contains(r.body, `failed to approve worker node CSR: failed to get CSR k8sd-9-worker-kubelet-serving: `) {
		t.Fatalf("approve before CSRs: %d %s", r.status, r.body)
	}
	n := e.sim.findNode("alpha", "alpha-w-0-vm")
	for _, c := range workerCSRs(n.cfg, 9) {
		if err := createCSR(context.Background(), e.wl.CertificatesV1().CertificateSigningRequests(), c, 3600); err != nil {
			t.Fatal(err)
		}
	}
	if r := e.do(t, cp1, "POST", pathApprove, `{"seed":9}`, "capi-auth-token", tokCAPI); r.status != 200 {
		t.Fatalf("approve: %d %s", r.status, r.body)
	}
	r = e.do(t, cp1, "POST", pathApprove, `{"seed":9}`, "capi-auth-token", tokCAPI)
	if want := errorBody(500, "failed to approve worker node CSR: CSR k8sd-9-worker-kubelet-serving is already approved"); r.status != 500 || r.body != want {
		t.Fatalf("second approve: %d %q", r.status, r.body)
	}
}

func TestApproveOnWorker(t *testing.T) {
	e := newTestEnv(t)
	r := e.do(t, "alpha-w-0-vm", "POST", pathApprove, `{"seed":9}`, "capi-auth-token", tokCAPI)
	if r.status != 500 || !strings.Contains(r.body, "only served by control-plane nodes") {
		t.Fatalf("approve on worker: %d %s", r.status, r.body)
	}
}

func TestCSRDenyFault(t *testing.T) {
	e := newTestEnv(t)
	e.startSigner(t)
	e.sim.faults.add(faultRequest{Cluster: "alpha", Kind: faultCSRDeny, Count: 1})
	run, approve := runAndApprove(t, e, "alpha-w-0-vm", tokW0, "alpha-cp-0-vm", 11, 3600)
	if approve.status != 200 {
		t.Fatalf("approve: %d %s", approve.status, approve.body)
	}
	if want := errorBody(500, "failed to get worker node certificates: CSR k8sd-11-worker-kubelet-serving was denied"); run.status != 500 || run.body != want {
		t.Fatalf("run: %d %q", run.status, run.body)
	}
	csr, err := e.wl.CertificatesV1().CertificateSigningRequests().Get(context.Background(), "k8sd-11-worker-kube-proxy-client", metav1.GetOptions{})
	if err != nil || !conditionTrue(csr, certv1.CertificateDenied) || csr.Status.Conditions[0].Reason != reasonDenied {
		t.Fatalf("CSR not denied: %v %+v", err, csr)
	}
	if len(e.sim.faults.list()) != 0 {
		t.Errorf("count=1 fault should be gone")
	}
}

func TestSignerMarksUnsignableCSRFailed(t *testing.T) {
	e := newTestEnv(t)
	csrs := e.wl.CertificatesV1().CertificateSigningRequests()
	_, err := csrs.Create(context.Background(), &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "bad"},
		Spec:       certv1.CertificateSigningRequestSpec{Request: []byte("not pem"), SignerName: "k8sd.io/kubelet-client"},
		Status: certv1.CertificateSigningRequestStatus{Conditions: []certv1.CertificateSigningRequestCondition{
			{Type: certv1.CertificateApproved, Status: "True"},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.sim.signCSR(context.Background(), e.sim.clusters[0], "bad")
	csr, _ := csrs.Get(context.Background(), "bad", metav1.GetOptions{})
	if !conditionTrue(csr, certv1.CertificateFailed) || len(csr.Status.Certificate) != 0 {
		t.Fatalf("unsignable CSR: %+v", csr.Status)
	}
}

func TestSignerIgnoresOtherSigners(t *testing.T) {
	csr := &certv1.CertificateSigningRequest{
		Spec: certv1.CertificateSigningRequestSpec{SignerName: "kubernetes.io/kube-apiserver-client"},
		Status: certv1.CertificateSigningRequestStatus{Conditions: []certv1.CertificateSigningRequestCondition{
			{Type: certv1.CertificateApproved, Status: "True"},
		}},
	}
	if needsSigning(csr) {
		t.Fatal("kubernetes.io signer must be left alone")
	}
	csr.Spec.SignerName = "k8sd.io/kubelet-serving"
	if !needsSigning(csr) {
		t.Fatal("approved k8sd.io CSR should be signed")
	}
	csr.Status.Certificate = []byte("x")
	if needsSigning(csr) {
		t.Fatal("already signed")
	}
}

func TestEnvelopeEscaping(t *testing.T) {
	rec := httptest.NewRecorder()
	writeError(rec, 500, `a "quoted" <msg>`)
	want := `{"type":"error","status":"","status_code":0,"operation":"","error_code":500,"error":"a \"quoted\" \u003cmsg\u003e","metadata":null}` + "\n"
	if rec.Code != 500 || rec.Body.String() != want {
		t.Fatalf("got %d %q want %q", rec.Code, rec.Body.String(), want)
	}
}
