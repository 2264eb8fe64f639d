package main

// Reaching k8sd the way the provider does (pkg/ck8s in cluster-api-k8s): the workload
// cluster's kubeconfig from the management Secret `<cluster>-kubeconfig` (key `value`), the
// tokens from `<cluster>-token`, and for every k8sd call a fresh HTTP client whose connections
// are SPDY port-forward streams through the workload API server to port 2380 of the
// `k8sd-proxy` pod on the target node. TLS verification is skipped; the URL host is the node's
// InternalIP and the port the CK8sConfig's microcluster port (it only reaches Host/SNI).

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	apiv1 "github.com/canonical/k8s-snap-api/api/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
)

const (
	proxyNamespace = "kube-system"
	proxySelector  = "app=k8sd-proxy"
	proxyPodPort   = 2380
	// Canonical Kubernetes labels control-plane nodes with this key and an empty value.
	controlPlaneNodeSelector = "node-role.kubernetes.io/control-plane="
	defaultMicroclusterPort  = 2380

	headerNodeToken = "node-token"
	headerCAPIToken = "capi-auth-token"
)

// workload is one reconcile's view of a workload cluster. Like the provider, the double builds
// it anew for every reconcile (new REST config and clients, nothing cached).
type workload struct {
	restConfig *rest.Config
	client     kubernetes.Interface
	authToken  string // capi-auth-token: a secret, never logged
	port       int    // microcluster port, used in URLs only
	// timeout bounds each k8sd request; 0 means none, which is what the provider's
	// CertificatesReconciler gets (design.md section 7 item 3).
	timeout time.Duration
}

func secretValue(ctx context.Context, mgmt kubernetes.Interface, namespace, name, key string) (string, error) {
	s, err := mgmt.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	v, ok := s.Data[key]
	if !ok {
		return "", fmt.Errorf("secret %s/%s has no key %q", namespace, name, key)
	}
	return string(v), nil
}

func newWorkload(ctx context.Context, mgmt kubernetes.Interface, namespace, cluster string, port int, timeout time.Duration) (*workload, error) {
	kubeconfig, err := secretValue(ctx, mgmt, namespace, cluster+"-kubeconfig", "value")
	if err != nil {
		return nil, fmt.Errorf("failed to get workload kubeconfig: %w", err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(kubeconfig))
	if err != nil {
		return nil, fmt.Errorf("failed to parse workload kubeconfig: %w", err)
	}
	cfg.Timeout = 30 * time.Second
	cfg.UserAgent = "bootstrapdouble"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	token, err := secretValue(ctx, mgmt, namespace, cluster+"-token", "value")
	if err != nil {
		return nil, fmt.Errorf("failed to lookup auth token: %w", err)
	}
	return &workload{restConfig: cfg, client: client, authToken: token, port: port, timeout: timeout}, nil
}

func lookupNodeToken(ctx context.Context, mgmt kubernetes.Interface, namespace, cluster, machine string) (string, error) {
	token, err := secretValue(ctx, mgmt, namespace, cluster+"-token", "node-token-"+machine)
	if err != nil {
		return "", fmt.Errorf("failed to lookup node token: %w", err)
	}
	return token, nil
}

// k8sdClient talks to one node's k8sd through its k8sd-proxy pod.
type k8sdClient struct {
	node   string
	nodeIP string
	http   *http.Client
}

// close drops the client's idle tunnels. (The provider leaves them to the idle timeout; the
// double closes them so that a test run does not pile up port-forwards.)
func (c *k8sdClient) close() { c.http.CloseIdleConnections() }

func (w *workload) proxyPods(ctx context.Context) (map[string]corev1.Pod, error) {
	pods, err := w.client.CoreV1().Pods(proxyNamespace).List(ctx, metav1.ListOptions{LabelSelector: proxySelector})
	if err != nil {
		return nil, fmt.Errorf("unable to list k8sd-proxy pods in target cluster: %w", err)
	}
	if len(pods.Items) == 0 {
		return nil, errors.New("there isn't any k8sd-proxy pods in target cluster")
	}
	byNode := make(map[string]corev1.Pod, len(pods.Items))
	for _, p := range pods.Items {
		byNode[p.Spec.NodeName] = p
	}
	return byNode, nil
}

func internalIP(node *corev1.Node) (string, error) {
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address, nil
		}
	}
	return "", fmt.Errorf("unable to find internal IP for node %s", node.Name)
}

func (w *workload) clientFor(node *corev1.Node, pod string) (*k8sdClient, error) {
	ip, err := internalIP(node)
	if err != nil {
		return nil, err
	}
	d, err := newTunnelDialer(w.restConfig, pod)
	if err != nil {
		return nil, err
	}
	return &k8sdClient{
		node:   node.Name,
		nodeIP: ip,
		http: &http.Client{
			Transport: &http.Transport{
				DialContext:         d.DialContext,
				TLSClientConfig:     &tls.Config{InsecureSkipVerify: true}, // #nosec G402 -- like the provider
				TLSHandshakeTimeout: 10 * time.Second,
				IdleConnTimeout:     90 * time.Second,
			},
			Timeout: w.timeout,
		},
	}, nil
}

// forNode: the k8sd of the node a Machine runs on (status.nodeRef.name).
func (w *workload) forNode(ctx context.Context, nodeName string) (*k8sdClient, error) {
	node, err := w.client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("failed to get node: %w", err)
	}
	pods, err := w.proxyPods(ctx)
	if err != nil {
		return nil, err
	}
	pod, ok := pods[node.Name]
	if !ok {
		return nil, fmt.Errorf("missing k8sd proxy pod for node %s", node.Name)
	}
	return w.clientFor(node, pod.Name)
}

// forControlPlane picks the node for `approve` like the provider: the control-plane nodes in
// list order, skipping those without a Ready k8sd-proxy pod, and the first whose k8sd answers
// a probe (`GET /` with the capi-auth-token) wins. Node readiness is not looked at.
func (w *workload) forControlPlane(ctx context.Context) (*k8sdClient, error) {
	nodes, err := w.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: controlPlaneNodeSelector})
	if err != nil {
		return nil, fmt.Errorf("failed to get control plane nodes: %w", err)
	}
	pods, err := w.proxyPods(ctx)
	if err != nil {
		return nil, fmt.Errorf("failed to get proxy pods: %w", err)
	}
	var errs []error
	for i := range nodes.Items {
		node := &nodes.Items[i]
		pod, ok := pods[node.Name]
		if !ok {
			errs = append(errs, fmt.Errorf("node %s has no k8sd proxy pod", node.Name))
			continue
		}
		if !podReady(&pod) {
			errs = append(errs, fmt.Errorf("pod '%s' is not Ready", pod.Name))
			continue
		}
		c, err := w.clientFor(node, pod.Name)
		if err != nil {
			errs = append(errs, fmt.Errorf("could not create proxy client for node %s: %w", node.Name, err))
			continue
		}
		if err := w.call(ctx, c, http.MethodGet, "", w.capiHeader(), "", nil); err != nil {
			c.close()
			errs = append(errs, fmt.Errorf("error while contacting proxy on node %s: %w", node.Name, err))
			continue
		}
		return c, nil
	}
	return nil, fmt.Errorf("failed to get k8sd proxy for control plane, previous errors: %w", errors.Join(errs...))
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Header maps with lowercase keys, sent as written (k8sd matches them case-insensitively).
func (w *workload) capiHeader() http.Header { return http.Header{headerCAPIToken: {w.authToken}} }
func nodeHeader(token string) http.Header   { return http.Header{headerNodeToken: {token}} }

// call sends one request and decodes the envelope like the provider: any non-200 status or a
// non-empty `error` is a failure; `metadata` is decoded leniently into response.
func (w *workload) call(ctx context.Context, c *k8sdClient, method, path string, header http.Header, request, response any) error {
	body, err := json.Marshal(request)
	if err != nil {
		return err
	}
	url := fmt.Sprintf("https://%s:%d/%s", c.nodeIP, w.port, path)
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header = header
	res, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("failed to reach k8sd through proxy client: %w", err)
	}
	defer res.Body.Close()
	var envelope struct {
		Error    string          `json:"error"`
		Metadata json.RawMessage `json:"metadata"`
	}
	if err := json.NewDecoder(res.Body).Decode(&envelope); err != nil {
		return fmt.Errorf("failed to parse HTTP response: %w", err)
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP request failed with status code: %d (%s)", res.StatusCode, envelope.Error)
	}
	if envelope.Error != "" {
		return fmt.Errorf("k8sd request failed: %s", envelope.Error)
	}
	if envelope.Metadata == nil || response == nil {
		return nil
	}
	if err := json.Unmarshal(envelope.Metadata, response); err != nil {
		return fmt.Errorf("failed to parse HTTP response: %w", err)
	}
	return nil
}

func rpcPath(rpc string) string { return apiv1.K8sdAPIVersion + "/" + rpc }

// expiry asks a node for `certificates-expiry` (body `{}`).
func (w *workload) expiry(ctx context.Context, nodeName, nodeToken string) (string, error) {
	c, err := w.forNode(ctx, nodeName)
	if err != nil {
		return "", fmt.Errorf("failed to create k8sd proxy: %w", err)
	}
	defer c.close()
	var res apiv1.CertificatesExpiryResponse
	if err := w.call(ctx, c, http.MethodPost, rpcPath(apiv1.ClusterAPICertificatesExpiryRPC), nodeHeader(nodeToken), apiv1.CertificatesExpiryRequest{}, &res); err != nil {
		return "", fmt.Errorf("failed to get certificates expiry date: %w", err)
	}
	return res.ExpiryDate, nil
}

// plan: body `{"certificates":null}`; the seed comes back under "seconds".
func (w *workload) plan(ctx context.Context, nodeName, nodeToken string) (int, error) {
	c, err := w.forNode(ctx, nodeName)
	if err != nil {
		return 0, fmt.Errorf("failed to create k8sd proxy: %w", err)
	}
	defer c.close()
	var res apiv1.ClusterAPICertificatesPlanResponse
	if err := w.call(ctx, c, http.MethodPost, rpcPath(apiv1.ClusterAPICertificatesPlanRPC), nodeHeader(nodeToken), apiv1.ClusterAPICertificatesPlanRequest{}, &res); err != nil {
		return 0, fmt.Errorf("failed to refresh certificates: %w", err)
	}
	return res.Seed, nil
}

// run: body `{"certificates":null,"seed":..,"expiration-seconds":..,"extra-sans":..}`; the
// answer is an absolute Unix time.
func (w *workload) run(ctx context.Context, nodeName, nodeToken string, req apiv1.ClusterAPICertificatesRunRequest) (int, error) {
	c, err := w.forNode(ctx, nodeName)
	if err != nil {
		return 0, fmt.Errorf("failed to create k8sd proxy: %w", err)
	}
	defer c.close()
	var res apiv1.ClusterAPICertificatesRunResponse
	if err := w.call(ctx, c, http.MethodPost, rpcPath(apiv1.ClusterAPICertificatesRunRPC), nodeHeader(nodeToken), req, &res); err != nil {
		return 0, fmt.Errorf("failed to run refresh certificates: %w", err)
	}
	return res.ExpirationSeconds, nil
}

// approve: body `{"seed":..}` with the capi-auth-token, on a control-plane node chosen by
// forControlPlane; returns that node's name.
func (w *workload) approve(ctx context.Context, seed int) (string, error) {
	c, err := w.forControlPlane(ctx)
	if err != nil {
		return "", fmt.Errorf("failed to create k8sd proxy: %w", err)
	}
	defer c.close()
	req := apiv1.ClusterAPIApproveWorkerCSRRequest{Seed: seed}
	var res apiv1.ClusterAPIApproveWorkerCSRResponse
	if err := w.call(ctx, c, http.MethodPost, rpcPath(apiv1.ClusterAPIApproveWorkerCSRRPC), w.capiHeader(), req, &res); err != nil {
		return c.node, fmt.Errorf("failed to approve certificates: %w", err)
	}
	return c.node, nil
}

// tunnelDialer opens, for every connection, a new SPDY port-forward session to the pod (one
// error stream and one data stream, request id 0), and hands out the data stream as the
// connection.
type tunnelDialer struct {
	upgrader  spdy.Upgrader
	transport http.RoundTripper
	url       func() *rest.Request
}

func newTunnelDialer(cfg *rest.Config, pod string) (*tunnelDialer, error) {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return nil, err
	}
	return &tunnelDialer{
		upgrader:  upgrader,
		transport: transport,
		url: func() *rest.Request {
			return client.CoreV1().RESTClient().Post().Resource("pods").
				Namespace(proxyNamespace).Name(pod).SubResource("portforward")
		},
	}, nil
}

func (d *tunnelDialer) DialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		conn, err := d.dial()
		done <- result{conn, err}
	}()
	select {
	case r := <-done:
		return r.conn, r.err
	case <-ctx.Done():
		// The SPDY dialer takes no context: close the session if it arrives late.
		go func() {
			if r := <-done; r.conn != nil {
				r.conn.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

func (d *tunnelDialer) dial() (net.Conn, error) {
	dialer := spdy.NewDialer(d.upgrader, &http.Client{Transport: d.transport}, http.MethodPost, d.url().URL())
	session, _, err := dialer.Dial(portforward.PortForwardProtocolV1Name)
	if err != nil {
		return nil, fmt.Errorf("error upgrading connection: %w", err)
	}
	headers := http.Header{}
	headers.Set(corev1.PortHeader, strconv.Itoa(proxyPodPort))
	headers.Set(corev1.PortForwardRequestIDHeader, "0")
	headers.Set(corev1.StreamType, corev1.StreamTypeError)
	errorStream, err := session.CreateStream(headers)
	if err != nil {
		session.Close()
		return nil, err
	}
	// Nothing is written on the error stream; the kubelet side reports there (e.g. the pod's
	// port refused the connection): log it for whoever reads the double's log.
	errorStream.Close()
	go func() {
		if msg, _ := io.ReadAll(errorStream); len(msg) > 0 {
			logf("port-forward: %s", msg)
		}
	}()
	headers.Set(corev1.StreamType, corev1.StreamTypeData)
	data, err := session.CreateStream(headers)
	if err != nil {
		session.Close()
		return nil, fmt.Errorf("error creating forwarding stream: %w", err)
	}
	return &streamConn{session: session, data: data}, nil
}

// streamConn is a port-forward data stream seen as a net.Conn. Deadlines are not supported
// (no-ops): the HTTP client's timeout and the request context bound the calls.
type streamConn struct {
	session httpstream.Connection
	data    httpstream.Stream
}

func (c *streamConn) Read(b []byte) (int, error)  { return c.data.Read(b) }
func (c *streamConn) Write(b []byte) (int, error) { return c.data.Write(b) }
func (c *streamConn) Close() error {
	c.data.Reset()
	return c.session.Close()
}
func (c *streamConn) LocalAddr() net.Addr              { return tunnelAddr{} }
func (c *streamConn) RemoteAddr() net.Addr             { return tunnelAddr{} }
func (c *streamConn) SetDeadline(time.Time) error      { return nil }
func (c *streamConn) SetReadDeadline(time.Time) error  { return nil }
func (c *streamConn) SetWriteDeadline(time.Time) error { return nil }

type tunnelAddr struct{}

func (tunnelAddr) Network() string { return "port-forward" }
func (tunnelAddr) String() string  { return "port-forward" }
