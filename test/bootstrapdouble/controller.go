package main

// The reconcile loop: a Machine informer (the cache the provider reads from, which lags behind
// writes), a rate-limited work queue with one worker (controller-runtime's defaults:
// MaxConcurrentReconciles 1, per-item exponential backoff 5 ms..1000 s after an error), and
// the provider's Reconcile, step for step (design.md section 8).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	apiv1 "github.com/canonical/k8s-snap-api/api/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
)

var (
	machineGVR   = schema.GroupVersionResource{Group: "cluster.x-k8s.io", Version: "v1beta1", Resource: "machines"}
	clusterGVR   = schema.GroupVersionResource{Group: "cluster.x-k8s.io", Version: "v1beta1", Resource: "clusters"}
	ck8sConfigGV = schema.GroupVersionResource{Group: "bootstrap.cluster.x-k8s.io", Version: "v1beta2", Resource: "ck8sconfigs"}
)

const (
	controlPlaneLabel = "cluster.x-k8s.io/control-plane"
	fieldManager      = "bootstrapdouble"

	eventInProgress = "CertificatesRefreshInProgress"
	eventDone       = "CertificatesRefreshDone"
	eventFailed     = "CertificatesRefreshFailed"
)

type options struct {
	k8sdTimeout time.Duration
	events      bool
}

type controller struct {
	opts     options
	dynamic  dynamic.Interface
	kube     kubernetes.Interface
	indexer  cache.Indexer
	queue    workqueue.TypedRateLimitingInterface[string]
	records  *recorder
	recorder record.EventRecorder // nil when --events=false
}

type result struct{ requeueAfter time.Duration }

// run starts the worker and blocks until ctx ends.
func (c *controller) run(ctx context.Context) {
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	for c.next(ctx) {
	}
}

func (c *controller) next(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	res, err := c.reconcile(ctx, key)
	switch {
	case err != nil:
		logf("reconcile %s: %v (requeued with backoff)", key, err)
		c.queue.AddRateLimited(key)
	case res.requeueAfter > 0:
		c.queue.Forget(key)
		c.queue.AddAfter(key, res.requeueAfter)
	default:
		c.queue.Forget(key)
	}
	return true
}

// machine is what a reconcile reads from the cached Machine.
type machine struct {
	obj         *unstructured.Unstructured // a deep copy of the cache's object
	namespace   string
	name        string
	cluster     string
	node        string
	annotations map[string]string
}

func (m *machine) record(step, outcome string, seed *int, detail string) Record {
	return Record{Namespace: m.namespace, Machine: m.name, Cluster: m.cluster, Node: m.node,
		Step: step, Outcome: outcome, Seed: seed, Detail: detail}
}

// scope is the provider's CertificatesScope: what it reads besides the Machine.
type scope struct {
	controlPlane bool
	extraSANs    []string
	endpointHost string
	workload     *workload
}

func (c *controller) reconcile(ctx context.Context, key string) (result, error) {
	cached, exists, err := c.indexer.GetByKey(key)
	if err != nil || !exists {
		return result{}, err
	}
	obj := cached.(*unstructured.Unstructured).DeepCopy()
	m := &machine{obj: obj, namespace: obj.GetNamespace(), name: obj.GetName(), annotations: obj.GetAnnotations()}
	m.cluster, _, _ = unstructured.NestedString(obj.Object, "spec", "clusterName")
	nodeRef, hasNodeRef, _ := unstructured.NestedMap(obj.Object, "status", "nodeRef")
	if hasNodeRef {
		m.node, _ = nodeRef["name"].(string)
	}

	d := decide(hasNodeRef, obj.GetDeletionTimestamp() != nil, m.annotations)
	switch d.action {
	case actRequeueNoNode:
		c.records.add(m.record("no-node-ref", outcomeRequeued, nil, ""))
		return result{requeueAfter: noNodeRequeue}, nil
	case actStop:
		return result{}, nil
	case actClearStatus:
		after := copyAnnotations(m.annotations)
		delete(after, annStatus)
		if err := c.update(ctx, m, after); err != nil {
			c.records.add(m.record("clear-status", outcomeError, nil, err.Error()))
			return result{}, fmt.Errorf("failed to clear status annotation: %w", err)
		}
		c.records.add(m.record("clear-status", outcomeOK, nil, ""))
		return result{}, nil
	case actSkipInProgress:
		logf("%s: Certificates refresh already in progress (refreshStatus=%s refreshAnnotation=%s)",
			key, statusInProgress, m.annotations[annTrigger])
		c.records.add(m.record("skip", outcomeSkipped, nil, "already in progress"))
		return result{}, nil
	}

	s, err := c.scope(ctx, m)
	if err != nil {
		c.records.add(m.record("scope", outcomeError, nil, err.Error()))
		return result{}, err
	}
	// The patch helper's snapshot is the cached Machine; `after` is the Machine as changed so
	// far in this reconcile (see annotationPatch).
	before := m.annotations
	after := copyAnnotations(before)
	if d.fetchExpiry {
		if err := c.fetchExpiry(ctx, m, s, before, after); err != nil {
			c.records.add(m.record("expiry", outcomeError, nil, err.Error()))
			return result{}, err
		}
	}
	if d.refresh {
		if err := c.refresh(ctx, m, s, before, after); err != nil {
			// The provider's failure path: a full Update of the cached Machine (its
			// resourceVersion is stale once in-progress was patched, so this conflicts).
			after[annStatus] = statusFailed
			if uerr := c.update(ctx, m, after); uerr != nil {
				c.records.add(m.record("failed", outcomeError, nil, fmt.Sprintf("%v; update: %v", err, uerr)))
				return result{}, fmt.Errorf("failed to clear status annotation after error: %w", uerr)
			}
			c.records.add(m.record("failed", outcomeOK, nil, err.Error()))
			return result{}, err
		}
	}
	return result{}, nil
}

// scope reads the CK8sConfig, its owner, the Cluster and the workload cluster's access.
// (The provider reads the first three from its cache; the double reads them directly.)
func (c *controller) scope(ctx context.Context, m *machine) (*scope, error) {
	configName, _, _ := unstructured.NestedString(m.obj.Object, "spec", "bootstrap", "configRef", "name")
	if configName == "" {
		// The provider dereferences a nil configRef here and panics; the double says so.
		return nil, errors.New("machine has no spec.bootstrap.configRef")
	}
	config, err := c.dynamic.Resource(ck8sConfigGV).Namespace(m.namespace).Get(ctx, configName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("failed to get CK8sConfig: %w", err)
	}
	owner, err := c.configOwner(ctx, config)
	if err != nil || owner == nil {
		return nil, fmt.Errorf("failed to get config owner: %w", err)
	}
	cluster, err := c.dynamic.Resource(clusterGVR).Namespace(m.namespace).Get(ctx, m.cluster, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("failed to get cluster: %w", err)
	}
	port := defaultMicroclusterPort
	if p, found, _ := unstructured.NestedInt64(config.Object, "spec", "controlPlane", "microclusterPort"); found {
		port = int(p)
	}
	w, err := newWorkload(ctx, c.kube, m.namespace, m.cluster, port, c.opts.k8sdTimeout)
	if err != nil {
		return nil, fmt.Errorf("failed to get workload cluster: %w", err)
	}
	sans, _, _ := unstructured.NestedStringSlice(config.Object, "spec", "controlPlane", "extraSANs")
	host, _, _ := unstructured.NestedString(cluster.Object, "spec", "controlPlaneEndpoint", "host")
	_, isControlPlane := owner.GetLabels()[controlPlaneLabel]
	return &scope{controlPlane: isControlPlane, extraSANs: sans, endpointHost: host, workload: w}, nil
}

// configOwner follows the CK8sConfig's owner reference to its Machine (Cluster API's
// GetConfigOwner; MachinePools are not modelled). nil when there is none.
func (c *controller) configOwner(ctx context.Context, config *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	for _, ref := range config.GetOwnerReferences() {
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err != nil || gv.Group != machineGVR.Group || ref.Kind != "Machine" {
			continue
		}
		gvr := gv.WithResource("machines")
		return c.dynamic.Resource(gvr).Namespace(config.GetNamespace()).Get(ctx, ref.Name, metav1.GetOptions{})
	}
	return nil, nil
}

// fetchExpiry is updateExpiryDateAnnotation: ask the node, patch the annotation.
func (c *controller) fetchExpiry(ctx context.Context, m *machine, s *scope, before, after map[string]string) error {
	token, err := lookupNodeToken(ctx, c.kube, m.namespace, m.cluster, m.name)
	if err != nil {
		return err
	}
	date, err := s.workload.expiry(ctx, m.node, token)
	if err != nil {
		return err
	}
	after[annExpiry] = date
	if err := c.patch(ctx, m, before, after); err != nil {
		return err
	}
	c.records.add(m.record("expiry", outcomeOK, nil, date))
	return nil
}

// refresh is the provider's refreshCertificates.
func (c *controller) refresh(ctx context.Context, m *machine, s *scope, before, after map[string]string) error {
	token, err := lookupNodeToken(ctx, c.kube, m.namespace, m.cluster, m.name)
	if err != nil {
		c.records.add(m.record("scope", outcomeError, nil, err.Error()))
		return err
	}
	ttl, ok := after[annTrigger]
	if !ok {
		return errors.New("refresh annotation not found")
	}
	after[annStatus] = statusInProgress
	if err := c.patch(ctx, m, before, after); err != nil {
		c.records.add(m.record("in-progress", outcomeError, nil, err.Error()))
		return fmt.Errorf("failed to set in-progress status: %w", err)
	}
	c.records.add(m.record("in-progress", outcomeOK, nil, ttl))
	c.event(m, corev1.EventTypeNormal, eventInProgress, "Certificates refresh in progress. TTL: %s", ttl)

	seconds, err := parseTTL(ttl)
	if err != nil {
		c.records.add(m.record("ttl", outcomeError, nil, err.Error()))
		return fmt.Errorf("failed to parse TTL: %w", err)
	}

	var expiresUnix int
	if s.controlPlane {
		// The CK8sConfig's extra SANs plus the endpoint host (appended even when empty).
		sans := append(append([]string{}, s.extraSANs...), s.endpointHost)
		expiresUnix, err = c.refreshControlPlane(ctx, m, s.workload, token, seconds, sans)
	} else {
		expiresUnix, err = c.refreshWorker(ctx, m, s.workload, token, seconds)
	}
	if err != nil {
		c.event(m, corev1.EventTypeWarning, eventFailed, "Failed to refresh certificates: %v", err)
		return fmt.Errorf("failed to refresh certificates: %w", err)
	}

	expiry := expiryAnnotation(expiresUnix)
	delete(after, annTrigger)
	after[annStatus] = statusDone
	after[annExpiry] = expiry
	if err := c.patch(ctx, m, before, after); err != nil {
		c.records.add(m.record("done", outcomeError, nil, err.Error()))
		return fmt.Errorf("failed to patch machine annotations: %w", err)
	}
	c.records.add(m.record("done", outcomeOK, nil, expiry))
	c.event(m, corev1.EventTypeNormal, eventDone, "Certificates refreshed, will expire at %s", time.Unix(int64(expiresUnix), 0))
	logf("%s/%s: Certificates refreshed (cluster=%s expiry=%s)", m.namespace, m.name, m.cluster, expiry)
	return nil
}

func (c *controller) plan(ctx context.Context, m *machine, w *workload, token string) (int, error) {
	seed, err := w.plan(ctx, m.node, token)
	if err != nil {
		c.records.add(m.record("plan", outcomeError, nil, err.Error()))
		return 0, fmt.Errorf("failed to get refresh certificates plan: %w", err)
	}
	c.records.add(m.record("plan", outcomeOK, &seed, ""))
	return seed, nil
}

func (c *controller) runOnNode(ctx context.Context, m *machine, w *workload, token string, req apiv1.ClusterAPICertificatesRunRequest) (int, error) {
	seed := req.Seed
	expires, err := w.run(ctx, m.node, token, req)
	if err != nil {
		c.records.add(m.record("run", outcomeError, &seed, err.Error()))
		return 0, err
	}
	c.records.add(m.record("run", outcomeOK, &seed, fmt.Sprintf("expiration-seconds=%d", expires)))
	return expires, nil
}

// refreshControlPlane: plan, then run with the TTL and SANs.
func (c *controller) refreshControlPlane(ctx context.Context, m *machine, w *workload, token string, seconds int, sans []string) (int, error) {
	seed, err := c.plan(ctx, m, w, token)
	if err != nil {
		return 0, err
	}
	return c.runOnNode(ctx, m, w, token, apiv1.ClusterAPICertificatesRunRequest{ExpirationSeconds: seconds, Seed: seed, ExtraSANs: sans})
}

// refreshWorker: plan, then run on the worker and approve on a control-plane node at the same
// time (an errgroup in the provider: the first error cancels the other call).
func (c *controller) refreshWorker(ctx context.Context, m *machine, w *workload, token string, seconds int) (int, error) {
	seed, err := c.plan(ctx, m, w, token)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg      sync.WaitGroup
		once    sync.Once
		first   error
		expires int
	)
	fail := func(err error) {
		once.Do(func() {
			first = err
			cancel()
		})
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		var err error
		expires, err = c.runOnNode(ctx, m, w, token, apiv1.ClusterAPICertificatesRunRequest{Seed: seed, ExpirationSeconds: seconds})
		if err != nil {
			fail(fmt.Errorf("failed to run refresh certificates: %w", err))
		}
	}()
	go func() {
		defer wg.Done()
		node, err := w.approve(ctx, seed)
		if err != nil {
			c.records.add(m.record("approve", outcomeError, &seed, fmt.Sprintf("node %s: %v", node, err)))
			fail(fmt.Errorf("failed to approve certificates: %w", err))
			return
		}
		c.records.add(m.record("approve", outcomeOK, &seed, "node "+node))
	}()
	wg.Wait()
	if first != nil {
		return 0, fmt.Errorf("failed to refresh worker certificates: %w", first)
	}
	return expires, nil
}

// patch sends the patch helper's merge patch (no resourceVersion), if there is a difference.
func (c *controller) patch(ctx context.Context, m *machine, before, after map[string]string) error {
	body := annotationPatch(before, after)
	if body == nil {
		return nil
	}
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	_, err = c.dynamic.Resource(machineGVR).Namespace(m.namespace).Patch(ctx, m.name, types.MergePatchType, data,
		metav1.PatchOptions{FieldManager: fieldManager})
	return err
}

// update is a full Update of the cached Machine (with the cache's resourceVersion) carrying
// `annotations`: a conflict when the cache is behind.
func (c *controller) update(ctx context.Context, m *machine, annotations map[string]string) error {
	obj := m.obj.DeepCopy()
	obj.SetAnnotations(annotations)
	_, err := c.dynamic.Resource(machineGVR).Namespace(m.namespace).Update(ctx, obj,
		metav1.UpdateOptions{FieldManager: fieldManager})
	if apierrors.IsConflict(err) {
		return fmt.Errorf("conflict (stale resourceVersion %s): %w", obj.GetResourceVersion(), err)
	}
	return err
}

func (c *controller) event(m *machine, kind, reason, format string, args ...any) {
	if c.recorder == nil {
		return
	}
	ref := &corev1.ObjectReference{
		APIVersion: m.obj.GetAPIVersion(), Kind: m.obj.GetKind(),
		Namespace: m.namespace, Name: m.name, UID: m.obj.GetUID(), ResourceVersion: m.obj.GetResourceVersion(),
	}
	c.recorder.Eventf(ref, kind, reason, format, args...)
}
