// Command nodesim plays every node of the workload clusters of a ck8s-certs test
// environment: per node a kubelet (only pods/portforward to the k8sd-proxy pod) and
// a k8sd speaking the CAPI certificate endpoints, plus a control API for tests.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Simulator holds all simulated clusters and the shared test state (faults, calls).
type Simulator struct {
	cfg      *Config
	mgmt     kubernetes.Interface
	clusters []*cluster
	// servers are the distinct workload API servers; clusters may share one.
	servers   []*apiServer
	byName    map[string]*cluster
	nodeNames map[string]bool // every node name of every cluster
	tokens    *tokenCache
	faults    *faultStore
	calls     *callLog
	log       *log.Logger
	// ctx ends when the simulator shuts down; hanging requests and waits watch it.
	ctx          context.Context
	restartDelay time.Duration
	// pollInterval paces the CSR waits of run and approve.
	pollInterval time.Duration
	// cacheGrace: how long those waits trust the informer cache alone (trustCache).
	cacheGrace time.Duration
	// apiserverRestartAfter: how long after a single control plane's delivered run
	// answer the restart hook is called (the answer travels back through the API server).
	apiserverRestartAfter time.Duration
	hookClient            *http.Client

	control *http.Server
	wg      sync.WaitGroup
}

type cluster struct {
	cfg    ClusterConfig
	ca     *authority
	server *apiServer           // the workload cluster's API server, maybe shared
	client kubernetes.Interface // server.client
	nodes  []*node
	byName map[string]*node

	mu sync.Mutex
	// annotations are the cluster's k8sd annotations (cluster config), e.g. auto-approve.
	annotations map[string]string
	// apiserverRestarts counts the API server restarts this cluster's control plane caused.
	apiserverRestarts int
	// apiCertificateExpired: the harness serves the workload API with an expired certificate
	// (a cluster switched off past its expiry). The next control plane whose run restarts its
	// services has it renewed: the hook is called for it whatever the number of control planes.
	apiCertificateExpired bool
}

type node struct {
	cfg     NodeConfig
	cluster *cluster

	mu      sync.Mutex
	serving *tls.Certificate  // k8sd's self-signed serving certificate
	initial *x509.Certificate // what the node was installed with: fixes certificates-expiry
	// current is what the node serves: the apiserver (control plane) or kubelet serving
	// (worker) certificate the running services loaded.
	current *x509.Certificate
	// onDisk is the same certificate as written by the last run; the services load it
	// when they restart (after a delivered run answer).
	onDisk   *x509.Certificate
	seedsRun []int64 // seeds of the runs that wrote certificates
	restarts int     // service restarts (delivered run answers)
	// clientExpired: the node's kubelet.conf client certificate has expired, so the API
	// server refuses the CSRs its worker run creates with it (401 Unauthorized).
	clientExpired bool
	// kubeletExpired: the node's certificates have expired (a cluster switched off past
	// their NotAfter), so its kubelet serves expiredKubelet until a delivered run renews them.
	kubeletExpired bool
	expiredKubelet *tls.Certificate // nil: the harness gave none (the node cannot expire)

	// nil until start (unit tests serve the handlers directly).
	k8sd    *svcListener
	kubelet *svcListener
	relays  atomic.Int64 // open port-forward relays into k8sd
}

// newSimulator builds the in-memory state (CAs and certificates) without listening.
// The clients are injected so that tests can use fake clientsets: workload maps each cluster
// to its API server's client, and clusters given the same client share that server (one
// informer and signer for all of them).
func newSimulator(ctx context.Context, cfg *Config, mgmt kubernetes.Interface, workload map[string]kubernetes.Interface, logger *log.Logger) (*Simulator, error) {
	s := &Simulator{
		cfg:          cfg,
		mgmt:         mgmt,
		byName:       map[string]*cluster{},
		nodeNames:    map[string]bool{},
		tokens:       newTokenCache(cfg),
		faults:       &faultStore{},
		calls:        &callLog{},
		log:          logger,
		ctx:          ctx,
		restartDelay: time.Duration(cfg.RestartSeconds * float64(time.Second)),
		pollInterval: 200 * time.Millisecond,
		cacheGrace:   defaultCacheGrace,

		apiserverRestartAfter: 300 * time.Millisecond,
		hookClient:            &http.Client{},
	}
	s.faults.onChange = s.reconcileListeners
	servers := map[kubernetes.Interface]*apiServer{}
	for _, cc := range cfg.Clusters {
		ca, err := newAuthority(cc.Name)
		if err != nil {
			return nil, fmt.Errorf("cluster %s: CA: %w", cc.Name, err)
		}
		client := workload[cc.Name]
		if client == nil {
			return nil, fmt.Errorf("cluster %s: no client", cc.Name)
		}
		cl := &cluster{cfg: cc, ca: ca, client: client, byName: map[string]*node{}, annotations: map[string]string{}}
		for k, v := range cc.Annotations {
			cl.annotations[k] = v
		}
		for _, nc := range cc.Nodes {
			n := &node{cfg: nc, cluster: cl}
			cl.nodes = append(cl.nodes, n)
			cl.byName[nc.Name] = n
			s.nodeNames[nc.Name] = true
		}
		srv := servers[client]
		if srv == nil {
			srv = newAPIServer(cc.Kubeconfig, client)
			servers[client] = srv
			s.servers = append(s.servers, srv)
		}
		if err := srv.add(cl); err != nil {
			return nil, err
		}
		s.clusters = append(s.clusters, cl)
		s.byName[cc.Name] = cl
	}
	// The nodes' keys and certificates: ECDSA work, spread over the CPUs.
	nodes := s.allNodes()
	if err := parallel(len(nodes), func(i int) error {
		n := nodes[i]
		if err := n.install(n.cfg.InitialCertLifetimeSeconds); err != nil {
			return fmt.Errorf("node %s: %w", n.cfg.Name, err)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	return s, nil
}

// parallel runs f(0) … f(count-1) on GOMAXPROCS goroutines; a worker stops at its first error.
func parallel(count int, f func(i int) error) error {
	workers := min(runtime.GOMAXPROCS(0), count)
	var next atomic.Int64
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= count {
					return
				}
				if err := f(i); err != nil {
					errs[w] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// install gives the node a new k8sd identity and a fresh initial certificate (start and reinstall).
func (n *node) install(lifetimeSeconds int64) error {
	serving, err := selfSignedServing(n.cfg.Name, n.cfg.Address)
	if err != nil {
		return err
	}
	initial, err := n.cluster.ca.initialCert(n.cfg, lifetimeSeconds)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.serving, n.initial, n.current, n.onDisk = serving, initial, initial, initial
	n.seedsRun, n.restarts = nil, 0
	n.mu.Unlock()
	return nil
}

// databaseExpiry is what certificates-expiry answers: the earliest NotAfter among the
// node's "database" certificates (the cluster CA and the initial certificate).
func (n *node) databaseExpiry() time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	exp := n.cluster.ca.cert.NotAfter
	if n.initial.NotAfter.Before(exp) {
		exp = n.initial.NotAfter
	}
	return exp.UTC()
}

func (s *Simulator) findNode(clusterName, nodeName string) *node {
	if cl := s.byName[clusterName]; cl != nil {
		return cl.byName[nodeName]
	}
	return nil
}

func (s *Simulator) allNodes() []*node {
	total := 0
	for _, cl := range s.clusters {
		total += len(cl.nodes)
	}
	out := make([]*node, 0, total)
	for _, cl := range s.clusters {
		out = append(out, cl.nodes...)
	}
	return out
}

// reconcileListeners opens or closes k8sd listeners after refuse faults changed.
func (s *Simulator) reconcileListeners() {
	for _, n := range s.allNodes() {
		if n.k8sd != nil {
			n.k8sd.reconcile()
		}
	}
}

// start binds every listener; any bind failure is returned (and nothing keeps running).
func (s *Simulator) start() error {
	caPEM, err := os.ReadFile(s.cfg.KubeletClientCA)
	if err != nil {
		return fmt.Errorf("kubeletClientCA: %w", err)
	}
	clientCAs := x509.NewCertPool()
	if !clientCAs.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("kubeletClientCA %s: no PEM certificate", s.cfg.KubeletClientCA)
	}

	controlLn, err := net.Listen("tcp", s.cfg.Control)
	if err != nil {
		return fmt.Errorf("control API: %w", err)
	}
	s.control = &http.Server{Handler: s.controlHandler(), ErrorLog: s.log, ReadHeaderTimeout: 30 * time.Second}
	s.serve(s.control, controlLn)

	nodes := s.allNodes()
	// The kubelet certificates (files the harness wrote), parsed on every CPU; a file pair
	// that several nodes name is read once.
	kubeletCerts := make([]*tls.Certificate, len(nodes))
	var certs sync.Map // "cert\x00key" -> func() (*tls.Certificate, error)
	load := func(certFile, keyFile string) (*tls.Certificate, error) {
		once, _ := certs.LoadOrStore(certFile+"\x00"+keyFile, sync.OnceValues(func() (*tls.Certificate, error) {
			cert, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err == nil {
				cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0])
			}
			return &cert, err
		}))
		return once.(func() (*tls.Certificate, error))()
	}
	if err := parallel(len(nodes), func(i int) error {
		n := nodes[i]
		cert, err := load(n.cfg.KubeletCert, n.cfg.KubeletKey)
		if err != nil {
			return fmt.Errorf("node %s: kubelet certificate: %w", n.cfg.Name, err)
		}
		kubeletCerts[i] = cert
		if n.cfg.KubeletExpiredCert != "" {
			expired, err := load(n.cfg.KubeletExpiredCert, n.cfg.KubeletExpiredKey)
			if err != nil {
				return fmt.Errorf("node %s: expired kubelet certificate: %w", n.cfg.Name, err)
			}
			n.mu.Lock()
			n.expiredKubelet = expired
			n.mu.Unlock()
		}
		return nil
	}); err != nil {
		s.stop()
		return err
	}
	for i, n := range nodes {
		n.kubelet = s.newKubeletListener(n, kubeletCerts[i], clientCAs)
		if err := n.kubelet.start(); err != nil {
			s.stop()
			return fmt.Errorf("node %s: kubelet listener: %w", n.cfg.Name, err)
		}
		n.k8sd = s.newK8sdListener(n)
		if err := n.k8sd.start(); err != nil {
			s.stop()
			return fmt.Errorf("node %s: k8sd listener: %w", n.cfg.Name, err)
		}
	}
	for _, srv := range s.servers {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.runServer(s.ctx, srv)
		}()
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.tokens.run(s.ctx, s.mgmt, s.log)
	}()
	return nil
}

func (s *Simulator) serve(srv *http.Server, ln net.Listener) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Printf("server on %s: %v", ln.Addr(), err)
		}
	}()
}

// stop closes every listener and connection (Close, not Shutdown: exit promptly).
func (s *Simulator) stop() {
	if s.control != nil {
		s.control.Close()
	}
	for _, n := range s.allNodes() {
		n.kubelet.stop()
		n.k8sd.stop()
	}
}

// restConfig reads a kubeconfig for one of nodesim's clients.
func restConfig(kubeconfig string) (*rest.Config, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	rc.UserAgent = "nodesim"
	return rc, nil
}

func newClient(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := restConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	// Tokens are read from a watch cache; this client mostly reads what the cache misses.
	rc.QPS, rc.Burst = 100, 200
	return kubernetes.NewForConfig(rc)
}

// workloadClients makes one client per distinct workload API server (server URL): clusters
// whose kubeconfigs name the same server share it, and so its informer and signer. For each
// client it also returns how to act as one of that server's nodes (nodeIdentities).
func workloadClients(clusters []ClusterConfig) (map[string]kubernetes.Interface, nodeIdentities, error) {
	byPath := map[string]kubernetes.Interface{}
	byServer := map[string]kubernetes.Interface{}
	out := map[string]kubernetes.Interface{}
	identities := nodeIdentities{}
	for _, cc := range clusters {
		client := byPath[cc.Kubeconfig]
		if client == nil {
			rc, err := restConfig(cc.Kubeconfig)
			if err != nil {
				return nil, nil, err
			}
			key := strings.TrimSuffix(rc.Host, "/")
			if client = byServer[key]; client == nil {
				// The server's client carries every run, approve and signature of all its
				// clusters (real k8sd has a client per cluster): no client-side throttling.
				rc.QPS, rc.Burst = -1, 0
				if client, err = kubernetes.NewForConfig(rc); err != nil {
					return nil, nil, err
				}
				if identities[client], err = newNodeIdentity(rc); err != nil {
					return nil, nil, err
				}
				byServer[key] = client
			}
			byPath[cc.Kubeconfig] = client
		}
		out[cc.Name] = client
	}
	return out, identities, nil
}

func main() {
	configPath := flag.String("config", "", "path of the JSON config written by the harness")
	flag.Parse()
	logger := log.New(os.Stderr, "nodesim ", log.LstdFlags|log.Lmicroseconds)
	if err := run(*configPath, logger); err != nil {
		fmt.Fprintln(os.Stderr, "nodesim:", err)
		os.Exit(1)
	}
}

func run(configPath string, logger *log.Logger) error {
	if configPath == "" {
		return errors.New("--config is required")
	}
	began := time.Now()
	cfg, err := loadConfig(configPath)
	if err != nil {
		return err
	}
	mgmt, err := newClient(cfg.ManagementKubeconfig)
	if err != nil {
		return err
	}
	workload, identities, err := workloadClients(cfg.Clusters)
	if err != nil {
		return err
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	s, err := newSimulator(ctx, cfg, mgmt, workload, logger)
	if err != nil {
		return err
	}
	for _, srv := range s.servers {
		srv.asNode = identities[srv.client]
	}
	built := time.Since(began)
	if err := s.start(); err != nil {
		return err
	}
	fmt.Fprintln(os.Stdout, "READY")
	logger.Printf("serving %d cluster(s) on %d API server(s), %d node(s); control API on %s; ready after %s (state %s, listeners %s)",
		len(s.clusters), len(s.servers), len(s.allNodes()), cfg.Control, time.Since(began).Round(time.Millisecond),
		built.Round(time.Millisecond), (time.Since(began) - built).Round(time.Millisecond))

	<-ctx.Done()
	logger.Printf("shutting down")
	s.stop()
	// Servers end at once; informers end with ctx. Do not hang the exit on stragglers.
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		logger.Printf("some goroutines did not end within 2s; exiting anyway")
	}
	return nil
}
