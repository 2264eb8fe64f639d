package main

// Behaviours of released k8sd that clients must survive (k8sd-protocol.md, "What released
// k8sd does that a client must survive"): lost run answers skip the restart, the restart
// takes k8sd, the kubelet and a lone control plane's API server away, approve has no
// deadline and fails on an approved CSR, auto-approve.

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// postFresh sends one request on a new connection (no transparent retry on a reused one)
// and returns the response or the transport error.
func (e *testEnv) postFresh(ctx context.Context, node, path, body string, headers ...string) (response, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", e.servers[node].URL+path, strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := (&http.Client{Transport: &http.Transport{}}).Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, err
	}
	return response{status: resp.StatusCode, close: resp.Close, header: resp.Header, body: string(b)}, nil
}

func runBody(seed int64, seconds int64) string {
	return fmt.Sprintf(`{"certificates":null,"seed":%d,"expiration-seconds":%d,"extra-sans":null}`, seed, seconds)
}

func parseRFC3339(t *testing.T, s string) time.Time {
	t.Helper()
	ts, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

func TestControlPlaneRunAnswerLostSkipsRestart(t *testing.T) {
	e := newTestEnv(t)
	cp := "alpha-cp-0-vm"
	n := e.sim.findNode("alpha", cp)
	before := n.status()
	if before.DiskCertNotAfter != before.CertNotAfter || before.Restarts != 0 {
		t.Fatalf("fresh node: %+v", before)
	}

	e.sim.faults.add(faultRequest{Node: cp, Kind: faultDropAnswer, Count: 1})
	if r, err := e.postFresh(context.Background(), cp, pathRun, runBody(7, 86400), "node-token", tokCP0); err == nil {
		t.Fatalf("drop-answer: run answered %d %s", r.status, r.body)
	}
	st := n.status()
	disk := parseRFC3339(t, st.DiskCertNotAfter)
	if d := time.Until(disk); d < 86000*time.Second || d > 86800*time.Second {
		t.Errorf("diskCertNotAfter %s: the run wrote its certificate", st.DiskCertNotAfter)
	}
	if st.CertNotAfter != before.CertNotAfter || st.Restarts != 0 || fmt.Sprint(st.SeedsRun) != "[7]" {
		t.Errorf("lost answer: the node must keep serving the old certificate, no restart: %+v", st)
	}
	calls := e.sim.calls.list("alpha", cp)
	if len(calls) != 1 || calls[0].Fault != faultDropAnswer || calls[0].Status != 0 {
		t.Errorf("call record %+v", calls)
	}
	if len(e.sim.faults.list()) != 0 {
		t.Errorf("count=1 drop-answer fault not consumed")
	}

	// A later run whose answer arrives serves its own new certificate.
	r := e.do(t, cp, "POST", pathRun, runBody(8, 7200), "node-token", tokCP0)
	var m runMeta
	if r.status != 200 || json.Unmarshal([]byte(r.body), &m) != nil {
		t.Fatalf("run: %d %s", r.status, r.body)
	}
	st = n.status()
	if parseRFC3339(t, st.CertNotAfter).Unix() != m.Metadata.ExpirationSeconds || st.DiskCertNotAfter != st.CertNotAfter ||
		st.Restarts != 1 || fmt.Sprint(st.SeedsRun) != "[7 8]" {
		t.Errorf("after a delivered run (answer %d): %+v", m.Metadata.ExpirationSeconds, st)
	}
}

func TestWorkerRunAnswerLostSkipsRestart(t *testing.T) {
	e := newTestEnv(t)
	e.startSigner(t)
	w := "alpha-w-0-vm"
	n := e.sim.findNode("alpha", w)
	before := n.status()
	e.sim.faults.add(faultRequest{Cluster: "alpha", Node: w, Endpoint: epRun, Kind: faultDropAnswer, Count: 1})

	runErr := make(chan error, 1)
	go func() {
		_, err := e.postFresh(context.Background(), w, pathRun, runBody(12, 3600), "node-token", tokW0)
		runErr <- err
	}()
	if r := e.do(t, "alpha-cp-0-vm", "POST", pathApprove, `{"seed":12}`, "capi-auth-token", tokCAPI); r.status != 200 {
		t.Fatalf("approve: %d %s", r.status, r.body)
	}
	select {
	case err := <-runErr:
		if err == nil {
			t.Fatal("drop-answer: run answered")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not end")
	}
	st := n.status()
	if st.CertNotAfter != before.CertNotAfter || st.DiskCertNotAfter == before.DiskCertNotAfter || st.Restarts != 0 ||
		fmt.Sprint(st.SeedsRun) != "[12]" {
		t.Errorf("lost worker answer: %+v (before %+v)", st, before)
	}

	// The seed is spent: only a new plan's seed refreshes the node.
	if r, err := e.postFresh(context.Background(), w, pathRun, runBody(12, 3600), "node-token", tokW0); err != nil || r.status != 500 ||
		!strings.Contains(r.body, "already exists") {
		t.Fatalf("same seed again: %v %+v", err, r)
	}
	run, approve := runAndApprove(t, e, w, tokW0, "alpha-cp-0-vm", 13, 3600)
	if run.status != 200 || approve.status != 200 {
		t.Fatalf("new seed: run %d %s, approve %d %s", run.status, run.body, approve.status, approve.body)
	}
	st = n.status()
	if st.CertNotAfter != st.DiskCertNotAfter || st.CertNotAfter == before.CertNotAfter || st.Restarts != 1 ||
		fmt.Sprint(st.SeedsRun) != "[12 13]" {
		t.Errorf("after a delivered run: %+v", st)
	}
}

// A client that left before the answer gets none, and the restart is skipped.
func TestAnswerRunSkipsRestartWhenClientGone(t *testing.T) {
	e := newTestEnv(t)
	n := e.sim.findNode("alpha", "alpha-cp-0-vm")
	cert, err := n.cluster.ca.issueNodeCert(n.cfg, time.Now(), time.Now().Add(time.Hour), nil)
	if err != nil {
		t.Fatal(err)
	}
	n.writeToDisk(cert, 3)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequestWithContext(ctx, "POST", pathRun, nil)
	rec := httptest.NewRecorder()
	e.sim.answerRun(rec, req, n, cert.NotAfter.Unix(), func(string) {})
	if rec.Body.Len() != 0 {
		t.Errorf("answered a gone client: %q", rec.Body.String())
	}
	if st := n.status(); st.Restarts != 0 || st.CertNotAfter == st.DiskCertNotAfter {
		t.Errorf("restart not skipped: %+v", st)
	}
}

func TestApproveWaitsWithoutDeadlineThenFailsOnApprovedCSR(t *testing.T) {
	e := newTestEnv(t)
	cp := "alpha-cp-0-vm"
	done := make(chan response, 1)
	go func() {
		r, err := e.postFresh(context.Background(), cp, pathApprove, `{"seed":21}`, "capi-auth-token", tokCAPI)
		if err != nil {
			r = response{body: err.Error()}
		}
		done <- r
	}()
	select {
	case r := <-done:
		t.Fatalf("approve answered before the CSRs existed: %d %s", r.status, r.body)
	case <-time.After(400 * time.Millisecond):
	}
	for _, c := range workerCSRs(e.sim.findNode("alpha", "alpha-w-0-vm").cfg, 21) {
		if err := createCSR(context.Background(), e.wl.CertificatesV1().CertificateSigningRequests(), c, 3600); err != nil {
			t.Fatal(err)
		}
	}
	if r := await(t, done, 5*time.Second, "approve once the CSRs exist"); r.status != 200 {
		t.Fatalf("approve: %d %s", r.status, r.body)
	}

	// A second approve appends a second Approved condition: the API server rejects it.
	r := e.do(t, cp, "POST", pathApprove, `{"seed":21}`, "capi-auth-token", tokCAPI)
	name := "k8sd-21-worker-kubelet-serving"
	want := errorBody(500, fmt.Sprintf(`failed to approve worker node CSR: failed to approve CSR %s: CertificateSigningRequest.certificates.k8s.io %q is invalid: status.conditions[1].type: Duplicate value: "Approved"`, name, name))
	if r.status != 500 || r.body != want {
		t.Fatalf("second approve: %d %q, want %q", r.status, r.body, want)
	}
}

func TestAutoApproveAnnotation(t *testing.T) {
	e := newTestEnv(t)
	e.startSigner(t)
	ctl := httptest.NewServer(e.sim.controlHandler())
	defer ctl.Close()

	code, body := controlCall(t, ctl, "PUT", "/clusters/alpha/annotations", `{"k8sd/v1alpha1/csrsigning/auto-approve":"true"}`)
	var st ClusterStatus
	if code != 200 || json.Unmarshal([]byte(body), &st) != nil || st.Annotations[annotationAutoApprove] != "true" {
		t.Fatalf("PUT annotations: %d %s", code, body)
	}
	for path, want := range map[string]int{"/clusters/ghost/annotations": 404} {
		if code, _ := controlCall(t, ctl, "PUT", path, `{}`); code != want {
			t.Errorf("PUT %s: %d, want %d", path, code, want)
		}
	}
	if code, _ := controlCall(t, ctl, "PUT", "/clusters/alpha/annotations", `{"a":1}`); code != 400 {
		t.Errorf("non-string annotation accepted: %d", code)
	}

	// run alone completes: the signer approves and signs.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := e.postFresh(ctx, "alpha-w-0-vm", pathRun, runBody(31, 3600), "node-token", tokW0)
	if err != nil || r.status != 200 {
		t.Fatalf("run with auto-approve: %v %+v", err, r)
	}
	csr, err := e.wl.CertificatesV1().CertificateSigningRequests().Get(context.Background(), "k8sd-31-worker-kubelet-client", metav1.GetOptions{})
	if err != nil || !conditionTrue(csr, certv1.CertificateApproved) || csr.Status.Conditions[0].Reason != reasonAutoApproved {
		t.Fatalf("CSR not auto-approved: %v %+v", err, csr.Status.Conditions)
	}
	// approve comes too late: the CSRs are approved already.
	if r := e.do(t, "alpha-cp-0-vm", "POST", pathApprove, `{"seed":31}`, "capi-auth-token", tokCAPI); r.status != 500 ||
		!strings.Contains(r.body, "failed to approve worker node CSR: failed to approve CSR k8sd-31-worker-kubelet-serving: ") ||
		!strings.Contains(r.body, "Duplicate value") {
		t.Errorf("approve after auto-approve: %d %s", r.status, r.body)
	}

	// Switched off again: a run waits for approve.
	controlCall(t, ctl, "PUT", "/clusters/alpha/annotations", `{}`)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel2()
	if r, err := e.postFresh(ctx2, "alpha-w-1-vm", pathRun, runBody(32, 3600), "node-token", tokW1); err == nil {
		t.Errorf("run without auto-approve answered without approve: %+v", r)
	}
	code, body = controlCall(t, ctl, "GET", "/clusters", "")
	var all []ClusterStatus
	if code != 200 || json.Unmarshal([]byte(body), &all) != nil || len(all) != 1 || all[0].Name != "alpha" ||
		all[0].ControlPlanes != 2 || len(all[0].Annotations) != 0 {
		t.Errorf("GET /clusters: %d %s", code, body)
	}
}

func TestAutoApproveFromConfig(t *testing.T) {
	cfg := testConfig(t)
	cfg.Clusters[0].Annotations = map[string]string{annotationAutoApprove: "true"}
	e := newTestEnvWith(t, cfg)
	if !e.sim.clusters[0].autoApprove() {
		t.Fatal("annotation from the config not applied")
	}
	e.startSigner(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r, err := e.postFresh(ctx, "alpha-w-0-vm", pathRun, runBody(41, 3600), "node-token", tokW0); err != nil || r.status != 200 {
		t.Fatalf("run: %v %+v", err, r)
	}
}

func TestRestartHookOnlyForALoneControlPlane(t *testing.T) {
	var mu sync.Mutex
	var hooked []string
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hooked = append(hooked, r.Method+" "+r.URL.Path)
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	defer hook.Close()
	hookCalls := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string{}, hooked...)
	}
	cfg := testConfig(t)
	cfg.Clusters = append(cfg.Clusters, soloConfig())
	cfg.RestartHook = hook.URL + "/"
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	e := newTestEnvWith(t, cfg)
	solo := e.sim.clusters[1]

	// Two control planes: the API server stays.
	if r := e.do(t, "alpha-cp-0-vm", "POST", pathRun, runBody(1, 3600), "node-token", tokCP0); r.status != 200 {
		t.Fatalf("alpha run: %d %s", r.status, r.body)
	}
	// A lone control plane whose answer is lost does not restart either.
	e.sim.faults.add(faultRequest{Cluster: "solo", Kind: faultDropAnswer, Count: 1})
	if _, err := e.postFresh(context.Background(), "solo-cp-0-vm", pathRun, runBody(2, 3600), "node-token", tokSoloCP); err == nil {
		t.Fatal("drop-answer: answered")
	}
	time.Sleep(200 * time.Millisecond)
	if got := hookCalls(); len(got) != 0 || solo.status().APIServerRestarts != 0 {
		t.Fatalf("hook called without a delivered lone control-plane run: %v", got)
	}

	if r := e.do(t, "solo-cp-0-vm", "POST", pathRun, runBody(3, 3600), "node-token", tokSoloCP); r.status != 200 {
		t.Fatalf("solo run: %d %s", r.status, r.body)
	}
	waitFor(t, func() bool { return len(hookCalls()) == 1 })
	if got := hookCalls(); got[0] != "POST /clusters/solo/restart-apiserver" {
		t.Errorf("hook call %v", got)
	}
	if st := solo.status(); st.APIServerRestarts != 1 || st.ControlPlanes != 1 {
		t.Errorf("solo status %+v", st)
	}
	if st := e.sim.clusters[0].status(); st.APIServerRestarts != 0 {
		t.Errorf("alpha status %+v", st)
	}
}

// TestRestartTakesK8sdAndKubeletDown runs real listeners: a delivered run takes k8sd down at
// once and the kubelet (with its open port-forward tunnels) once the relays ended; a lost
// answer takes nothing down.
func TestRestartTakesK8sdAndKubeletDown(t *testing.T) {
	cfg := testConfig(t)
	cfg.RestartSeconds = 0.6
	nc := &cfg.Clusters[0].Nodes[0]
	nc.Address, nc.MicroclusterPort, nc.KubeletPort = "127.0.0.1", freePort(t), freePort(t)
	e := newTestEnvWith(t, cfg)
	n := e.startK8sdListener(t, "alpha", "alpha-cp-0-vm")
	kubeletCert, err := selfSignedServing(nc.Name, nc.Address)
	if err != nil {
		t.Fatal(err)
	}
	// A stand-in kubelet whose every request becomes a long-lived upgraded connection,
	// as a port-forward tunnel is.
	n.kubelet = &svcListener{
		addr: net.JoinHostPort(nc.Address, strconv.Itoa(nc.KubeletPort)),
		handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: test\r\nConnection: Upgrade\r\n\r\n")
			brw.Flush()
			io.Copy(io.Discard, conn)
		}),
		tlsConf:  &tls.Config{Certificates: []tls.Certificate{*kubeletCert}, NextProtos: []string{"http/1.1"}},
		log:      t.Logf,
		errorLog: testLogger(t),
	}
	if err := n.kubelet.start(); err != nil {
		t.Fatal(err)
	}
	defer n.kubelet.stop()

	k8sdAddr := net.JoinHostPort(nc.Address, strconv.Itoa(nc.MicroclusterPort))
	kubeletAddr := n.kubelet.addr
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	run := func(seed int) (*http.Response, error) {
		req, _ := http.NewRequest("POST", "https://"+k8sdAddr+pathRun, strings.NewReader(runBody(int64(seed), 3600)))
		req.Header.Set("node-token", tokCP0)
		return client.Do(req)
	}
	tunnel := func() net.Conn {
		t.Helper()
		c, err := tls.Dial("tcp", kubeletAddr, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "GET /portForward/kube-system/p HTTP/1.1\r\nHost: kubelet\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n")
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.Contains(line, "101") {
			t.Fatalf("tunnel: %q %v", line, err)
		}
		return c
	}
	// open reports whether the tunnel is still up after wait (a read times out).
	open := func(c net.Conn, wait time.Duration) bool {
		c.SetReadDeadline(time.Now().Add(wait))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		return err != nil && errors.As(err, &ne) && ne.Timeout()
	}

	// Lost answer: nothing goes down, the tunnel stays.
	tun := tunnel()
	defer tun.Close()
	e.sim.faults.add(faultRequest{Kind: faultDropAnswer, Count: 1})
	if resp, err := run(1); err == nil {
		resp.Body.Close()
		t.Fatal("drop-answer: answered")
	}
	if refusedAt(k8sdAddr) || refusedAt(kubeletAddr) || !open(tun, 900*time.Millisecond) {
		t.Fatal("a run whose answer was lost restarted the node")
	}

	// Delivered: a relay still carries the answer, so the kubelet waits for it.
	n.relayStarted()
	relayEnd := time.Now().Add(400 * time.Millisecond)
	time.AfterFunc(400*time.Millisecond, n.relayEnded)
	resp, err := run(2)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("run: %v %v", resp, err)
	}
	resp.Body.Close()
	if !refusedAt(k8sdAddr) || !refusedAt(kubeletAddr) {
		t.Fatal("k8sd and kubelet must refuse connections right after a delivered run")
	}
	if !open(tun, 200*time.Millisecond) {
		t.Fatal("the tunnel closed while a relay was still carrying the answer")
	}
	if open(tun, 2*time.Second) {
		t.Fatal("the kubelet restart left a port-forward tunnel open")
	}
	if time.Now().Before(relayEnd) {
		t.Fatal("tunnel closed before the relay ended")
	}
	waitFor(t, func() bool { return !refusedAt(k8sdAddr) && !refusedAt(kubeletAddr) })
	if st := n.status(); st.Restarts != 1 || fmt.Sprint(st.SeedsRun) != "[1 2]" || st.CertNotAfter != st.DiskCertNotAfter {
		t.Errorf("status %+v", st)
	}
	tunnel().Close()
}
