//! Who may ask for a refresh, and who is named as having asked, with users made in the test
//! API server (ServiceAccount tokens) under real RBAC, the admission webhook and the provider's
//! admission policies (`config/policy`) installed as in a cluster.

use std::time::{Duration, Instant};

use ck8s_certs_api::annotations::{REFRESH_CERTIFICATES, REQUESTER};
use ck8s_certs_api::capi::WATCH_FILTER_LABEL;
use ck8s_certs_api::certificate_refresh::{CertificateRefresh, RequestPhase, Requester, Target};
use ck8s_certs_e2e::fixtures::manual_request;
use ck8s_certs_e2e::users::{Grant, refused};
use ck8s_certs_e2e::{Environment, shared_of};
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

const FILTER: &str = "attribution";
const NAMESPACE: &str = "fleet";
const TIMEOUT: Duration = Duration::from_secs(90);

/// A ServiceAccount of namespace `fleet` with a Role of `rules` there, and a client that
/// authenticates as it. Returns the client and its username.
async fn user(env: &Environment, name: &str, rules: serde_json::Value) -> (Client, String) {
    env.user(NAMESPACE, name, Grant::Rules(rules)).await
}

fn request_for(name: &str, machine: &str, requester: Option<&str>) -> CertificateRefresh {
    let target = Target {
        machine: Some(machine.into()),
        ..Default::default()
    };
    let mut request = manual_request(name, target, FILTER);
    request.spec.requester = requester.map(|username| Requester {
        username: username.into(),
        ..Default::default()
    });
    request
}

/// The first request of `records` that `matches`.
async fn find_record(
    records: &Api<CertificateRefresh>,
    matches: impl Fn(&CertificateRefresh) -> bool,
) -> Option<CertificateRefresh> {
    let list = records.list(&Default::default()).await.unwrap();
    list.items.into_iter().find(|r| matches(r))
}

#[tokio::test]
async fn only_users_who_may_change_the_target_get_a_refresh_and_they_are_named() {
    let env = shared_of(&["beta"]).await;
    let [by_request, by_trigger] = env
        .isolated("beta", ["beta-md-0-w0", "beta-md-0-w1"], FILTER)
        .await;
    env.install_admission_policies().await;
    let _controller = env.start_controller_with_request_webhook(FILTER, &[]).await;
    let requests_only = json!([{ "apiGroups": ["certificates.ck8s.io"],
        "resources": ["certificaterefreshes"], "verbs": ["create", "get", "list"] }]);
    let (alice, alice_name) = user(&env, "alice", requests_only).await;
    let (bob, bob_name) = user(
        &env,
        "bob",
        json!([
            { "apiGroups": ["certificates.ck8s.io"], "resources": ["certificaterefreshes"],
              "verbs": ["create", "get", "list"] },
            { "apiGroups": ["cluster.x-k8s.io"], "resources": ["machines", "machinedeployments"],
              "verbs": ["get", "list", "patch"] }
        ]),
    )
    .await;
    let post = PostParams::default();

    // Only the right to create requests: refused, the missing permission named.
    let as_alice: Api<CertificateRefresh> = Api::namespaced(alice, NAMESPACE);
    let message = refused(
        as_alice
            .create(&post, &request_for("by-alice", &by_request.machine, None))
            .await,
    );
    assert!(
        message.contains(&format!(
            "{alice_name} may not refresh machines {} in namespace {NAMESPACE}",
            by_request.machine
        )) && message.contains("needs patch"),
        "{message}"
    );

    // A requester set by the client to someone else: refused.
    let as_bob: Api<CertificateRefresh> = Api::namespaced(bob.clone(), NAMESPACE);
    let message = refused(
        as_bob
            .create(
                &post,
                &request_for("by-bob-as-alice", &by_request.machine, Some(&alice_name)),
            )
            .await,
    );
    assert!(
        message.contains(&format!("spec.requester names {alice_name}")),
        "{message}"
    );

    // Bob may patch the Machine: his request is admitted, names him, and refreshes the node.
    let created = as_bob
        .create(&post, &request_for("by-bob", &by_request.machine, None))
        .await
        .unwrap();
    let requester = created
        .spec
        .requester
        .clone()
        .expect("the requester is written");
    assert_eq!(requester.username, bob_name);
    assert!(
        requester
            .groups
            .iter()
            .any(|g| g == "system:serviceaccounts"),
        "{requester:?}"
    );
    env.wait_for_done(&by_request, TIMEOUT).await;
    let start = Instant::now();
    let request = loop {
        let request = as_bob.get("by-bob").await.unwrap();
        if request.status.as_ref().and_then(|s| s.phase) == Some(RequestPhase::Succeeded) {
            break request;
        }
        assert!(start.elapsed() < TIMEOUT, "{request:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        request.spec.requester.map(|r| r.username),
        Some(bob_name.clone())
    );
    // `kubectl ck8s-certs history` (the controller binary under the plugin's name) names him.
    let plugin = env.dir.join("bin/kubectl-ck8s_certs");
    if !plugin.exists() {
        std::fs::create_dir_all(plugin.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(ck8s_certs_e2e::Binaries::controller().unwrap(), &plugin)
            .unwrap();
    }
    let history = std::process::Command::new(&plugin)
        .args(["history", "-n", NAMESPACE])
        .env("KUBECONFIG", &env.management_kubeconfig)
        .output()
        .unwrap();
    let history = String::from_utf8_lossy(&history.stdout);
    assert!(history.contains(&bob_name), "{history}");
    // The request's Events (on its cluster) name him.
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(env.management().await.unwrap(), NAMESPACE);
    let notes: Vec<String> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("CertificatesFleetRefreshStarted"))
        .filter_map(|e| e.note)
        .collect();
    assert!(
        notes
            .iter()
            .any(|note| note.contains(&format!("asked by {bob_name}"))),
        "an Event names who asked: {notes:#?}"
    );

    // The trigger path: the annotating user is recorded on the request the controller makes.
    let machines = env.machine_api(bob.clone(), NAMESPACE);
    env.annotate_refresh_through(&machines, &by_trigger, "1y")
        .await;
    assert_eq!(
        env.machine_annotations(&by_trigger).await.get(REQUESTER),
        Some(&bob_name),
        "the webhook writes the trigger's author"
    );
    env.wait_for_done(&by_trigger, TIMEOUT).await;
    let op = env.operation(&by_trigger).await;
    assert_eq!(
        op.requester.clone().map(|r| r.username),
        Some(bob_name.clone()),
        "{op:#?}"
    );
    let records: Api<CertificateRefresh> =
        Api::namespaced(env.management().await.unwrap(), NAMESPACE);
    let record = find_record(&records, |r| {
        r.spec.target.machine.as_deref() == Some(by_trigger.machine.as_str())
    })
    .await
    .expect("the Machine's record");
    assert_eq!(
        record.spec.requester.map(|r| r.username),
        Some(bob_name.clone())
    );
    let announced = env
        .machine_events(&by_trigger)
        .await
        .into_iter()
        .filter_map(|e| e.note)
        .any(|note| note.contains(&format!("asked by {bob_name}")));
    assert!(announced, "the refresh Event names who annotated");

    // A fleet trigger (on the MachineDeployment of both workers): the fleet request made from
    // it names its author.
    let deployment = "beta-md-0";
    let admin = env.management().await.unwrap();
    env.machine_deployment_api(admin.clone(), NAMESPACE)
        .patch(
            deployment,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { WATCH_FILTER_LABEL: FILTER } } })),
        )
        .await
        .unwrap();
    env.machine_deployment_api(bob.clone(), NAMESPACE)
        .patch(
            deployment,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { REFRESH_CERTIFICATES: "1y" } } })),
        )
        .await
        .unwrap();
    let start = Instant::now();
    let fleet = loop {
        let found = find_record(&records, |r| {
            r.spec.target.machine_deployment.as_deref() == Some(deployment)
        })
        .await;
        if let Some(found) = found {
            break found;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "no fleet request for {deployment}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        fleet.spec.requester.map(|r| r.username),
        Some(bob_name.clone()),
        "the fleet request names who annotated the MachineDeployment"
    );
    for node in [&by_request, &by_trigger] {
        env.wait_for_done(node, TIMEOUT).await;
    }

    // Nobody can name someone else as the trigger's author afterwards.
    let forged = env
        .machine_api(env.management().await.unwrap(), NAMESPACE)
        .patch(
            &by_trigger.machine,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { REQUESTER: alice_name } } })),
        )
        .await;
    let message = refused(forged);
    assert!(message.contains("may name only yourself"), "{message}");

    // A renewal policy renews Machines by itself: writing one needs the right a trigger needs.
    let policy = |name: &str| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "certificates.ck8s.io/v1alpha1", "kind": "CertificateRenewalPolicy",
            "metadata": { "name": name, "namespace": NAMESPACE },
            "spec": { "policy": "Disabled", "machineSelector": { "matchLabels": { "e2e-policy": "none" } } }
        }))
        .unwrap()
    };
    let policies = json!({ "apiGroups": ["certificates.ck8s.io"],
        "resources": ["certificaterenewalpolicies"], "verbs": ["create", "get"] });
    let (carol, carol_name) = user(&env, "carol", json!([policies.clone()])).await;
    let resource = kube::api::ApiResource::erase::<
        ck8s_certs_api::renewal_policy::CertificateRenewalPolicy,
    >(&());
    let message = refused(
        Api::<DynamicObject>::namespaced_with(carol, NAMESPACE, &resource)
            .create(&post, &policy("by-carol"))
            .await,
    );
    assert!(
        message.contains(&format!(
            "{carol_name} may not write a CertificateRenewalPolicy in namespace {NAMESPACE}"
        )),
        "{message}"
    );
    let (dave, _) = user(
        &env,
        "dave",
        json!([policies.clone(), { "apiGroups": ["cluster.x-k8s.io"], "resources": ["machines"], "verbs": ["patch"] }]),
    )
    .await;
    let dave = Api::<DynamicObject>::namespaced_with(dave, NAMESPACE, &resource);
    dave.create(&post, &policy("by-dave"))
        .await
        .expect("a user who may patch Machines writes a renewal policy");

    // A policy that replaces Machines makes the controller delete them: it needs that right.
    let replacing = |name: &str| {
        let mut policy = policy(name);
        policy.data["spec"]["inPlaceImpossible"] = json!({ "action": "Replace" });
        policy
    };
    let message = refused(dave.create(&post, &replacing("replace-by-dave")).await);
    assert!(
        message.contains("may not ask a CertificateRenewalPolicy in namespace")
            && message.contains("to replace Machines (inPlaceImpossible: Replace): that needs delete on machines.cluster.x-k8s.io"),
        "{message}"
    );
    let (erin, _) = user(
        &env,
        "erin",
        json!([policies, { "apiGroups": ["cluster.x-k8s.io"], "resources": ["machines"], "verbs": ["patch", "delete"] }]),
    )
    .await;
    Api::<DynamicObject>::namespaced_with(erin, NAMESPACE, &resource)
        .create(&post, &replacing("replace-by-erin"))
        .await
        .expect("a user who may delete Machines writes a policy that replaces them");
}
