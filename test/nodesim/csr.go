package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	certclient "k8s.io/client-go/kubernetes/typed/certificates/v1"
	"k8s.io/client-go/util/retry"
)

const (
	reasonApproved = "ApprovedByCK8sCAPI"
	reasonDenied   = "DeniedBySimulator"
)

// workerCSR is one of the three CSRs a worker's run creates.
type workerCSR struct {
	name    string
	signer  string
	subject pkix.Name
	dns     []string
	ips     []net.IP
	usages  []certv1.KeyUsage
}

// workerCSRs lists the CSRs of a worker refresh, kubelet serving first (its certificate
// is the one run reports).
func workerCSRs(n NodeConfig, seed int) []workerCSR {
	names := workerCSRNames(seed)
	nodeSubject := pkix.Name{CommonName: "system:node:" + n.Name, Organization: []string{"system:nodes"}}
	return []workerCSR{
		{
			name: names[0], signer: "k8sd.io/kubelet-serving", subject: nodeSubject,
			dns: []string{n.Name}, ips: []net.IP{net.ParseIP(n.Address)},
			usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageKeyEncipherment, certv1.UsageServerAuth},
		},
		{
			name: names[1], signer: "k8sd.io/kubelet-client", subject: nodeSubject,
			usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageKeyEncipherment, certv1.UsageClientAuth},
		},
		{
			name: names[2], signer: "k8sd.io/kube-proxy-client", subject: pkix.Name{CommonName: "system:kube-proxy"},
			usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageKeyEncipherment, certv1.UsageClientAuth},
		},
	}
}

func conditionTrue(csr *certv1.CertificateSigningRequest, t certv1.RequestConditionType) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// refreshWorker creates the worker's CSRs with a plain Create, as released k8sd does (a
// second run with the same seed fails: the CSRs exist, and the private keys of the first
// attempt lived only in its request), and blocks until all are approved and signed. It
// returns the kubelet serving certificate.
//
// It watches the CSRs through the server's informer cache (woken by their changes) for its
// first cache grace; without a usable cache (not synced yet, or its watch failed lately), and
// after that, it polls the API server (see trustCache).
func (s *Simulator) refreshWorker(ctx context.Context, n *node, seed int, expirationSeconds int32) (*x509.Certificate, error) {
	srv := n.cluster.server
	client := srv.client.CertificatesV1().CertificateSigningRequests()
	csrs := workerCSRs(n.cfg, seed)
	names := workerCSRNames(seed)
	wake, unsubscribe := srv.subscribe(names)
	defer unsubscribe()
	srv.claim(n.cluster, names)
	// Created as the node, as k8sd does with the node's kubelet.conf (an expired one: a client
	// whose certificate the API server refuses).
	n.mu.Lock()
	clientExpired := n.clientExpired
	n.mu.Unlock()
	var asNode kubernetes.Interface
	var err error
	if clientExpired {
		asNode, err = srv.expiredNodeClient(n.cfg.Name, n.cluster.ca)
	} else {
		asNode, err = srv.nodeClient(n.cfg.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("client of node %s: %w", n.cfg.Name, err)
	}
	for _, c := range csrs {
		if err := createCSR(ctx, asNode.CertificatesV1().CertificateSigningRequests(), c, expirationSeconds); err != nil {
			return nil, err
		}
	}
	created := time.Now()
	var lastKick time.Time
	for {
		var serving []byte
		var pending []string
		fromCache := true
		for i, c := range csrs {
			csr, found, usable := srv.cached(c.name)
			usable = usable && s.trustCache(created)
			if usable && !found {
				// Not in the cache yet: it was just created.
				pending = append(pending, c.name)
				continue
			}
			if !usable {
				fromCache = false
				var err error
				csr, err = client.Get(ctx, c.name, metav1.GetOptions{})
				switch {
				case ctx.Err() != nil:
					return nil, ctx.Err()
				case apierrors.IsNotFound(err):
					return nil, fmt.Errorf("CSR %s was deleted", c.name)
				case err != nil:
					// The API server may be restarting: keep waiting.
					s.log.Printf("k8sd %s/%s: get CSR %s: %v", n.cluster.cfg.Name, n.cfg.Name, c.name, err)
					pending = append(pending, "")
					continue
				}
			}
			if conditionTrue(csr, certv1.CertificateDenied) {
				return nil, fmt.Errorf("CSR %s was denied", c.name)
			}
			if conditionTrue(csr, certv1.CertificateFailed) {
				return nil, fmt.Errorf("CSR %s failed", c.name)
			}
			if !conditionTrue(csr, certv1.CertificateApproved) || len(csr.Status.Certificate) == 0 {
				pending = append(pending, c.name)
				continue
			}
			if i == 0 {
				serving = csr.Status.Certificate
			}
		}
		if len(pending) == 0 && bytes.Equal(serving, issuedMarker) {
			// The cache knows that it was signed, not the certificate.
			csr, err := client.Get(ctx, csrs[0].name, metav1.GetOptions{})
			switch {
			case ctx.Err() != nil:
				return nil, ctx.Err()
			case err != nil:
				s.log.Printf("k8sd %s/%s: get CSR %s: %v", n.cluster.cfg.Name, n.cfg.Name, csrs[0].name, err)
				pending = append(pending, "")
			default:
				serving = csr.Status.Certificate
			}
		}
		if len(pending) == 0 {
			cert, err := parseCertPEM(serving)
			if err != nil {
				return nil, fmt.Errorf("CSR %s: %w", csrs[0].name, err)
			}
			return cert, nil
		}
		wait := cacheRecheck
		if !fromCache {
			wait = srv.livePoll(s.pollInterval)
			// The signer's watch may be backing off after an API server restart: nudge it
			// for CSRs that wait unusually long (it approves with auto-approve, and signs).
			if time.Since(created) > signerNudgeAfter && time.Since(lastKick) > signerNudgeAfter {
				lastKick = time.Now()
				for _, name := range pending {
					if name != "" {
						srv.queue.Add(name)
					}
				}
			}
		}
		if !waitWake(ctx, wake, wait) {
			return nil, ctx.Err()
		}
	}
}

// trustCache: whether a wait that began at started may still be served by the informer cache
// alone (for cacheGrace). A watch can go stale without an error (a killed API server ends it
// with a plain EOF, and the informer backs off before it lists again), leaving a CSR missing or
// unapproved in the cache while the API server has it approved and signed; released k8sd reads
// the API server, so a wait that lasts reads it too.
func (s *Simulator) trustCache(started time.Time) bool {
	return time.Since(started) < s.cacheGrace
}

// createCSR generates a key (kept only for this request, like k8sd's in-memory keys) and
// creates the CSR; an existing CSR of that name is an error.
func createCSR(ctx context.Context, client certclient.CertificateSigningRequestInterface, c workerCSR, expirationSeconds int32) error {
	request, err := newCSRPEM(c.subject, c.dns, c.ips)
	if err != nil {
		return fmt.Errorf("failed to generate CSR %s: %w", c.name, err)
	}
	exp := expirationSeconds
	_, err = client.Create(ctx, &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: c.name},
		Spec: certv1.CertificateSigningRequestSpec{
			Request:           request,
			SignerName:        c.signer,
			Usages:            c.usages,
			ExpirationSeconds: &exp,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("failed to create CSR for %s: %w", c.name, err)
	}
	return nil
}

// approveWatch is released k8sd: wait (no deadline of its own) until the seed's three
// CSRs exist, then append the Approved condition to each without looking at it. An
// already approved CSR makes the API server reject the update (duplicate condition), and
// approve fails. On a shared API server another cluster's CSRs do not exist for cl.
func (s *Simulator) approveWatch(ctx context.Context, cl *cluster, seed int, deny bool) error {
	srv := cl.server
	client := srv.client.CertificatesV1().CertificateSigningRequests()
	names := workerCSRNames(seed)
	wake, unsubscribe := srv.subscribe(names)
	defer unsubscribe()
	started := time.Now()
	for {
		found, fromCache := 0, true
		for _, name := range names {
			_, inCache, usable := srv.cached(name)
			usable = usable && s.trustCache(started)
			if !usable {
				fromCache = false
				if _, err := client.Get(ctx, name, metav1.GetOptions{}); err != nil {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					if !apierrors.IsNotFound(err) {
						s.log.Printf("approve %s: get CSR %s: %v", cl.cfg.Name, name, err)
					}
					break
				}
			} else if !inCache {
				break
			}
			if !srv.visibleTo(cl, name) {
				break
			}
			found++
		}
		if found == len(names) {
			break
		}
		wait := cacheRecheck
		if !fromCache {
			wait = srv.livePoll(s.pollInterval)
		}
		if !waitWake(ctx, wake, wait) {
			return ctx.Err()
		}
	}
	for _, name := range names {
		if err := setApproval(ctx, client, name, deny); err != nil {
			return fmt.Errorf("failed to approve CSR %s: %w", name, err)
		}
	}
	return nil
}

// approveGetOnce is a never-released draft of k8sd (approveMode "get-once",
// k8sd-protocol.md item 8): one GET per CSR, each handled independently (so a partial
// approval is possible), an error for a missing or already approved CSR.
func (s *Simulator) approveGetOnce(ctx context.Context, cl *cluster, seed int, deny bool) error {
	client := cl.server.client.CertificatesV1().CertificateSigningRequests()
	var errs []error
	for _, name := range workerCSRNames(seed) {
		csr, err := client.Get(ctx, name, metav1.GetOptions{})
		if err == nil && !cl.server.visibleTo(cl, name) {
			// Another cluster's CSR on a shared API server: not there for this one.
			csr, err = nil, apierrors.NewNotFound(certv1.Resource("certificatesigningrequests"), name)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("failed to get CSR %s: %w", name, err))
			continue
		}
		if conditionTrue(csr, certv1.CertificateApproved) {
			errs = append(errs, fmt.Errorf("CSR %s is already approved", name))
			continue
		}
		if err := setApproval(ctx, client, name, deny); err != nil {
			errs = append(errs, fmt.Errorf("failed to approve CSR %s: %w", name, err))
		}
	}
	if len(errs) > 0 {
		// Report the first failure, as k8sd's errgroup does.
		return errs[0]
	}
	return nil
}

// setApproval appends the Approved (or, for a csr-deny fault, Denied) condition through
// the approval subresource without looking at the conditions there (the API server
// rejects a duplicate), retrying on update conflicts.
func setApproval(ctx context.Context, client certclient.CertificateSigningRequestInterface, name string, deny bool) error {
	condType, reason, msg := certv1.CertificateApproved, reasonApproved, "This CSR was approved by Canonical Kubernetes CAPI Provider"
	if deny {
		condType, reason, msg = certv1.CertificateDenied, reasonDenied, "This CSR was denied by the node simulator (csr-deny fault)"
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		csr, err := client.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		csr.Status.Conditions = append(csr.Status.Conditions, certv1.CertificateSigningRequestCondition{
			Type:           condType,
			Status:         corev1.ConditionTrue,
			Reason:         reason,
			Message:        msg,
			LastUpdateTime: metav1.Now(),
		})
		_, err = client.UpdateApproval(ctx, name, csr, metav1.UpdateOptions{})
		return err
	})
}
