// Command replicator-peer is the benchmarks' Go reference point: the smallest client-go controller that
// keeps one copy of a source Secret in every selected namespace, with the client's rate limiter lifted.
//
// It is what a hand-written Go replicator costs, not a licensectl: no entitlement (every namespace the
// selector picks gets a copy), no revision store, no Events, no rollout, no metrics. Level-based: shared
// informers for the selected Namespaces, its own copies (label peer-replica=true) and the one source
// Secret feed a work queue of namespace names; a pool of workers creates a missing copy and replaces a
// copy whose data differs from the source's. It never deletes.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
)

// clientGoVersion is stamped at build time (-X) with the client-go release the module pins.
var clientGoVersion = "unknown"

const (
	copyLabel      = "peer-replica"
	copyLabelValue = "true"
)

type options struct {
	kubeconfig string
	source     string // namespace/name
	selector   string // label selector of the namespaces that get a copy
	copyName   string
	workers    int
	qps        float64
	burst      int
}

func parseFlags() options {
	var o options
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (empty: in-cluster)")
	flag.StringVar(&o.source, "source", "", "the source Secret as namespace/name")
	flag.StringVar(&o.selector, "namespace-selector", "", "label selector of the namespaces that get a copy")
	flag.StringVar(&o.copyName, "copy-name", "peer-license", "name of the copy Secret in each namespace")
	flag.IntVar(&o.workers, "workers", 32, "concurrent reconcile workers")
	flag.Float64Var(&o.qps, "qps", -1, "client QPS; negative: no client-side rate limiter")
	flag.IntVar(&o.burst, "burst", 10000, "client burst (only with a positive -qps)")
	flag.Parse()
	if o.source == "" || o.selector == "" || !strings.Contains(o.source, "/") {
		fmt.Fprintln(os.Stderr, "replicator-peer: -source namespace/name and -namespace-selector are required")
		os.Exit(2)
	}
	return o
}

type peer struct {
	client     kubernetes.Interface
	copyName   string
	sourceNS   string
	sourceName string
	namespaces listersv1.NamespaceLister
	copies     listersv1.SecretLister
	sources    listersv1.SecretLister
	queue      workqueue.TypedRateLimitingInterface[string]
}

func main() {
	o := parseFlags()
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		log.Fatalf("replicator-peer: kubeconfig: %v", err)
	}
	// A negative QPS: client-go builds no token bucket at all (rate unlimited); Burst counts only with QPS > 0.
	cfg.QPS = float32(o.qps)
	cfg.Burst = o.burst
	cfg.UserAgent = "replicator-peer"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		log.Fatalf("replicator-peer: client: %v", err)
	}
	sourceNS, sourceName, _ := strings.Cut(o.source, "/")
	if _, err := labels.Parse(o.selector); err != nil {
		log.Fatalf("replicator-peer: -namespace-selector: %v", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	// One factory per filter: a factory's list options apply to every informer it makes.
	nsFactory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = o.selector }))
	copyFactory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.LabelSelector = copyLabel + "=" + copyLabelValue
		}))
	sourceFactory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(sourceNS),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", sourceName).String()
		}))
	nsInformer := nsFactory.Core().V1().Namespaces()
	copyInformer := copyFactory.Core().V1().Secrets()
	sourceInformer := sourceFactory.Core().V1().Secrets()

	p := &peer{
		client:     client,
		copyName:   o.copyName,
		sourceNS:   sourceNS,
		sourceName: sourceName,
		namespaces: nsInformer.Lister(),
		copies:     copyInformer.Lister(),
		sources:    sourceInformer.Lister(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "replicator-peer"}),
	}
	mustHandle(nsInformer.Informer(), p.enqueueObjectNamespace(true))
	mustHandle(copyInformer.Informer(), p.enqueueObjectNamespace(false))
	mustHandle(sourceInformer.Informer(), func(any) { p.enqueueAll() })

	nsFactory.Start(ctx.Done())
	copyFactory.Start(ctx.Done())
	sourceFactory.Start(ctx.Done())
	started := time.Now()
	if !cache.WaitForCacheSync(ctx.Done(), nsInformer.Informer().HasSynced, copyInformer.Informer().HasSynced,
		sourceInformer.Informer().HasSynced) {
		log.Fatalf("replicator-peer: caches did not sync")
	}
	log.Printf("replicator-peer (client-go %s): caches synced in %s, %d workers, qps %g",
		clientGoVersion, time.Since(started).Round(time.Millisecond), o.workers, o.qps)

	var wg sync.WaitGroup
	for range o.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p.processNext(ctx) {
			}
		}()
	}
	<-ctx.Done()
	p.queue.ShutDown()
	wg.Wait()
	nsFactory.Shutdown()
	copyFactory.Shutdown()
	sourceFactory.Shutdown()
}

func mustHandle(inf cache.SharedIndexInformer, enqueue func(any)) {
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	})
	if err != nil {
		log.Fatalf("replicator-peer: event handler: %v", err)
	}
}

// enqueueObjectNamespace queues the namespace a Namespace is (isNamespace) or a copy lives in.
func (p *peer) enqueueObjectNamespace(isNamespace bool) func(any) {
	return func(obj any) {
		key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		if err != nil {
			return
		}
		ns, name, err := cache.SplitMetaNamespaceKey(key)
		if err != nil {
			return
		}
		if isNamespace {
			p.queue.Add(name)
		} else {
			p.queue.Add(ns)
		}
	}
}

// enqueueAll queues every selected namespace: the source changed, so every copy may differ.
func (p *peer) enqueueAll() {
	all, err := p.namespaces.List(labels.Everything())
	if err != nil {
		return
	}
	for _, ns := range all {
		p.queue.Add(ns.Name)
	}
}

func (p *peer) processNext(ctx context.Context) bool {
	ns, shutdown := p.queue.Get()
	if shutdown {
		return false
	}
	defer p.queue.Done(ns)
	if err := p.reconcile(ctx, ns); err != nil {
		if ctx.Err() == nil && !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			log.Printf("replicator-peer: %s: %v", ns, err)
		}
		p.queue.AddRateLimited(ns)
		return true
	}
	p.queue.Forget(ns)
	return true
}

// reconcile makes the copy in `ns` carry the source's data: create it when missing, replace it when
// its data differs. A namespace no longer selected, or no source, leaves everything as it is.
func (p *peer) reconcile(ctx context.Context, ns string) error {
	if _, err := p.namespaces.Get(ns); apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	src, err := p.sources.Secrets(p.sourceNS).Get(p.sourceName)
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	current, err := p.copies.Secrets(ns).Get(p.copyName)
	if apierrors.IsNotFound(err) {
		want := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: p.copyName, Namespace: ns,
				Labels: map[string]string{copyLabel: copyLabelValue}},
			Type: corev1.SecretTypeOpaque,
			Data: src.Data,
		}
		_, err = p.client.CoreV1().Secrets(ns).Create(ctx, want, metav1.CreateOptions{})
		return err
	} else if err != nil {
		return err
	}
	if dataEqual(current.Data, src.Data) {
		return nil
	}
	updated := current.DeepCopy() // the lister's object is shared with the cache: never modify it
	updated.Data = src.Data
	_, err = p.client.CoreV1().Secrets(ns).Update(ctx, updated, metav1.UpdateOptions{})
	return err
}

func dataEqual(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}
