// Command refmanager is a reference manager built the way the CK8s bootstrap provider's manager
// is (github.com/canonical/cluster-api-k8s at 212a208f, Go module not available to this build),
// for benchmarks that compare the idle and start-up footprint (RSS, CPU, API requests,
// connections) of that manager with ck8s-certs on the same management cluster.
//
// What is modelled, and from where in the provider:
//
//   - bootstrap/main.go: one controller-runtime manager with the provider's settings: client
//     QPS 20 / burst 30 (controller-runtime v0.19's GetConfig defaults, which the provider gets
//     because it sets neither; v0.24 would disable client-side throttling instead), cache
//     SyncPeriod 10m (its --sync-period default), default cache (full typed objects, every
//     namespace, unstructured reads not cached), SkipNameValidation (two controllers are both
//     named "machine"), leader-election ID 6b2b21b1.k8s.io, zap development-mode logging, the
//     four controllers below in the same order. The scheme holds client-go's types, the Cluster
//     API core types and CK8sConfig.
//   - bootstrap/controllers/ck8sconfig_controller.go, CK8sConfigReconciler: For(CK8sConfig) only
//     (the provider has no Owns/Watches on Machines or Clusters). Reconcile: cached Get of the
//     CK8sConfig; its owner through cluster-api bootstrap/util.GetConfigOwner ->
//     controllers/external.Get, an unstructured Get that the manager's client does not cache,
//     i.e. one live GET of the Machine per reconcile; the Cluster through a cached typed Get
//     (util.GetClusterByName; the Cluster informer starts lazily at the first reconcile); the
//     paused check; patch.NewHelper's snapshot and the deferred comparison with the Ready
//     summary and observedGeneration applied; the switch "infrastructure not ready -> requeue
//     1m", "owner has spec.bootstrap.dataSecretName but status not ready -> adopt it into the
//     status", "status.ready -> return".
//   - bootstrap/controllers/certificates_controller.go, CertificatesReconciler: For(Machine).
//     Reconcile: cached Get of the Machine; no nodeRef -> requeue 5 s; deleting -> stop;
//     in-progress status without trigger -> (Update); in-progress with trigger -> log, stop;
//     no trigger and a certificates-expiry annotation -> stop. Otherwise createScope's reads
//     (CK8sConfig cached, owner live, Cluster cached) and GetWorkloadCluster's Secret reads
//     (kubeconfig and token Secrets through the cache, which starts a cluster-wide Secret
//     informer as in the provider).
//   - bootstrap/controllers/upgrade_controller.go, InPlaceUpgradeReconciler: For(Machine);
//     returns unless the Machine has the in-place-upgrade-to annotation (then the same reads).
//   - bootstrap/controllers/orchestrated_inplace_upgrade_controller.go,
//     OrchestratedInPlaceUpgradeController: For(MachineDeployment).Owns(Machine); returns unless
//     the MachineDeployment has upgrade instructions (pkg/upgrade/inplace).
//
// What is left out:
//
//   - Every write. Where the provider would patch or update (the CK8sConfig status on first
//     sight of a fleet whose CK8sConfigs have no status, the certificates status clean-up), the
//     change is computed in memory and not sent; the count is logged at exit.
//   - Bootstrapping (init lock, tokens, cloud-init, data Secret), expiry lookups, certificate
//     refreshes and in-place upgrades: their k8sd calls, workload-cluster clients, writes and
//     Events. The reads that precede them are made; then the reconcile stops without requeue.
//   - The CK8sConfig/CK8sConfigTemplate admission webhooks and their server on :9443
//     (bootstrap/api/v1beta2/*_webhook.go), and the GCP auth plugin import.
//   - Cluster API versions: the provider reads cluster.x-k8s.io/v1beta1 with CAPI v1.9 and
//     controller-runtime v0.19; this manager reads v1beta2 (the storage version of the CAPI
//     v1.14 CRDs the benchmark installs, which have no conversion webhook) with
//     controller-runtime v0.24 / client-go v0.36. Its priority queue is turned off and
//     client-go's WatchListClient gate is turned off (KUBE_FEATURE_WatchListClient=false
//     unless set), so informers start with LIST then WATCH like client-go v0.31. Cluster status
//     is read from status.initialization.infrastructureProvisioned; when it is absent but the
//     owner Machine already has a bootstrap data secret, the Cluster is taken as provisioned (a
//     steady-state fleet) instead of requeueing every CK8sConfig each minute. Differences that
//     remain: Go 1.26 instead of 1.24 (runtime/GC), client-go v0.36's informer queue, v0.24's
//     RESTMapper (aggregated discovery), and a scheme without the v1beta1/exp Go types.
//
// What follows for a benchmark: each CK8sConfig reconcile costs one live GET, throttled at
// 20/s, so the first pass over N CK8sConfigs takes about N/20 seconds (about 250 s for 5,000)
// of steady requests and CPU, and the 10-minute resync repeats it; Machine reconciles read
// only the cache. Stopped during such a pass, the manager drains its queue with a cancelled
// context and logs one "Reconciler error" per remaining CK8sConfig, as the provider would.
//
// Flags: --kubeconfig (required), --metrics-bind-address (default 0: off),
// --health-probe-bind-address (default 0: off), --leader-elect (default false),
// --namespace (default: all namespaces); klog and --zap-* flags for debugging.
//
// Output: logs on stderr; on stdout the line READY once the watched kinds' caches have synced,
// and {"event":"first-reconcile","at":"<RFC3339Nano>"} at the first reconcile of any controller.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

const (
	// providerSyncPeriod is the provider's --sync-period default.
	providerSyncPeriod = 10 * time.Minute
	// providerQPS and providerBurst are what controller-runtime v0.19's GetConfig sets.
	providerQPS   = 20
	providerBurst = 30
	// providerLeaderElectionID is the provider's lease name.
	providerLeaderElectionID = "6b2b21b1.k8s.io"
)

// notLeaderRunnable runs whether or not this replica holds the lease.
type notLeaderRunnable func(context.Context) error

func (f notLeaderRunnable) Start(ctx context.Context) error { return f(ctx) }
func (notLeaderRunnable) NeedLeaderElection() bool          { return false }

// stats counts what the manager did (and did not send), logged at exit.
type stats struct {
	reconciles       atomic.Int64
	liveGets         atomic.Int64
	suppressedWrites atomic.Int64
	notModelled      atomic.Int64
}

// stdout serialises the machine-readable lines.
var stdout = struct {
	sync.Mutex
	enc *json.Encoder
}{enc: json.NewEncoder(os.Stdout)}

func printLine(s string) {
	stdout.Lock()
	defer stdout.Unlock()
	fmt.Fprintln(os.Stdout, s)
}

func printEvent(v any) {
	stdout.Lock()
	defer stdout.Unlock()
	_ = stdout.enc.Encode(v)
}

func newScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme,
		clusterv1.AddToScheme,
		addCK8sToScheme,
	} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// watchedKinds are the kinds whose informers the controllers start with the manager.
func watchedKinds() []client.Object {
	return []client.Object{&CK8sConfig{}, &clusterv1.Machine{}, &clusterv1.MachineDeployment{}}
}

func main() {
	// client-go v0.36 streams the initial list (WatchListClient, default on since 1.35); the
	// provider's client-go v0.31 lists then watches. Must be set before any gate is read.
	if _, set := os.LookupEnv("KUBE_FEATURE_WatchListClient"); !set {
		_ = os.Setenv("KUBE_FEATURE_WatchListClient", "false")
	}

	// controller-runtime registers --kubeconfig on the default FlagSet itself. The zap and klog
	// flags are for debugging only (--zap-log-level=6 --v=6 log every API request; requests
	// made with a reconcile's context log through zap, the others through klog); their
	// defaults are the provider's zap.New(zap.UseDevMode(true)).
	klog.InitFlags(nil)
	zapOpts := zap.Options{Development: true}
	zapOpts.BindFlags(flag.CommandLine)
	var metricsAddr, probeAddr, namespace string
	var leaderElect bool
	flag.StringVar(&metricsAddr, "metrics-bind-address", "0", "Address the metrics endpoint binds to; 0 disables it.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", "0", "Address the health probes bind to; 0 disables them.")
	flag.BoolVar(&leaderElect, "leader-elect", false, "Enable leader election (lease "+providerLeaderElectionID+").")
	flag.StringVar(&namespace, "namespace", "", "Restrict the caches to one namespace (the provider watches all); also the leader-election namespace (default: default).")
	flag.Parse()
	kubeconfig := flag.Lookup("kubeconfig").Value.String()
	if kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "refmanager: --kubeconfig is required")
		os.Exit(2)
	}

	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	setupLog := ctrl.Log.WithName("setup")

	if err := run(metricsAddr, probeAddr, namespace, leaderElect); err != nil {
		setupLog.Error(err, "refmanager failed")
		os.Exit(1)
	}
}

func run(metricsAddr, probeAddr, namespace string, leaderElect bool) error {
	setupLog := ctrl.Log.WithName("setup")
	scheme, err := newScheme()
	if err != nil {
		return fmt.Errorf("building scheme: %w", err)
	}
	restConfig, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	restConfig.QPS = providerQPS
	restConfig.Burst = providerBurst

	syncPeriod := providerSyncPeriod
	cacheOpts := cache.Options{SyncPeriod: &syncPeriod}
	leNamespace := "default"
	if namespace != "" {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{namespace: {}}
		leNamespace = namespace
	}
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 server.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress:  probeAddr,
		LeaderElection:          leaderElect,
		LeaderElectionID:        providerLeaderElectionID,
		LeaderElectionNamespace: leNamespace,
		Cache:                   cacheOpts,
		Controller: config.Controller{
			SkipNameValidation: ptr.To(true),
			// controller-runtime v0.19 has no priority queue.
			UsePriorityQueue: ptr.To(false),
		},
	})
	if err != nil {
		return fmt.Errorf("unable to start manager: %w", err)
	}
	if probeAddr != "0" && probeAddr != "" {
		if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
			return err
		}
		if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
			return err
		}
	}

	st := &stats{}
	var first sync.Once
	wrap := func(name string, f reconcile.Func) reconcile.Func {
		return func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
			first.Do(func() {
				printEvent(map[string]string{"event": "first-reconcile", "at": time.Now().UTC().Format(time.RFC3339Nano)})
				setupLog.Info("first reconcile", "controller", name, "object", req.NamespacedName)
			})
			st.reconciles.Add(1)
			return f(ctx, req)
		}
	}

	c := mgr.GetClient()
	controllersLog := ctrl.Log.WithName("controllers")
	base := func(name string) reconcilerBase {
		return reconcilerBase{Client: c, Log: controllersLog.WithName(name), Stats: st}
	}
	if err := (&CK8sConfigReconciler{base("CK8sConfig")}).SetupWithManager(mgr, wrap); err != nil {
		return fmt.Errorf("unable to create controller CK8sConfig: %w", err)
	}
	if err := (&InPlaceUpgradeReconciler{base("Machine")}).SetupWithManager(mgr, wrap); err != nil {
		return fmt.Errorf("unable to create controller Machine: %w", err)
	}
	if err := (&CertificatesReconciler{base("Certificates")}).SetupWithManager(mgr, wrap); err != nil {
		return fmt.Errorf("unable to create controller Certificates: %w", err)
	}
	if err := (&OrchestratedInPlaceUpgradeController{base("OrchestratedInPlaceUpgrade")}).SetupWithManager(mgr, wrap); err != nil {
		return fmt.Errorf("unable to create controller OrchestratedInPlaceUpgrade: %w", err)
	}

	// READY: once the informers of the watched kinds (the same shared informers the controllers'
	// sources use) have synced. Runs with the caches, whether or not this replica leads.
	if err := mgr.Add(notLeaderRunnable(func(ctx context.Context) error {
		for _, obj := range watchedKinds() {
			if _, err := mgr.GetCache().GetInformer(ctx, obj); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("waiting for %T informer: %w", obj, err)
			}
		}
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return nil
		}
		printLine("READY")
		setupLog.Info("caches synced")
		return nil
	})); err != nil {
		return err
	}

	setupLog.Info("starting manager")
	err = mgr.Start(ctrl.SetupSignalHandler())
	setupLog.Info("manager stopped",
		"reconciles", st.reconciles.Load(),
		"liveOwnerGets", st.liveGets.Load(),
		"writesNotSent", st.suppressedWrites.Load(),
		"notModelled", st.notModelled.Load())
	if err != nil {
		return fmt.Errorf("problem running manager: %w", err)
	}
	return nil
}
