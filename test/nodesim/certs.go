package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"

	certv1 "k8s.io/api/certificates/v1"
)

// tenYears is the lifetime of the simulator's CAs and k8sd serving certificates,
// and what the k8sd CSR signer grants regardless of spec.expirationSeconds.
func tenYears(from time.Time) time.Time { return from.AddDate(10, 0, 0) }

// authority is a cluster CA: it issues the nodes' "Kubernetes" certificates and
// signs the k8sd.io/* CSRs.
type authority struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func newKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func newAuthority(cluster string) (*authority, error) {
	key, cert, err := selfSigned(&x509.Certificate{
		Subject:               pkix.Name{CommonName: "nodesim-ca-" + cluster},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	})
	if err != nil {
		return nil, err
	}
	return &authority{cert: cert, key: key}, nil
}

// selfSigned signs tmpl with a fresh key of its own, with a fresh serial, valid from a minute
// ago for ten years: the simulator's CAs and k8sd serving certificates.
func selfSigned(tmpl *x509.Certificate) (*ecdsa.PrivateKey, *x509.Certificate, error) {
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-time.Minute)
	tmpl.NotAfter = tenYears(now)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return key, cert, nil
}

// issue signs tmpl for pub. A fresh serial is always set.
func (a *authority) issue(tmpl *x509.Certificate, pub crypto.PublicKey) (*x509.Certificate, error) {
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, pub, a.key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

// splitSANs sorts names into IP and DNS SANs, dropping duplicates while keeping order.
func splitSANs(names []string) ([]string, []net.IP) {
	var dns []string
	var ips []net.IP
	seen := map[string]bool{}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			if !seen["ip:"+ip.String()] {
				seen["ip:"+ip.String()] = true
				ips = append(ips, ip)
			}
			continue
		}
		if !seen["dns:"+n] {
			seen["dns:"+n] = true
			dns = append(dns, n)
		}
	}
	return dns, ips
}

// apiserverSANs is what k8sd puts on a control-plane apiserver certificate.
func apiserverSANs(nodeName, address string, extra []string) []string {
	sans := append([]string{}, extra...)
	return append(sans, address, nodeName,
		"kubernetes", "kubernetes.default", "kubernetes.default.svc",
		"kubernetes.default.svc.cluster.local", "10.96.0.1")
}

// issueNodeCert issues the certificate the simulator reports as a node's current one:
// the apiserver certificate on a control plane, the kubelet serving one on a worker.
func (a *authority) issueNodeCert(n NodeConfig, notBefore, notAfter time.Time, extraSANs []string) (*x509.Certificate, error) {
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		NotBefore:   notBefore,
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if n.Role == roleControlPlane {
		tmpl.Subject = pkix.Name{CommonName: "kube-apiserver"}
		tmpl.DNSNames, tmpl.IPAddresses = splitSANs(apiserverSANs(n.Name, n.Address, extraSANs))
	} else {
		tmpl.Subject = pkix.Name{CommonName: "system:node:" + n.Name, Organization: []string{"system:nodes"}}
		tmpl.DNSNames, tmpl.IPAddresses = splitSANs([]string{n.Address, n.Name})
	}
	return a.issue(tmpl, key.Public())
}

// initialCert issues the certificate a node was "installed" with. A negative lifetime
// gives an already expired certificate (useful to test expiry handling).
func (a *authority) initialCert(n NodeConfig, lifetimeSeconds int64) (*x509.Certificate, error) {
	now := time.Now()
	notAfter := now.Add(time.Duration(lifetimeSeconds) * time.Second)
	notBefore := now
	if !notAfter.After(notBefore) {
		notBefore = notAfter.Add(-time.Hour)
	}
	return a.issueNodeCert(n, notBefore, notAfter, nil)
}

// selfSignedServing creates the k8sd serving certificate of a node: k8sd's own
// certificate is self-signed, so clients cannot verify it against any CA.
func selfSignedServing(nodeName, address string) (*tls.Certificate, error) {
	key, leaf, err := selfSigned(&x509.Certificate{
		Subject:     pkix.Name{CommonName: nodeName},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{nodeName},
		IPAddresses: []net.IP{net.ParseIP(address)},
	})
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

func fingerprint(c *tls.Certificate) string {
	sum := sha256.Sum256(c.Certificate[0])
	return hex.EncodeToString(sum[:])
}

// newCSRPEM builds a PKCS#10 request from a fresh ECDSA key, as k8sd does on a worker.
func newCSRPEM(subject pkix.Name, dns []string, ips []net.IP) ([]byte, error) {
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:     subject,
		DNSNames:    dns,
		IPAddresses: ips,
	}, key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// signCSR issues a certificate for a PEM PKCS#10 request, like k8s-snap's csrsigning
// controller: subject and SANs from the request, usages from the CSR spec.
func (a *authority) signCSR(requestPEM []byte, usages []certv1.KeyUsage, notBefore, notAfter time.Time) ([]byte, error) {
	block, _ := pem.Decode(requestPEM)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("spec.request is not a PEM CERTIFICATE REQUEST")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse certificate request: %w", err)
	}
	if err := req.CheckSignature(); err != nil {
		return nil, fmt.Errorf("certificate request signature: %w", err)
	}
	tmpl := &x509.Certificate{
		Subject:     req.Subject,
		DNSNames:    req.DNSNames,
		IPAddresses: req.IPAddresses,
		NotBefore:   notBefore,
		NotAfter:    notAfter,
	}
	for _, u := range usages {
		switch u {
		case certv1.UsageDigitalSignature:
			tmpl.KeyUsage |= x509.KeyUsageDigitalSignature
		case certv1.UsageKeyEncipherment:
			tmpl.KeyUsage |= x509.KeyUsageKeyEncipherment
		case certv1.UsageServerAuth:
			tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		case certv1.UsageClientAuth:
			tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
		}
	}
	cert, err := a.issue(tmpl, req.PublicKey)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), nil
}

// parseCertPEM parses the first certificate of a PEM bundle.
func parseCertPEM(data []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("not a PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

// certSANs lists DNS SANs then IP SANs as strings.
func certSANs(c *x509.Certificate) []string {
	out := append([]string{}, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		out = append(out, ip.String())
	}
	return out
}
