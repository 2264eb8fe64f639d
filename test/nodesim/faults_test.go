package main

import (
	"context"
	"encoding/json"
	"net/http"
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
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", e.servers[cp].URL+"/", nil)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Errorf("hang: answered %d", resp.StatusCode)
	}

	// Every call is recorded with the fault that hit it, the hang once the client left.
	waitFor(t, func() bool {
		e.sim.calls.mu.Lock()
		defer e.sim.calls.mu.Unlock()
		n := 0
		for _, c := range e.sim.calls.entries {
			if c.rec.Node == cp && c.done {
				n++
			}
		}
		return n == 8
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
	} {
		if err := r.validate(); err == nil {
			t.Errorf("%+v accepted", r)
		}
	}
	r := faultRequest{Kind: faultError}
	if err := r.validate(); err != nil || r.Status != 500 || r.Message == "" {
		t.Errorf("error defaults: %v %+v", err, r)
	}
	for _, ep := range []string{"", epRun} {
		r := faultRequest{Kind: faultDropAnswer, Endpoint: ep}
		if err := r.validate(); err != nil {
			t.Errorf("drop-answer at %q: %v", ep, err)
		}
	}
}
