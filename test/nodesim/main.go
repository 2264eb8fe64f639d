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
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// Simulator holds all simulated clusters and the shared test state (faults, calls).
type Simulator struct {
	cfg      *Config
	mgmt     kubernetes.Interface
	clusters []*cluster
	faults   *faultStore
	calls    *callLog
	log      *log.Logger
	// ctx ends when the simulator shuts down; hanging requests and waits watch it.
	ctx          context.Context
	restartDelay time.Duration
	// pollInterval paces the CSR waits of run and approve.
	pollInterval time.Duration
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
	client kubernetes.Interface // the workload cluster's API server
	nodes  []*node

	mu sync.Mutex
	// annotations are the cluster's k8sd annotations (cluster config), e.g. auto-approve.
	annotations map[string]string
	// apiserverRestarts counts the API server restarts this cluster's control plane caused.
	apiserverRestarts int
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

	// nil until start (unit tests serve the handlers directly).
	k8sd    *svcListener
	kubelet *svcListener
	relays  atomic.Int64 // open port-forward relays into k8sd
}

// newSimulator builds the in-memory state (CAs and certificates) without listening.
// The clients are injected so that tests can use fake clientsets.
func newSimulator(ctx context.Context, cfg *Config, mgmt kubernetes.Interface, workload map[string]kubernetes.Interface, logger *log.Logger) (*Simulator, error) {
	s := &Simulator{
		cfg:          cfg,
		mgmt:         mgmt,
		faults:       &faultStore{},
		calls:        &callLog{},
		log:          logger,
		ctx:          ctx,
		restartDelay: time.Duration(cfg.RestartSeconds * float64(time.Second)),
		pollInterval: 200 * time.Millisecond,

		apiserverRestartAfter: 300 * time.Millisecond,
		hookClient:            &http.Client{},
	}
	s.faults.onChange = s.reconcileListeners
	for _, cc := range cfg.Clusters {
		ca, err := newAuthority(cc.Name)
		if err != nil {
			return nil, fmt.Errorf("cluster %s: CA: %w", cc.Name, err)
		}
		cl := &cluster{cfg: cc, ca: ca, client: workload[cc.Name], annotations: map[string]string{}}
		for k, v := range cc.Annotations {
			cl.annotations[k] = v
		}
		if cl.client == nil {
			return nil, fmt.Errorf("cluster %s: no client", cc.Name)
		}
		for _, nc := range cc.Nodes {
			n := &node{cfg: nc, cluster: cl}
			if err := n.install(nc.InitialCertLifetimeSeconds); err != nil {
				return nil, fmt.Errorf("node %s: %w", nc.Name, err)
			}
			cl.nodes = append(cl.nodes, n)
		}
		s.clusters = append(s.clusters, cl)
	}
	return s, nil
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
	for _, cl := range s.clusters {
		if cl.cfg.Name != clusterName {
			continue
		}
		for _, n := range cl.nodes {
			if n.cfg.Name == nodeName {
				return n
			}
		}
	}
	return nil
}

func (s *Simulator) allNodes() []*node {
	var out []*node
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

	for _, n := range s.allNodes() {
		kubelet, err := s.newKubeletListener(n, clientCAs)
		if err != nil {
			s.stop()
			return err
		}
		n.kubelet = kubelet
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
	for _, cl := range s.clusters {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.runSigner(s.ctx, cl)
		}()
	}
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

func newClient(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	// Many nodes poll CSRs concurrently: client-side throttling would only add noise.
	rc.QPS, rc.Burst = 100, 200
	rc.UserAgent = "nodesim"
	return kubernetes.NewForConfig(rc)
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
	cfg, err := loadConfig(configPath)
	if err != nil {
		return err
	}
	mgmt, err := newClient(cfg.ManagementKubeconfig)
	if err != nil {
		return err
	}
	workload := map[string]kubernetes.Interface{}
	for _, cc := range cfg.Clusters {
		if workload[cc.Name], err = newClient(cc.Kubeconfig); err != nil {
			return err
		}
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	s, err := newSimulator(ctx, cfg, mgmt, workload, logger)
	if err != nil {
		return err
	}
	if err := s.start(); err != nil {
		return err
	}
	fmt.Fprintln(os.Stdout, "READY")
	logger.Printf("serving %d cluster(s), %d node(s); control API on %s", len(s.clusters), len(s.allNodes()), cfg.Control)

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
