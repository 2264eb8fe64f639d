package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestFaultKinds(t *testing.T) {
	e := newTestEnv(t)
	cp := "alpha-cp-0-vm"
	add := func(r faultRequest) string {
		t.Helper()
		if err := r.validate(); err != nil {
			t.Fatal(err)
		}
		return e.sim.faults.add(r).ID
	}

	id := add(faultRequest{Node: cp, Endpoint: epExpiry, Kind: faultError, Status: 502, Message: "boom"})
	if r := e.do(t, cp, "POST", pathExpiry, "{}", "node-token", tokCP0); r.status != 502 || r.body != errorBody(502, "boom") {
		t.Errorf("error fault: %d %q", r.status, r.body)
	}
	// Endpoint filter: plan is unaffected.
	if r := e.do(t, cp, "POST", pathPlan, "{}", "node-token", tokCP0); r.status != 200 {
		t.Errorf("plan under an expiry fault: %d %s", r.status, r.body)
	}
	// Node filter: another node is unaffected.
	if r := e.do(t, "alpha-cp-1-vm", "POST", pathExpiry, "{}", "node-token", tokCP1); r.status != 200 {
		t.Errorf("other node under a node fault: %d %s", r.status, r.body)
	}
	e.sim.faults.remove(id)

	add(faultRequest{Node: cp, Kind: faultUnavailable, Count: 1})
	if r := e.do(t, cp, "GET", "/", ""); r.status != 503 || r.body != errorBody(503, "Database is not yet initialized") {
		t.Errorf("unavailable: %d %q", r.status, r.body)
	}
	if r := e.do(t, cp, "GET", "/", ""); r.status != 200 {
		t.Errorf("count=1 fault applied twice: %d", r.status)
	}

	add(faultRequest{Node: cp, Endpoint: epRoot, Kind: faultMalformed, Count: 1})
	r := e.do(t, cp, "GET", "/", "")
	if r.status != 200 || json.Valid([]byte(r.body)) {
		t.Errorf("malformed: %d %q", r.status, r.body)
	}

	add(faultRequest{Node: cp, Kind: faultDrop, Count: 1})
	// A fresh transport: on a reused connection Go would retry the GET transparently.
	if _, err := (&http.Client{Transport: &http.Transport{}}).Get(e.servers[cp].URL + "/"); err == nil {
		t.Errorf("drop: request succeeded")
	}

	add(faultRequest{Node: cp, Kind: faultLatency, DelayMs: 150, Count: 1})
	start := time.Now()
	if r := e.do(t, cp, "GET", "/", ""); r.status != 200 || time.Since(start) < 150*time.Millisecond {
		t.Errorf("latency: %d after %s", r.status, time.Since(start))
	}

	add(faultRequest{Node: cp, Kind: faultHang, Count: 1})
	e.abandon(t, 200*time.Millisecond, cp, "GET", "/", "")

	// Every call is recorded with the fault that hit it, the hang once the client left.
	waitFor(t, func() bool {
		done, _ := e.callsDone(cp)
		return done == 8
	})
	var kinds []string
	var statuses []string
	for _, c := range e.sim.calls.list("alpha", cp) {
		kinds = append(kinds, c.Fault)
		statuses = append(statuses, strconv.Itoa(c.Status))
	}
	if got, want := strings.Join(kinds, ","), "error,,unavailable,,malformed,drop,latency,hang"; got != want {
		t.Errorf("faults recorded %s, want %s", got, want)
	}
	if got, want := strings.Join(statuses, ","), "502,200,503,200,200,0,200,0"; got != want {
		t.Errorf("statuses recorded %s, want %s", got, want)
	}
}

func TestFaultOrderAndCount(t *testing.T) {
	s := &faultStore{}
	s.add(faultRequest{Cluster: "alpha", Kind: faultError, Status: 500, Message: "first", Count: 2})
	s.add(faultRequest{Kind: faultError, Status: 500, Message: "second"})
	s.add(faultRequest{Cluster: "alpha", Kind: faultRefuse})
	for i, want := range []string{"first", "first", "second", "second"} {
		f, ok := s.take("alpha", "n", epPlan, requestFaultKinds)
		if !ok || f.Message != want {
			t.Fatalf("take %d: %v %+v, want %s", i, ok, f, want)
		}
	}
	if !s.refused("alpha", "n") || s.refused("beta", "n") {
		t.Fatal("refuse matching")
	}
	// A fault for one endpoint does not match unknown paths (endpoint "").
	s.clear("")
	s.add(faultRequest{Endpoint: epRun, Kind: faultHang})
	if _, ok := s.take("alpha", "n", "", requestFaultKinds); ok {
		t.Fatal("run fault matched an unknown path")
	}
	if _, ok := s.take("alpha", "n", epRun, requestFaultKinds); !ok {
		t.Fatal("run fault did not match run")
	}
}

func TestFaultValidation(t *testing.T) {
	for _, r := range []faultRequest{
		{Kind: "explode"},
		{Kind: faultError, Status: 200},
		{Kind: faultLatency, DelayMs: -1},
		{Kind: faultHang, Endpoint: "expiry/"},
		{Kind: faultHang, Count: -1},
		{Kind: faultCSRDeny, Endpoint: epRun},
		{Kind: faultDropAnswer, Endpoint: epPlan},
		{Kind: faultHuge, Bytes: -1},
		{Kind: faultHuge, Status: 302},
	} {
		if err := r.validate(); err == nil {
			t.Errorf("%+v accepted", r)
		}
	}
	r := faultRequest{Kind: faultError}
	if err := r.validate(); err != nil || r.Status != 500 || r.Message == "" {
		t.Errorf("error defaults: %v %+v", err, r)
	}
	r = faultRequest{Kind: faultHuge, Endpoint: epPlan}
	if err := r.validate(); err != nil || r.Bytes != 100<<20 || r.Status != 200 {
		t.Errorf("huge defaults: %v %+v", err, r)
	}
	for _, ep := range []string{"", epRun} {
		r := faultRequest{Kind: faultDropAnswer, Endpoint: ep}
		if err := r.validate(); err != nil {
			t.Errorf("drop-answer at %q: %v", ep, err)
		}
	}
}

// discardWriter is a ResponseWriter that counts what it is sent and, once failAfter bytes
// went through (when set), fails every write like a connection the client closed.
type discardWriter struct {
	header    http.Header
	status    int
	n         int64
	writes    int
	failAfter int64
}

func (d *discardWriter) Header() http.Header {
	if d.header == nil {
		d.header = http.Header{}
	}
	return d.header
}

func (d *discardWriter) WriteHeader(code int) { d.status = code }

func (d *discardWriter) Write(b []byte) (int, error) {
	d.writes++
	if d.failAfter > 0 && d.n >= d.failAfter {
		return 0, errors.New("write: broken pipe")
	}
	d.n += int64(len(b))
	return len(b), nil
}

func (d *discardWriter) Flush() {}

func TestHugeFault(t *testing.T) {
	e := newTestEnv(t)
	cp := "alpha-cp-0-vm"
	add := func(r faultRequest) {
		t.Helper()
		if err := r.validate(); err != nil {
			t.Fatal(err)
		}
		e.sim.faults.add(r)
	}

	// A 200 whose envelope is valid JSON, exactly the size asked, chunked (no Content-Length).
	const size = 3<<20 + 7
	add(faultRequest{Node: cp, Endpoint: epPlan, Kind: faultHuge, Bytes: size, Count: 1})
	r := e.do(t, cp, "POST", pathPlan, "{}", "node-token", tokCP0)
	if r.status != 200 || len(r.body) != size || r.header.Get("Content-Length") != "" {
		t.Fatalf("huge: %d, %d bytes, Content-Length %q", r.status, len(r.body), r.header.Get("Content-Length"))
	}
	var env struct {
		Type     string            `json:"type"`
		Metadata map[string]string `json:"metadata"`
	}
	if err := json.Unmarshal([]byte(r.body), &env); err != nil || env.Type != "sync" ||
		int64(len(env.Metadata["filler"])) < size-200 {
		t.Errorf("huge body is not a padded sync envelope: %v %q…", err, r.body[:120])
	}
	// count=1: the next plan is answered normally.
	if r := e.do(t, cp, "POST", pathPlan, "{}", "node-token", tokCP0); r.status != 200 || len(r.body) > 1000 {
		t.Errorf("plan after the huge fault: %d, %d bytes", r.status, len(r.body))
	}

	// An error status pads the error string; a size below the envelope cuts it.
	add(faultRequest{Node: cp, Endpoint: epRun, Kind: faultHuge, Status: 500, Bytes: 1 << 20, Count: 1})
	r = e.do(t, cp, "POST", pathRun, "{}", "node-token", tokCP0)
	if r.status != 500 || len(r.body) != 1<<20 || !strings.HasPrefix(r.body, `{"type":"error","status":"","status_code":0,"operation":"","error_code":500,"error":"xxx`) ||
		!strings.HasSuffix(r.body, `xxx","metadata":null}`+"\n") || !json.Valid([]byte(r.body)) {
		t.Errorf("huge error: %d, %d bytes", r.status, len(r.body))
	}
	add(faultRequest{Node: cp, Endpoint: epRoot, Kind: faultHuge, Bytes: 40, Count: 1})
	if r := e.do(t, cp, "GET", "/", ""); r.status != 200 || r.body != `{"type":"sync","status":"Success","statu` {
		t.Errorf("huge below the envelope: %d %q", r.status, r.body)
	}
	var recorded []string
	for _, c := range e.sim.calls.list("alpha", cp) {
		recorded = append(recorded, c.Endpoint+":"+strconv.Itoa(c.Status)+":"+c.Fault)
	}
	if got, want := strings.Join(recorded, ","), "plan:200:huge,plan:200:,run:500:huge,root:200:huge"; got != want {
		t.Errorf("calls recorded %s, want %s", got, want)
	}

	// Through the control API: bytes defaults to 100 MiB and is listed.
	ctl := httptest.NewServer(e.sim.controlHandler())
	defer ctl.Close()
	if code, body := controlCall(t, ctl, "POST", "/faults", `{"node":"alpha-w-0-vm","endpoint":"plan","kind":"huge","bytes":-5}`); code != 400 {
		t.Errorf("negative bytes: %d %s", code, body)
	}
	controlCall(t, ctl, "POST", "/faults", `{"node":"alpha-w-0-vm","endpoint":"plan","kind":"huge"}`)
	controlCall(t, ctl, "POST", "/faults", `{"node":"alpha-w-1-vm","endpoint":"plan","kind":"huge","status":503,"bytes":2048}`)
	code, body := controlCall(t, ctl, "GET", "/faults", "")
	var faults []Fault
	if code != 200 || json.Unmarshal([]byte(body), &faults) != nil || len(faults) != 2 ||
		faults[0].Bytes != 100<<20 || faults[0].Status != 200 || faults[1].Bytes != 2048 || faults[1].Status != 503 {
		t.Errorf("GET /faults: %d %s", code, body)
	}
}

func TestHugeAnswerIsStreamed(t *testing.T) {
	// The default size goes out in full without being built: far less allocated than sent.
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	w := &discardWriter{}
	sent, err := writeHuge(context.Background(), w, 200, defaultHugeBytes)
	runtime.ReadMemStats(&after)
	if err != nil || sent != defaultHugeBytes || w.n != defaultHugeBytes || w.status != 200 {
		t.Fatalf("sent %d (%d written, status %d): %v", sent, w.n, w.status, err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
		t.Errorf("%d bytes allocated to send %d", alloc, sent)
	}

	// A client that leaves stops it: at the first failed write, or once the request is over.
	w = &discardWriter{failAfter: 1 << 20}
	sent, err = writeHuge(context.Background(), w, 200, defaultHugeBytes)
	if err == nil || sent > 1<<20+hugeChunk || w.writes > (1<<20)/hugeChunk+2 {
		t.Errorf("after a failed write: sent %d in %d writes: %v", sent, w.writes, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w = &discardWriter{}
	if sent, err := writeHuge(ctx, w, 200, defaultHugeBytes); !errors.Is(err, context.Canceled) || sent != 0 {
		t.Errorf("client gone: sent %d: %v", sent, err)
	}
}
