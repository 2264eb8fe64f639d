// Command bootstrapdouble is a test double of the CK8s bootstrap provider's
// CertificatesReconciler (canonical/cluster-api-k8s, bootstrap/controllers/
// certificates_controller.go at 212a208f), to run beside ck8s-certs in the e2e environment:
// on a real management cluster that reconciler always runs and reacts to the same Machine
// annotations (design.md section 8).
//
// What it models, faithfully:
//   - Machines are read as cluster.x-k8s.io/v1beta1 from an informer cache that lags behind
//     writes; one worker; errors requeue with controller-runtime's default backoff; a Machine
//     without a node is looked at again every 5 s; a resync every --resync (the provider's
//     sync period, 10 min).
//   - The branch order of its Reconcile (decide in decide.go), the TTL parser with its quirks,
//     the patch helper's merge patches computed against the Machine as first read (which repeat
//     earlier changes and can omit the final status), the failure path's full Update with a
//     stale resourceVersion (which conflicts and leaves the Machine in-progress), expiry
//     written in local time, extra SANs = CK8sConfig extraSANs + endpoint host (without the
//     CK8sConfig name), no k8sd timeout by default, a fresh client and tunnel per k8sd call,
//     worker run and approve issued concurrently, approve on the first control-plane node
//     whose Ready k8sd-proxy pod answers a probe, its Events (source
//     ck8s-certificates-controller).
//
// Where it simplifies (none of these changes what it writes to a Machine or sends to k8sd):
//   - --namespace and --label-selector narrow the watch so that tests can isolate Machines
//     (the provider watches every Machine of every namespace; design.md section 7 item 6);
//   - CK8sConfig, its owner Machine, Cluster and Secrets are read directly, not from a cache;
//     MachinePool owners are not modelled; a Machine without a configRef is an error, not a
//     panic;
//   - idle port-forward tunnels are closed after each call instead of idling out;
//   - no leader election, metrics, webhooks or other provider controllers.
//
// Everything it does to a Machine is appended to --records as JSON lines (see Record). It
// prints READY on stdout once its cache has synced. Tokens are never logged or recorded.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
)

func main() {
	var (
		kubeconfig    = flag.String("kubeconfig", "", "kubeconfig of the management cluster (default: $KUBECONFIG or in-cluster)")
		namespace     = flag.String("namespace", "", "watch Machines of this namespace only (default: all)")
		labelSelector = flag.String("label-selector", "", "watch only Machines matching this label selector, e.g. cluster.x-k8s.io/watch-filter=t1 (the provider has none)")
		records       = flag.String("records", "", "append a JSON line per action to this file")
		resync        = flag.Duration("resync", 10*time.Minute, "informer resync period (the provider's --sync-period)")
		k8sdTimeout   = flag.Duration("k8sd-timeout", 0, "timeout of each k8sd request; 0 = none, like the provider")
		events        = flag.Bool("events", true, "emit the provider's Events on Machines")
	)
	flag.Parse()
	if err := run(*kubeconfig, *namespace, *labelSelector, *records, *resync, options{k8sdTimeout: *k8sdTimeout, events: *events}); err != nil {
		logf("bootstrapdouble: %v", err)
		os.Exit(1)
	}
}

func run(kubeconfig, namespace, selector, recordsPath string, resync time.Duration, opts options) error {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.UserAgent = "bootstrapdouble"
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	recs, err := openRecorder(recordsPath)
	if err != nil {
		return fmt.Errorf("records: %w", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	c := &controller{
		opts:    opts,
		dynamic: dyn,
		kube:    kube,
		records: recs,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "certificates"}),
	}
	if opts.events {
		broadcaster := record.NewBroadcaster()
		broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
		defer broadcaster.Shutdown()
		c.recorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "ck8s-certificates-controller"})
	}

	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, resync, namespace,
		func(o *metav1.ListOptions) { o.LabelSelector = selector })
	informer := factory.ForResource(machineGVR).Informer()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			c.queue.Add(key)
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	}); err != nil {
		return err
	}
	c.indexer = informer.GetIndexer()
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return fmt.Errorf("the Machine cache did not sync")
	}
	logf("watching %s (namespace=%q selector=%q)", machineGVR, namespace, selector)
	fmt.Println("READY")
	c.run(ctx)
	factory.Shutdown()
	return nil
}
