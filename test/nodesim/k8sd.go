package main

import (
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"time"

	apiv1 "github.com/canonical/k8s-snap-api/api/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// k8sdRoutes maps the exact paths k8sd serves (no trailing slash) to endpoint names.
var k8sdRoutes = map[string]string{
	"/": epRoot,
	"/1.0/" + apiv1.ClusterAPICertificatesExpiryRPC: epExpiry,
	"/1.0/" + apiv1.ClusterAPICertificatesPlanRPC:   epPlan,
	"/1.0/" + apiv1.ClusterAPICertificatesRunRPC:    epRun,
	"/1.0/" + apiv1.ClusterAPIApproveWorkerCSRRPC:   epApprove,
}

const (
	headerNodeToken    = "node-token"
	headerCAPIToken    = "capi-auth-token"
	maxRequestBodySize = 1 << 20
	// The latest NotAfter x509 can encode (9999-12-31T23:59:59Z).
	maxNotAfterUnix = 253402300799
)

// envelope is the LXD/microcluster response body, field order as k8sd sends it.
type envelope struct {
	Type       string `json:"type"`
	Status     string `json:"status"`
	StatusCode int    `json:"status_code"`
	Operation  string `json:"operation"`
	ErrorCode  int    `json:"error_code"`
	Error      string `json:"error"`
	Metadata   any    `json:"metadata"`
}

// writeEnvelope sends a complete response with Content-Length and flushes it, so
// that the bytes are on the wire before a simulated restart closes the connection.
// It returns the error of the write or the flush: nil means the answer left.
func writeEnvelope(w http.ResponseWriter, code int, env envelope) error {
	var buf bytes.Buffer
	// json.Encoder like LXD's util.WriteJSON (HTML escaping, trailing newline).
	if err := json.NewEncoder(&buf).Encode(env); err != nil {
		code = http.StatusInternalServerError
		buf.Reset()
		json.NewEncoder(&buf).Encode(envelope{Type: "error", ErrorCode: code, Error: "failed to encode response: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(code)
	if _, err := w.Write(buf.Bytes()); err != nil {
		return err
	}
	return http.NewResponseController(w).Flush()
}

func writeSync(w http.ResponseWriter, metadata any) error {
	return writeEnvelope(w, http.StatusOK, envelope{Type: "sync", Status: "Success", StatusCode: http.StatusOK, Metadata: metadata})
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeEnvelope(w, code, envelope{Type: "error", ErrorCode: code, Error: msg})
}

// statusWriter remembers the status answered. onStatus runs before the status goes
// out, so the call record is complete by the time the client has the answer.
type statusWriter struct {
	http.ResponseWriter
	status   int
	onStatus func(code int)
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
		if w.onStatus != nil {
			w.onStatus(code)
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() { w.FlushError() }

// FlushError lets http.ResponseController report a failed flush (run's delivery check).
func (w *statusWriter) FlushError() error {
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach Hijack (drop fault).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// k8sdHandler serves one node's k8sd API.
func (s *Simulator) k8sdHandler(n *node) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.serveK8sd(n, w, r) })
}

func (s *Simulator) serveK8sd(n *node, rw http.ResponseWriter, r *http.Request) {
	started := time.Now()
	body, readErr := io.ReadAll(io.LimitReader(r.Body, maxRequestBodySize+1))
	ep := k8sdRoutes[r.URL.Path]
	call := s.calls.begin(n, ep, r, body, started)
	w := &statusWriter{ResponseWriter: rw, onStatus: func(code int) {
		s.calls.answered(call, code, time.Since(started))
	}}
	faultKind := ""
	defer func() {
		elapsed := time.Since(started)
		s.calls.finish(call, elapsed)
		label := ep
		if label == "" {
			label = r.URL.Path
		}
		s.log.Printf("k8sd cluster=%s node=%s endpoint=%s method=%s status=%d fault=%s duration=%s",
			n.cluster.cfg.Name, n.cfg.Name, label, r.Method, w.status, faultKind, elapsed.Round(time.Microsecond))
	}()

	markFault := func(kind string) {
		faultKind = kind
		s.calls.setFault(call, kind)
	}
	// A latency fault delays the request, then the first matching fault of another kind
	// (taken once the delay is over) decides what happens.
	if f, ok := s.faults.take(n.cluster.cfg.Name, n.cfg.Name, ep, latencyKinds); ok {
		markFault(f.Kind)
		if done := s.applyFault(w, r, f); done {
			return
		}
	}
	if f, ok := s.faults.take(n.cluster.cfg.Name, n.cfg.Name, ep, outcomeKinds); ok {
		markFault(f.Kind)
		if done := s.applyFault(w, r, f); done {
			return
		}
	}

	if ep == "" {
		writeError(w, http.StatusNotFound, "not found")
		return
	}
	wantMethod := http.MethodPost
	if ep == epRoot {
		wantMethod = http.MethodGet
	}
	if r.Method != wantMethod {
		writeError(w, http.StatusNotImplemented, fmt.Sprintf("method %s not implemented", r.Method))
		return
	}
	if ep == epRoot {
		writeSync(w, []string{"/1.0"})
		return
	}

	// Authentication comes before decoding, as in k8sd's access handlers.
	header, key := headerNodeToken, "node-token-"+n.cfg.Machine
	if ep == epApprove {
		header, key = headerCAPIToken, "value"
	}
	if code, msg := s.authenticate(r.Context(), n, r.Header.Get(header), header, key); code != 0 {
		writeError(w, code, msg)
		return
	}
	if readErr != nil {
		writeError(w, http.StatusBadRequest, "failed to parse request: "+readErr.Error())
		return
	}
	if len(body) > maxRequestBodySize {
		writeError(w, http.StatusBadRequest, "failed to parse request: request body too large")
		return
	}

	switch ep {
	case epExpiry:
		var req apiv1.CertificatesExpiryRequest
		if decodeOrReject(w, body, &req) {
			writeSync(w, apiv1.CertificatesExpiryResponse{ExpiryDate: n.databaseExpiry().Format(time.RFC3339)})
		}
	case epPlan:
		var req apiv1.ClusterAPICertificatesPlanRequest
		if decodeOrReject(w, body, &req) {
			s.handlePlan(w, n)
		}
	case epRun:
		var req apiv1.ClusterAPICertificatesRunRequest
		if decodeOrReject(w, body, &req) {
			if n.cfg.Role == roleControlPlane {
				s.handleRunControlPlane(w, r, n, req, markFault)
			} else {
				s.handleRunWorker(w, r, n, req, markFault)
			}
		}
	case epApprove:
		var req apiv1.ClusterAPIApproveWorkerCSRRequest
		if decodeOrReject(w, body, &req) {
			s.handleApprove(w, r, n, req)
		}
	}
}

// applyFault acts out a request fault; it returns true when the request is finished.
func (s *Simulator) applyFault(w http.ResponseWriter, r *http.Request, f Fault) bool {
	switch f.Kind {
	case faultLatency:
		t := time.NewTimer(time.Duration(f.DelayMs) * time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
			return false
		case <-r.Context().Done():
		case <-s.ctx.Done():
		}
		return true
	case faultError:
		writeError(w, f.Status, f.Message)
	case faultUnavailable:
		writeError(w, http.StatusServiceUnavailable, "Database is not yet initialized")
	case faultMalformed:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, `{"type":"sync","status":`)
	case faultHang:
		select {
		case <-r.Context().Done():
		case <-s.ctx.Done():
		}
	case faultDrop:
		hijackAndClose(w)
	case faultHuge:
		sent, err := writeHuge(r.Context(), w, f.Status, f.Bytes)
		s.log.Printf("k8sd huge answer: %d of %d bytes sent (stopped by: %v)", sent, f.Bytes, err)
	}
	return true
}

// hugeChunk is the unit a huge answer is written in; hugeFiller is one chunk of its filler.
const hugeChunk = 32 << 10

var hugeFiller = bytes.Repeat([]byte{'x'}, hugeChunk)

// writeHuge answers status with a body of exactly size bytes, streamed in chunks (never built
// in memory) and without Content-Length, so a client learns the size only by reading: a k8sd
// envelope whose one string (metadata.filler on a 200, error otherwise) is padded with 'x'. The
// body is valid JSON when size covers the envelope, a cut-off envelope below that. It stops at
// the first failed write or once the client has left, and returns the bytes written and why
// it stopped early (nil when the whole body went out).
func writeHuge(ctx context.Context, w http.ResponseWriter, status int, size int64) (int64, error) {
	prefix := `{"type":"sync","status":"Success","status_code":200,"operation":"","error_code":0,"error":"","metadata":{"filler":"`
	suffix := "\"}}\n"
	if status != http.StatusOK {
		prefix = `{"type":"error","status":"","status_code":0,"operation":"","error_code":` + strconv.Itoa(status) + `,"error":"`
		suffix = "\",\"metadata\":null}\n"
	}
	head, tail := []byte(prefix), []byte(suffix)
	filler := size - int64(len(head)) - int64(len(tail))
	if filler < 0 {
		head, tail, filler = append(head, tail...)[:size], nil, 0
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	var sent int64
	write := func(b []byte) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := w.Write(b)
		sent += int64(n)
		return err
	}
	if err := write(head); err != nil {
		return sent, err
	}
	for filler > 0 {
		chunk := hugeFiller[:min(filler, hugeChunk)]
		if err := write(chunk); err != nil {
			return sent, err
		}
		filler -= int64(len(chunk))
	}
	if err := write(tail); err != nil {
		return sent, err
	}
	return sent, http.NewResponseController(w).Flush()
}

// authenticate checks a token header against the management cluster's Secret
// <cluster>-token: its watch cache (tokens.go), else read at request time. It returns 0 when
// the token is valid.
func (s *Simulator) authenticate(ctx context.Context, n *node, got, header, key string) (int, string) {
	if got == "" {
		return http.StatusUnauthorized, fmt.Sprintf("missing header %q", header)
	}
	name := n.cluster.cfg.Name + "-token"
	if want, ok := s.tokens.lookup(n.cluster.cfg.Namespace, name, key); ok && len(want) > 0 &&
		subtle.ConstantTimeCompare(want, []byte(got)) == 1 {
		return 0, ""
	}
	// Not confirmed by the cache (none yet, a rotated token, a missing Secret): ask.
	namespace := n.cluster.cfg.Namespace
	secret, err := s.mgmt.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		// Gone from this management cluster (moved): k8sd still has the tokens it was given.
		if want, ok := s.tokens.remembered(namespace, name, key); ok {
			if subtle.ConstantTimeCompare(want, []byte(got)) == 1 {
				return 0, ""
			}
			return http.StatusUnauthorized, "invalid token"
		}
	}
	if err != nil {
		return http.StatusInternalServerError, fmt.Sprintf("failed to check token: failed to read Secret %s/%s: %v", namespace, name, err)
	}
	want, ok := secret.Data[key]
	if !ok {
		if sd, found := secret.StringData[key]; found {
			want, ok = []byte(sd), true
		}
	}
	if ok {
		s.tokens.remember(namespace, name, key, want)
	}
	if !ok || len(want) == 0 || subtle.ConstantTimeCompare(want, []byte(got)) != 1 {
		return http.StatusUnauthorized, "invalid token"
	}
	return 0, ""
}

// decodeOrReject decodes like k8sd's strict decoder (unknown fields rejected) and
// also rejects data after the object; it answers 400 and returns false on failure.
func decodeOrReject(w http.ResponseWriter, body []byte, v any) bool {
	if err := decodeStrict(body, v); err != nil {
		writeError(w, http.StatusBadRequest, "failed to parse request: "+err.Error())
		return false
	}
	return true
}

func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("unexpected data after the JSON object")
	}
	return nil
}

func workerCSRNames(seed int) []string {
	return []string{
		fmt.Sprintf("k8sd-%d-worker-kubelet-serving", seed),
		fmt.Sprintf("k8sd-%d-worker-kubelet-client", seed),
		fmt.Sprintf("k8sd-%d-worker-kube-proxy-client", seed),
	}
}

func (s *Simulator) handlePlan(w http.ResponseWriter, n *node) {
	seed := int(rand.Int64N(math.MaxInt64))
	resp := apiv1.ClusterAPICertificatesPlanResponse{Seed: seed}
	if n.cfg.Role == roleWorker {
		resp.CertificateSigningRequests = workerCSRNames(seed)
	}
	writeSync(w, resp)
}

func (s *Simulator) handleRunControlPlane(w http.ResponseWriter, r *http.Request, n *node, req apiv1.ClusterAPICertificatesRunRequest, markFault func(string)) {
	now := time.Now()
	if req.ExpirationSeconds <= 0 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid expiration-seconds %d: must be greater than zero", req.ExpirationSeconds))
		return
	}
	if int64(req.ExpirationSeconds) > maxNotAfterUnix-now.Unix() {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid expiration-seconds %d: too large", req.ExpirationSeconds))
		return
	}
	notAfter := time.Unix(now.Unix()+int64(req.ExpirationSeconds), 0)
	cert, err := n.cluster.ca.issueNodeCert(n.cfg, now, notAfter, req.ExtraSANs)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "failed to generate new control plane certificates: "+err.Error())
		return
	}
	n.writeToDisk(cert, req.Seed)
	s.answerRun(w, r, n, cert.NotAfter.Unix(), markFault)
}

func (s *Simulator) handleRunWorker(w http.ResponseWriter, r *http.Request, n *node, req apiv1.ClusterAPICertificatesRunRequest, markFault func(string)) {
	if req.ExpirationSeconds <= 0 || req.ExpirationSeconds > math.MaxInt32 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid expiration-seconds %d: must be between 1 and %d", req.ExpirationSeconds, math.MaxInt32))
		return
	}
	ctx := r.Context()
	cert, err := s.refreshWorker(ctx, n, req.Seed, int32(req.ExpirationSeconds))
	if ctx.Err() != nil {
		// The client went away: nothing was written, and there is nobody to answer.
		return
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, "failed to get worker node certificates: "+err.Error())
		return
	}
	n.writeToDisk(cert, req.Seed)
	answer := cert.NotAfter.Unix()
	if n.cfg.RunAnswersDuration {
		answer = int64(cert.NotAfter.Sub(cert.NotBefore) / time.Second)
	}
	s.answerRun(w, r, n, answer, markFault)
}

// answerRun sends run's answer (the new certificate is on disk already) and, only if
// the answer was delivered, restarts the node's services, as k8sd does: a lost answer
// leaves the node serving its old certificate with the new one on disk.
func (s *Simulator) answerRun(w http.ResponseWriter, r *http.Request, n *node, expirationSeconds int64, markFault func(string)) {
	// No new connections from here on: a delivered answer is followed by the restart.
	n.holdListeners()
	delivered, released := false, false
	notDelivered := func() {
		if !released {
			released = true
			s.log.Printf("k8sd %s/%s: run answer not delivered: restart skipped, serving the old certificate", n.cluster.cfg.Name, n.cfg.Name)
			n.releaseListeners()
		}
	}
	defer func() {
		// Also when the handler is aborted (a panic): the listeners must not stay held.
		if !delivered {
			notDelivered()
		}
	}()
	if f, ok := s.faults.take(n.cluster.cfg.Name, n.cfg.Name, epRun, map[string]bool{faultDropAnswer: true}); ok {
		markFault(f.Kind)
		// Listening again before the client sees the connection close.
		notDelivered()
		hijackAndClose(w)
	} else if r.Context().Err() == nil {
		// The connection dies with the restart: tell the client not to reuse it.
		w.Header().Set("Connection", "close")
		// The node state changes before the answer leaves, so that whoever holds the
		// answer sees the node serving the new certificate; a failed write undoes it.
		undo := n.serveFromDisk()
		err := writeSync(w, apiv1.ClusterAPICertificatesRunResponse{ExpirationSeconds: int(expirationSeconds)})
		// The context is checked before the write: a client that read the answer may
		// close at once, which cancels the context of a delivered answer.
		delivered = err == nil
		if err != nil {
			undo()
			s.log.Printf("k8sd %s/%s: run answer not delivered: %v", n.cluster.cfg.Name, n.cfg.Name, err)
		}
	}
	if delivered {
		s.restartNode(n)
	}
}

// hijackAndClose closes the connection without an answer.
func hijackAndClose(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Not hijackable (HTTP/2): aborting the handler resets the stream instead.
		panic(http.ErrAbortHandler)
	}
	conn.Close()
}

func (s *Simulator) handleApprove(w http.ResponseWriter, r *http.Request, n *node, req apiv1.ClusterAPIApproveWorkerCSRRequest) {
	if n.cfg.Role != roleControlPlane {
		writeError(w, http.StatusInternalServerError, "approve is only served by control-plane nodes")
		return
	}
	_, deny := s.faults.take(n.cluster.cfg.Name, n.cfg.Name, epApprove, map[string]bool{faultCSRDeny: true})
	ctx := r.Context()
	var err error
	if n.cfg.ApproveMode == approveGetOnce {
		err = s.approveGetOnce(ctx, n.cluster, req.Seed, deny)
	} else {
		err = s.approveWatch(ctx, n.cluster, req.Seed, deny)
	}
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, "failed to approve worker node CSR: "+err.Error())
		return
	}
	writeSync(w, apiv1.ClusterAPIApproveWorkerCSRResponse{})
}

func (s *Simulator) newK8sdListener(n *node) *svcListener {
	name := n.cluster.cfg.Name + "/" + n.cfg.Name
	return &svcListener{
		addr:    net.JoinHostPort(n.cfg.Address, strconv.Itoa(n.cfg.MicroclusterPort)),
		handler: s.k8sdHandler(n),
		tlsConf: &tls.Config{
			// Read at handshake time so that a reinstall changes the certificate.
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
				n.mu.Lock()
				defer n.mu.Unlock()
				return n.serving, nil
			},
			NextProtos: []string{"http/1.1"},
			MinVersion: tls.VersionTLS12,
		},
		refused:     func() bool { return s.faults.refused(n.cluster.cfg.Name, n.cfg.Name) },
		log:         func(f string, a ...any) { s.log.Printf("k8sd %s: "+f, append([]any{name}, a...)...) },
		errorLog:    s.log,
		idleTimeout: 2 * time.Minute,
	}
}

// waitTick sleeps for one poll interval; false when ctx ended.
func waitTick(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
