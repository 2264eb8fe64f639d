package main

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
)

// Fault kinds.
const (
	faultLatency     = "latency"
	faultError       = "error"
	faultHang        = "hang"
	faultDrop        = "drop"
	faultMalformed   = "malformed"
	faultUnavailable = "unavailable"
	faultRefuse      = "refuse"
	faultCSRDeny     = "csr-deny"
	faultDropAnswer  = "drop-answer"
	faultHuge        = "huge"
)

// defaultHugeBytes is the size of a huge fault's answer when the request names none.
const defaultHugeBytes = 100 << 20

// Endpoint names used by faults and call records.
const (
	epExpiry  = "expiry"
	epPlan    = "plan"
	epRun     = "run"
	epApprove = "approve"
	epRoot    = "root"
)

// Fault is one injected misbehaviour: a request as POST /faults sent it, under the id the
// simulator gave it. Its JSON is the id then the request's fields.
type Fault struct {
	ID string `json:"id"`
	faultRequest
}

// faultRequest is the body of POST /faults (the id is assigned by the simulator). Empty
// Cluster/Node/Endpoint match anything. Count > 0 is the number of remaining applications; 0
// means until cleared.
type faultRequest struct {
	Cluster  string `json:"cluster"`
	Node     string `json:"node"`
	Endpoint string `json:"endpoint"`
	Kind     string `json:"kind"`
	DelayMs  int    `json:"delayMs"`
	Status   int    `json:"status"`
	Message  string `json:"message"`
	Count    int    `json:"count"`
	// Bytes is the size of a huge fault's answer.
	Bytes int64 `json:"bytes"`
}

// validate checks a fault request and fills the defaults of the error kind.
func (f *faultRequest) validate() error {
	switch f.Endpoint {
	case "", epExpiry, epPlan, epRun, epApprove, epRoot:
	default:
		return fmt.Errorf("unknown endpoint %q (want expiry, plan, run, approve, root or empty)", f.Endpoint)
	}
	switch f.Kind {
	case faultLatency:
		if f.DelayMs < 0 {
			return fmt.Errorf("delayMs must not be negative")
		}
	case faultError:
		if f.Status == 0 {
			f.Status = 500
		}
		if f.Status < 400 || f.Status > 599 {
			return fmt.Errorf("status %d: an error fault needs a 4xx or 5xx status", f.Status)
		}
		if f.Message == "" {
			f.Message = "simulated error"
		}
	case faultCSRDeny:
		if f.Endpoint != "" && f.Endpoint != epApprove {
			return fmt.Errorf("a csr-deny fault acts on approve; endpoint must be empty or %q", epApprove)
		}
	case faultDropAnswer:
		if f.Endpoint != "" && f.Endpoint != epRun {
			return fmt.Errorf("a drop-answer fault acts on run; endpoint must be empty or %q", epRun)
		}
	case faultHuge:
		if f.Bytes < 0 {
			return fmt.Errorf("bytes must not be negative")
		}
		if f.Bytes == 0 {
			f.Bytes = defaultHugeBytes
		}
		if f.Status == 0 {
			f.Status = http.StatusOK
		}
		if f.Status != http.StatusOK && (f.Status < 400 || f.Status > 599) {
			return fmt.Errorf("status %d: a huge fault answers 200, 4xx or 5xx", f.Status)
		}
	case faultHang, faultDrop, faultMalformed, faultUnavailable, faultRefuse:
	default:
		return fmt.Errorf("unknown kind %q", f.Kind)
	}
	if f.Count < 0 {
		return fmt.Errorf("count must not be negative")
	}
	return nil
}

// requestFaultKinds are the kinds applied by the k8sd request middleware; refuse
// acts on the listener, csr-deny inside approve and drop-answer at the end of run. A latency
// fault composes with the others: the request is delayed first (latencyKinds), then the first
// matching fault of another kind applies (outcomeKinds).
var (
	requestFaultKinds = map[string]bool{
		faultLatency: true, faultError: true, faultHang: true, faultDrop: true,
		faultMalformed: true, faultUnavailable: true, faultHuge: true,
	}
	latencyKinds = map[string]bool{faultLatency: true}
	outcomeKinds = map[string]bool{
		faultError: true, faultHang: true, faultDrop: true, faultMalformed: true, faultUnavailable: true,
		faultHuge: true,
	}
)

// faultStore holds the faults in insertion order. Matching scans them (a handful, whatever
// the number of nodes) under one mutex.
type faultStore struct {
	mu     sync.Mutex
	next   int
	faults []*Fault
	// onChange runs after a refuse fault was added or removed (outside the lock): it
	// re-evaluates the listeners.
	onChange func()
}

func (s *faultStore) add(r faultRequest) Fault {
	s.mu.Lock()
	s.next++
	f := &Fault{ID: "f" + strconv.Itoa(s.next), faultRequest: r}
	s.faults = append(s.faults, f)
	out := *f
	s.mu.Unlock()
	if f.Kind == faultRefuse {
		s.changed()
	}
	return out
}

func (s *faultStore) changed() {
	if s.onChange != nil {
		s.onChange()
	}
}

func (s *faultStore) list() []Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Fault, 0, len(s.faults))
	for _, f := range s.faults {
		out = append(out, *f)
	}
	return out
}

// remove deletes one fault; false when the id is unknown.
func (s *faultStore) remove(id string) bool {
	s.mu.Lock()
	found, refuse := false, false
	for i, f := range s.faults {
		if f.ID == id {
			s.faults = append(s.faults[:i], s.faults[i+1:]...)
			found, refuse = true, f.Kind == faultRefuse
			break
		}
	}
	s.mu.Unlock()
	if refuse {
		s.changed()
	}
	return found
}

// clear deletes all faults, or only those of one cluster; it returns how many.
func (s *faultStore) clear(cluster string) int {
	s.mu.Lock()
	kept := s.faults[:0]
	n, refuse := 0, false
	for _, f := range s.faults {
		if cluster != "" && f.Cluster != cluster {
			kept = append(kept, f)
			continue
		}
		n++
		refuse = refuse || f.Kind == faultRefuse
	}
	clear(s.faults[len(kept):])
	s.faults = kept
	s.mu.Unlock()
	if refuse {
		s.changed()
	}
	return n
}

func (f *Fault) matches(cluster, node, endpoint string) bool {
	return (f.Cluster == "" || f.Cluster == cluster) &&
		(f.Node == "" || f.Node == node) &&
		(f.Endpoint == "" || f.Endpoint == endpoint)
}

// take returns the first fault (insertion order) of one of kinds that matches, and
// consumes one application of it. A request to an unknown path has endpoint "" and
// only matches faults for all endpoints.
func (s *faultStore) take(cluster, node, endpoint string, kinds map[string]bool) (Fault, bool) {
	s.mu.Lock()
	for i, f := range s.faults {
		if !kinds[f.Kind] || !f.matches(cluster, node, endpoint) {
			continue
		}
		out := *f
		if f.Count > 0 {
			f.Count--
			if f.Count == 0 {
				s.faults = append(s.faults[:i], s.faults[i+1:]...)
			}
		}
		s.mu.Unlock()
		return out, true
	}
	s.mu.Unlock()
	return Fault{}, false
}

// refused reports whether a refuse fault covers this node (its endpoint and count are ignored).
func (s *faultStore) refused(cluster, node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.faults {
		if f.Kind == faultRefuse && (f.Cluster == "" || f.Cluster == cluster) && (f.Node == "" || f.Node == node) {
			return true
		}
	}
	return false
}
