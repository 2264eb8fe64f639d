package main

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// workloadClusterReads performs the management-cluster reads of the provider's
// ck8s.Management.GetWorkloadCluster (pkg/ck8s/management_cluster.go): the `<cluster>-kubeconfig`
// Secret (cluster-api controllers/remote.RESTConfig) and the `<cluster>-token` Secret
// (pkg/token.Lookup), both through the cached client, so the first one starts a cluster-wide
// Secret informer, as it does in the provider. The workload client and the k8sd calls that
// follow in the provider are not modelled.
func workloadClusterReads(ctx context.Context, c client.Reader, cluster client.ObjectKey) error {
	for _, name := range []string{cluster.Name + "-kubeconfig", cluster.Name + "-token"} {
		if err := c.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: name}, &corev1.Secret{}); err != nil {
			return fmt.Errorf("failed to get secret %s/%s: %w", cluster.Namespace, name, err)
		}
	}
	return nil
}

// ---------------------------------------------------------------------------------------------

// CertificatesReconciler models bootstrap/controllers/certificates_controller.go
// (CertificatesReconciler.Reconcile, createScope, SetupWithManager).
type CertificatesReconciler struct {
	reconcilerBase
}

// SetupWithManager: For(Machine), nothing else, as the provider.
func (r *CertificatesReconciler) SetupWithManager(mgr ctrl.Manager, wrap func(string, reconcile.Func) reconcile.Func) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&clusterv1.Machine{}).
		Complete(wrap("certificates", r.Reconcile))
}

// certAction is what the provider's certificates Reconcile decides from a cached Machine.
type certAction int

const (
	certRequeueNoNode     certAction = iota // no status.nodeRef: requeue after 5 s
	certDeleting                            // being deleted: stop
	certClearStatus                         // in-progress without trigger: Update deleting the status annotation
	certAlreadyInProgress                   // in-progress with trigger: log and stop
	certNothingToDo                         // no trigger, expiry annotation present: stop
	certNeedsNode                           // expiry lookup and/or refresh through k8sd
)

func decideCertificates(m *clusterv1.Machine) certAction {
	if !m.Status.NodeRef.IsDefined() {
		return certRequeueNoNode
	}
	if !m.DeletionTimestamp.IsZero() {
		return certDeleting
	}
	a := m.GetAnnotations()
	_, refresh := a[certificatesRefreshAnnotation]
	_, hasExpiry := a[certificatesExpiryAnnotation]
	if a[certificatesRefreshStatusAnnotation] == certificatesRefreshInProgress {
		if !refresh {
			return certClearStatus
		}
		return certAlreadyInProgress
	}
	if !refresh && hasExpiry {
		return certNothingToDo
	}
	return certNeedsNode
}

func (r *CertificatesReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := r.Log.WithValues("namespace", req.Namespace, "machine", req.Name)

	m := &clusterv1.Machine{}
	if err := r.Get(ctx, req.NamespacedName, m); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}

	switch decideCertificates(m) {
	case certRequeueNoNode:
		return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
	case certDeleting, certNothingToDo:
		return ctrl.Result{}, nil
	case certClearStatus:
		// The provider sends a full Update of the Machine here. Not sent.
		r.Stats.suppressedWrites.Add(1)
		log.Info("provider would clear the refresh status annotation (Update); not sent")
		return ctrl.Result{}, nil
	case certAlreadyInProgress:
		log.Info("Certificates refresh already in progress",
			"refreshStatus", certificatesRefreshInProgress,
			"refreshAnnotation", m.GetAnnotations()[certificatesRefreshAnnotation])
		return ctrl.Result{}, nil
	}

	// createScope's reads: the CK8sConfig (cache), its owner (live unstructured GET through
	// bootstrap/util.GetConfigOwner), the Cluster (cache), then GetWorkloadCluster's Secrets.
	config := &CK8sConfig{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.Bootstrap.ConfigRef.Name}, config); err != nil {
		return ctrl.Result{}, fmt.Errorf("failed to get CK8sConfig: %w", err)
	}
	ref, err := configOwnerRef(config)
	if err != nil || ref == nil {
		return ctrl.Result{}, fmt.Errorf("failed to get config owner: %w", err)
	}
	owner := &unstructured.Unstructured{}
	owner.SetAPIVersion(ref.APIVersion)
	owner.SetKind(ref.Kind)
	r.Stats.liveGets.Add(1)
	if err := r.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, owner); err != nil {
		return ctrl.Result{}, fmt.Errorf("failed to get config owner: %w", err)
	}
	cluster := &clusterv1.Cluster{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.ClusterName}, cluster); err != nil {
		return ctrl.Result{}, fmt.Errorf("failed to get cluster: %w", err)
	}
	if err := workloadClusterReads(ctx, r.Client, client.ObjectKeyFromObject(cluster)); err != nil {
		return ctrl.Result{}, fmt.Errorf("failed to get workload cluster: %w", err)
	}
	// The expiry lookup / refresh (k8sd calls, annotation patches, Events) is not modelled.
	return r.notModelled(log, "Machine needs an expiry lookup or a certificates refresh")
}

// ---------------------------------------------------------------------------------------------

// InPlaceUpgradeReconciler models bootstrap/controllers/upgrade_controller.go
// (InPlaceUpgradeReconciler): a second controller For(Machine) in the same manager.
type InPlaceUpgradeReconciler struct {
	reconcilerBase
}

func (r *InPlaceUpgradeReconciler) SetupWithManager(mgr ctrl.Manager, wrap func(string, reconcile.Func) reconcile.Func) error {
	_, err := ctrl.NewControllerManagedBy(mgr).
		For(&clusterv1.Machine{}).
		Build(wrap("inplace-upgrade", r.Reconcile))
	return err
}

func (r *InPlaceUpgradeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := r.Log.WithValues("namespace", req.Namespace, "machine", req.Name)

	m := &clusterv1.Machine{}
	if err := r.Get(ctx, req.NamespacedName, m); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if _, ok := m.GetAnnotations()[inPlaceUpgradeToAnnotation]; !ok {
		return ctrl.Result{}, nil
	}

	// The reads before the provider's first write: Cluster and CK8sConfig from the cache, then
	// the workload cluster's Secrets.
	cluster := &clusterv1.Cluster{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.ClusterName}, cluster); err != nil {
		return ctrl.Result{}, err
	}
	config := &CK8sConfig{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.Bootstrap.ConfigRef.Name}, config); err != nil {
		return ctrl.Result{}, fmt.Errorf("failed to get workload cluster for machine: %w", err)
	}
	if err := workloadClusterReads(ctx, r.Client, client.ObjectKeyFromObject(cluster)); err != nil {
		return ctrl.Result{}, fmt.Errorf("failed to get workload cluster for machine: %w", err)
	}
	return r.notModelled(log, "Machine asks for an in-place upgrade")
}

// ---------------------------------------------------------------------------------------------

// OrchestratedInPlaceUpgradeController models
// bootstrap/controllers/orchestrated_inplace_upgrade_controller.go: For(MachineDeployment),
// Owns(Machine).
type OrchestratedInPlaceUpgradeController struct {
	reconcilerBase
}

func (r *OrchestratedInPlaceUpgradeController) SetupWithManager(mgr ctrl.Manager, wrap func(string, reconcile.Func) reconcile.Func) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&clusterv1.MachineDeployment{}).
		Owns(&clusterv1.Machine{}).
		Complete(wrap("orchestrated-inplace-upgrade", r.Reconcile))
}

// upgradeInstructions is pkg/upgrade/inplace.GetUpgradeInstructions.
func upgradeInstructions(obj client.Object) string {
	a := obj.GetAnnotations()
	to := a[inPlaceUpgradeReleaseAnnotation]
	if v, ok := a[inPlaceUpgradeToAnnotation]; ok {
		to = v
	}
	return to
}

func (r *OrchestratedInPlaceUpgradeController) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := r.Log.WithValues("orchestrated_inplace_upgrade", req.NamespacedName)
	log.V(1).Info("Reconciliation started...")

	md := &clusterv1.MachineDeployment{}
	if err := r.Get(ctx, req.NamespacedName, md); err != nil {
		if apierrors.IsNotFound(err) {
			log.V(1).Info("MachineDeployment resource not found. Ignoring since object must be deleted.")
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("failed to get MachineDeployment: %w", err)
	}
	if upgradeInstructions(md) == "" {
		log.V(1).Info("MachineDeployment has no upgrade instructions, skipping reconciliation")
		return ctrl.Result{}, nil
	}
	if !md.DeletionTimestamp.IsZero() {
		log.V(1).Info("MachineDeployment is being deleted, skipping reconciliation")
		return ctrl.Result{}, nil
	}
	return r.notModelled(log, "MachineDeployment asks for an orchestrated in-place upgrade")
}
