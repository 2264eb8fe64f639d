package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
)

// Config is the file the Rust harness writes before starting the simulator.
type Config struct {
	Control              string  `json:"control"`
	KubeletClientCA      string  `json:"kubeletClientCA"`
	ManagementKubeconfig string  `json:"managementKubeconfig"`
	RestartSeconds       float64 `json:"restartSeconds"`
	// RestartHook is the harness's URL (http://host:port) the simulator POSTs
	// /clusters/<name>/restart-apiserver to when the only control plane of a cluster
	// restarted its services. Empty: the API servers are never restarted.
	RestartHook string          `json:"restartHook"`
	Clusters    []ClusterConfig `json:"clusters"`
}

// ClusterConfig describes one workload cluster and the nodes the simulator plays.
type ClusterConfig struct {
	Name                string `json:"name"`
	Namespace           string `json:"namespace"`
	Kubeconfig          string `json:"kubeconfig"`
	HonourCSRExpiration bool   `json:"honourCSRExpiration"`
	// Annotations are the cluster's initial k8sd annotations (k8sd cluster config), e.g.
	// "k8sd/v1alpha1/csrsigning/auto-approve": "true". Changeable at runtime.
	Annotations map[string]string `json:"annotations"`
	Nodes       []NodeConfig      `json:"nodes"`
}

// NodeConfig describes one node: its kubelet and its k8sd.
type NodeConfig struct {
	Name             string `json:"name"`
	Machine          string `json:"machine"`
	Role             string `json:"role"`
	Address          string `json:"address"`
	KubeletPort      int    `json:"kubeletPort"`
	MicroclusterPort int    `json:"microclusterPort"`
	ProxyPod         string `json:"proxyPod"`
	KubeletCert      string `json:"kubeletCert"`
	KubeletKey       string `json:"kubeletKey"`
	// KubeletExpiredCert/Key: the same kubelet serving certificate, expired (optional); the
	// kubelet serves it while the node's certificates are expired (PUT .../certificates).
	KubeletExpiredCert         string `json:"kubeletExpiredCert,omitempty"`
	KubeletExpiredKey          string `json:"kubeletExpiredKey,omitempty"`
	InitialCertLifetimeSeconds int64  `json:"initialCertLifetimeSeconds"`
	ApproveMode                string `json:"approveMode"`
	RunAnswersDuration         bool   `json:"runAnswersDuration"`
}

const (
	roleControlPlane = "control-plane"
	roleWorker       = "worker"

	approveWatch   = "watch"
	approveGetOnce = "get-once"

	// Used when the harness leaves initialCertLifetimeSeconds at 0.
	defaultInitialLifetimeSeconds = 365 * 24 * 3600
)

// loadConfig reads and validates the config file.
func loadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseConfig(data)
}

// parseConfig decodes strictly (unknown fields are errors: a typo in the harness
// must not silently fall back to a default) and fills defaults.
func parseConfig(data []byte) (*Config, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var cfg Config
	if err := dec.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("parse config: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("parse config: unexpected data after the JSON object")
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	return &cfg, nil
}

func (c *Config) validate() error {
	if c.Control == "" {
		return errors.New("control is required")
	}
	if c.KubeletClientCA == "" {
		return errors.New("kubeletClientCA is required")
	}
	if c.ManagementKubeconfig == "" {
		return errors.New("managementKubeconfig is required")
	}
	if c.RestartSeconds < 0 {
		return errors.New("restartSeconds must not be negative")
	}
	if c.RestartHook != "" {
		u, err := url.Parse(c.RestartHook)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
			return fmt.Errorf("restartHook %q: want http://host:port", c.RestartHook)
		}
		c.RestartHook = strings.TrimSuffix(c.RestartHook, "/")
	}
	clusters := map[string]bool{}
	endpoints := map[string]string{}
	for ci := range c.Clusters {
		cl := &c.Clusters[ci]
		if cl.Name == "" || cl.Namespace == "" || cl.Kubeconfig == "" {
			return fmt.Errorf("cluster %d: name, namespace and kubeconfig are required", ci)
		}
		if clusters[cl.Name] {
			return fmt.Errorf("cluster %q listed twice", cl.Name)
		}
		clusters[cl.Name] = true
		nodes := map[string]bool{}
		for ni := range cl.Nodes {
			n := &cl.Nodes[ni]
			where := fmt.Sprintf("cluster %q node %d (%q)", cl.Name, ni, n.Name)
			if n.Name == "" || n.Machine == "" || n.ProxyPod == "" || n.KubeletCert == "" || n.KubeletKey == "" {
				return fmt.Errorf("%s: name, machine, proxyPod, kubeletCert and kubeletKey are required", where)
			}
			if (n.KubeletExpiredCert == "") != (n.KubeletExpiredKey == "") {
				return fmt.Errorf("%s: kubeletExpiredCert and kubeletExpiredKey go together", where)
			}
			if nodes[n.Name] {
				return fmt.Errorf("%s: node listed twice", where)
			}
			nodes[n.Name] = true
			if n.Role != roleControlPlane && n.Role != roleWorker {
				return fmt.Errorf("%s: role must be %q or %q", where, roleControlPlane, roleWorker)
			}
			if net.ParseIP(n.Address) == nil {
				return fmt.Errorf("%s: address %q is not an IP", where, n.Address)
			}
			for _, p := range []int{n.KubeletPort, n.MicroclusterPort} {
				if p < 1 || p > 65535 {
					return fmt.Errorf("%s: port %d out of range", where, p)
				}
			}
			for _, p := range []int{n.KubeletPort, n.MicroclusterPort} {
				ep := net.JoinHostPort(n.Address, fmt.Sprint(p))
				if other, dup := endpoints[ep]; dup {
					return fmt.Errorf("%s: %s is already used by %s", where, ep, other)
				}
				endpoints[ep] = where
			}
			switch n.ApproveMode {
			case "":
				n.ApproveMode = approveWatch
			case approveWatch, approveGetOnce:
			default:
				return fmt.Errorf("%s: approveMode must be %q or %q", where, approveWatch, approveGetOnce)
			}
			if n.InitialCertLifetimeSeconds == 0 {
				n.InitialCertLifetimeSeconds = defaultInitialLifetimeSeconds
			}
		}
	}
	return nil
}
