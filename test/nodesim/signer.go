package main

import (
	"context"
	"strings"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// The signer plays k8s-snap's csrsigning controller, which runs on the control plane:
// without kube-controller-manager nothing else would ever sign the k8sd.io/* CSRs. One runs
// per distinct API server (server.go) and handles each CSR for the cluster it belongs to.

const k8sdSignerPrefix = "k8sd.io/"

// signerResync makes the informer redeliver every CSR, so that a sign that failed on
// a transient API error is retried.
const signerResync = 5 * time.Second

// signerNudgeAfter: a worker run whose CSRs wait longer than this asks the signer
// directly (its watch backs off for a while after the API server was down).
const signerNudgeAfter = 2 * time.Second

// The cluster annotation (k8sd cluster config) that makes k8sd's csrsigning controller
// approve the k8sd.io/* CSRs itself, and the reason it approves with.
const (
	annotationAutoApprove = "k8sd/v1alpha1/csrsigning/auto-approve"
	reasonAutoApproved    = "K8sdApprove"
)

func (c *cluster) autoApprove() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.annotations[annotationAutoApprove] == "true"
}

// undecided: neither approved, denied nor failed.
func undecided(csr *certv1.CertificateSigningRequest) bool {
	return !conditionTrue(csr, certv1.CertificateApproved) &&
		!conditionTrue(csr, certv1.CertificateDenied) &&
		!conditionTrue(csr, certv1.CertificateFailed)
}

// reconcileCSR handles one CSR as k8sd's csrsigning controller does: with auto-approve on,
// an undecided k8sd.io/* CSR is approved first; an approved one is signed.
func (s *Simulator) reconcileCSR(ctx context.Context, cl *cluster, name string) {
	if cl.autoApprove() {
		s.autoApproveCSR(ctx, cl, name)
	}
	s.signCSR(ctx, cl, name)
}

// autoApproveCSR approves an undecided k8sd.io/* CSR (it looks first, unlike approve).
func (s *Simulator) autoApproveCSR(ctx context.Context, cl *cluster, name string) {
	client := cl.client.CertificatesV1().CertificateSigningRequests()
	approved := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		csr, err := client.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !strings.HasPrefix(csr.Spec.SignerName, k8sdSignerPrefix) || !undecided(csr) {
			return nil
		}
		csr.Status.Conditions = append(csr.Status.Conditions, certv1.CertificateSigningRequestCondition{
			Type:           certv1.CertificateApproved,
			Status:         corev1.ConditionTrue,
			Reason:         reasonAutoApproved,
			Message:        "approved by the simulated k8sd csrsigning auto-approver",
			LastUpdateTime: metav1.Now(),
		})
		if _, err := client.UpdateApproval(ctx, name, csr, metav1.UpdateOptions{}); err != nil {
			return err
		}
		approved = true
		return nil
	})
	switch {
	case err != nil && ctx.Err() == nil:
		s.log.Printf("signer %s: auto-approve CSR %s: %v (will retry on resync)", cl.cfg.Name, name, err)
	case approved:
		s.log.Printf("signer %s: auto-approved CSR %s", cl.cfg.Name, name)
	}
}

// needsSigning: a k8sd.io/* CSR that is approved, not denied or failed, and unsigned.
func needsSigning(csr *certv1.CertificateSigningRequest) bool {
	return strings.HasPrefix(csr.Spec.SignerName, k8sdSignerPrefix) &&
		conditionTrue(csr, certv1.CertificateApproved) &&
		!conditionTrue(csr, certv1.CertificateDenied) &&
		!conditionTrue(csr, certv1.CertificateFailed) &&
		len(csr.Status.Certificate) == 0
}

// signCSR signs one CSR with the cluster CA and writes status.certificate. A request
// that cannot be signed gets a Failed condition, as a real signer would set.
func (s *Simulator) signCSR(ctx context.Context, cl *cluster, name string) {
	client := cl.client.CertificatesV1().CertificateSigningRequests()
	var signedUntil time.Time
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		csr, err := client.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !needsSigning(csr) {
			return nil
		}
		now := time.Now()
		// Published k8sd signs for 10 years whatever spec.expirationSeconds says.
		notAfter := tenYears(now)
		if cl.cfg.HonourCSRExpiration && csr.Spec.ExpirationSeconds != nil {
			notAfter = now.Add(time.Duration(*csr.Spec.ExpirationSeconds) * time.Second)
		}
		certPEM, signErr := cl.ca.signCSR(csr.Spec.Request, csr.Spec.Usages, now, notAfter)
		if signErr != nil {
			s.log.Printf("signer %s: CSR %s cannot be signed: %v", cl.cfg.Name, name, signErr)
			csr.Status.Conditions = append(csr.Status.Conditions, certv1.CertificateSigningRequestCondition{
				Type:           certv1.CertificateFailed,
				Status:         corev1.ConditionTrue,
				Reason:         "SignerValidationFailure",
				Message:        signErr.Error(),
				LastUpdateTime: metav1.Now(),
			})
		} else {
			csr.Status.Certificate = certPEM
		}
		if _, err = client.UpdateStatus(ctx, csr, metav1.UpdateOptions{}); err != nil {
			return err
		}
		if signErr == nil {
			signedUntil = notAfter
		}
		return nil
	})
	if err != nil {
		if ctx.Err() == nil {
			s.log.Printf("signer %s: CSR %s: %v (will retry on resync)", cl.cfg.Name, name, err)
		}
		return
	}
	if !signedUntil.IsZero() {
		s.log.Printf("signer %s: signed CSR %s, NotAfter %s", cl.cfg.Name, name, signedUntil.UTC().Format(time.RFC3339))
	}
}
