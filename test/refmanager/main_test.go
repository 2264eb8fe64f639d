package main

import (
	"context"
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	clusterv1beta1 "sigs.k8s.io/cluster-api/api/core/v1beta1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func machine(annotations map[string]string, node string) *clusterv1.Machine {
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", Annotations: annotations}}
	m.Status.NodeRef = clusterv1.MachineNodeReference{Name: node}
	return m
}

func TestConfigOwnerRef(t *testing.T) {
	owner := func(apiVersion, kind, name string) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name}
	}
	cases := []struct {
		name string
		refs []metav1.OwnerReference
		want *corev1.ObjectReference
		err  bool
	}{
		{name: "no owners"},
		{name: "foreign kinds only", refs: []metav1.OwnerReference{
			owner("cluster.x-k8s.io/v1beta2", "MachineSet", "ms"),
			owner("example.com/v1", "Machine", "other-group"),
		}},
		{name: "v1beta2 Machine after a foreign owner", refs: []metav1.OwnerReference{
			owner("example.com/v1", "Thing", "t"),
			owner("cluster.x-k8s.io/v1beta2", "Machine", "m1"),
			owner("cluster.x-k8s.io/v1beta2", "Machine", "m2"),
		}, want: &corev1.ObjectReference{APIVersion: "cluster.x-k8s.io/v1beta2", Kind: "Machine", Name: "m1", Namespace: "ns"}},
		{name: "v1beta1 owner keeps its version", refs: []metav1.OwnerReference{
			owner("cluster.x-k8s.io/v1beta1", "Machine", "old"),
		}, want: &corev1.ObjectReference{APIVersion: "cluster.x-k8s.io/v1beta1", Kind: "Machine", Name: "old", Namespace: "ns"}},
		{name: "MachinePool", refs: []metav1.OwnerReference{
			owner("cluster.x-k8s.io/v1beta2", "MachinePool", "mp"),
		}, want: &corev1.ObjectReference{APIVersion: "cluster.x-k8s.io/v1beta2", Kind: "MachinePool", Name: "mp", Namespace: "ns"}},
		{name: "unparsable apiVersion", refs: []metav1.OwnerReference{owner("a/b/c", "Machine", "m")}, err: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &CK8sConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", OwnerReferences: tc.refs}}
			got, err := configOwnerRef(cfg)
			if (err != nil) != tc.err {
				t.Fatalf("err = %v, want error %v", err, tc.err)
			}
			if !equality.Semantic.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestDecideConfig(t *testing.T) {
	secret := ptr.To("m-data")
	ready := &CK8sConfig{Status: CK8sConfigStatus{Ready: true, DataSecretName: secret}}
	readyNoName := &CK8sConfig{Status: CK8sConfigStatus{Ready: true}}
	fresh := &CK8sConfig{}
	cases := []struct {
		name   string
		infra  bool
		secret *string
		config *CK8sConfig
		want   configAction
	}{
		{"infra not ready, not bootstrapped", false, nil, fresh, actionWaitInfrastructure},
		{"infra not ready even if status ready", false, nil, ready, actionWaitInfrastructure},
		{"owner bootstrapped, harness status (none)", false, secret, fresh, actionAdoptSecret},
		{"owner bootstrapped, status without secret name", true, secret, readyNoName, actionAdoptSecret},
		{"steady state", true, secret, ready, actionAlreadyReady},
		{"steady state, Cluster status unset", false, secret, ready, actionAlreadyReady},
		{"ready without owner secret", true, nil, readyNoName, actionAlreadyReady},
		{"needs bootstrapping", true, nil, fresh, actionBootstrap},
	}
	for _, tc := range cases {
		if got := decideConfig(tc.infra, tc.secret, tc.config); got != tc.want {
			t.Errorf("%s: got %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestDecideCertificates(t *testing.T) {
	expiry := map[string]string{certificatesExpiryAnnotation: "2030-01-01T00:00:00Z"}
	deleting := machine(expiry, "n")
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	cases := []struct {
		name string
		m    *clusterv1.Machine
		want certAction
	}{
		{"no node", machine(expiry, ""), certRequeueNoNode},
		{"deleting", deleting, certDeleting},
		{"steady state", machine(expiry, "n"), certNothingToDo},
		{"no expiry yet", machine(nil, "n"), certNeedsNode},
		{"trigger", machine(map[string]string{certificatesRefreshAnnotation: "1y", certificatesExpiryAnnotation: "x"}, "n"), certNeedsNode},
		{"in-progress without trigger", machine(map[string]string{certificatesRefreshStatusAnnotation: "in-progress", certificatesExpiryAnnotation: "x"}, "n"), certClearStatus},
		{"in-progress with trigger", machine(map[string]string{certificatesRefreshStatusAnnotation: "in-progress", certificatesRefreshAnnotation: "1y"}, "n"), certAlreadyInProgress},
		{"done, no trigger", machine(map[string]string{certificatesRefreshStatusAnnotation: "done", certificatesExpiryAnnotation: "x"}, "n"), certNothingToDo},
	}
	for _, tc := range cases {
		if got := decideCertificates(tc.m); got != tc.want {
			t.Errorf("%s: got %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestUpgradeInstructions(t *testing.T) {
	md := &clusterv1.MachineDeployment{}
	if got := upgradeInstructions(md); got != "" {
		t.Fatalf("no annotations: %q", got)
	}
	md.Annotations = map[string]string{inPlaceUpgradeReleaseAnnotation: "channel=1.33/stable"}
	if got := upgradeInstructions(md); got != "channel=1.33/stable" {
		t.Fatalf("release only: %q", got)
	}
	md.Annotations[inPlaceUpgradeToAnnotation] = "channel=1.34/stable"
	if got := upgradeInstructions(md); got != "channel=1.34/stable" {
		t.Fatalf("upgrade-to wins: %q", got)
	}
}

// The orchestrated in-place upgrade controller's Owns(Machine) maps a Machine to the
// MachineDeployment that is its controller owner, and nothing else.
func TestOwnsMachineMapping(t *testing.T) {
	scheme, err := newScheme()
	if err != nil {
		t.Fatal(err)
	}
	mapper := meta.NewDefaultRESTMapper(nil)
	mdGVK, err := apiutil.GVKForObject(&clusterv1.MachineDeployment{}, scheme)
	if err != nil {
		t.Fatal(err)
	}
	mapper.Add(mdGVK, meta.RESTScopeNamespace)
	h := handler.EnqueueRequestForOwner(scheme, mapper, &clusterv1.MachineDeployment{}, handler.OnlyControllerOwner())

	requests := func(refs ...metav1.OwnerReference) []reconcile.Request {
		q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
		defer q.ShutDown()
		m := machine(nil, "n")
		m.OwnerReferences = refs
		h.Create(context.Background(), event.CreateEvent{Object: m}, q)
		var out []reconcile.Request
		for q.Len() > 0 {
			r, _ := q.Get()
			out = append(out, r)
			q.Done(r)
		}
		return out
	}
	ref := func(kind, name string, controller bool) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: "cluster.x-k8s.io/v1beta2", Kind: kind, Name: name, UID: types.UID(name), Controller: ptr.To(controller)}
	}

	if got := requests(); len(got) != 0 {
		t.Fatalf("unowned Machine (the fleet's): %v", got)
	}
	if got := requests(ref("MachineSet", "ms", true)); len(got) != 0 {
		t.Fatalf("MachineSet-owned Machine: %v", got)
	}
	if got := requests(ref("MachineDeployment", "md", false)); len(got) != 0 {
		t.Fatalf("non-controller MachineDeployment owner: %v", got)
	}
	got := requests(ref("MachineDeployment", "md", true))
	want := []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "md"}}}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestCK8sConfigScheme(t *testing.T) {
	scheme, err := newScheme()
	if err != nil {
		t.Fatal(err)
	}
	gvk, err := apiutil.GVKForObject(&CK8sConfig{}, scheme)
	if err != nil {
		t.Fatal(err)
	}
	if gvk.Group != "bootstrap.cluster.x-k8s.io" || gvk.Version != "v1beta2" || gvk.Kind != "CK8sConfig" {
		t.Fatalf("gvk = %v", gvk)
	}
	if _, err := apiutil.GVKForObject(&CK8sConfigList{}, scheme); err != nil {
		t.Fatal(err)
	}

	// A deep copy is equal and shares nothing mutable.
	raw := `{"apiVersion":"bootstrap.cluster.x-k8s.io/v1beta2","kind":"CK8sConfig",
	  "metadata":{"name":"c","namespace":"ns","labels":{"a":"b"}},
	  "spec":{"files":[{"path":"/x","contentFrom":{"secret":{"name":"s","key":"k"}}}],
	    "controlPlane":{"microclusterPort":2381,"extraSANs":["a"],"extraKubeAPIServerArgs":{"x":"y"}},
	    "initConfig":{"enableDefaultDNS":false,"annotations":{"k":"v"}},
	    "extraKubeletArgs":{"k":null},"bootstrapConfig":{"contentFrom":{"secret":{"name":"s","key":"k"}}}},
	  "status":{"ready":true,"dataSecretName":"c","conditions":[{"type":"Ready","status":"True","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}`
	in := &CK8sConfig{}
	if err := json.Unmarshal([]byte(raw), in); err != nil {
		t.Fatal(err)
	}
	out := in.DeepCopyObject().(*CK8sConfig)
	if !equality.Semantic.DeepEqual(in, out) {
		t.Fatal("deep copy differs")
	}
	*out.Spec.ControlPlaneConfig.MicroclusterPort = 1
	out.Spec.ControlPlaneConfig.ExtraSANs[0] = "changed"
	*out.Spec.ControlPlaneConfig.ExtraKubeAPIServerArgs["x"] = "changed"
	*out.Spec.InitConfig.EnableDefaultDNS = true
	out.Spec.Files[0].ContentFrom.Secret.Name = "changed"
	out.Spec.BootstrapConfig.ContentFrom.Secret.Name = "changed"
	*out.Status.DataSecretName = "changed"
	out.Status.Conditions[0].Status = corev1.ConditionFalse
	out.Labels["a"] = "changed"
	if *in.Spec.ControlPlaneConfig.MicroclusterPort != 2381 || in.Spec.ControlPlaneConfig.ExtraSANs[0] != "a" ||
		*in.Spec.ControlPlaneConfig.ExtraKubeAPIServerArgs["x"] != "y" || *in.Spec.InitConfig.EnableDefaultDNS ||
		in.Spec.Files[0].ContentFrom.Secret.Name != "s" || in.Spec.BootstrapConfig.ContentFrom.Secret.Name != "s" ||
		*in.Status.DataSecretName != "c" || in.Status.Conditions[0].Status != corev1.ConditionTrue || in.Labels["a"] != "b" {
		t.Fatalf("deep copy shares state: %+v", in)
	}
	list := &CK8sConfigList{Items: []CK8sConfig{*in}}
	if !equality.Semantic.DeepEqual(list, list.DeepCopyObject()) {
		t.Fatal("list deep copy differs")
	}
}

func TestConditions(t *testing.T) {
	cfg := &CK8sConfig{}
	setReadySummary(cfg, dataSecretAvailableCondition, certificatesAvailableCondition)
	if len(cfg.Status.Conditions) != 0 {
		t.Fatalf("summary of nothing: %v", cfg.Status.Conditions)
	}
	markCondition(cfg, dataSecretAvailableCondition, corev1.ConditionFalse, waitingForClusterInfraReason, clusterv1beta1.ConditionSeverityInfo)
	setReadySummary(cfg, dataSecretAvailableCondition, certificatesAvailableCondition)
	if len(cfg.Status.Conditions) != 2 || cfg.Status.Conditions[1].Type != clusterv1beta1.ReadyCondition ||
		cfg.Status.Conditions[1].Status != corev1.ConditionFalse || cfg.Status.Conditions[1].Reason != waitingForClusterInfraReason {
		t.Fatalf("false summary: %+v", cfg.Status.Conditions)
	}
	before := cfg.DeepCopy()
	markCondition(cfg, dataSecretAvailableCondition, corev1.ConditionFalse, waitingForClusterInfraReason, clusterv1beta1.ConditionSeverityInfo)
	setReadySummary(cfg, dataSecretAvailableCondition, certificatesAvailableCondition)
	if !equality.Semantic.DeepEqual(before, cfg) {
		t.Fatalf("re-marking the same state changed the object: %+v", cfg.Status.Conditions)
	}
	markCondition(cfg, dataSecretAvailableCondition, corev1.ConditionTrue, "", "")
	setReadySummary(cfg, dataSecretAvailableCondition, certificatesAvailableCondition)
	if cfg.Status.Conditions[1].Status != corev1.ConditionTrue || cfg.Status.Conditions[1].Reason != "" {
		t.Fatalf("true summary: %+v", cfg.Status.Conditions)
	}
}
