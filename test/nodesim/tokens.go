package main

import (
	"context"
	"log"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// tokenCache mirrors the clusters' token Secrets (<cluster>-token in the management cluster)
// so that a k8sd request that presents the current token costs no API call: at thousands of
// nodes a GET per request would load the management API server the controller under test
// uses (real k8sd checks tokens against its own database). A token the cache does not confirm
// is checked against the API server as before, so a token just rotated in works at once and
// a missing Secret fails with the same error.
type tokenCache struct {
	wanted map[string]bool // namespace/name of every cluster's token Secret

	mu     sync.Mutex
	lister corelisters.SecretLister // nil until the informer synced
	// The last value seen of each token (namespace/name/key): real k8sd keeps its tokens in its
	// own database, so a token Secret gone from this management cluster (moved to another by
	// `clusterctl move`) does not unauthenticate the nodes.
	known map[string][]byte
}

// remember records a token value seen in the management cluster.
func (c *tokenCache) remember(namespace, name, key string, value []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.known == nil {
		c.known = map[string][]byte{}
	}
	c.known[namespace+"/"+name+"/"+key] = value
}

// remembered returns the last value seen of a token.
func (c *tokenCache) remembered(namespace, name, key string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.known[namespace+"/"+name+"/"+key]
	return v, ok
}

func newTokenCache(cfg *Config) *tokenCache {
	c := &tokenCache{wanted: map[string]bool{}}
	for _, cc := range cfg.Clusters {
		c.wanted[cc.Namespace+"/"+cc.Name+"-token"] = true
	}
	return c
}

// strip keeps the data of the token Secrets only.
func (c *tokenCache) strip(obj any) (any, error) {
	secret, ok := obj.(*corev1.Secret)
	if !ok {
		return obj, nil
	}
	secret.ManagedFields = nil
	if !c.wanted[secret.Namespace+"/"+secret.Name] {
		secret.Data, secret.StringData = nil, nil
	}
	return secret, nil
}

// run watches the management cluster's Secrets until ctx ends.
func (c *tokenCache) run(ctx context.Context, mgmt kubernetes.Interface, logger *log.Logger) {
	if len(c.wanted) == 0 {
		return
	}
	factory := informers.NewSharedInformerFactoryWithOptions(mgmt, 0, informers.WithTransform(c.strip))
	secrets := factory.Core().V1().Secrets()
	inf := secrets.Informer()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return
	}
	c.mu.Lock()
	c.lister = secrets.Lister()
	c.mu.Unlock()
	logger.Printf("token Secrets cached (%d clusters)", len(c.wanted))
	<-ctx.Done()
}

// lookup returns key of the cached Secret; false when there is no cache, Secret or key.
func (c *tokenCache) lookup(namespace, name, key string) ([]byte, bool) {
	c.mu.Lock()
	lister := c.lister
	c.mu.Unlock()
	if lister == nil {
		return nil, false
	}
	secret, err := lister.Secrets(namespace).Get(name)
	if err != nil {
		return nil, false
	}
	if v, ok := secret.Data[key]; ok {
		c.remember(namespace, name, key, v)
		return v, true
	}
	return nil, false
}
