package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"
)

// Record is one thing the double did (or deliberately did not do) to a Machine. The records
// file holds one JSON object per line, appended as it happens, so a test can prove that the
// double did or did not act on a Machine. Tokens never appear in records.
//
//	{"time":"2026-01-02T03:04:05.123456789Z","namespace":"fleet","machine":"alpha-cp-0",
//	 "cluster":"alpha","node":"ip-127-10-1-1","step":"run","outcome":"ok",
//	 "seed":4242,"detail":"expiration-seconds=1798765432"}
//
// Steps (in the order a reconcile can produce them) and their outcomes:
//
//	no-node-ref   requeued   no status.nodeRef; looked at again in 5 s
//	skip          skipped    trigger present and status in-progress: "already in progress"
//	clear-status  ok|error   in-progress without trigger: status deleted by a full Update
//	scope         error      CK8sConfig, config owner, Cluster, kubeconfig or token not usable
//	expiry        ok|error   certificates-expiry asked and the annotation patched (detail: date)
//	in-progress   ok|error   status in-progress patched (detail: the trigger's TTL)
//	ttl           error      the trigger's TTL did not parse (after in-progress, like the provider)
//	plan          ok|error   seed
//	run           ok|error   seed; detail expiration-seconds=<unix> or the error
//	approve       ok|error   seed; detail names the control-plane node that answered the probe
//	done          ok|error   trigger removed, status done and expiry patched (detail: expiry)
//	failed        ok|error   the failure Update (status failed); error = it conflicted, so the
//	                         Machine stays in-progress (design.md section 7 item 1)
type Record struct {
	Time      string `json:"time"`
	Namespace string `json:"namespace"`
	Machine   string `json:"machine"`
	Cluster   string `json:"cluster,omitempty"`
	Node      string `json:"node,omitempty"`
	Step      string `json:"step"`
	Outcome   string `json:"outcome"`
	Seed      *int   `json:"seed,omitempty"`
	Detail    string `json:"detail,omitempty"`
}

const (
	outcomeOK       = "ok"
	outcomeError    = "error"
	outcomeSkipped  = "skipped"
	outcomeRequeued = "requeued"
)

// recorder appends records to a file (and mirrors them to the log).
type recorder struct {
	mu   sync.Mutex
	file *os.File
}

func openRecorder(path string) (*recorder, error) {
	if path == "" {
		return &recorder{}, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &recorder{file: f}, nil
}

// add writes one line with a single write call, so a reader sees whole lines (a reader should
// still ignore a last line without its newline).
func (r *recorder) add(rec Record) {
	rec.Time = time.Now().UTC().Format(time.RFC3339Nano)
	line, err := json.Marshal(rec)
	if err != nil {
		logf("record: %v", err)
		return
	}
	logf("record %s", line)
	if r.file == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.file.Write(append(line, '\n')); err != nil {
		logf("record: %v", err)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().UTC().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}
