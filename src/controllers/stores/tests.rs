use super::*;
use kube::api::DynamicObject;
use serde_json::json;

#[test]
fn cached_certificates_keep_identity_and_status() {
    let full = json!({
        "apiVersion": "certificates.ck8s.io/v1alpha1", "kind": "MachineCertificates",
        "metadata": { "name": "m", "namespace": "ns", "uid": "u", "resourceVersion": "9",
            "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": { "cluster.x-k8s.io/cluster-name": "c" },
            "ownerReferences": [{ "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "name": "m", "uid": "mu" }],
            "managedFields": [{ "manager": "ck8s-certs", "operation": "Apply", "fieldsV1": { "f:status": {} } }] },
        "spec": { "clusterName": "c" },
        "status": { "role": "Worker", "nodeName": "n1", "expiry": "2027-01-01T00:00:00Z",
            "conditions": [{ "type": "Ready", "status": "True", "reason": "ExpiryKnown", "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z" }] }
    });
    let decoded: MachineCertificates = serde_json::from_value(full.clone()).expect("object");
    let cached: CachedCertificates = serde_json::from_str(&full.to_string()).expect("cached");
    let meta = &cached.metadata;
    assert_eq!(
        (
            meta.name.as_deref(),
            meta.namespace.as_deref(),
            meta.resource_version.as_deref()
        ),
        (Some("m"), Some("ns"), Some("9"))
    );
    assert_eq!(
        (
            &meta.uid,
            &meta.labels,
            &meta.owner_references,
            &meta.managed_fields,
            meta.generation
        ),
        (&None, &None, &None, &None, None)
    );
    assert_eq!(cached.status().expect("status"), decoded.status);
    // The cache's digest is the one of the same status read from the API server, and no other.
    assert_eq!(
        cached.status.digest(),
        status_digest(decoded.status.as_ref())
    );
    let mut other = decoded.status.clone().expect("status");
    other.node_name = Some("n2".into());
    assert_ne!(cached.status.digest(), status_digest(Some(&other)));
    assert_eq!(
        cached.status.expiry().map(|t| t.to_string()).as_deref(),
        Some("2027-01-01T00:00:00Z")
    );
    let bare: CachedCertificates =
        serde_json::from_str(r#"{"metadata":{"name":"m"},"spec":{"clusterName":"c"}}"#)
            .expect("cached");
    assert_eq!(bare.status().expect("status"), None);
    assert_eq!(bare.status.digest(), status_digest(None));
    assert_eq!(bare.status.expiry(), None);
}

fn certificates(namespace: &str, name: &str, node: &str) -> CachedCertificates {
    serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": namespace, "resourceVersion": "1" },
        "status": { "role": "Worker", "nodeName": node }
    }))
    .expect("cached")
}

fn node_in(store: &CertificateStore, namespace: &str, name: &str) -> Option<String> {
    let status = store.get(namespace, name)?.status().expect("status")?;
    status.node_name
}

/// The certificate cache follows its watch like kube-runtime's store: a (re)list replaces
/// the contents when it is complete, changes and deletions apply at once, and it is ready
/// from the first complete list on.
#[tokio::test]
async fn the_certificate_cache_follows_its_watch() {
    use watcher::Event;
    let mut writer = CertificateWriter::new();
    let store = writer.reader();
    let synced = {
        let store = store.clone();
        tokio::spawn(async move { store.synced().await })
    };
    writer.apply(&Event::Init);
    writer.apply(&Event::InitApply(certificates("a", "m1", "n1")));
    writer.apply(&Event::InitApply(certificates("b", "m1", "n2")));
    assert_eq!(
        node_in(&store, "a", "m1"),
        None,
        "a list is used once complete"
    );
    assert!(!synced.is_finished());
    writer.apply(&Event::InitDone);
    tokio::time::timeout(std::time::Duration::from_secs(5), synced)
        .await
        .expect("ready after the first list")
        .expect("task");
    assert_eq!(node_in(&store, "a", "m1").as_deref(), Some("n1"));
    assert_eq!(node_in(&store, "b", "m1").as_deref(), Some("n2"));

    writer.apply(&Event::Apply(certificates("a", "m1", "n3")));
    writer.apply(&Event::Apply(certificates("a", "m2", "n4")));
    assert_eq!(node_in(&store, "a", "m1").as_deref(), Some("n3"));
    assert_eq!(node_in(&store, "a", "m2").as_deref(), Some("n4"));
    writer.apply(&Event::Delete(certificates("b", "m1", "n2")));
    assert!(store.get("b", "m1").is_none());
    assert!(store.get("c", "m1").is_none());

    // A relist: what it no longer lists is gone once it completes.
    writer.apply(&Event::Init);
    writer.apply(&Event::InitApply(certificates("a", "m2", "n5")));
    assert_eq!(node_in(&store, "a", "m1").as_deref(), Some("n3"));
    writer.apply(&Event::InitDone);
    assert!(store.get("a", "m1").is_none());
    assert_eq!(node_in(&store, "a", "m2").as_deref(), Some("n5"));
    store.synced().await;
}

#[test]
fn trimmed_metadata_drops_managed_fields_and_the_last_applied_configuration() {
    let mut policy: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "certificates.ck8s.io/v1alpha1", "kind": "CertificateRenewalPolicy",
        "metadata": { "name": "p", "namespace": "ns",
            "annotations": { "kubectl.kubernetes.io/last-applied-configuration": "{…}", "keep": "me" },
            "managedFields": [{ "manager": "kubectl", "operation": "Apply", "fieldsV1": { "f:spec": {} } }] },
        "spec": { "policy": "Automatic" }
    }))
    .expect("object");
    trim_policy(&mut policy);
    assert_eq!(policy.metadata.managed_fields, None);
    assert_eq!(
        policy.metadata.annotations,
        Some([("keep".to_owned(), "me".to_owned())].into())
    );
    assert_eq!(policy.data, json!({ "spec": { "policy": "Automatic" } }));
}

/// `(name, resourceVersion, node)` of the objects a relist passes on, in order.
fn passed<K: Resource, C: Cache<K>>(cache: &mut C, events: Vec<watcher::Event<K>>) -> Vec<String> {
    events
        .into_iter()
        .filter_map(|event| pass_on(cache, Ok(event)))
        .filter_map(Result::ok)
        .map(
            |Passed {
                 object, deleted, ..
             }| {
                let meta = object.meta();
                format!(
                    "{}{}@{}",
                    if deleted { "-" } else { "" },
                    meta.name.clone().unwrap_or_default(),
                    meta.resource_version.clone().unwrap_or_default()
                )
            },
        )
        .collect()
}

/// The events of a (re)list of `objects`.
fn listed<K>(objects: impl IntoIterator<Item = K>) -> Vec<watcher::Event<K>> {
    use watcher::Event;
    let applied = objects.into_iter().map(Event::InitApply);
    [Event::Init]
        .into_iter()
        .chain(applied)
        .chain([Event::InitDone])
        .collect()
}

fn machine(name: &str, version: &str) -> ck8s_certs_api::machine::Machine {
    let mut machine = ck8s_certs_api::machine::Machine::default();
    machine.metadata.name = Some(name.into());
    machine.metadata.namespace = Some("ns".into());
    machine.metadata.resource_version = Some(version.into());
    machine
}

/// The first list passes every object on (the whole fleet is reconciled once); a relist only
/// those that changed during the gap, and every change after it.
#[test]
fn a_relist_passes_on_only_what_changed() {
    use watcher::Event;
    let mut cache = Reflector::new(CapiVersion::default());
    let store = cache.reader();
    let first = passed(
        &mut cache,
        listed([machine("m1", "1"), machine("m2", "1"), machine("m3", "1")]),
    );
    assert_eq!(first, ["m1@1", "m2@1", "m3@1"]);
    assert_eq!(
        passed(&mut cache, vec![Event::Apply(machine("m1", "2"))]),
        ["m1@2"]
    );
    // A deletion is passed on (marked), for the subscribers that want it.
    assert_eq!(
        passed(
            &mut cache,
            vec![
                Event::Apply(machine("m5", "3")),
                Event::Delete(machine("m5", "4"))
            ]
        ),
        ["m5@3", "-m5@4"]
    );

    // After a gap: m1 unchanged since, m2 changed, m3 deleted, m4 new.
    let relist = passed(
        &mut cache,
        listed([machine("m1", "2"), machine("m2", "5"), machine("m4", "6")]),
    );
    assert_eq!(relist, ["m2@5", "m4@6"]);
    let mut names: Vec<String> = store
        .state()
        .iter()
        .filter_map(|m| m.metadata.name.clone())
        .collect();
    names.sort();
    assert_eq!(names, ["m1", "m2", "m4"]);
    // A relist of objects without a resourceVersion passes them on (nothing to compare).
    let mut bare = machine("m1", "2");
    bare.metadata.resource_version = None;
    assert_eq!(passed(&mut cache, listed([bare])), ["m1@"]);
}

/// The certificate cache compares statuses (all it keeps), and a relisted status equal to the
/// cached one is the cached one, not a second copy.
#[test]
fn a_certificate_relist_passes_on_only_changed_statuses_and_shares_the_rest() {
    let mut writer = CertificateWriter::new();
    let store = writer.reader();
    let first = passed(
        &mut writer,
        listed([certificates("a", "m1", "n1"), certificates("a", "m2", "n2")]),
    );
    assert_eq!(first, ["m1@1", "m2@1"]);
    let before = store.get("a", "m1").expect("cached");
    let relist = passed(
        &mut writer,
        listed([certificates("a", "m1", "n1"), certificates("a", "m2", "n9")]),
    );
    assert_eq!(relist, ["m2@1"]);
    let after = store.get("a", "m1").expect("cached");
    assert!(
        Arc::ptr_eq(&before, &after),
        "an unchanged status is shared"
    );
    assert_eq!(node_in(&store, "a", "m2").as_deref(), Some("n9"));
}
