//! The controller checks a request itself before it hands Machines over
//! (`src/controllers/fleet/authority.rs`), with the provider's admission policies
//! (`config/policy`), the request webhook and real RBAC installed as in a cluster: the policies
//! can be missing for a while (`clusterctl upgrade` deletes and re-creates them), and rights can
//! be revoked after a request was admitted. Then, with the same controller and webhook, that who
//! asked cannot be erased, redirected or inherited.

use std::time::Duration;

use ck8s_certs_api::annotations::{
    FLEET_REQUEST, IN_FLIGHT_REFRESH, REFRESH_CERTIFICATES, REFRESH_REQUEST, REQUESTER,
};
use ck8s_certs_api::certificate_refresh::{CertificateRefresh, RequestPhase, Requester, Target};
use ck8s_certs_e2e::fixtures::{NodeInfo, manual_request};
use ck8s_certs_e2e::sim::{Endpoint, Fault};
use ck8s_certs_e2e::users::{Grant, refused};
use ck8s_certs_e2e::webhook::admission_settled;
use ck8s_certs_e2e::{Environment, shared_of};
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

const FILTER: &str = "request-checks";
const NAMESPACE: &str = "fleet";
const POLICY: &str = "ck8s-certs-requests";
const TIMEOUT: Duration = Duration::from_secs(90);

fn request_for(name: &str, machine: &str) -> CertificateRefresh {
    let target = Target {
        machine: Some(machine.into()),
        ..Default::default()
    };
    manual_request(name, target, FILTER)
}

/// Checks that `name` was refused with a message containing `why`, and that its Machine's node
/// was sent nothing.
async fn assert_refused(env: &Environment, name: &str, node: &NodeInfo, why: &str) {
    let request = env.finished_request(NAMESPACE, name, TIMEOUT).await;
    let status = request.status.unwrap_or_default();
    let message = status.message.unwrap_or_default();
    println!("{name}: {message}");
    assert_eq!(status.phase, Some(RequestPhase::Failed), "{message}");
    assert!(message.contains(why), "{message}");
    let calls = env.calls(node).await;
    assert!(
        calls
            .iter()
            .all(|c| c.endpoint != "plan" && c.endpoint != "run"),
        "{name}: the node was sent a refresh: {calls:#?}"
    );
}

async fn user(env: &Environment, name: &str, rules: serde_json::Value) -> (Client, String) {
    env.user(NAMESPACE, name, Grant::Rules(rules)).await
}

#[tokio::test]
async fn a_request_the_policy_never_checked_or_whose_author_lost_the_right_refreshes_nothing() {
    let env = shared_of(&["alpha"]).await;
    let nodes = env.isolate_cluster("alpha", FILTER).await;
    let node = |machine: &str| {
        nodes
            .iter()
            .find(|n| n.machine == machine)
            .cloned()
            .unwrap()
    };
    let (gap, revoked, live_gap, control) = (
        node("alpha-md-0-w0"),
        node("alpha-md-0-w1"),
        node("alpha-cp-1"),
        node("alpha-cp-0"),
    );
    env.install_admission_policies().await;
    let admin = env.management().await.unwrap();
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(admin.clone());
    let requests_only = json!([{ "apiGroups": ["certificates.ck8s.io"],
        "resources": ["certificaterefreshes"], "verbs": ["create", "get", "list"] }]);
    let may_refresh = json!([
        { "apiGroups": ["certificates.ck8s.io"], "resources": ["certificaterefreshes"],
          "verbs": ["create", "get", "list"] },
        { "apiGroups": ["cluster.x-k8s.io"], "resources": ["machines"], "verbs": ["get", "patch"] }
    ]);
    let (mallory, _) = user(&env, "mallory", requests_only).await;
    let (bob, bob_name) = user(&env, "bob", may_refresh.clone()).await;
    let (alice, alice_name) = user(&env, "alice", may_refresh).await;
    let as_user =
        |client: &Client| Api::<CertificateRefresh>::namespaced(client.clone(), NAMESPACE);

    // No controller runs yet; the webhook does (a webhook-only instance would do too): it is
    // started below with the request checks on.
    let binding = bindings.get(POLICY).await.unwrap();
    let restore = || {
        let mut again = binding.clone();
        again.metadata.resource_version = None;
        again.metadata.uid = None;
        again.metadata.creation_timestamp = None;
        again.metadata.managed_fields = None;
        again
    };

    // With the binding gone (the API server's policy informer given 2 s to notice), mallory,
    // who may not refresh anything, creates request `name` naming alice as its author: nothing
    // checks it.
    let forge = async |name: &str, node: &NodeInfo| {
        bindings
            .delete(POLICY, &DeleteParams::default())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut forged = request_for(name, &node.machine);
        forged.spec.requester = Some(Requester {
            username: alice_name.clone(),
            ..Default::default()
        });
        as_user(&mallory)
            .create(&PostParams::default(), &forged)
            .await
            .expect("admitted: no binding checks it");
    };

    // 1. The binding is gone (an upgrade in progress) while a request is forged; then it is back.
    forge("forged-in-the-gap", &gap).await;
    // Creation times are in seconds: the binding must be visibly younger.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    bindings
        .create(&PostParams::default(), &restore())
        .await
        .unwrap();
    admission_settled().await;

    // 2. Bob may refresh and asks (naming himself, as the webhook, which runs with the
    //    controller, would); his right is revoked before the controller gets to the request.
    let mut asked = request_for("revoked", &revoked.machine);
    asked.spec.requester = Some(Requester {
        username: bob_name,
        ..Default::default()
    });
    as_user(&bob)
        .create(&PostParams::default(), &asked)
        .await
        .expect("bob may ask");
    Api::<RoleBinding>::namespaced(admin.clone(), NAMESPACE)
        .delete("bob", &DeleteParams::default())
        .await
        .unwrap();

    let _controller = env
        .start_controller_with_request_webhook(FILTER, &[&format!("--request-policy={POLICY}")])
        .await;
    assert_refused(
        &env,
        "forged-in-the-gap",
        &gap,
        "before the admission policy ck8s-certs-requests that checks its author was in force",
    )
    .await;
    assert_refused(
        &env,
        "revoked",
        &revoked,
        "may not refresh machines.cluster.x-k8s.io alpha-md-0-w1 in namespace fleet (now)",
    )
    .await;

    // 3. The binding gone while the controller runs: a request made meanwhile is refused at once.
    forge("forged-while-running", &live_gap).await;
    assert_refused(
        &env,
        "forged-while-running",
        &live_gap,
        "ValidatingAdmissionPolicyBinding ck8s-certs-requests",
    )
    .await;
    bindings
        .create(&PostParams::default(), &restore())
        .await
        .unwrap();
    admission_settled().await;

    // 4. And with everything in place, alice's own request goes through: the checks refuse
    //    what they should, not everything.
    as_user(&alice)
        .create(
            &PostParams::default(),
            &request_for("by-alice", &control.machine),
        )
        .await
        .expect("alice may ask");
    let done = env.finished_request(NAMESPACE, "by-alice", TIMEOUT).await;
    let status = done.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Some(RequestPhase::Succeeded), "{status:?}");
    assert_eq!(
        done.spec.requester.as_ref().map(|r| r.username.as_str()),
        Some(alice_name.as_str()),
        "{}",
        done.name_any()
    );

    who_asked_cannot_be_erased_redirected_or_inherited(&env, &gap).await;
}

/// Each write that would erase or redirect who asked (issue 36, item 4) is refused by the
/// provider's policies, and the controller forgets a trigger's author with the trigger. Run
/// after the checks above, with their controller and webhook (one webhook configuration per
/// management cluster: a second test installing its own would take it from the first).
async fn who_asked_cannot_be_erased_redirected_or_inherited(env: &Environment, node: &NodeInfo) {
    let may_refresh = json!([
        { "apiGroups": ["certificates.ck8s.io"], "resources": ["certificaterefreshes"],
          "verbs": ["create", "get", "list"] },
        { "apiGroups": ["cluster.x-k8s.io"], "resources": ["machines"], "verbs": ["get", "list", "patch"] }
    ]);
    let (erin, erin_name) = user(env, "erin", may_refresh).await;
    let machines = env.machine_api(erin.clone(), NAMESPACE);
    let patch = |annotations: serde_json::Value| {
        let machines = machines.clone();
        let name = node.machine.clone();
        async move {
            machines
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "metadata": { "annotations": annotations } })),
                )
                .await
        }
    };

    // Her trigger filed under someone else's running fleet request (which names no requester
    // of hers), or with the controller's in-flight mark; the webhook's request mark written
    // without a trigger: refused, each mark named.
    for (mark, annotations) in [
        (
            FLEET_REQUEST,
            json!({ REFRESH_CERTIFICATES: "1y", FLEET_REQUEST: "alpha-1798761600" }),
        ),
        (
            IN_FLIGHT_REFRESH,
            json!({ REFRESH_CERTIFICATES: "1y", IN_FLIGHT_REFRESH: "alpha-md-0-w0-1798761600" }),
        ),
        (
            REFRESH_REQUEST,
            json!({ REFRESH_REQUEST: "an-earlier-request" }),
        ),
    ] {
        let message = refused(patch(annotations).await);
        assert!(
            message.contains(mark) && message.contains(&format!("{erin_name} may not set")),
            "{mark}: {message}"
        );
    }

    // Her own trigger is stamped with her name, which she cannot remove while it stands. (The
    // node's plan waits 10 s: the trigger is still there when she tries.)
    let wait = Fault::latency(Duration::from_secs(10))
        .at(Endpoint::Plan)
        .times(1);
    env.sim.inject(&wait.on(node)).await.unwrap();
    env.annotate_refresh_through(&machines, node, "1y").await;
    assert_eq!(
        env.machine_annotations(node).await.get(REQUESTER),
        Some(&erin_name)
    );
    let remove: json_patch::Patch = serde_json::from_value(json!([{ "op": "remove",
        "path": format!("/metadata/annotations/{}", REQUESTER.replace('/', "~1")) }]))
    .unwrap();
    let erase = machines
        .patch(
            &node.machine,
            &PatchParams::default(),
            &Patch::<()>::Json(remove),
        )
        .await;
    let message = refused(erase);
    assert!(message.contains("only the"), "{message}");

    // The refresh names her, and her name goes with the trigger: a later trigger written
    // without the webhook does not inherit it.
    env.wait_for_done(node, TIMEOUT).await;
    let op = env.operation(node).await;
    assert_eq!(op.requester.map(|r| r.username), Some(erin_name.clone()));
    let annotations = env.machine_annotations(node).await;
    assert!(!annotations.contains_key(REQUESTER), "{annotations:#?}");

    // A request made by hand cannot carry the controller's free-text requestedBy.
    let mut claimed = request_for("erin-as-admin", &node.machine);
    claimed.spec.requested_by = Some("admin".into());
    let message = refused(
        Api::<CertificateRefresh>::namespaced(erin, NAMESPACE)
            .create(&PostParams::default(), &claimed)
            .await,
    );
    assert!(message.contains("spec.requestedBy"), "{message}");

    // A user granted every verb on requests (custom ones included) still names only herself.
    let (frank, _) = user(
        env,
        "frank",
        json!([{ "apiGroups": ["certificates.ck8s.io"], "resources": ["certificaterefreshes"], "verbs": ["*"] },
               { "apiGroups": ["cluster.x-k8s.io"], "resources": ["machines"], "verbs": ["patch"] }]),
    )
    .await;
    let mut as_erin = request_for("frank-as-erin", &node.machine);
    as_erin.spec.requester = Some(Requester {
        username: erin_name.clone(),
        ..Default::default()
    });
    let message = refused(
        Api::<CertificateRefresh>::namespaced(frank, NAMESPACE)
            .create(&PostParams::default(), &as_erin)
            .await,
    );
    assert!(
        message.contains(&format!("spec.requester names {erin_name}")),
        "{message}"
    );
}
