package main

import (
	"strings"
	"testing"
)

const sampleConfig = `{
  "control": "127.0.0.1:41234",
  "kubeletClientCA": "/tmp/env/ca.crt",
  "managementKubeconfig": "/tmp/env/mgmt.kubeconfig",
  "restartSeconds": 3,
  "restartHook": "http://127.0.0.1:41235/",
  "clusters": [
    {
      "name": "alpha",
      "namespace": "fleet",
      "kubeconfig": "/tmp/env/alpha.kubeconfig",
      "honourCSRExpiration": false,
      "annotations": {"k8sd/v1alpha1/csrsigning/auto-approve": "true"},
      "nodes": [
        {
          "name": "alpha-cp-0-vm",
          "machine": "alpha-cp-0",
          "role": "control-plane",
          "address": "127.23.1.1",
          "kubeletPort": 10250,
          "microclusterPort": 2380,
          "proxyPod": "k8sd-proxy-abc12",
          "kubeletCert": "/tmp/env/kubelet-alpha-cp-0-vm.crt",
          "kubeletKey": "/tmp/env/kubelet-alpha-cp-0-vm.key",
          "initialCertLifetimeSeconds": 31536000,
          "approveMode": "watch",
          "runAnswersDuration": false
        },
        {
          "name": "alpha-w-0-vm",
          "machine": "alpha-w-0",
          "role": "worker",
          "address": "127.23.1.2",
          "kubeletPort": 10250,
          "microclusterPort": 2380,
          "proxyPod": "k8sd-proxy-def34",
          "kubeletCert": "/tmp/env/kubelet-alpha-w-0-vm.crt",
          "kubeletKey": "/tmp/env/kubelet-alpha-w-0-vm.key"
        }
      ]
    }
  ]
}`

func TestParseConfig(t *testing.T) {
	cfg, err := parseConfig([]byte(sampleConfig))
	if err != nil {
		t.Fatal(err)
	}
	w := cfg.Clusters[0].Nodes[1]
	if w.ApproveMode != approveWatch || w.InitialCertLifetimeSeconds != defaultInitialLifetimeSeconds {
		t.Errorf("defaults not applied: %+v", w)
	}
	if cfg.RestartHook != "http://127.0.0.1:41235" || cfg.Clusters[0].Annotations[annotationAutoApprove] != "true" {
		t.Errorf("restartHook %q, annotations %v", cfg.RestartHook, cfg.Clusters[0].Annotations)
	}
	for name, mutate := range map[string]func(string) string{
		"unknown field":  func(s string) string { return strings.Replace(s, `"restartSeconds"`, `"restartSecs"`, 1) },
		"bad role":       func(s string) string { return strings.Replace(s, `"worker"`, `"minion"`, 1) },
		"bad approve":    func(s string) string { return strings.Replace(s, `"watch"`, `"poll"`, 1) },
		"bad address":    func(s string) string { return strings.Replace(s, `"127.23.1.2"`, `"localhost"`, 1) },
		"duplicate port": func(s string) string { return strings.Replace(s, `"127.23.1.2"`, `"127.23.1.1"`, 1) },
		"trailing data":  func(s string) string { return s + "{}" },
		"hook scheme":    func(s string) string { return strings.Replace(s, `"http://127.0.0.1:41235/"`, `"127.0.0.1:41235"`, 1) },
		"hook path":      func(s string) string { return strings.Replace(s, `41235/"`, `41235/hook"`, 1) },
		"annotation int": func(s string) string { return strings.Replace(s, `auto-approve": "true"`, `auto-approve": true`, 1) },
	} {
		if _, err := parseConfig([]byte(mutate(sampleConfig))); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
