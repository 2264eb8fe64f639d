//! The watch caches the controllers read from: one watch per kind (and label selector), shared
//! by every controller that needs the kind, trimmed to what the controllers read.
//!
//! Reconcilers read Machines, Clusters, MachineCertificates and policies here instead of asking
//! the API server, so a Machine whose situation does not change costs no request at all.
//! Machines and Clusters are cached as the compact kinds of `ck8s_certs_api::machine` (decoded
//! straight into the few fields the controllers read); of MachineCertificates and policies,
//! `managedFields` and `kubectl.kubernetes.io/last-applied-configuration` are dropped.

use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, PoisonError, RwLock};

use ck8s_certs_api::cluster_certificates::ClusterCertificates;
use ck8s_certs_api::control_plane::{ControlPlane, ControlPlaneVersion};
use ck8s_certs_api::machine::{CapiVersion, Cluster, Machine};
use ck8s_certs_api::machine_certificates::{MachineCertificates, MachineCertificatesStatus};
use ck8s_certs_api::machine_deployment::MachineDeployment;
use ck8s_certs_api::reasons::conditions;
use futures::{Stream, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use kube::api::DynamicObject;
use kube::core::ObjectMeta;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::Deserialize;

/// How long start-up waits for the CK8s control plane kind to be looked for (and listed when
/// served): its rollouts are a pre-flight gate.
const CONTROL_PLANES_SETTLE: std::time::Duration = std::time::Duration::from_secs(30);

/// The watch caches the reconcilers read .
#[derive(Clone)]
pub struct Stores {
    pub machines: Store<Machine>,
    pub clusters: Store<Cluster>,
    /// For their fleet refresh trigger.
    pub deployments: Store<MachineDeployment>,
    pub certificates: CertificateStore,
    /// The Clusters' records: the cluster CA's end a refresh may not outlive.
    pub cluster_records: Store<ClusterCertificates>,
    pub policies: Store<DynamicObject>,
    /// The policies decoded and validated, once per generation.
    pub policy_readings: Arc<super::governing_policy::PolicyReadings>,
    /// The CK8s control plane kind's version and cache, once it is served (for its refresh
    /// trigger and its rollouts).
    pub control_planes: ControlPlanes,
}

impl Stores {
    /// Waits until every cache holds a full list.
    /// The caches a change of a policy's selection is read from.
    pub fn policy_caches(&self) -> crate::controllers::governing_policy::Caches<'_> {
        crate::controllers::governing_policy::Caches {
            policies: &self.policies,
            readings: &self.policy_readings,
            machines: &self.machines,
            clusters: &self.clusters,
        }
    }

    pub async fn synced(&self) {
        synced(&self.machines).await;
        synced(&self.clusters).await;
        synced(&self.deployments).await;
        self.certificates.synced().await;
        synced(&self.cluster_records).await;
        synced(&self.policies).await;
        self.control_planes.settled(CONTROL_PLANES_SETTLE).await;
    }
}

/// Waits until `store` holds a full list. The Controller itself also waits on the store, and a
/// store wakes only one waiter (kube-runtime's DelayedInit keeps one waker), so this polls.
pub(super) async fn synced<K>(store: &Store<K>)
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        let poll = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            store.wait_until_ready(),
        );
        if let Ok(result) = poll.await {
            if result.is_err() {
                // The writer is gone: the controller stopped, readiness no longer matters.
                std::future::pending::<()>().await;
            }
            return;
        }
    }
}

/// Changed objects a subscriber may fall behind by before the watch waits for it (the default
/// of `--watch-buffer`). Every subscription must be read from the start: the caches' sync waits
/// for the watch, and the watch for its slowest subscriber.
pub const BUFFER: usize = 1024;

/// Where a [`SharedWatch`] keeps the objects it sees, and what it hands to readers.
pub trait Cache<K>: Send + 'static {
    type Reader: Clone;
    fn reader(&self) -> Self::Reader;
    fn apply(&mut self, event: &watcher::Event<K>);
    /// Whether the cache already holds `object` as it is (a relist hands every object over
    /// again; only the ones that changed during the gap need a reconcile).
    fn holds(&self, object: &K) -> bool;
    /// The object of `object`'s name as the cache holds it, for subscribers that look at what
    /// changed ([`SharedWatch::subscribe_changes`]); `None` from caches that keep less than the
    /// object.
    fn held(&self, _object: &K) -> Option<Arc<K>> {
        None
    }
}

/// kube-runtime's reflector store, what the controllers' `Controller`s read their objects from,
/// and the dynamic type its objects are looked up with.
pub struct Reflector<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    writer: Writer<K>,
    reader: Store<K>,
    dyntype: K::DynamicType,
}

impl<K> Reflector<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    pub fn new(dyntype: K::DynamicType) -> Self {
        let writer = Writer::new(dyntype.clone());
        let reader = writer.as_reader();
        Self {
            writer,
            reader,
            dyntype,
        }
    }
}

impl<K> Cache<K> for Reflector<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    type Reader = Store<K>;

    fn reader(&self) -> Store<K> {
        self.reader.clone()
    }

    fn apply(&mut self, event: &watcher::Event<K>) {
        self.writer.apply_watcher_event(event);
    }

    /// Same resourceVersion: the same object.
    fn holds(&self, object: &K) -> bool {
        let Some(version) = object.meta().resource_version.as_deref() else {
            return false;
        };
        self.held(object)
            .is_some_and(|cached| cached.meta().resource_version.as_deref() == Some(version))
    }

    fn held(&self, object: &K) -> Option<Arc<K>> {
        self.reader
            .get(&ObjectRef::from_obj_with(object, self.dyntype.clone()))
    }
}

/// Which changes a subscriber wants: the object as the cache held it before (`None`: new to the
/// cache, or a cache that keeps less than the object) and as it is now.
pub type Wants<K> = fn(Option<&K>, &K) -> bool;

struct Subscriber<K> {
    tx: tokio::sync::mpsc::Sender<K>,
    wants: Wants<K>,
    /// Whether deleted objects are passed on too.
    deletions: bool,
}

impl<K> Clone for Subscriber<K> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            wants: self.wants,
            deletions: self.deletions,
        }
    }
}

/// One watch of a kind: its cache, and the controllers it feeds. (kube-runtime's shared streams
/// need a static type; this fans out dynamic objects too.)
pub struct SharedWatch<K, C: Cache<K> = Reflector<K>> {
    pub store: C::Reader,
    cache: C,
    subscribers: Vec<Subscriber<K>>,
    buffer: usize,
}

impl<K> SharedWatch<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default + Send + Sync,
{
    pub fn new() -> Self {
        Self::with(Default::default())
    }
}

impl<K> SharedWatch<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    pub fn with(dyntype: K::DynamicType) -> Self {
        Self::in_cache(Reflector::new(dyntype))
    }
}

impl<K: Send + 'static, C: Cache<K>> SharedWatch<K, C> {
    /// A watch that keeps its objects in `cache`.
    pub fn in_cache(cache: C) -> Self {
        Self {
            store: cache.reader(),
            cache,
            subscribers: Vec::new(),
            buffer: BUFFER,
        }
    }

    /// The same watch with subscriptions of `buffer` objects (at least one).
    pub fn buffered(mut self, buffer: usize) -> Self {
        self.buffer = buffer.max(1);
        self
    }

    /// The changed objects (after the cache took them), for one more controller.
    pub fn subscribe(
        &mut self,
    ) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static + use<K, C> {
        self.subscribe_changes(|_, _| true)
    }

    /// [`Self::subscribe`], only for the changes `wants` picks (a controller that reads a few
    /// fields of the kind is not woken by changes of the others).
    pub fn subscribe_changes(
        &mut self,
        wants: Wants<K>,
    ) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static + use<K, C> {
        self.attach(wants, false)
    }

    /// [`Self::subscribe_changes`], and the deleted objects too (as the watch last showed them;
    /// the cache no longer holds them when they are passed on). A relist that no longer finds an
    /// object does not pass it on.
    pub fn subscribe_with_deletions(
        &mut self,
        wants: Wants<K>,
    ) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static + use<K, C> {
        self.attach(wants, true)
    }

    fn attach(
        &mut self,
        wants: Wants<K>,
        deletions: bool,
    ) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static + use<K, C> {
        let (tx, rx) = tokio::sync::mpsc::channel(self.buffer);
        self.subscribers.push(Subscriber {
            tx,
            wants,
            deletions,
        });
        futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|object| (Ok(object), rx))
        })
    }
}

impl<K, C> SharedWatch<K, C>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    C: Cache<K>,
{
    /// Runs the watch (forever): list, then watch, trimming each object before it is cached
    /// and passed on. Of a relist (after a watch gap: an API server restart, an expired
    /// resourceVersion) only the objects that changed are passed on: the first list reconciles
    /// the whole fleet, a relist does not do it again (at 50,000 Machines that was 10 CPU
    /// seconds and the memory peak, docs/performance.md).
    pub fn run(
        self,
        api: Api<K>,
        config: watcher::Config,
        trim: fn(&mut K),
    ) -> impl Future<Output = ()> + Send + 'static {
        let (subscribers, mut cache) = (self.subscribers, self.cache);
        watcher(api, config)
            .default_backoff()
            .modify(trim)
            .filter_map(move |event| std::future::ready(pass_on(&mut cache, event)))
            .for_each(move |object| {
                let subscribers = subscribers.clone();
                async move {
                    match object {
                        Ok(Passed {
                            before,
                            object,
                            deleted,
                        }) => {
                            for subscriber in &subscribers {
                                let wanted = match deleted {
                                    true => subscriber.deletions,
                                    false => (subscriber.wants)(before.as_deref(), &object),
                                };
                                if !wanted {
                                    continue;
                                }
                                // A closed subscriber is a controller that stopped.
                                let _ = subscriber.tx.send(object.clone()).await;
                            }
                        }
                        Err(err) => {
                            tracing::warn!(error = %err, "Watch failed; retrying with backoff")
                        }
                    }
                }
            })
    }
}

/// An object to pass on, with what the cache held of it before.
struct Passed<K> {
    before: Option<Arc<K>>,
    object: K,
    /// Deleted: passed on only to the subscribers that want deletions.
    deleted: bool,
}

/// Applies `event` to `cache` and returns the object to pass on to the controllers, if any
/// (an applied or deleted object, or a listed one the cache did not already hold as it is) with
/// the cache's copy from before, or the error.
fn pass_on<K, C: Cache<K>>(
    cache: &mut C,
    event: Result<watcher::Event<K>, watcher::Error>,
) -> Option<Result<Passed<K>, watcher::Error>> {
    let event = match event {
        Ok(event) => event,
        Err(err) => return Some(Err(err)),
    };
    // Asked before the event is applied: a relist fills a buffer that replaces the cache only
    // when complete, so until then the cache holds what was there before the gap.
    let (fresh, before) = match &event {
        watcher::Event::InitApply(object) => (!cache.holds(object), cache.held(object)),
        watcher::Event::Apply(object) => (true, cache.held(object)),
        _ => (true, None),
    };
    cache.apply(&event);
    let passed = |object, deleted| {
        Some(Ok(Passed {
            before,
            object,
            deleted,
        }))
    };
    match event {
        watcher::Event::Apply(object) => passed(object, false),
        watcher::Event::InitApply(object) if fresh => passed(object, false),
        watcher::Event::Delete(object) => passed(object, true),
        _ => None,
    }
}

impl<K> Default for SharedWatch<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default + Send + Sync,
{
    fn default() -> Self {
        Self::new()
    }
}

/// Looks up `namespace/name` in a cache of a Cluster API kind.
pub fn get_capi<K>(
    store: &Store<K>,
    version: CapiVersion,
    namespace: &str,
    name: &str,
) -> Option<Arc<K>>
where
    K: Resource<DynamicType = CapiVersion> + Clone + 'static,
{
    store.get(&ObjectRef::new_with(name, version).within(namespace))
}

/// Looks up the status of the MachineCertificates `namespace/name` in the cache.
pub fn get(store: &CertificateStore, namespace: &str, name: &str) -> Option<Arc<CachedStatus>> {
    store.get(namespace, name)
}

/// Metadata the controllers never read.
fn trim_metadata(meta: &mut ObjectMeta) {
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    meta.managed_fields = None;
}

/// Nothing to trim: the kind is decoded compactly.
pub fn keep<K>(_: &mut K) {}

/// A MachineCertificates as its watch decodes it: name, namespace and resourceVersion (the
/// watch resumes from it), and the status as [`CachedStatus`], which is all the cache keeps of it
/// (see [`CertificateStore`]). Labels and owner references are not kept: writes are server-side
/// applies of the status, labels are checked on live reads, and its Machine is the one of the
/// same name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CachedCertificates {
    pub metadata: ObjectMeta,
    status: Arc<CachedStatus>,
}

impl CachedCertificates {
    /// The status as stored; `Err` only for a status this version cannot read.
    pub fn status(&self) -> Result<Option<MachineCertificatesStatus>, serde_json::Error> {
        self.status.status()
    }

    /// When its last automatic renewal failed, if it has since the last success.
    pub fn last_failure(&self) -> Option<jiff::Timestamp> {
        self.status.last_failure()
    }

    /// `status.expiry`, when known.
    pub fn expiry(&self) -> Option<jiff::Timestamp> {
        self.status.expiry()
    }
}

/// A MachineCertificates' status as the cache keeps it: compact JSON, decoded when a reconcile
/// reads it (about half the memory of the decoded status, and a reconcile reads a Machine's
/// status at most a few times an hour at rest), and its expiry for the expiry metric.
#[derive(Debug, Default, PartialEq)]
pub struct CachedStatus {
    json: Option<Box<str>>,
    /// `status.expiry`, Unix milliseconds.
    expiry_ms: Option<i64>,
    /// Since when condition `RenewalOverdue` is True, Unix milliseconds (its metric).
    overdue_since_ms: Option<i64>,
    /// `status.lastFailureTime`, Unix milliseconds (the circuit breakers count them).
    last_failure_ms: Option<i64>,
}

impl CachedStatus {
    /// The status as stored; `Err` only for a status this version cannot read.
    pub fn status(&self) -> Result<Option<MachineCertificatesStatus>, serde_json::Error> {
        self.json.as_deref().map(serde_json::from_str).transpose()
    }

    /// A digest of the status as stored (see [`status_digest`]).
    pub fn digest(&self) -> u64 {
        digest_json(self.json.as_deref())
    }

    /// `status.expiry`, when known.
    pub fn expiry(&self) -> Option<jiff::Timestamp> {
        self.expiry_ms
            .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
    }

    /// Since when its renewal is overdue (condition `RenewalOverdue`), if it is.
    pub fn overdue_since(&self) -> Option<jiff::Timestamp> {
        self.overdue_since_ms
            .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
    }

    /// When its last automatic renewal failed, if it has since the last success.
    pub fn last_failure(&self) -> Option<jiff::Timestamp> {
        self.last_failure_ms
            .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
    }
}

impl Resource for CachedCertificates {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        MachineCertificates::kind(&())
    }
    fn group(_: &()) -> Cow<'_, str> {
        MachineCertificates::group(&())
    }
    fn version(_: &()) -> Cow<'_, str> {
        MachineCertificates::version(&())
    }
    fn plural(_: &()) -> Cow<'_, str> {
        MachineCertificates::plural(&())
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl<'de> Deserialize<'de> for CachedCertificates {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            metadata: ObjectMeta,
            #[serde(default)]
            status: Option<MachineCertificatesStatus>,
        }
        let wire = Wire::deserialize(deserializer)?;
        let expiry_ms = wire
            .status
            .as_ref()
            .and_then(|status| status.expiry.as_ref())
            .map(|expiry| expiry.0.as_millisecond());
        let overdue_since_ms = wire.status.as_ref().and_then(|status| {
            status
                .conditions
                .iter()
                .find(|c| c.type_ == conditions::RENEWAL_OVERDUE && c.status == "True")
                .map(|c| c.last_transition_time.0.as_millisecond())
        });
        let last_failure_ms = wire
            .status
            .as_ref()
            .and_then(|status| status.last_failure_time.as_ref())
            .map(|at| at.0.as_millisecond());
        let json = wire
            .status
            .map(|status| serde_json::to_string(&status).map(String::into_boxed_str))
            .transpose()
            .map_err(serde::de::Error::custom)?;
        let meta = wire.metadata;
        Ok(Self {
            metadata: ObjectMeta {
                name: meta.name,
                namespace: meta.namespace,
                resource_version: meta.resource_version,
                ..ObjectMeta::default()
            },
            status: Arc::new(CachedStatus {
                json,
                expiry_ms,
                overdue_since_ms,
                last_failure_ms,
            }),
        })
    }
}

/// A digest of a MachineCertificates' status as the API server returned it, equal to the
/// [`CachedStatus::digest`] of the cache once the cache holds that same status: the serialized
/// form of the decoded status (the status has no maps, so the form is one).
pub fn status_digest(status: Option<&MachineCertificatesStatus>) -> u64 {
    let json = status.and_then(|status| serde_json::to_string(status).ok());
    digest_json(json.as_deref())
}

fn digest_json(json: Option<&str>) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut hasher = DefaultHasher::new();
    json.hash(&mut hasher);
    hasher.finish()
}

/// Statuses by name, in one namespace.
type ByName = HashMap<Box<str>, Arc<CachedStatus>>;

/// The MachineCertificates cache, read by namespace and name: the status of each (a
/// [`CachedStatus`]), under its name, under its namespace (namespaces are few, each stored once).
/// kube-runtime's store would also keep, per object, a key of four strings (name, namespace, uid
/// and resourceVersion) and the object's `ObjectMeta` (344 bytes, nearly all empty): with one
/// MachineCertificates per Machine, that was a fifth of the controller's memory at 5,000
/// Machines (docs/performance.md, step 3).
#[derive(Clone)]
pub struct CertificateStore {
    entries: Arc<RwLock<HashMap<Box<str>, ByName>>>,
    ready: tokio::sync::watch::Receiver<bool>,
}

impl CertificateStore {
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<CachedStatus>> {
        // A poisoned lock only means a writer panicked mid-update of a plain map: still readable.
        let entries = self.entries.read().unwrap_or_else(PoisonError::into_inner);
        entries.get(namespace)?.get(name).cloned()
    }

    /// The statuses whose last automatic renewal failed after `after`, with their namespace
    /// and name (a scan of plain numbers: failures are few).
    pub fn failed_after(
        &self,
        after: jiff::Timestamp,
    ) -> Vec<(Box<str>, Box<str>, Arc<CachedStatus>)> {
        let after = after.as_millisecond();
        let entries = self.entries.read().unwrap_or_else(PoisonError::into_inner);
        entries
            .iter()
            .flat_map(|(namespace, names)| {
                names
                    .iter()
                    .filter(|(_, status)| status.last_failure_ms.is_some_and(|ms| ms > after))
                    .map(|(name, status)| (namespace.clone(), name.clone(), Arc::clone(status)))
            })
            .collect()
    }

    /// Waits until the cache holds a full list; never returns once its writer is gone (the
    /// watch stopped, and with it the controller).
    pub async fn synced(&self) {
        let mut ready = self.ready.clone();
        if ready.wait_for(|ready| *ready).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Fills a [`CertificateStore`] from its watch.
pub struct CertificateWriter {
    entries: Arc<RwLock<HashMap<Box<str>, ByName>>>,
    /// A (re)list being received: it replaces the cache when complete.
    buffer: HashMap<Box<str>, ByName>,
    ready: tokio::sync::watch::Sender<bool>,
}

impl CertificateWriter {
    /// An empty cache (not ready until its watch has listed).
    pub fn new() -> Self {
        Self {
            entries: Arc::default(),
            buffer: HashMap::new(),
            ready: tokio::sync::watch::channel(false).0,
        }
    }

    fn insert(map: &mut HashMap<Box<str>, ByName>, object: &CachedCertificates) {
        let (Some(namespace), Some(name)) = (&object.metadata.namespace, &object.metadata.name)
        else {
            return;
        };
        let status = Arc::clone(&object.status);
        match map.get_mut(namespace.as_str()) {
            Some(names) => {
                names.insert(name.as_str().into(), status);
            }
            None => {
                let names = HashMap::from([(name.as_str().into(), status)]);
                map.insert(namespace.as_str().into(), names);
            }
        }
    }

    /// The status the cache holds for `object`'s name.
    fn cached(&self, object: &CachedCertificates) -> Option<Arc<CachedStatus>> {
        let meta = &object.metadata;
        let (namespace, name) = (meta.namespace.as_deref()?, meta.name.as_deref()?);
        let entries = self.entries.read().unwrap_or_else(PoisonError::into_inner);
        entries.get(namespace)?.get(name).cloned()
    }

    fn entries(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<Box<str>, ByName>> {
        // See `CertificateStore::get`.
        self.entries.write().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for CertificateWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl Cache<CachedCertificates> for CertificateWriter {
    type Reader = CertificateStore;

    fn reader(&self) -> CertificateStore {
        CertificateStore {
            entries: Arc::clone(&self.entries),
            ready: self.ready.subscribe(),
        }
    }

    /// The status is all it keeps, and all the controllers read of a MachineCertificates.
    fn holds(&self, object: &CachedCertificates) -> bool {
        self.cached(object)
            .is_some_and(|status| *status == *object.status)
    }

    fn held(&self, object: &CachedCertificates) -> Option<Arc<CachedCertificates>> {
        let status = self.cached(object)?;
        Some(Arc::new(CachedCertificates {
            metadata: object.metadata.clone(),
            status,
        }))
    }

    /// What kube-runtime's reflector store does with each event.
    fn apply(&mut self, event: &watcher::Event<CachedCertificates>) {
        match event {
            watcher::Event::Apply(object) => Self::insert(&mut self.entries(), object),
            watcher::Event::Delete(object) => {
                let meta = &object.metadata;
                let (Some(namespace), Some(name)) = (&meta.namespace, &meta.name) else {
                    return;
                };
                let mut entries = self.entries();
                if let Some(names) = entries.get_mut(namespace.as_str()) {
                    names.remove(name.as_str());
                    if names.is_empty() {
                        entries.remove(namespace.as_str());
                    }
                }
            }
            watcher::Event::Init => self.buffer = HashMap::new(),
            watcher::Event::InitApply(object) => match self.cached(object) {
                // The same status as before the gap: the relist's copy shares it.
                Some(status) if *status == *object.status => {
                    let shared = CachedCertificates {
                        metadata: object.metadata.clone(),
                        status,
                    };
                    Self::insert(&mut self.buffer, &shared)
                }
                _ => Self::insert(&mut self.buffer, object),
            },
            watcher::Event::InitDone => {
                let listed = std::mem::take(&mut self.buffer);
                // The previous contents are dropped outside the lock.
                let previous = std::mem::replace(&mut *self.entries(), listed);
                drop(previous);
                self.ready.send_replace(true);
            }
        }
    }
}

pub fn trim_policy(policy: &mut DynamicObject) {
    trim_metadata(&mut policy.metadata);
}

/// The CK8s control plane kind, set once it is discovered (it may be installed after we start).
#[derive(Clone)]
pub struct ControlPlanes {
    kind: Arc<std::sync::OnceLock<(ControlPlaneVersion, Store<ControlPlane>)>>,
    /// True once what is known of the kind is whole: not served when first looked for, or
    /// served and listed. Until then a rollout of it would go unseen by the gates.
    settled: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Default for ControlPlanes {
    fn default() -> Self {
        Self {
            kind: Arc::default(),
            settled: Arc::new(tokio::sync::watch::channel(false).0),
        }
    }
}

impl ControlPlanes {
    pub fn set(&self, version: ControlPlaneVersion, store: Store<ControlPlane>) {
        // Set once, by the one task that discovers the kind.
        let _ = self.kind.set((version, store));
    }

    /// What is known of the kind is whole (see `settled`).
    pub fn settle(&self) {
        self.settled.send_replace(true);
    }

    /// Waits until what is known of the kind is whole, at most `limit` once: a watch the API
    /// server refuses must not keep every reconcile waiting, so after that it counts as whole.
    pub async fn settled(&self, limit: std::time::Duration) {
        let mut settled = self.settled.subscribe();
        if tokio::time::timeout(limit, settled.wait_for(|s| *s))
            .await
            .is_err()
        {
            tracing::warn!(
                "The CK8sControlPlane kind was not listed in time: its rollouts are not seen by the gates until it is"
            );
            self.settle();
        }
    }

    pub fn version(&self) -> Option<&ControlPlaneVersion> {
        self.kind.get().map(|(version, _)| version)
    }

    /// A cached control plane object.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<ControlPlane>> {
        let (version, store) = self.kind.get()?;
        store.get(&ObjectRef::new_with(name, version.clone()).within(namespace))
    }

    /// Every cached control plane object (none before the kind is served).
    pub fn state(&self) -> Vec<Arc<ControlPlane>> {
        self.kind
            .get()
            .map(|(_, store)| store.state())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
