package main

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// The control API lets tests inject faults, read what the nodes were asked, and
// inspect or reinstall nodes. Plain HTTP, JSON in and out.

// CallRecord is one k8sd request as tests see it. Header values are never kept:
// they include tokens.
type CallRecord struct {
	Cluster    string   `json:"cluster"`
	Node       string   `json:"node"`
	Endpoint   string   `json:"endpoint"`
	Method     string   `json:"method"`
	Path       string   `json:"path"`
	Headers    []string `json:"headers"`
	Body       string   `json:"body"`
	Status     int      `json:"status"`
	Fault      string   `json:"fault"`
	StartedAt  string   `json:"startedAt"`
	DurationMs float64  `json:"durationMs"`
}

type callEntry struct {
	rec     CallRecord
	started time.Time
	done    bool
}

type callLog struct {
	mu      sync.Mutex
	entries []*callEntry
}

// begin records a call as started (before any fault applies).
func (l *callLog) begin(n *node, ep string, r *http.Request, body []byte, started time.Time) *callEntry {
	names := map[string]bool{}
	for k := range r.Header {
		names[strings.ToLower(k)] = true
	}
	if r.Host != "" {
		// Go moves Host out of the header map; it was on the wire all the same.
		names["host"] = true
	}
	headers := make([]string, 0, len(names))
	for k := range names {
		headers = append(headers, k)
	}
	sort.Strings(headers)
	e := &callEntry{
		started: started,
		rec: CallRecord{
			Cluster:   n.cluster.cfg.Name,
			Node:      n.cfg.Name,
			Endpoint:  ep,
			Method:    r.Method,
			Path:      r.URL.Path,
			Headers:   headers,
			Body:      string(body),
			StartedAt: started.UTC().Format(time.RFC3339Nano),
		},
	}
	l.mu.Lock()
	l.entries = append(l.entries, e)
	l.mu.Unlock()
	return e
}

func (l *callLog) setFault(e *callEntry, kind string) {
	l.mu.Lock()
	e.rec.Fault = kind
	l.mu.Unlock()
}

// answered completes the record when the status is sent: durationMs is the time to
// the answer.
func (l *callLog) answered(e *callEntry, status int, d time.Duration) {
	l.mu.Lock()
	e.rec.Status, e.rec.DurationMs, e.done = status, float64(d)/float64(time.Millisecond), true
	l.mu.Unlock()
}

// finish completes a record that got no answer (hang, drop, client gone).
func (l *callLog) finish(e *callEntry, d time.Duration) {
	l.mu.Lock()
	if !e.done {
		e.rec.DurationMs, e.done = float64(d)/float64(time.Millisecond), true
	}
	l.mu.Unlock()
}

func (e *callEntry) matches(cluster, node string) bool {
	return (cluster == "" || e.rec.Cluster == cluster) && (node == "" || e.rec.Node == node)
}

// list returns the matching records in arrival order; a call still in progress has
// status 0 and its duration so far.
func (l *callLog) list(cluster, node string) []CallRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := []CallRecord{}
	for _, e := range l.entries {
		if !e.matches(cluster, node) {
			continue
		}
		rec := e.rec
		if !e.done {
			rec.DurationMs = float64(time.Since(e.started)) / float64(time.Millisecond)
		}
		out = append(out, rec)
	}
	return out
}

func (l *callLog) clear(cluster, node string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	kept := l.entries[:0]
	for _, e := range l.entries {
		if !e.matches(cluster, node) {
			kept = append(kept, e)
		}
	}
	n := len(l.entries) - len(kept)
	clear(l.entries[len(kept):])
	l.entries = kept
	return n
}

// NodeStatus is the GET /nodes view of one node.
type NodeStatus struct {
	Cluster               string   `json:"cluster"`
	Node                  string   `json:"node"`
	Machine               string   `json:"machine"`
	Role                  string   `json:"role"`
	Address               string   `json:"address"`
	MicroclusterPort      int      `json:"microclusterPort"`
	CertNotAfter          string   `json:"certNotAfter"`
	CertNotBefore         string   `json:"certNotBefore"`
	CertSANs              []string `json:"certSANs"`
	DatabaseExpiry        string   `json:"databaseExpiry"`
	K8sdFingerprintSHA256 string   `json:"k8sdFingerprintSHA256"`
	// DiskCertNotAfter is the certificate the last run wrote; it differs from certNotAfter
	// (what the node serves) while a run answer was lost and the restart skipped.
	DiskCertNotAfter string  `json:"diskCertNotAfter"`
	Restarts         int     `json:"restarts"`
	SeedsRun         []int64 `json:"seedsRun"`
	// ClientCertificateExpired: its kubelet.conf client certificate has expired
	// (PUT /nodes/{cluster}/{node}/client-certificate).
	ClientCertificateExpired bool `json:"clientCertificateExpired"`
	// CertificatesExpired: the node's certificates have expired (PUT .../certificates) and
	// its kubelet serves an expired certificate, until a run renews them.
	CertificatesExpired bool `json:"certificatesExpired"`
}

func (n *node) status() NodeStatus {
	dbExpiry := n.databaseExpiry()
	n.mu.Lock()
	defer n.mu.Unlock()
	return NodeStatus{
		Cluster:                  n.cluster.cfg.Name,
		Node:                     n.cfg.Name,
		Machine:                  n.cfg.Machine,
		Role:                     n.cfg.Role,
		Address:                  n.cfg.Address,
		MicroclusterPort:         n.cfg.MicroclusterPort,
		CertNotAfter:             n.current.NotAfter.UTC().Format(time.RFC3339),
		CertNotBefore:            n.current.NotBefore.UTC().Format(time.RFC3339),
		CertSANs:                 certSANs(n.current),
		DatabaseExpiry:           dbExpiry.Format(time.RFC3339),
		K8sdFingerprintSHA256:    fingerprint(n.serving),
		DiskCertNotAfter:         n.onDisk.NotAfter.UTC().Format(time.RFC3339),
		Restarts:                 n.restarts,
		SeedsRun:                 append([]int64{}, n.seedsRun...),
		ClientCertificateExpired: n.clientExpired,
		CertificatesExpired:      n.kubeletExpired,
	}
}

// ClusterStatus is the GET /clusters view of one workload cluster.
type ClusterStatus struct {
	Name          string            `json:"name"`
	Namespace     string            `json:"namespace"`
	ControlPlanes int               `json:"controlPlanes"`
	Annotations   map[string]string `json:"annotations"`
	// APIServerRestarts counts the restarts of the only control plane's services, each of
	// which takes the workload API down (the restart hook is called for each).
	APIServerRestarts int `json:"apiserverRestarts"`
	// APICertificateExpired: the workload API serves an expired certificate until a control
	// plane's refresh restarts it (PUT /clusters/{cluster}/api-certificate).
	APICertificateExpired bool `json:"apiCertificateExpired"`
}

func (c *cluster) status() ClusterStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	annotations := make(map[string]string, len(c.annotations))
	for k, v := range c.annotations {
		annotations[k] = v
	}
	return ClusterStatus{
		Name:                  c.cfg.Name,
		Namespace:             c.cfg.Namespace,
		ControlPlanes:         c.controlPlanes(),
		Annotations:           annotations,
		APIServerRestarts:     c.apiserverRestarts,
		APICertificateExpired: c.apiCertificateExpired,
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func writeJSONError(w http.ResponseWriter, code int, format string, args ...any) {
	writeJSON(w, code, map[string]string{"error": fmt.Sprintf(format, args...)})
}

func (s *Simulator) controlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("POST /faults", s.postFault)
	mux.HandleFunc("GET /faults", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.faults.list())
	})
	mux.HandleFunc("DELETE /faults", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]int{"deleted": s.faults.clear(r.URL.Query().Get("cluster"))})
	})
	mux.HandleFunc("DELETE /faults/{id}", func(w http.ResponseWriter, r *http.Request) {
		if !s.faults.remove(r.PathValue("id")) {
			writeJSONError(w, http.StatusNotFound, "no fault %q", r.PathValue("id"))
			return
		}
		writeJSON(w, http.StatusOK, map[string]int{"deleted": 1})
	})
	mux.HandleFunc("GET /calls", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		writeJSON(w, http.StatusOK, s.calls.list(q.Get("cluster"), q.Get("node")))
	})
	mux.HandleFunc("DELETE /calls", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		writeJSON(w, http.StatusOK, map[string]int{"deleted": s.calls.clear(q.Get("cluster"), q.Get("node"))})
	})
	mux.HandleFunc("GET /nodes", func(w http.ResponseWriter, r *http.Request) {
		out := []NodeStatus{}
		for _, n := range s.allNodes() {
			out = append(out, n.status())
		}
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("POST /nodes/{cluster}/{node}/reinstall", s.postReinstall)
	mux.HandleFunc("PUT /nodes/{cluster}/{node}/client-certificate", s.putClientCertificate)
	mux.HandleFunc("PUT /nodes/{cluster}/{node}/certificates", s.putCertificates)
	mux.HandleFunc("GET /clusters", func(w http.ResponseWriter, r *http.Request) {
		out := []ClusterStatus{}
		for _, cl := range s.clusters {
			out = append(out, cl.status())
		}
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("PUT /clusters/{cluster}/annotations", s.putAnnotations)
	mux.HandleFunc("PUT /clusters/{cluster}/api-certificate", s.putAPICertificate)
	return mux
}

// putAnnotations replaces a cluster's k8sd annotations (like `k8s set annotations=...`
// on its nodes); the CSR signer reads them for every CSR it handles.
func (s *Simulator) putAnnotations(w http.ResponseWriter, r *http.Request) {
	cl := s.byName[r.PathValue("cluster")]
	if cl == nil {
		writeJSONError(w, http.StatusNotFound, "no cluster %q", r.PathValue("cluster"))
		return
	}
	var annotations map[string]string
	dec := json.NewDecoder(r.Body)
	if err := dec.Decode(&annotations); err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid annotations (want a JSON object of strings): %v", err)
		return
	}
	if annotations == nil {
		annotations = map[string]string{}
	}
	cl.mu.Lock()
	cl.annotations = annotations
	cl.mu.Unlock()
	s.log.Printf("cluster %s: annotations set to %v", cl.cfg.Name, annotations)
	writeJSON(w, http.StatusOK, cl.status())
}

// putAPICertificate records whether the harness now serves the cluster's workload API with an
// expired certificate ({"expired": true}); the next control-plane refresh asks for it to be
// renewed (see takeExpiredAPI).
func (s *Simulator) putAPICertificate(w http.ResponseWriter, r *http.Request) {
	cl := s.byName[r.PathValue("cluster")]
	if cl == nil {
		writeJSONError(w, http.StatusNotFound, "no cluster %q", r.PathValue("cluster"))
		return
	}
	expired, ok := decodeExpired(w, r)
	if !ok {
		return
	}
	cl.mu.Lock()
	cl.apiCertificateExpired = expired
	cl.mu.Unlock()
	s.log.Printf("cluster %s: API server certificate expired: %v", cl.cfg.Name, expired)
	writeJSON(w, http.StatusOK, cl.status())
}

func (s *Simulator) postFault(w http.ResponseWriter, r *http.Request) {
	var req faultRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid fault: %v", err)
		return
	}
	if err := req.validate(); err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid fault: %v", err)
		return
	}
	// Unknown names are almost certainly typos in a test: reject them.
	if req.Cluster != "" && !s.hasCluster(req.Cluster) {
		writeJSONError(w, http.StatusBadRequest, "invalid fault: unknown cluster %q", req.Cluster)
		return
	}
	if req.Node != "" && !s.hasNode(req.Cluster, req.Node) {
		writeJSONError(w, http.StatusBadRequest, "invalid fault: unknown node %q", req.Node)
		return
	}
	f := s.faults.add(req)
	s.log.Printf("fault %s added: kind=%s cluster=%q node=%q endpoint=%q count=%d", f.ID, f.Kind, f.Cluster, f.Node, f.Endpoint, f.Count)
	writeJSON(w, http.StatusOK, map[string]string{"id": f.ID})
}

func (s *Simulator) hasCluster(name string) bool { return s.byName[name] != nil }

// hasNode: the node exists in the named cluster, or in any cluster when none is named.
func (s *Simulator) hasNode(clusterName, nodeName string) bool {
	if clusterName == "" {
		return s.nodeNames[nodeName]
	}
	return s.findNode(clusterName, nodeName) != nil
}

// decodeExpired reads a {"expired": bool} body; on a bad one it answers 400 and reports false.
func decodeExpired(w http.ResponseWriter, r *http.Request) (expired, ok bool) {
	var body struct {
		Expired bool `json:"expired"`
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid body (want {\"expired\": bool}): %v", err)
		return false, false
	}
	return body.Expired, true
}

// nodeExpired reads the node of the path and an {"expired": bool} body; on a bad one it has
// answered (404, 400) and reports false.
func (s *Simulator) nodeExpired(w http.ResponseWriter, r *http.Request) (n *node, expired, ok bool) {
	n = s.findNode(r.PathValue("cluster"), r.PathValue("node"))
	if n == nil {
		writeJSONError(w, http.StatusNotFound, "no node %s/%s", r.PathValue("cluster"), r.PathValue("node"))
		return nil, false, false
	}
	expired, ok = decodeExpired(w, r)
	return n, expired, ok
}

// putClientCertificate records whether the node's kubelet.conf client certificate has expired
// ({"expired": true}): its worker runs then fail as released k8sd's do when the API server
// refuses that client.
func (s *Simulator) putClientCertificate(w http.ResponseWriter, r *http.Request) {
	n, expired, ok := s.nodeExpired(w, r)
	if !ok {
		return
	}
	n.mu.Lock()
	n.clientExpired = expired
	n.mu.Unlock()
	s.log.Printf("node %s/%s: kubelet.conf client certificate expired: %v", n.cluster.cfg.Name, n.cfg.Name, expired)
	writeJSON(w, http.StatusOK, n.status())
}

// putCertificates makes a node's certificates expired ({"expired": true}), as on a node
// switched off past their NotAfter: what certificates-expiry reports (the database copies) and
// what the node serves end when the harness's expired kubelet certificate ended, and the
// kubelet serves that certificate for real, so the API server refuses to port-forward to it. The
// next delivered run renews them. {"expired": false} gives the node fresh certificates of its
// configured lifetime (its k8sd identity stays).
func (s *Simulator) putCertificates(w http.ResponseWriter, r *http.Request) {
	n, expired, ok := s.nodeExpired(w, r)
	if !ok {
		return
	}
	n.mu.Lock()
	served := n.expiredKubelet
	n.mu.Unlock()
	if expired && served == nil {
		writeJSONError(w, http.StatusConflict, "node %s/%s has no expired kubelet certificate (kubeletExpiredCert)", r.PathValue("cluster"), r.PathValue("node"))
		return
	}
	var (
		cert *x509.Certificate
		err  error
	)
	if expired {
		end := served.Leaf.NotAfter
		cert, err = n.cluster.ca.issueNodeCert(n.cfg, end.AddDate(-1, 0, 0), end, nil)
	} else {
		cert, err = n.cluster.ca.initialCert(n.cfg, n.cfg.InitialCertLifetimeSeconds)
	}
	if err != nil {
		writeJSONError(w, http.StatusInternalServerError, "certificates: %v", err)
		return
	}
	n.mu.Lock()
	n.initial, n.current, n.onDisk, n.kubeletExpired = cert, cert, cert, expired
	n.mu.Unlock()
	// Connections made with the old certificate end, as a node that was switched off has none.
	if n.kubelet != nil {
		n.kubelet.bounce()
	}
	s.log.Printf("node %s/%s: certificates expired: %v (end %s)", n.cluster.cfg.Name, n.cfg.Name, expired, cert.NotAfter.UTC().Format(time.RFC3339))
	writeJSON(w, http.StatusOK, n.status())
}

type reinstallRequest struct {
	InitialCertLifetimeSeconds *int64 `json:"initialCertLifetimeSeconds"`
}

// postReinstall gives a node a new k8sd identity (new fingerprint) and a fresh initial
// certificate (new databaseExpiry), then drops its open k8sd connections.
func (s *Simulator) postReinstall(w http.ResponseWriter, r *http.Request) {
	n := s.findNode(r.PathValue("cluster"), r.PathValue("node"))
	if n == nil {
		writeJSONError(w, http.StatusNotFound, "no node %s/%s", r.PathValue("cluster"), r.PathValue("node"))
		return
	}
	var req reinstallRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		writeJSONError(w, http.StatusBadRequest, "invalid reinstall request: %v", err)
		return
	}
	lifetime := n.cfg.InitialCertLifetimeSeconds
	if req.InitialCertLifetimeSeconds != nil && *req.InitialCertLifetimeSeconds != 0 {
		lifetime = *req.InitialCertLifetimeSeconds
	}
	if err := n.install(lifetime); err != nil {
		writeJSONError(w, http.StatusInternalServerError, "reinstall: %v", err)
		return
	}
	n.k8sd.bounce()
	st := n.status()
	s.log.Printf("node %s/%s reinstalled: k8sd fingerprint %s, database expiry %s", st.Cluster, st.Node, st.K8sdFingerprintSHA256, st.DatabaseExpiry)
	writeJSON(w, http.StatusOK, st)
}
