//! The pure parts: what a Secret implies (certificate, caBundle), when what is re-issued, the
//! key and chain checks, and the caBundle patch.

use k8s_openapi::api::admissionregistration::v1::WebhookClientConfig;

use super::*;

const DAY: SignedDuration = SignedDuration::from_hours(24);

fn names() -> Vec<String> {
    vec![
        "ck8s-certs-webhook-service.ck8s-certs-system.svc".into(),
        "127.0.0.1".into(),
    ]
}

fn days_ago(now: Timestamp, days: i32) -> Timestamp {
    now.saturating_sub(DAY * days).unwrap()
}

/// A Secret as the controller writes it on a fresh install, issued at `at`.
fn fresh(at: Timestamp) -> Stored {
    Stored::from_data(Some(&rotated(None, &names(), at).unwrap()))
}

/// A fresh Secret issued at `now`, then changed by `change`.
fn fresh_but(now: Timestamp, change: impl FnOnce(&mut Stored)) -> Stored {
    let mut stored = fresh(now);
    change(&mut stored);
    stored
}

/// What the controller plans for `stored` (serving the usual names) at `now`.
fn planned(stored: &Stored, now: Timestamp) -> Plan {
    plan(stored, &names(), now)
}

fn kept(plan: Plan) -> Current {
    match plan {
        Plan::Keep(current) => current,
        other => panic!("not kept: {other:?}"),
    }
}

fn parsed(pem: &str) -> x509_parser::pem::Pem {
    pem_block(pem).unwrap()
}

/// `leaf` verifies against `ca`, as the API server checks it.
fn signed_by(leaf: &str, ca: &str) -> bool {
    let (leaf, ca) = (parsed(leaf), parsed(ca));
    let (leaf, ca) = (leaf.parse_x509().unwrap(), ca.parse_x509().unwrap());
    leaf.issuer() == ca.subject() && leaf.verify_signature(Some(ca.public_key())).is_ok()
}

#[test]
fn a_fresh_secret_is_served_and_its_ca_alone_is_the_bundle() {
    let now = Timestamp::now();
    let stored = fresh(now);
    let current = kept(planned(&stored, now));
    assert_eq!(Some(&current.pem.ca), stored.ca_cert.as_ref());
    assert_eq!(Some(&current.pem.cert), stored.cert.as_ref());
    // Byte for byte the CA: what a configuration set before this release holds stays right.
    assert_eq!(current.bundle, current.pem.ca);
    assert!(signed_by(&current.pem.cert, &current.pem.ca));
    assert!(stored.previous.is_none() && stored.previous_until.is_none());
}

#[test]
fn a_serving_certificate_is_used_until_a_month_before_it_ends() {
    let now = Timestamp::now();
    let stored = fresh(days_ago(now, SERVING_DAYS as i32 - 40));
    kept(planned(&stored, now));
    let stored = fresh(days_ago(now, SERVING_DAYS as i32 - 20));
    assert!(matches!(
        planned(&stored, now),
        Plan::Reissue(Why::ServingEnding(_))
    ));
    // Re-issued by the same CA: the bundle does not change.
    let renewed = Stored::from_data(Some(&reissued(&stored, &names(), now).unwrap()));
    let current = kept(planned(&renewed, now));
    assert_eq!(renewed.ca_cert, stored.ca_cert);
    assert_eq!(renewed.ca_key, stored.ca_key);
    assert_ne!(renewed.cert, stored.cert);
    assert_eq!(Some(current.bundle), stored.bundle());
    assert!(signed_by(&current.pem.cert, &current.pem.ca));
}

#[test]
fn a_name_missing_is_added_and_no_name_is_dropped() {
    let now = Timestamp::now();
    let stored = fresh(now);
    // Fewer names (another replica's flags): served as it is, nothing re-issued.
    kept(plan(&stored, &names()[..1], now));
    let more = [names(), vec!["webhook.example.com".into()]].concat();
    assert_eq!(
        plan(&stored, &more, now),
        Plan::Reissue(Why::Unnamed("webhook.example.com".into()))
    );
    // Re-issued for both sets: the replica with fewer names does not re-issue in turn.
    let renewed = Stored::from_data(Some(&reissued(&stored, &names()[..1], now).unwrap()));
    kept(planned(&renewed, now));
    let renewed = Stored::from_data(Some(&reissued(&stored, &more, now).unwrap()));
    kept(plan(&renewed, &more, now));
    kept(planned(&renewed, now));
    // DNS names compare case-insensitively, as certificates are checked.
    kept(plan(&renewed, &["WEBHOOK.example.com".into()], now));
}

#[test]
fn the_ca_is_replaced_when_a_third_of_its_life_is_left() {
    let now = Timestamp::now();
    let start = days_ago(now, 10);
    let end = start.saturating_add(DAY * 300).unwrap();
    assert!(!ca_due(start, end, start));
    assert!(!ca_due(
        start,
        end,
        start.saturating_add(DAY * 199).unwrap()
    ));
    assert!(ca_due(start, end, start.saturating_add(DAY * 201).unwrap()));
    assert!(ca_due(start, end, end));
    assert!(ca_due(start, end, end.saturating_add(DAY).unwrap()));

    // The controller's CA (ten years) is replaced a bit over six and a half years in; before
    // that only its serving certificates are.
    assert!(matches!(
        planned(&fresh(days_ago(now, 2400)), now),
        Plan::Reissue(Why::ServingEnding(_))
    ));
    let old = fresh(days_ago(now, 2500));
    let Plan::Rotate(Why::CaEnding(until)) = planned(&old, now) else {
        panic!("not rotated: {:?}", planned(&old, now));
    };
    assert!(until > now, "still valid when it is replaced");
}

#[test]
fn a_rotation_keeps_the_replaced_ca_in_the_bundle_for_a_day() {
    let now = Timestamp::now();
    let old = fresh(days_ago(now, 2500));
    let held = old.ca_cert.clone().unwrap();
    let previous = previous_ca(Some(&held), &old, now);
    assert_eq!(previous.as_deref(), Some(held.as_str()));
    let rotated = Stored::from_data(Some(&rotated(previous.as_deref(), &names(), now).unwrap()));
    let current = kept(planned(&rotated, now));
    assert_ne!(current.pem.ca, held);
    assert_eq!(current.bundle, format!("{}{}", current.pem.ca, held));
    assert!(signed_by(&current.pem.cert, &current.pem.ca));
    let until: Timestamp = rotated.previous_until.as_deref().unwrap().parse().unwrap();
    assert_eq!(until, now.saturating_add(PREVIOUS_CA_KEPT).unwrap());

    // Kept until then; the first check after it removes the old CA, and only that changes.
    kept(planned(&rotated, until.saturating_sub(DAY / 24).unwrap()));
    assert_eq!(planned(&rotated, until), Plan::DropPrevious);
    let dropped = Stored::from_data(Some(&rotated.without_previous()));
    let after = kept(planned(&dropped, until));
    assert_eq!(after.pem, current.pem);
    assert_eq!(after.bundle, current.pem.ca);
    // A serving certificate re-issued once the day is over drops it in the same write.
    let renewed = Stored::from_data(Some(&reissued(&rotated, &names(), until).unwrap()));
    assert!(renewed.previous.is_none() && renewed.previous_until.is_none());
}

#[test]
fn the_ca_kept_is_the_one_served_else_the_secrets_own_if_still_valid() {
    let now = Timestamp::now();
    let served = fresh(now).ca_cert.unwrap();
    let stored = fresh(now);
    let own = stored.ca_cert.clone().unwrap();
    assert_eq!(
        previous_ca(Some(&served), &stored, now),
        Some(served.clone())
    );
    assert_eq!(previous_ca(None, &stored, now), Some(own));
    // The Secret deleted: what this replica serves.
    assert_eq!(
        previous_ca(Some(&served), &Stored::default(), now),
        Some(served)
    );
    assert_eq!(previous_ca(None, &Stored::default(), now), None);
    // An expired CA is no use to anyone.
    let expired = fresh(days_ago(now, CA_DAYS as i32 + 5));
    assert!(matches!(
        planned(&expired, now),
        Plan::Rotate(Why::CaEnding(_))
    ));
    assert_eq!(previous_ca(expired.ca_cert.as_deref(), &expired, now), None);
}

#[test]
fn a_previous_ca_that_cannot_be_read_is_dropped_and_never_in_the_bundle() {
    let now = Timestamp::now();
    let mut stored = fresh(now);
    stored.previous = Some("not a certificate".into());
    stored.previous_until = Some(now.saturating_add(DAY).unwrap().to_string());
    assert_eq!(stored.bundle(), stored.ca_cert.clone());
    assert_eq!(planned(&stored, now), Plan::DropPrevious);
    let mut stored = fresh(now);
    stored.previous = fresh(now).ca_cert;
    stored.previous_until = Some("soon".into());
    assert_eq!(planned(&stored, now), Plan::DropPrevious);
    stored.previous_until = None;
    assert_eq!(planned(&stored, now), Plan::DropPrevious);
}

#[test]
fn a_key_that_is_not_its_certificates_is_caught() {
    let now = Timestamp::now();
    let other = fresh(now);
    let stored = fresh_but(now, |s| s.ca_key = other.ca_key.clone());
    assert_eq!(planned(&stored, now), Plan::Rotate(Why::CaKeyMismatch));
    let stored = fresh_but(now, |s| s.key = other.key.clone());
    assert_eq!(
        planned(&stored, now),
        Plan::Reissue(Why::ServingKeyMismatch)
    );
    let stored = fresh_but(now, |s| s.key = Some("garbage".into()));
    assert_eq!(planned(&stored, now), Plan::Reissue(Why::ServingUnreadable));
}

#[test]
fn a_serving_certificate_of_another_ca_is_reissued_by_the_secrets_ca() {
    let now = Timestamp::now();
    let other = fresh(now);
    let mut stored = fresh(now);
    stored.cert = other.cert.clone();
    stored.key = other.key.clone();
    assert_eq!(planned(&stored, now), Plan::Reissue(Why::NotSignedByCa));
    let renewed = Stored::from_data(Some(&reissued(&stored, &names(), now).unwrap()));
    let current = kept(planned(&renewed, now));
    assert_eq!(Some(&current.pem.ca), stored.ca_cert.as_ref());
    assert!(signed_by(&current.pem.cert, &current.pem.ca));
}

#[test]
fn a_ca_this_controller_did_not_issue_is_replaced() {
    let now = Timestamp::now();
    // Not a CA at all.
    let leaf = rcgen::generate_simple_self_signed(vec!["x".to_owned()]).unwrap();
    let mut stored = fresh(now);
    stored.ca_cert = Some(leaf.cert.pem());
    stored.ca_key = Some(leaf.signing_key.serialize_pem());
    assert_eq!(planned(&stored, now), Plan::Rotate(Why::NotOurCa));
    // A CA of another name: its certificates would name another issuer than ours.
    let key = KeyPair::generate().unwrap();
    let mut params = ca_params(now).unwrap();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, "someone else's CA");
    let mut stored = fresh(now);
    stored.ca_cert = Some(params.self_signed(&key).unwrap().pem());
    stored.ca_key = Some(key.serialize_pem());
    assert_eq!(planned(&stored, now), Plan::Rotate(Why::NotOurCa));
}

#[test]
fn an_unreadable_secret_gets_a_new_ca() {
    let now = Timestamp::now();
    assert_eq!(
        planned(&Stored::default(), now),
        Plan::Rotate(Why::CaUnreadable)
    );
    let stored = fresh_but(now, |s| s.ca_key = None);
    assert_eq!(planned(&stored, now), Plan::Rotate(Why::CaUnreadable));
}

#[test]
fn keys_the_controller_does_not_know_are_kept() {
    let now = Timestamp::now();
    let mut data = rotated(None, &names(), now).unwrap();
    data.insert("note".into(), ByteString(b"kept".to_vec()));
    let stored = Stored::from_data(Some(&data));
    assert_eq!(stored.data(), data);
    let renewed = reissued(&stored, &names(), now).unwrap();
    assert_eq!(renewed["note"], ByteString(b"kept".to_vec()));
}

fn webhook(name: &str, bundle: Option<&str>) -> MutatingWebhook {
    MutatingWebhook {
        name: name.into(),
        admission_review_versions: vec!["v1".into()],
        side_effects: "None".into(),
        client_config: WebhookClientConfig {
            ca_bundle: bundle.map(|b| ByteString(b.as_bytes().to_vec())),
            url: Some("https://127.0.0.1:9443/mutate-machine".into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn configuration(webhooks: Vec<MutatingWebhook>) -> MutatingWebhookConfiguration {
    MutatingWebhookConfiguration {
        metadata: kube::api::ObjectMeta {
            name: Some("ck8s-certs-refresh-trigger".into()),
            ..Default::default()
        },
        webhooks: Some(webhooks),
    }
}

fn apply(
    configuration: &MutatingWebhookConfiguration,
    ops: &[serde_json::Value],
) -> Result<MutatingWebhookConfiguration, json_patch::PatchError> {
    let mut object = serde_json::to_value(configuration).unwrap();
    let patch: json_patch::Patch = serde_json::from_value(json!(ops)).unwrap();
    json_patch::patch(&mut object, &patch)?;
    Ok(serde_json::from_value(object).unwrap())
}

fn bundles(configuration: &MutatingWebhookConfiguration) -> Vec<Option<String>> {
    configuration
        .webhooks
        .iter()
        .flatten()
        .map(|w| {
            w.client_config
                .ca_bundle
                .as_ref()
                .map(|b| String::from_utf8(b.0.clone()).unwrap())
        })
        .collect()
}

#[test]
fn the_bundle_patch_sets_only_our_entries_each_guarded_by_its_name() {
    let before = configuration(vec![
        webhook("audit.example.com", Some("theirs")),
        webhook("refresh-trigger.certificates.ck8s.io", None),
        webhook("policy.example.com", None),
        webhook("fleet-trigger.certificates.ck8s.io", Some("old")),
        webhook("refresh-request.certificates.ck8s.io", Some("new")),
    ]);
    let ops = bundle_patch(before.webhooks.as_deref().unwrap(), "new");
    assert_eq!(
        ops,
        vec![
            json!({ "op": "test", "path": "/webhooks/1/name", "value": "refresh-trigger.certificates.ck8s.io" }),
            json!({ "op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": "bmV3" }),
            json!({ "op": "test", "path": "/webhooks/3/name", "value": "fleet-trigger.certificates.ck8s.io" }),
            json!({ "op": "test", "path": "/webhooks/3/clientConfig/caBundle", "value": "b2xk" }),
            json!({ "op": "add", "path": "/webhooks/3/clientConfig/caBundle", "value": "bmV3" }),
        ]
    );
    let after = apply(&before, &ops).unwrap();
    assert_eq!(
        bundles(&after),
        [
            Some("theirs".into()),
            Some("new".into()),
            None,
            Some("new".into()),
            Some("new".into())
        ]
    );
    assert!(bundle_differs(&before, "new"));
    assert!(!bundle_differs(&after, "new"));
    assert!(bundle_patch(after.webhooks.as_deref().unwrap(), "new").is_empty());

    // Entries moved since the read: the patch fails as a whole, nobody else's CA is set.
    let mut moved = before.clone();
    moved.webhooks.as_mut().unwrap().swap(0, 1);
    assert!(apply(&moved, &ops).is_err());
    // Another replica set it in between: the second write fails instead of writing again.
    let mut written = before.clone();
    written.webhooks.as_mut().unwrap()[3] =
        webhook("fleet-trigger.certificates.ck8s.io", Some("new"));
    assert!(apply(&written, &ops).is_err());
}

#[test]
fn a_configuration_without_entries_of_ours_is_left_alone() {
    let foreign = configuration(vec![webhook("audit.example.com", None)]);
    assert!(bundle_patch(foreign.webhooks.as_deref().unwrap(), "new").is_empty());
    assert!(!bundle_differs(&foreign, "new"));
    assert!(!bundle_differs(&configuration(Vec::new()), "new"));
}

#[test]
fn the_policy_webhook_configuration_gets_the_same_bundle() {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingWebhook, ValidatingWebhookConfiguration,
    };
    let entry = |name: &str, bundle: Option<&str>| ValidatingWebhook {
        name: name.into(),
        admission_review_versions: vec!["v1".into()],
        side_effects: "None".into(),
        client_config: WebhookClientConfig {
            ca_bundle: bundle.map(|b| ByteString(b.as_bytes().to_vec())),
            ..Default::default()
        },
        ..Default::default()
    };
    let configuration = ValidatingWebhookConfiguration {
        metadata: kube::api::ObjectMeta {
            name: Some("ck8s-certs-policy-promise".into()),
            ..Default::default()
        },
        webhooks: Some(vec![
            entry("audit.example.com", None),
            entry("policy-promise.certificates.ck8s.io", Some("old")),
        ]),
    };
    assert!(bundle_differs(&configuration, "new"));
    assert_eq!(
        bundle_patch(configuration.entries(), "new"),
        vec![
            json!({ "op": "test", "path": "/webhooks/1/name", "value": "policy-promise.certificates.ck8s.io" }),
            json!({ "op": "test", "path": "/webhooks/1/clientConfig/caBundle", "value": "b2xk" }),
            json!({ "op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": "bmV3" }),
        ]
    );
    assert!(!bundle_differs(&configuration, "old"));
}
