//! `kubectl ck8s-certs` (the controller's binary under the plugin's name) against the real
//! environment, with the user's kubeconfig: `status`, `explain` and `renew` output asserted for a
//! small fleet (cluster `solo`: one control plane, three workers), and `renew` refused clearly
//! for a read-only identity, before anything is written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use ck8s_certs_api::annotations::REFRESH_CERTIFICATES;
use ck8s_certs_api::certificate_refresh::CertificateRefresh;
use ck8s_certs_api::machine_certificates::MachineCertificatesStatus;
use ck8s_certs_e2e::fixtures::NodeInfo;
use ck8s_certs_e2e::{Binaries, Environment, shared_of};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);
const FILTER: &str = "plugin";

/// The plugin: the controller binary linked under the name kubectl looks for.
fn plugin(env: &Environment) -> PathBuf {
    let path = env.dir.join("bin/kubectl-ck8s_certs");
    if !path.exists() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(Binaries::controller().unwrap(), &path).unwrap();
    }
    path
}

fn run(env: &Environment, kubeconfig: &Path, args: &[&str]) -> Output {
    std::process::Command::new(plugin(env))
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("NO_COLOR")
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

async fn settled(env: &Environment, node: &NodeInfo) -> MachineCertificatesStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = env.machine_certificates(node).await.and_then(|m| m.status)
            && status.expiry.is_some()
            && status
                .renewal
                .as_ref()
                .is_some_and(|r| r.reason == "NotDue")
        {
            return status;
        }
        assert!(start.elapsed() < TIMEOUT, "{} never settled", node.machine);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A kubeconfig for ServiceAccount `viewer` of namespace fleet, which may read Machines and
/// our records but not patch anything.
async fn viewer_kubeconfig(env: &Environment) -> PathBuf {
    let client = env.management().await.unwrap();
    let pp = PostParams::default();
    let role: Role = serde_json::from_value(json!({
        "metadata": { "name": "viewer" },
        "rules": [
            { "apiGroups": ["cluster.x-k8s.io"], "resources": ["machines"], "verbs": ["get", "list", "watch"] },
            { "apiGroups": ["certificates.ck8s.io"], "resources": ["*"], "verbs": ["get", "list", "watch"] },
        ]
    }))
    .unwrap();
    Api::<Role>::namespaced(client.clone(), "fleet")
        .create(&pp, &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "viewer" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "viewer" },
        "subjects": [{ "kind": "ServiceAccount", "name": "viewer", "namespace": "fleet" }]
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), "fleet")
        .create(&pp, &binding)
        .await
        .unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(client, "fleet");
    accounts
        .create(
            &pp,
            &serde_json::from_value(json!({ "metadata": { "name": "viewer" } })).unwrap(),
        )
        .await
        .unwrap();
    let request =
        serde_json::from_value(json!({ "spec": { "expirationSeconds": 3600, "audiences": [] } }))
            .unwrap();
    let token = accounts
        .create_token_request("viewer", &pp, &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    // The controller's kubeconfig with the viewer's token (same server and CA).
    let mut yaml: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&env.controller_kubeconfig).unwrap())
            .unwrap();
    yaml["users"][0]["user"]["token"] = token.into();
    let path = env.dir.join("viewer.kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&yaml).unwrap()).unwrap();
    path
}

fn when(at: jiff::Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// `89d 23h` as the plugin prints a time left.
fn left(expiry: jiff::Timestamp, now: jiff::Timestamp) -> String {
    let seconds = expiry.duration_since(now).as_secs();
    format!("{}d {}h", seconds / 86_400, seconds / 3_600 % 24)
}

#[tokio::test]
async fn status_explain_and_renew_answer_for_a_small_fleet_and_a_reader_cannot_renew() {
    let env = shared_of(&["solo"]).await;
    let solo = env.cluster("solo");
    let nodes = solo.nodes.clone();
    // The Cluster too: `renew --cluster` is the Cluster's trigger.
    env.isolate_cluster("solo", FILTER).await;
    for node in &nodes {
        env.patch_machine(
            node,
            json!({ "metadata": { "labels": { "e2e-policy": FILTER } } }),
        )
        .await;
    }
    env.create_policy(
        "fleet",
        "solo-auto",
        FILTER,
        // No spread: the next renewal is exactly 30 days before expiry.
        json!({ "policy": "Automatic", "renewBefore": "30d", "spread": "0s" }),
    )
    .await;
    let _controller = env.start_controller(FILTER, &[]);
    let mut expiries = BTreeMap::new();
    for node in &nodes {
        let status = settled(&env, node).await;
        expiries.insert(node.machine.clone(), status.expiry.unwrap().0);
    }
    let admin = env.management_kubeconfig.clone();

    // status: the exact table.
    let before = jiff::Timestamp::now();
    let table = stdout(&run(
        &env,
        &admin,
        &["status", "-n", "fleet", "--cluster", "solo"],
    ));
    let after = jiff::Timestamp::now();
    let expected = |now: jiff::Timestamp| {
        let mut rows = vec![
            [
                "NAMESPACE",
                "MACHINE",
                "CLUSTER",
                "ROLE",
                "EXPIRY",
                "TIME LEFT",
                "NEXT RENEWAL",
                "WHY",
                "LAST REFRESH",
                "RESULT",
            ]
            .map(String::from),
        ];
        for node in &nodes {
            let expiry = expiries[&node.machine];
            let role = if node.machine.contains("-cp-") {
                "control-plane"
            } else {
                "worker"
            };
            rows.push([
                "fleet".into(),
                node.machine.clone(),
                "solo".into(),
                role.into(),
                when(expiry),
                left(expiry, now),
                when(expiry - jiff::SignedDuration::from_hours(30 * 24)),
                "NotDue".into(),
                "-".into(),
                "-".into(),
            ]);
        }
        let widths: Vec<usize> = (0..10)
            .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap())
            .collect();
        rows.iter()
            .map(|row| {
                let mut line = String::new();
                for (i, cell) in row.iter().enumerate() {
                    line.push_str(cell);
                    if i < 9 {
                        line.push_str(&" ".repeat(widths[i] - cell.len() + 2));
                    }
                }
                line + "\n"
            })
            .collect::<String>()
    };
    assert!(
        table == expected(before) || table == expected(after),
        "got:\n{table}\nexpected:\n{}",
        expected(before)
    );
    println!("{table}");

    // status -o json: the same rows as data.
    let json: serde_json::Value = serde_json::from_str(&stdout(&run(
        &env,
        &admin,
        &[
            "status",
            "-A",
            "-l",
            &format!("e2e-policy={FILTER}"),
            "-o",
            "json",
        ],
    )))
    .unwrap();
    let rows = json.as_array().unwrap();
    assert_eq!(rows.len(), nodes.len());
    assert!(
        rows.iter()
            .all(|r| r["policy"] == "solo-auto" && r["why"] == "NotDue"),
        "{json:#}"
    );

    // explain: the policy, what happens next, how to renew now.
    let cp = &nodes[0];
    let explain = stdout(&run(&env, &admin, &["explain", &cp.machine, "-n", "fleet"]));
    println!("{explain}");
    let lines: Vec<&str> = explain.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "Machine fleet/{} (control plane of cluster solo, node {})",
            cp.machine, cp.node
        )
    );
    assert!(
        lines.contains(&"Policy: solo-auto (Automatic, generation 1)"),
        "{explain}"
    );
    let next = when(expiries[&cp.machine] - jiff::SignedDuration::from_hours(30 * 24));
    assert!(
        lines.contains(&format!("Next renewal: {next} (NotDue)").as_str()),
        "{explain}"
    );
    assert!(lines.contains(&"Last refresh: none recorded"), "{explain}");
    assert_eq!(
        lines.last().copied(),
        Some(
            format!(
                "Renew now: kubectl ck8s-certs renew {} -n fleet",
                cp.machine
            )
            .as_str()
        )
    );

    // A reader may look but not renew: refused before anything is written.
    let viewer = viewer_kubeconfig(&env).await;
    let worker = &nodes[1];
    stdout(&run(
        &env,
        &viewer,
        &["status", "-n", "fleet", "--cluster", "solo"],
    ));
    let refused = run(&env, &viewer, &["renew", &worker.machine, "-n", "fleet"]);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.starts_with(
            "error: forbidden: you may not patch machines.cluster.x-k8s.io in namespace fleet"
        ) && stderr.contains("nothing was changed"),
        "{stderr}"
    );
    assert!(
        !env.machine_annotations(worker)
            .await
            .contains_key(REFRESH_CERTIFICATES)
    );

    // A TTL a worker cannot take: refused, nothing written.
    let refused = run(
        &env,
        &admin,
        &["renew", "--cluster", "solo", "-n", "fleet", "--ttl", "5m"],
    );
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("is a worker"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    for node in &nodes {
        assert!(
            !env.machine_annotations(node)
                .await
                .contains_key(REFRESH_CERTIFICATES)
        );
    }

    // renew --wait: requested, then done with the new expiry.
    let renewed = stdout(&run(
        &env,
        &admin,
        &["renew", &worker.machine, "-n", "fleet", "--wait"],
    ));
    println!("{renewed}");
    let lines: Vec<&str> = renewed.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "machine.cluster.x-k8s.io/{} renewal requested (1y)",
            worker.machine
        )
    );
    let op = env.operation(worker).await;
    assert_eq!(op.requested_by.as_deref(), Some("kubectl-ck8s-certs"));
    assert_eq!(
        lines.last().copied(),
        Some(
            format!(
                "{}: done, certificates expire at {}",
                worker.machine,
                when(op.new_expiry.unwrap().0)
            )
            .as_str()
        )
    );

    // renew --cluster --wait: one CertificateRefresh (as `kubectl annotate cluster`), every
    // Machine of the cluster, the control plane first.
    let renewed = stdout(&run(
        &env,
        &admin,
        &[
            "renew",
            "--cluster",
            "solo",
            "-n",
            "fleet",
            "--ttl",
            "2y",
            "--wait",
        ],
    ));
    println!("{renewed}");
    let lines: Vec<&str> = renewed.lines().collect();
    assert_eq!(
        lines[0],
        "cluster.cluster.x-k8s.io/solo renewal requested (2y): one CertificateRefresh, control planes one at a time, then workers",
        "{renewed}"
    );
    assert!(
        lines[1].starts_with("certificaterefresh/solo-"),
        "{renewed}"
    );
    for node in &nodes {
        assert!(
            lines.iter().any(|l| l.starts_with(&format!("{}: done, certificates expire at ", node.machine))),
            "{renewed}"
        );
    }
    let finished = |machine: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(&format!("{machine}: done")))
            .unwrap()
    };
    let control_plane = finished(&cp.machine);
    assert!(
        nodes[1..]
            .iter()
            .all(|n| finished(&n.machine) > control_plane),
        "the control plane first:\n{renewed}"
    );
    let table = stdout(&run(
        &env,
        &admin,
        &["status", "-n", "fleet", "--cluster", "solo"],
    ));
    println!("{table}");
    assert!(
        table
            .lines()
            .skip(1)
            .all(|l| l.contains("(fleet)") && l.ends_with("Succeeded")),
        "{table}"
    );

    // history: the worker's two refreshes, newest first, exactly as recorded.
    let history = stdout(&run(
        &env,
        &viewer,
        &["history", &worker.machine, "-n", "fleet"],
    ));
    println!("{history}");
    let records: Api<CertificateRefresh> =
        Api::namespaced(env.management().await.unwrap(), "fleet");
    let mut recorded = records
        .list(
            &ListParams::default()
                .labels(&format!("certificates.ck8s.io/machine={}", worker.machine)),
        )
        .await
        .unwrap()
        .items;
    assert_eq!(recorded.len(), 2, "{recorded:?}");
    recorded.sort_by_key(|r| std::cmp::Reverse(r.status.as_ref().unwrap().started_at.clone()));
    let width = worker.machine.len().max("TARGET".len());
    // The newest through the cluster's request (origin Fleet, asked for by it), the older one
    // asked for on the Machine.
    let asked_by = |r: &CertificateRefresh| r.spec.requested_by.clone().unwrap_or_default();
    let by = recorded
        .iter()
        .map(|r| asked_by(r).len())
        .max()
        .unwrap_or_default()
        .max("REQUESTED BY".len());
    let mut expected = vec![format!(
        "NAMESPACE  {:<width$}  TTL  ORIGIN  {:<by$}  STARTED               RESULT     NEW EXPIRY",
        "TARGET", "REQUESTED BY"
    )];
    for record in &recorded {
        let status = record.status.as_ref().unwrap();
        expected.push(format!(
            "fleet      {:<width$}  {}   {:<6}  {:<by$}  {}  Succeeded  {}",
            worker.machine,
            record.spec.ttl,
            format!("{:?}", record.spec.origin),
            asked_by(record),
            when(status.started_at.as_ref().unwrap().0),
            when(status.new_expiry.as_ref().unwrap().0),
        ));
    }
    assert_eq!(
        recorded
            .iter()
            .map(|r| format!("{:?}", r.spec.origin))
            .collect::<Vec<_>>(),
        ["Fleet", "Manual"]
    );
    assert_eq!(history.lines().collect::<Vec<_>>(), expected, "{history}");
    assert_eq!(recorded[0].spec.ttl, "2y");
}
