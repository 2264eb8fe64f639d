package main

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	clusterv1beta1 "sigs.k8s.io/cluster-api/api/core/v1beta1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// CK8sConfigReconciler models bootstrap/controllers/ck8sconfig_controller.go
// (CK8sConfigReconciler.Reconcile and SetupWithManager) up to the point where a configuration
// is found to be already generated.
type CK8sConfigReconciler struct {
	reconcilerBase
}

// reconcilerBase is what every modelled controller holds: the manager's client, its logger and
// the counters logged at exit.
type reconcilerBase struct {
	client.Client
	Log   logr.Logger
	Stats *stats
}

// notModelled ends a reconcile at the work this reference manager leaves out (no requeue), and
// counts it. what says what the provider would go on to do.
func (b *reconcilerBase) notModelled(log logr.Logger, what string) (ctrl.Result, error) {
	b.Stats.notModelled.Add(1)
	log.Info(what + ", which this reference manager does not model")
	return ctrl.Result{}, nil
}

// SetupWithManager registers the controller exactly as the provider does: For(CK8sConfig) and
// nothing else (no Owns, no Watches on Machines or Clusters).
func (r *CK8sConfigReconciler) SetupWithManager(mgr ctrl.Manager, wrap func(string, reconcile.Func) reconcile.Func) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&CK8sConfig{}).
		Complete(wrap("ck8sconfig", r.Reconcile))
}

// configOwnerKinds are the owner kinds sigs.k8s.io/cluster-api bootstrap/util.GetConfigOwner
// accepts (MachinePool is behind a feature gate that is on by default in the provider's CAPI).
var configOwnerKinds = []schema.GroupKind{
	{Group: clusterv1.GroupVersion.Group, Kind: "Machine"},
	{Group: clusterv1.GroupVersion.Group, Kind: "MachinePool"},
}

// configOwnerRef returns the reference bootstrap/util.GetConfigOwner follows: the first owner
// reference whose group and kind are allowed, with its own apiVersion (so the GET goes to the
// version named in the owner reference), in the object's namespace. Nil when there is none.
func configOwnerRef(obj metav1.Object) (*corev1.ObjectReference, error) {
	for _, ref := range obj.GetOwnerReferences() {
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err != nil {
			return nil, fmt.Errorf("failed to parse GroupVersion from %q: %w", ref.APIVersion, err)
		}
		for _, gk := range configOwnerKinds {
			if gv.Group == gk.Group && ref.Kind == gk.Kind {
				return &corev1.ObjectReference{
					APIVersion: ref.APIVersion,
					Kind:       ref.Kind,
					Name:       ref.Name,
					Namespace:  obj.GetNamespace(),
				}, nil
			}
		}
	}
	return nil, nil
}

// ownerDataSecretName is ConfigOwner.DataSecretName: spec.bootstrap.dataSecretName.
func ownerDataSecretName(owner *unstructured.Unstructured) *string {
	name, found, err := unstructured.NestedString(owner.Object, "spec", "bootstrap", "dataSecretName")
	if err != nil || !found {
		return nil
	}
	return &name
}

// ownerClusterName is ConfigOwner.ClusterName: spec.clusterName.
func ownerClusterName(owner *unstructured.Unstructured) string {
	name, _, _ := unstructured.NestedString(owner.Object, "spec", "clusterName")
	return name
}

// isPaused is annotations.IsPaused: the Cluster is paused or the object has the paused
// annotation.
func isPaused(cluster *clusterv1.Cluster, obj metav1.Object) bool {
	if ptr.Deref(cluster.Spec.Paused, false) {
		return true
	}
	_, ok := obj.GetAnnotations()[clusterv1.PausedAnnotation]
	return ok
}

// configAction is what the provider's Reconcile switch decides for a CK8sConfig.
type configAction int

const (
	// actionWaitInfrastructure: Cluster infrastructure not ready; the provider marks
	// DataSecretAvailable false and requeues after one minute.
	actionWaitInfrastructure configAction = iota
	// actionAdoptSecret: the owner already has a data secret but the status does not say so
	// (pivot/restore); the provider copies it into the status and returns.
	actionAdoptSecret
	// actionAlreadyReady: the configuration has been generated; return.
	actionAlreadyReady
	// actionBootstrap: init or join; not modelled.
	actionBootstrap
)

// decideConfig is the provider's switch. infrastructureReady is the Cluster's
// status.initialization.infrastructureProvisioned (the v1beta2 form of the v1beta1
// status.infrastructureReady the provider reads). Where the Cluster does not say so but the owner
// already carries a bootstrap data secret, the Cluster is taken as provisioned: Cluster API
// only bootstraps Machines of provisioned clusters, and the benchmark's fleet (which does not
// write Cluster status) stands for a fleet in steady state.
func decideConfig(infrastructureReady bool, ownerDataSecret *string, config *CK8sConfig) configAction {
	if !infrastructureReady && ownerDataSecret == nil {
		return actionWaitInfrastructure
	}
	switch {
	case ownerDataSecret != nil && (!config.Status.Ready || config.Status.DataSecretName == nil):
		return actionAdoptSecret
	case config.Status.Ready:
		return actionAlreadyReady
	}
	return actionBootstrap
}

// Reconcile performs the provider's reads for one CK8sConfig and its in-memory status changes,
// and sends none of the writes.
func (r *CK8sConfigReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, rerr error) {
	log := r.Log.WithValues("ck8sconfig", req.NamespacedName)

	// 1. The CK8sConfig, from the informer cache.
	config := &CK8sConfig{}
	if err := r.Get(ctx, req.NamespacedName, config); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		log.Error(err, "Failed to get config")
		return ctrl.Result{}, err
	}

	// 2. Its owner, through bootstrap/util.GetConfigOwner -> controllers/external.Get: an
	// *unstructured* Get, which the manager's default client does not cache, so this is a live
	// GET against the API server on every reconcile.
	ref, err := configOwnerRef(config)
	if err != nil {
		log.Error(err, "Failed to get owner")
		return ctrl.Result{}, err
	}
	if ref == nil {
		return ctrl.Result{}, nil
	}
	owner := &unstructured.Unstructured{}
	owner.SetAPIVersion(ref.APIVersion)
	owner.SetKind(ref.Kind)
	r.Stats.liveGets.Add(1)
	if err := r.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, owner); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		log.Error(err, "Failed to get owner")
		return ctrl.Result{}, err
	}
	log = log.WithValues("kind", owner.GetKind(), "version", owner.GetResourceVersion(), "name", owner.GetName())

	// 3. The Cluster, typed, through the cache (util.GetClusterByName). The first such Get
	// starts the Cluster informer: the provider watches no Clusters until then.
	cluster := &clusterv1.Cluster{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: owner.GetNamespace(), Name: ownerClusterName(owner)}, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			log.Info("Cluster does not exist yet, waiting until it is created")
			return ctrl.Result{}, nil
		}
		log.Error(err, "Could not get cluster with metadata")
		return ctrl.Result{}, err
	}

	if isPaused(cluster, config) {
		log.Info("Reconciliation is paused for this object")
		return ctrl.Result{}, nil
	}

	// 4. patch.NewHelper: a snapshot of the object, compared after the reconcile (the provider
	// always runs patchHelper.Patch in a defer; with no difference it sends nothing).
	before, err := runtime.DefaultUnstructuredConverter.ToUnstructured(config)
	if err != nil {
		return ctrl.Result{}, err
	}
	defer func() {
		setReadySummary(config, dataSecretAvailableCondition, certificatesAvailableCondition)
		if rerr == nil {
			config.Status.ObservedGeneration = config.Generation
		}
		after, err := runtime.DefaultUnstructuredConverter.ToUnstructured(config)
		if err != nil {
			if rerr == nil {
				rerr = err
			}
			return
		}
		if !equality.Semantic.DeepEqual(before, after) {
			// The provider would patch the CK8sConfig (and its status) here. Not sent.
			r.Stats.suppressedWrites.Add(1)
			log.V(2).Info("provider would patch CK8sConfig; not sent")
		}
	}()

	infrastructureReady := cluster.Status.Initialization.InfrastructureProvisioned != nil &&
		*cluster.Status.Initialization.InfrastructureProvisioned
	switch decideConfig(infrastructureReady, ownerDataSecretName(owner), config) {
	case actionWaitInfrastructure:
		log.Info("Cluster infrastructure is not ready, waiting")
		markCondition(config, dataSecretAvailableCondition, corev1.ConditionFalse, waitingForClusterInfraReason, clusterv1beta1.ConditionSeverityInfo)
		return ctrl.Result{RequeueAfter: time.Minute}, nil
	case actionAdoptSecret:
		config.Status.Ready = true
		config.Status.DataSecretName = ownerDataSecretName(owner)
		markCondition(config, dataSecretAvailableCondition, corev1.ConditionTrue, "", "")
		return ctrl.Result{}, nil
	case actionAlreadyReady:
		return ctrl.Result{}, nil
	}
	// Control-plane init/join and worker join (init lock ConfigMaps, token Secrets, workload
	// cluster clients, cloud-init, the bootstrap data Secret) are not modelled.
	return r.notModelled(log, "CK8sConfig needs bootstrapping")
}

// markCondition is conditions.MarkTrue/MarkFalse for v1beta1-style conditions: the transition
// time changes only when the status does.
func markCondition(config *CK8sConfig, t clusterv1beta1.ConditionType, status corev1.ConditionStatus, reason string, severity clusterv1beta1.ConditionSeverity) {
	c := clusterv1beta1.Condition{Type: t, Status: status, Reason: reason, Severity: severity}
	if status == corev1.ConditionTrue {
		c.Reason, c.Severity = "", clusterv1beta1.ConditionSeverityNone
	}
	for i := range config.Status.Conditions {
		old := &config.Status.Conditions[i]
		if old.Type != t {
			continue
		}
		c.LastTransitionTime = old.LastTransitionTime
		if old.Status != c.Status {
			c.LastTransitionTime = metav1.NewTime(time.Now().UTC().Truncate(time.Second))
		}
		*old = c
		return
	}
	c.LastTransitionTime = metav1.NewTime(time.Now().UTC().Truncate(time.Second))
	config.Status.Conditions = append(config.Status.Conditions, c)
}

// setReadySummary is a reduced conditions.SetSummary(WithConditions(...)): Ready is True when
// every listed condition that exists is True, otherwise it copies the first one that is not.
// With none of them present it leaves the conditions alone.
func setReadySummary(config *CK8sConfig, types ...clusterv1beta1.ConditionType) {
	var found bool
	var notTrue *clusterv1beta1.Condition
	for _, t := range types {
		for i := range config.Status.Conditions {
			c := &config.Status.Conditions[i]
			if c.Type != t {
				continue
			}
			found = true
			if c.Status != corev1.ConditionTrue && notTrue == nil {
				notTrue = c
			}
		}
	}
	if !found {
		return
	}
	if notTrue == nil {
		markCondition(config, clusterv1beta1.ReadyCondition, corev1.ConditionTrue, "", "")
		return
	}
	markCondition(config, clusterv1beta1.ReadyCondition, notTrue.Status, notTrue.Reason, notTrue.Severity)
}
