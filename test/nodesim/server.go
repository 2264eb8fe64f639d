package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	certlisters "k8s.io/client-go/listers/certificates/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// apiServer is one distinct workload kube-apiserver. Clusters whose kubeconfigs name the same
// server share it (a benchmark fleet puts many workload clusters on a few servers), and with it
// one client, one CSR informer and one signer. Every k8sd.io/* CSR belongs to one cluster, the
// one whose node created it: the signer approves (that cluster's auto-approve annotation) and
// signs it (that cluster's CA) once, and only that cluster's approve sees it. Each cluster so
// behaves as if it had an API server of its own.
type apiServer struct {
	name   string // for logs
	client kubernetes.Interface
	// asNode acts as one of the server's nodes (their CSRs are created so); nil with the
	// tests' fake clientsets, which record no requester: client is used.
	asNode   *nodeIdentity
	clusters []*cluster
	// nodeCluster finds a CSR's cluster from its subject (system:node:<name>); node names
	// are unique on a server, as Node objects are.
	nodeCluster map[string]*cluster

	// queue holds the names of CSRs the signer has to look at; a name is never handled by two
	// workers at once, so nothing is signed twice.
	queue workqueue.TypedRateLimitingInterface[string]

	// renewMu: one control plane's refresh at a time renews what the server serves
	// (cluster.takeExpiredAPI).
	renewMu sync.Mutex

	mu sync.Mutex
	// owners maps CSR names to their cluster on a shared server (unused with one cluster).
	owners map[string]*cluster
	// waiters are the wake-up channels of the runs and approves waiting for a CSR.
	waiters map[string]map[chan struct{}]struct{}
	// lister reads the informer's CSR cache; nil until it synced.
	lister certlisters.CertificateSigningRequestLister
	// degradedUntil: the informer's watch failed lately (API server restarting), so waits read
	// the API server too until then.
	degradedUntil time.Time
}

const (
	// signerWorkers handle a server's CSR queue in parallel (different CSRs).
	signerWorkers = 8
	// degradedFor: how long after a watch error the waits also read the API server.
	degradedFor = 30 * time.Second
	// cacheRecheck: how often a wait served by the cache looks again without a wake-up.
	cacheRecheck = time.Second
	// defaultCacheGrace: how long a wait (run, approve) is served by the cache alone; after
	// it, it reads the API server (a fresh CSR may be missing from the cache at first, and a
	// stale cache must not hold a wait for ever).
	defaultCacheGrace = 5 * time.Second
	// degradedPoll paces the API server reads of waits while the watch is unhealthy.
	degradedPoll = time.Second
)

// issuedMarker replaces status.certificate in the cache: the cache only needs to know that a
// CSR was signed (the run reads its certificate from the API server).
var issuedMarker = []byte("issued")

// nodeClient is the client that acts as node name.
func (srv *apiServer) nodeClient(name string) (kubernetes.Interface, error) {
	if srv.asNode == nil {
		return srv.client, nil
	}
	return srv.asNode.client(name)
}

func newAPIServer(name string, client kubernetes.Interface) *apiServer {
	return &apiServer{
		name:        name,
		client:      client,
		nodeCluster: map[string]*cluster{},
		owners:      map[string]*cluster{},
		waiters:     map[string]map[chan struct{}]struct{}{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{}),
	}
}

// add attaches a cluster; a node name another cluster of the server has is an error.
func (srv *apiServer) add(cl *cluster) error {
	for _, n := range cl.nodes {
		if other, dup := srv.nodeCluster[n.cfg.Name]; dup {
			return fmt.Errorf("clusters %s and %s share an API server and both have a node %s", other.cfg.Name, cl.cfg.Name, n.cfg.Name)
		}
	}
	for _, n := range cl.nodes {
		srv.nodeCluster[n.cfg.Name] = cl
	}
	srv.clusters = append(srv.clusters, cl)
	cl.server = srv
	return nil
}

func (srv *apiServer) shared() bool { return len(srv.clusters) > 1 }

// ownerOf is the cluster a CSR belongs to; nil when unknown (a shared server's CSR that
// nodesim did not create and whose subject names none of its nodes).
func (srv *apiServer) ownerOf(name string) *cluster {
	if !srv.shared() {
		return srv.clusters[0]
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return srv.owners[name]
}

// visibleTo: the CSR exists for cl (its own, or one of unknown owner).
func (srv *apiServer) visibleTo(cl *cluster, name string) bool {
	owner := srv.ownerOf(name)
	return owner == nil || owner == cl
}

// claim records, before a worker run creates them, that these CSRs are cl's. A name that
// another cluster holds stays theirs (its CSR exists: the create fails).
func (srv *apiServer) claim(cl *cluster, names []string) {
	if !srv.shared() {
		return
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for _, name := range names {
		if _, held := srv.owners[name]; !held {
			srv.owners[name] = cl
		}
	}
}

// learnOwner works out the cluster of a CSR nodesim did not create from its subject
// (system:node:<node>) and records it, for a k8sd-<seed>-worker-* CSR also for its siblings
// (the kube-proxy CSR names no node).
func (srv *apiServer) learnOwner(csr *certv1.CertificateSigningRequest) {
	if !srv.shared() || srv.ownerOf(csr.Name) != nil {
		return
	}
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil {
		return
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return
	}
	node, ok := strings.CutPrefix(req.Subject.CommonName, "system:node:")
	if !ok {
		return
	}
	cl := srv.nodeCluster[node]
	if cl == nil {
		return
	}
	names := []string{csr.Name}
	if seed, ok := workerCSRSeed(csr.Name); ok {
		names = workerCSRNames(seed)
	}
	srv.claim(cl, names)
}

// forget drops the owner of a deleted CSR.
func (srv *apiServer) forget(name string) {
	srv.mu.Lock()
	delete(srv.owners, name)
	srv.mu.Unlock()
}

// workerCSRSeed parses k8sd-<seed>-worker-….
func workerCSRSeed(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "k8sd-")
	if !ok {
		return 0, false
	}
	seed, _, ok := strings.Cut(rest, "-worker-")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(seed)
	return n, err == nil
}

// subscribe returns a channel that receives (coalesced) when one of the CSRs changes in the
// cache; cancel unregisters it.
func (srv *apiServer) subscribe(names []string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	srv.mu.Lock()
	for _, name := range names {
		set := srv.waiters[name]
		if set == nil {
			set = map[chan struct{}]struct{}{}
			srv.waiters[name] = set
		}
		set[ch] = struct{}{}
	}
	srv.mu.Unlock()
	return ch, func() {
		srv.mu.Lock()
		for _, name := range names {
			if set := srv.waiters[name]; set != nil {
				delete(set, ch)
				if len(set) == 0 {
					delete(srv.waiters, name)
				}
			}
		}
		srv.mu.Unlock()
	}
}

func (srv *apiServer) notify(name string) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for ch := range srv.waiters[name] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// cached reads a CSR from the informer's cache. usable is false while there is no cache or
// its watch failed lately: the caller reads the API server instead.
func (srv *apiServer) cached(name string) (csr *certv1.CertificateSigningRequest, found, usable bool) {
	srv.mu.Lock()
	lister, degraded := srv.lister, time.Now().Before(srv.degradedUntil)
	srv.mu.Unlock()
	if lister == nil || degraded {
		return nil, false, false
	}
	csr, err := lister.Get(name)
	if err != nil {
		return nil, false, true
	}
	return csr, true, true
}

// livePoll is how often a wait reads the API server when the cache cannot serve it: the
// simulator's poll interval without a cache, slower while the watch recovers.
func (srv *apiServer) livePoll(base time.Duration) time.Duration {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.lister != nil && base < degradedPoll {
		return degradedPoll
	}
	return base
}

// degrade makes the waits read the API server for a while (the watch may be behind).
func (srv *apiServer) degrade() {
	srv.mu.Lock()
	srv.degradedUntil = time.Now().Add(degradedFor)
	srv.mu.Unlock()
}

// waitWake waits for a wake-up, d, or the end of ctx (false).
func waitWake(ctx context.Context, wake <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-wake:
		return true
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// stripCSR keeps in the cache what the waits and the signer's triage read: no request, no
// managed fields, and a marker for the certificate. Idempotent, as informer transforms must be.
func (srv *apiServer) stripCSR(obj any) (any, error) {
	csr, ok := obj.(*certv1.CertificateSigningRequest)
	if !ok {
		return obj, nil
	}
	if strings.HasPrefix(csr.Spec.SignerName, k8sdSignerPrefix) && len(csr.Spec.Request) > 0 {
		srv.learnOwner(csr)
	}
	csr.ManagedFields = nil
	csr.Spec.Request = nil
	if len(csr.Status.Certificate) > 0 {
		csr.Status.Certificate = issuedMarker
	}
	return csr, nil
}

// runServer runs the server's CSR informer (the cache of the waits) and its signer until ctx
// ends.
func (s *Simulator) runServer(ctx context.Context, srv *apiServer) {
	factory := informers.NewSharedInformerFactoryWithOptions(srv.client, signerResync, informers.WithTransform(srv.stripCSR))
	csrInformer := factory.Certificates().V1().CertificateSigningRequests()
	inf := csrInformer.Informer()
	if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		if !errors.Is(err, io.EOF) {
			srv.degrade()
		}
		cache.DefaultWatchErrorHandler(ctx, r, err)
	}); err != nil {
		s.log.Printf("server %s: %v", srv.name, err)
		return
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.observeCSR(srv, obj) },
		UpdateFunc: func(_, obj any) { s.observeCSR(srv, obj) },
		DeleteFunc: func(obj any) {
			if name, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
				srv.forget(name)
				srv.notify(name)
			}
		},
	}); err != nil {
		s.log.Printf("server %s: %v", srv.name, err)
		return
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	defer srv.queue.ShutDown()

	var workers sync.WaitGroup
	for range signerWorkers {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for s.signNext(ctx, srv) {
			}
		}()
	}
	if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		srv.mu.Lock()
		srv.lister = csrInformer.Lister()
		srv.mu.Unlock()
	}
	<-ctx.Done()
	srv.queue.ShutDown()
	workers.Wait()
}

// observeCSR wakes the waits of a CSR and queues it for the signer when it has work: approved
// and unsigned, or undecided while its cluster auto-approves.
func (s *Simulator) observeCSR(srv *apiServer, obj any) {
	csr, ok := obj.(*certv1.CertificateSigningRequest)
	if !ok {
		return
	}
	srv.notify(csr.Name)
	if !strings.HasPrefix(csr.Spec.SignerName, k8sdSignerPrefix) {
		return
	}
	cl := srv.ownerOf(csr.Name)
	if cl == nil {
		return
	}
	if needsSigning(csr) || (undecided(csr) && cl.autoApprove()) {
		srv.queue.Add(csr.Name)
	}
}

// signNext handles one queued CSR for the cluster it belongs to; false once the queue shut down.
func (s *Simulator) signNext(ctx context.Context, srv *apiServer) bool {
	name, quit := srv.queue.Get()
	if quit {
		return false
	}
	defer srv.queue.Done(name)
	if cl := srv.ownerOf(name); cl != nil {
		s.reconcileCSR(ctx, cl, name)
	}
	return true
}
