//! The release installs like a Cluster API provider's. `hack/release.sh` (what `make release`
//! runs) renders the artifacts; the pinned clusterctl reads them from a local provider repository
//! (`<dir>/addon-ck8s-certs/<version>/`, laid out as a GitHub release is) and generates the
//! components with its variables substituted; the management API server accepts every object;
//! and the controller runs with the installed ServiceAccount and the Deployment's environment.
//!
//! Tools: `CK8S_E2E_CLUSTERCTL` / `CK8S_E2E_KUBECTL` (the Makefile sets them), else the cache of
//! `hack/build-tools.sh` (`make tools`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ck8s_certs_e2e::manifests::{self, Applier, describe};
use ck8s_certs_e2e::process::Process;
use ck8s_certs_e2e::{Binaries, Environment, controlplane, shared_of, tool};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use kube::api::{DynamicObject, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

/// The standard clusters these tests use; the others are not started.
const CLUSTERS: &[&str] = &["solo"];

/// `clusterctl init --addon ck8s-certs`.
const PROVIDER: &str = "ck8s-certs";
/// clusterctl's label for an AddonProvider named [`PROVIDER`].
const PROVIDER_LABEL: &str = "addon-ck8s-certs";
/// clusterctl's file name for an AddonProvider's components.
const COMPONENTS: &str = "addon-components.yaml";
const NAMESPACE: &str = "ck8s-certs-system";
const SERVICE_ACCOUNT: &str = "ck8s-certs-manager";
const DEPLOYMENT: &str = "ck8s-certs-controller-manager";
const IMAGE: &str = "ghcr.io/ck8s-certs/ck8s-certs";

/// Every clusterctl variable of the components, with its default (docs/install.md).
const VARIABLES: &[(&str, &str)] = &[
    ("CK8S_CERTS_K8SD_TRANSPORT", "port-forward"),
    ("CK8S_CERTS_LEADER_ELECT_LEASE_DURATION", "15s"),
    ("CK8S_CERTS_LEADER_ELECT_RENEW_DEADLINE", "10s"),
    ("CK8S_CERTS_LEADER_ELECT_RETRY_PERIOD", "2s"),
    ("CK8S_CERTS_LOG_FORMAT", "json"),
    ("CK8S_CERTS_LOG_LEVEL", "info"),
    ("CK8S_CERTS_MAX_WORKER_REFRESHES", "10"),
    ("CK8S_CERTS_MAX_WORKER_REFRESHES_PER_CLUSTER", "2"),
    ("CK8S_CERTS_RENEWAL_BACKOFF_MAX", "32h"),
    ("CK8S_CERTS_RENEWAL_BACKOFF_MIN", "1h"),
    ("CK8S_CERTS_RENEWAL_WINDOW_STRICT", "false"),
    ("CK8S_CERTS_RENEW_MANAGEMENT_KUBECONFIG", "off"),
    ("CK8S_CERTS_SHUTDOWN_GRACE_PERIOD", "60s"),
];

/// The manager's environment that is not configurable through clusterctl.
const FIXED_ENV: &[(&str, &str)] = &[
    ("CK8S_CERTS_LEADER_ELECT", "true"),
    ("CK8S_CERTS_HEALTH_BIND_ADDRESS", "0.0.0.0:8081"),
    ("CK8S_CERTS_METRICS_BIND_ADDRESS", "0.0.0.0:8080"),
    ("CK8S_CERTS_WEBHOOK_BIND_ADDRESS", "0.0.0.0:9443"),
];

/// Held by the tests that install the components into the management cluster while they
/// install and read back what they installed: each applies the same objects with other values.
static INSTALLING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn version() -> String {
    format!("v{}", env!("CARGO_PKG_VERSION"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn write(path: &Path, contents: impl AsRef<[u8]>) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .unwrap_or_else(|e| panic!("creating {}: {e}", parent.display()));
    }
    std::fs::write(path, contents).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A fresh folder for one test, kept after the run for inspection. Per Cluster API version:
/// `hack/e2e.sh` may run this binary against two versions at once.
fn scratch(name: &str) -> PathBuf {
    let version = std::env::var("CK8S_E2E_CAPI_VERSION").unwrap_or_default();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("release-{name}-{version}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the test folder");
    dir
}

/// Runs `hack/release.sh` into `<dir>/release` and returns that folder.
fn release(dir: &Path) -> PathBuf {
    let out = dir.join("release");
    let output = Command::new(repo_root().join("hack/release.sh"))
        .env("RELEASE_VERSION", version())
        .env("RELEASE_DIR", &out)
        .env_remove("IMG")
        .env(
            "KUBECTL",
            tool("CK8S_E2E_KUBECTL", "kubectl", "KUBE_VERSION"),
        )
        .output()
        .expect("run hack/release.sh");
    assert!(
        output.status.success(),
        "hack/release.sh failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

/// A clusterctl file repository holding the release, and a clusterctl config naming it.
struct Clusterctl {
    home: PathBuf,
    config: PathBuf,
}

impl Clusterctl {
    /// `settings` are merged into the config file (variables, `images:`).
    fn new(dir: &Path, settings: serde_json::Value) -> Self {
        let release = release(dir);
        let versioned = dir.join("repository").join(PROVIDER_LABEL).join(version());
        std::fs::create_dir_all(&versioned).expect("create the repository");
        for file in [COMPONENTS, "metadata.yaml"] {
            std::fs::copy(release.join(file), versioned.join(file)).expect("copy the release");
        }
        let mut config = json!({
            "providers": [{
                "name": PROVIDER,
                "type": "AddonProvider",
                "url": format!("file://{}", versioned.join(COMPONENTS).display()),
            }],
            // It would ask the Go module proxy for a newer clusterctl after every command.
            "CLUSTERCTL_DISABLE_VERSIONCHECK": "true",
        });
        if let (Some(config), Some(settings)) = (config.as_object_mut(), settings.as_object()) {
            config.extend(settings.clone());
        }
        let path = dir.join("clusterctl.yaml");
        write(&path, serde_yaml::to_string(&config).expect("config YAML"));
        let home = dir.join("home");
        std::fs::create_dir_all(&home).expect("create HOME");
        Self { home, config: path }
    }

    /// Runs the pinned clusterctl with only `vars` in its environment (nothing of the
    /// developer's: no CK8S_CERTS_* variables, no ~/.config/cluster-api overrides).
    fn run(&self, args: &[&str], vars: &[(&str, &str)]) -> String {
        let output = Command::new(tool(
            "CK8S_E2E_CLUSTERCTL",
            "clusterctl",
            "CLUSTERCTL_VERSION",
        ))
        .args(args)
        .arg("--config")
        .arg(&self.config)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &self.home)
        .env("XDG_CONFIG_HOME", self.home.join(".config"))
        .envs(vars.iter().copied())
        .output()
        .expect("run clusterctl");
        assert!(
            output.status.success(),
            "clusterctl {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("clusterctl prints UTF-8")
    }

    fn generate(&self, extra: &[&str], vars: &[(&str, &str)]) -> String {
        let addon = format!("{PROVIDER}:{}", version());
        let mut args = vec!["generate", "provider", "--addon", &addon];
        args.extend(extra);
        self.run(&args, vars)
    }
}

fn kind(object: &DynamicObject) -> &str {
    object.types.as_ref().map_or("", |t| t.kind.as_str())
}

fn typed<K: serde::de::DeserializeOwned>(object: &DynamicObject) -> K {
    serde_json::from_value(serde_json::to_value(object).expect("serialize"))
        .unwrap_or_else(|e| panic!("{}: {e}", describe(object)))
}

fn find<'a>(objects: &'a [DynamicObject], kind_name: &str, name: &str) -> &'a DynamicObject {
    objects
        .iter()
        .find(|o| kind(o) == kind_name && o.name_any() == name)
        .unwrap_or_else(|| panic!("no {kind_name} {name} in the components"))
}

/// The manager container's environment: literal values, and `fieldRef:<path>` for the
/// downward API.
fn manager_env(deployment: &Deployment) -> BTreeMap<String, String> {
    let spec = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("a pod template");
    let manager = spec
        .containers
        .iter()
        .find(|c| c.name == "manager")
        .expect("a manager container");
    manager
        .env
        .iter()
        .flatten()
        .map(|var| {
            let value = match (&var.value, &var.value_from) {
                (Some(value), None) => value.clone(),
                (None, Some(from)) => format!(
                    "fieldRef:{}",
                    from.field_ref.as_ref().expect("a fieldRef").field_path
                ),
                other => panic!("env {}: {other:?}", var.name),
            };
            (var.name.clone(), value)
        })
        .collect()
}

fn manager_image(deployment: &Deployment) -> String {
    deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers.iter().find(|c| c.name == "manager"))
        .and_then(|c| c.image.clone())
        .expect("a manager image")
}

/// The environment expected with `set` overriding the defaults.
fn expected_env(set: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = VARIABLES
        .iter()
        .chain(FIXED_ENV)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (k, v) in set {
        env.insert(k.to_string(), v.to_string());
    }
    env.insert("POD_NAME".into(), "fieldRef:metadata.name".into());
    env.insert("POD_NAMESPACE".into(), "fieldRef:metadata.namespace".into());
    env
}

/// Kustomize writes `minimum: 0.0` as `0`: the same number, another JSON representation.
fn numbers_as_floats(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Number(n) => n.as_f64().map_or(Value::Number(n), Value::from),
        Value::Array(items) => items.into_iter().map(numbers_as_floats).collect(),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, numbers_as_floats(v)))
                .collect(),
        ),
        other => other,
    }
}

#[test]
fn the_release_is_config_default_for_an_addon_provider_of_contract_v1beta1() {
    let release = release(&scratch("artifacts"));
    let text = read(&release.join(COMPONENTS));
    let objects = manifests::parse(&text).unwrap();

    let kinds: BTreeSet<(String, String)> = objects
        .iter()
        .map(|o| (kind(o).to_owned(), o.name_any()))
        .collect();
    let expected: BTreeSet<(String, String)> = [
        ("Namespace", NAMESPACE),
        (
            "CustomResourceDefinition",
            "certificaterenewalpolicies.certificates.ck8s.io",
        ),
        (
            "CustomResourceDefinition",
            "machinecertificates.certificates.ck8s.io",
        ),
        (
            "CustomResourceDefinition",
            "clustercertificates.certificates.ck8s.io",
        ),
        (
            "CustomResourceDefinition",
            "certificaterefreshes.certificates.ck8s.io",
        ),
        ("ServiceAccount", SERVICE_ACCOUNT),
        ("ClusterRole", "ck8s-certs-manager-role"),
        ("ClusterRole", "ck8s-certs-requester"),
        ("ClusterRoleBinding", "ck8s-certs-manager-rolebinding"),
        ("Role", "ck8s-certs-leader-election-role"),
        ("RoleBinding", "ck8s-certs-leader-election-rolebinding"),
        ("Role", "ck8s-certs-webhook-role"),
        ("RoleBinding", "ck8s-certs-webhook-rolebinding"),
        ("Service", "ck8s-certs-webhook-service"),
        ("Secret", "ck8s-certs-webhook-cert"),
        ("NetworkPolicy", "ck8s-certs-controller-manager"),
        ("FlowSchema", "ck8s-certs-leader-election"),
        ("MutatingWebhookConfiguration", "ck8s-certs-refresh-trigger"),
        (
            "ValidatingWebhookConfiguration",
            "ck8s-certs-policy-promise",
        ),
        ("ValidatingAdmissionPolicy", "ck8s-certs-template-trigger"),
        (
            "ValidatingAdmissionPolicyBinding",
            "ck8s-certs-template-trigger",
        ),
        ("ValidatingAdmissionPolicy", "ck8s-certs-requests"),
        ("ValidatingAdmissionPolicyBinding", "ck8s-certs-requests"),
        (
            "ValidatingAdmissionPolicy",
            "ck8s-certs-requester-annotation",
        ),
        (
            "ValidatingAdmissionPolicyBinding",
            "ck8s-certs-requester-annotation",
        ),
        ("ValidatingAdmissionPolicy", "ck8s-certs-renewal-policies"),
        (
            "ValidatingAdmissionPolicyBinding",
            "ck8s-certs-renewal-policies",
        ),
        ("ValidatingAdmissionPolicy", "ck8s-certs-refresh-marks"),
        (
            "ValidatingAdmissionPolicyBinding",
            "ck8s-certs-refresh-marks",
        ),
        ("Deployment", DEPLOYMENT),
    ]
    .iter()
    .map(|(k, n)| (k.to_string(), n.to_string()))
    .collect();
    assert_eq!(kinds, expected);
    // The FlowSchema names the ServiceAccount as rendered (config/flowcontrol spells it out).
    let schema = objects.iter().find(|o| kind(o) == "FlowSchema");
    assert_eq!(
        schema.map(|o| &o.data["spec"]["rules"][0]["subjects"][0]["serviceAccount"]),
        Some(&json!({ "name": SERVICE_ACCOUNT, "namespace": NAMESPACE }))
    );
    for object in &objects {
        assert_eq!(
            object
                .labels()
                .get("cluster.x-k8s.io/provider")
                .map(String::as_str),
            Some(PROVIDER_LABEL),
            "{}",
            describe(object)
        );
        if kind(object) != "Namespace" && object.namespace().is_some() {
            assert_eq!(object.namespace().as_deref(), Some(NAMESPACE));
        }
    }

    // The CRDs are config/crd/bases, unchanged but for the label.
    for object in objects
        .iter()
        .filter(|o| kind(o) == "CustomResourceDefinition")
    {
        let path = repo_root()
            .join("config/crd/bases")
            .join(format!("{}.yaml", object.name_any()));
        let source: serde_json::Value = serde_yaml::from_str(&read(&path)).unwrap();
        assert_eq!(
            numbers_as_floats(object.data["spec"].clone()),
            numbers_as_floats(source["spec"].clone()),
            "{}",
            path.display()
        );
    }

    // Variables are whole, quoted values: substituted, `10` and `false` stay strings.
    for line in text.lines().filter(|l| l.contains("${")) {
        let value = line.split_once(": ").map(|(_, v)| v.trim()).unwrap_or("");
        assert!(
            value.starts_with("\"${") && value.ends_with("}\"") && value.matches("${").count() == 1,
            "not a whole quoted variable: {line}"
        );
    }
    let deployment: Deployment = typed(find(&objects, "Deployment", DEPLOYMENT));
    assert_eq!(manager_image(&deployment), format!("{IMAGE}:{}", version()));
    let spec = deployment.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    assert_eq!(
        spec.selector
            .match_labels
            .as_ref()
            .and_then(|l| l.get("cluster.x-k8s.io/provider"))
            .map(String::as_str),
        Some(PROVIDER_LABEL),
        "the selector only matches this provider's pods"
    );

    let metadata: serde_json::Value =
        serde_yaml::from_str(&read(&release.join("metadata.yaml"))).unwrap();
    assert_eq!(
        metadata["apiVersion"],
        "clusterctl.cluster.x-k8s.io/v1alpha3"
    );
    assert_eq!(metadata["kind"], "Metadata");
    let (major, minor) = {
        let mut parts = env!("CARGO_PKG_VERSION").split('.');
        let mut next = || parts.next().unwrap().parse::<u64>().unwrap();
        (next(), next())
    };
    let series = metadata["releaseSeries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["major"] == major && s["minor"] == minor)
        .unwrap_or_else(|| panic!("no release series {major}.{minor}: {metadata}"));
    assert_eq!(series["contract"], "v1beta1");
}

#[test]
fn clusterctl_describes_the_provider_its_variables_and_image() {
    let clusterctl = Clusterctl::new(&scratch("describe"), json!({}));
    let text = clusterctl.generate(&["--describe"], &[]);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
            .to_owned()
    };
    assert_eq!(field("Name"), PROVIDER);
    assert_eq!(field("Type"), "AddonProvider");
    assert_eq!(field("Version"), version());
    assert_eq!(field("File"), COMPONENTS);
    assert_eq!(field("TargetNamespace"), NAMESPACE);
    let listed = |section: &str| -> Vec<String> {
        text.lines()
            .skip_while(|l| *l != format!("{section}:"))
            .skip(1)
            .map_while(|l| l.strip_prefix("  - "))
            .map(str::to_owned)
            .collect()
    };
    let variables: Vec<String> = VARIABLES.iter().map(|(k, _)| k.to_string()).collect();
    assert_eq!(listed("Variables"), variables, "{text}");
    assert_eq!(listed("Images"), [format!("{IMAGE}:{}", version())]);
}

#[test]
fn clusterctl_moves_every_namespaced_object_and_binding_to_a_target_namespace() {
    let clusterctl = Clusterctl::new(&scratch("target-namespace"), json!({}));
    let objects =
        manifests::parse(&clusterctl.generate(&["--target-namespace", "certs-elsewhere"], &[]))
            .unwrap();
    let namespaces: Vec<String> = objects
        .iter()
        .filter(|o| kind(o) == "Namespace")
        .map(|o| o.name_any())
        .collect();
    assert_eq!(namespaces, ["certs-elsewhere"]);
    for object in &objects {
        if let Some(namespace) = object.namespace() {
            assert_eq!(namespace, "certs-elsewhere", "{}", describe(object));
        }
    }
    let subjects = |object: &DynamicObject| -> Vec<(String, String)> {
        object.data["subjects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["name"].as_str().unwrap().to_owned(),
                    s["namespace"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    for binding in objects.iter().filter(|o| kind(o).ends_with("RoleBinding")) {
        assert_eq!(
            subjects(binding),
            [(SERVICE_ACCOUNT.to_owned(), "certs-elsewhere".to_owned())],
            "{}",
            describe(binding)
        );
    }
    // The webhook still reaches the Service where it now lives.
    let webhook = find(
        &objects,
        "MutatingWebhookConfiguration",
        "ck8s-certs-refresh-trigger",
    );
    assert_eq!(
        webhook.data["webhooks"][0]["clientConfig"]["service"]["namespace"],
        "certs-elsewhere"
    );
}

/// The route docs/install.md gives for kustomize: substitute the release's variables with
/// `clusterctl generate yaml` (no cluster needed), then patch the result in a kustomization.
#[test]
fn the_substituted_release_can_be_patched_with_kustomize() {
    let dir = scratch("kustomize");
    let clusterctl = Clusterctl::new(&dir, json!({}));
    let components = dir.join("release").join(COMPONENTS);
    let substituted = clusterctl.run(
        &[
            "generate",
            "yaml",
            "--from",
            &components.display().to_string(),
        ],
        &[("CK8S_CERTS_MAX_WORKER_REFRESHES", "4")],
    );
    assert!(!substituted.contains("${"), "{substituted}");
    let overlay = dir.join("overlay");
    write(&overlay.join("ck8s-certs.yaml"), substituted);
    write(
        &overlay.join("kustomization.yaml"),
        "resources:\n  - ck8s-certs.yaml\npatches:\n  - target: {kind: Deployment, name: ck8s-certs-controller-manager}\n    patch: |-\n      - op: replace\n        path: /spec/replicas\n        value: 3\n",
    );
    let output = Command::new(tool("CK8S_E2E_KUBECTL", "kubectl", "KUBE_VERSION"))
        .arg("kustomize")
        .arg(&overlay)
        .output()
        .expect("run kubectl kustomize");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let objects = manifests::parse(&String::from_utf8(output.stdout).unwrap()).unwrap();
    let deployment: Deployment = typed(find(&objects, "Deployment", DEPLOYMENT));
    assert_eq!(deployment.spec.as_ref().unwrap().replicas, Some(3));
    assert_eq!(
        manager_env(&deployment),
        expected_env(&[("CK8S_CERTS_MAX_WORKER_REFRESHES", "4")])
    );
}

/// Variables set through the environment and through the config file override their defaults;
/// `images:` overrides the image.
fn generate_for_the_management_cluster(
    name: &str,
) -> (Vec<DynamicObject>, Vec<(&'static str, &'static str)>) {
    let clusterctl = Clusterctl::new(
        &scratch(name),
        json!({
            "CK8S_CERTS_RENEWAL_BACKOFF_MAX": "48h",
            "images": { PROVIDER_LABEL: { "repository": "registry.example.com/mirror" } },
        }),
    );
    let from_env = [
        ("CK8S_CERTS_LOG_LEVEL", "debug"),
        ("CK8S_CERTS_MAX_WORKER_REFRESHES", "25"),
        ("CK8S_CERTS_RENEWAL_WINDOW_STRICT", "true"),
    ];
    let text = clusterctl.generate(&[], &from_env);
    assert!(!text.contains("${"), "unsubstituted variables:\n{text}");
    let mut set = from_env.to_vec();
    set.push(("CK8S_CERTS_RENEWAL_BACKOFF_MAX", "48h"));
    (manifests::parse(&text).unwrap(), set)
}

#[tokio::test]
async fn clusterctl_generates_components_that_the_management_cluster_accepts() {
    let (objects, set) = generate_for_the_management_cluster("install");
    let deployment: Deployment = typed(find(&objects, "Deployment", DEPLOYMENT));
    assert_eq!(manager_env(&deployment), expected_env(&set));
    assert_eq!(
        manager_image(&deployment),
        format!("registry.example.com/mirror/ck8s-certs:{}", version())
    );
    for object in &objects {
        for label in ["cluster.x-k8s.io/provider", "clusterctl.cluster.x-k8s.io"] {
            assert!(
                object.labels().contains_key(label),
                "{} lacks {label}",
                describe(object)
            );
        }
    }

    let env = shared_of(CLUSTERS).await;
    let mgmt = env.management().await.unwrap();
    let _installing = INSTALLING.lock().await;
    let mut applier = Applier::new(mgmt.clone(), "e2e-clusterctl");
    for object in &objects {
        applier
            .apply(object)
            .await
            .unwrap_or_else(|e| panic!("applying {}: {e}", describe(object)));
    }
    for object in &objects {
        let stored = applier
            .get(object)
            .await
            .unwrap_or_else(|e| panic!("reading {}: {e}", describe(object)));
        assert_eq!(
            stored
                .labels()
                .get("cluster.x-k8s.io/provider")
                .map(String::as_str),
            Some(PROVIDER_LABEL),
            "{}",
            describe(object)
        );
    }

    // As stored: the Deployment kept its environment (strings, not numbers or booleans).
    let stored: Deployment = Api::namespaced(mgmt.clone(), NAMESPACE)
        .get(DEPLOYMENT)
        .await
        .unwrap();
    assert_eq!(manager_env(&stored), expected_env(&set));
    let bindings = [
        Api::<ClusterRoleBinding>::all(mgmt.clone())
            .get("ck8s-certs-manager-rolebinding")
            .await
            .unwrap()
            .subjects,
        Api::<RoleBinding>::namespaced(mgmt.clone(), NAMESPACE)
            .get("ck8s-certs-leader-election-rolebinding")
            .await
            .unwrap()
            .subjects,
    ];
    for subjects in bindings {
        let subjects: Vec<(String, Option<String>)> = subjects
            .unwrap_or_default()
            .into_iter()
            .map(|s| (s.name, s.namespace))
            .collect();
        assert_eq!(
            subjects,
            [(SERVICE_ACCOUNT.to_owned(), Some(NAMESPACE.to_owned()))]
        );
    }

    // The bindings reach the installed ServiceAccount: it may do what the controller does, and
    // take Leases only in its own namespace.
    let user = format!("system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}");
    for (group, resource, verb, namespace, allowed) in [
        ("cluster.x-k8s.io", "machines", "patch", None, true),
        // Only under a renewal policy with inPlaceImpossible: Replace, which only a user who
        // may delete Machines can write (docs/security.md).
        ("cluster.x-k8s.io", "machines", "delete", None, true),
        ("", "secrets", "get", Some("fleet"), true),
        ("", "secrets", "list", Some("fleet"), false),
        (
            "coordination.k8s.io",
            "leases",
            "update",
            Some(NAMESPACE),
            true,
        ),
        (
            "coordination.k8s.io",
            "leases",
            "update",
            Some("default"),
            false,
        ),
    ] {
        let review: SubjectAccessReview = serde_json::from_value(json!({
            "spec": {
                "user": user,
                "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{NAMESPACE}")],
                "resourceAttributes": {
                    "group": group, "resource": resource, "verb": verb, "namespace": namespace,
                },
            }
        }))
        .unwrap();
        let status = Api::<SubjectAccessReview>::all(mgmt.clone())
            .create(&PostParams::default(), &review)
            .await
            .unwrap()
            .status
            .unwrap();
        assert_eq!(
            status.allowed, allowed,
            "{verb} {resource} in {namespace:?}: {status:?}"
        );
    }

    // The namespace enforces the restricted Pod Security Standard, and the pod template passes
    // it (a dry run, as the ReplicaSet controller would create the pod); without its security
    // context the same pod is refused, so the check is live.
    let pods: Api<Pod> = Api::namespaced(mgmt.clone(), NAMESPACE);
    let template = stored.spec.unwrap().template;
    let pod = |spec| Pod {
        metadata: kube::api::ObjectMeta {
            name: Some("ck8s-certs-controller-manager-dry-run".into()),
            labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
            ..Default::default()
        },
        spec: Some(spec),
        ..Default::default()
    };
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let spec = template.spec.clone().unwrap();
    pods.create(&dry_run, &pod(spec.clone()))
        .await
        .expect("the pod template meets the restricted Pod Security Standard");
    let mut lax = spec;
    lax.security_context = None;
    for container in &mut lax.containers {
        container.security_context = None;
    }
    match pods.create(&dry_run, &pod(lax)).await {
        Err(refused) => assert!(
            refused.to_string().contains("violates PodSecurity"),
            "{refused}"
        ),
        Ok(_) => panic!(
            "{NAMESPACE} admitted a pod without a security context: is Pod Security enforced?"
        ),
    }
}

/// A kubeconfig for `account`'s token, whose context namespace is the account's (as in a pod).
async fn service_account_kubeconfig(
    mgmt: &Client,
    admin_kubeconfig: &str,
    namespace: &str,
    account: &str,
) -> String {
    let request: TokenRequest =
        serde_json::from_value(json!({ "spec": { "expirationSeconds": 3600 } })).unwrap();
    let token = Api::<ServiceAccount>::namespaced(mgmt.clone(), namespace)
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let mut config: serde_yaml::Value = serde_yaml::from_str(admin_kubeconfig).unwrap();
    config["users"][0]["user"] = serde_yaml::to_value(json!({ "token": token })).unwrap();
    config["contexts"][0]["context"]["namespace"] = namespace.into();
    serde_yaml::to_string(&config).unwrap()
}

/// The controller as the installed Deployment runs it, as far as the e2e environment can: the
/// environment has API servers but no kubelet or container runtime, so no pod can start. Runs the
/// controller binary of this build (what the image holds) with the manager container's
/// environment as the kubelet would set it (the downward API filled in) and the installed
/// ServiceAccount's token; only the bind addresses change, to free loopback ports, and
/// `filter` is set as the watch filter, which keeps it off other tests' Machines. Returns once
/// it is ready and holds its Lease, with its log folder.
async fn run_as_installed(env: &Environment, deployment: &Deployment, filter: &str) -> Running {
    let mgmt = env.management().await.unwrap();
    let pod_name = format!("ck8s-certs-controller-manager-7f9c-{filter}");
    let health_port = controlplane::free_port().expect("a free port");
    let metrics_port = controlplane::free_port().expect("a free port");
    let webhook_port = controlplane::free_port().expect("a free port");
    let dir = env.dir.join(format!("{filter}-controller"));
    let kubeconfig = dir.join("kubeconfig");
    write(
        &kubeconfig,
        service_account_kubeconfig(
            &mgmt,
            &env.management_kubeconfig_yaml,
            NAMESPACE,
            SERVICE_ACCOUNT,
        )
        .await,
    );
    let mut command = Command::new(Binaries::controller().expect("the controller binary"));
    command.env_clear();
    for (name, value) in manager_env(deployment) {
        let value = match value.as_str() {
            "fieldRef:metadata.name" => pod_name.clone(),
            "fieldRef:metadata.namespace" => NAMESPACE.to_owned(),
            _ => value,
        };
        command.env(name, value);
    }
    command
        .env(
            "CK8S_CERTS_HEALTH_BIND_ADDRESS",
            format!("127.0.0.1:{health_port}"),
        )
        .env(
            "CK8S_CERTS_METRICS_BIND_ADDRESS",
            format!("127.0.0.1:{metrics_port}"),
        )
        .env(
            "CK8S_CERTS_WEBHOOK_BIND_ADDRESS",
            format!("127.0.0.1:{webhook_port}"),
        )
        .env("CK8S_CERTS_KUBECONFIG", &kubeconfig)
        .env("CK8S_CERTS_WATCH_FILTER", filter);
    let log = format!("controller-{filter}");
    let process = Process::spawn(&log, command, &dir).expect("the controller starts");

    let leases: Api<Lease> = Api::namespaced(mgmt.clone(), NAMESPACE);
    let http = reqwest::Client::new();
    let start = Instant::now();
    loop {
        let ready = http
            .get(format!("http://127.0.0.1:{health_port}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        let held = leases
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|lease| {
                lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.holder_identity.as_deref())
                    .is_some_and(|holder| holder.starts_with(&pod_name))
            });
        if ready && held {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the controller did not become ready and leader in {NAMESPACE} (ready: {ready}, lease held: {held}):\n{}",
            process.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Running {
        log: dir.join(format!("{log}.log")),
        metrics_port,
        process,
    }
}

/// A controller started by [`run_as_installed`], killed on drop.
struct Running {
    process: Process,
    log: PathBuf,
    metrics_port: u16,
}

#[tokio::test]
async fn the_controller_runs_with_the_installed_service_account_and_the_deployments_environment() {
    let (objects, _) = generate_for_the_management_cluster("run");
    let env = shared_of(CLUSTERS).await;
    let mgmt = env.management().await.unwrap();
    {
        let _installing = INSTALLING.lock().await;
        let mut applier = Applier::new(mgmt.clone(), "e2e-clusterctl");
        for object in &objects {
            applier.apply(object).await.unwrap();
        }
    }
    let deployment: Deployment = typed(find(&objects, "Deployment", DEPLOYMENT));
    let running = run_as_installed(&env, &deployment, "release").await;
    let process = &running.process;

    // With the installed rights (no `create` on Secrets), the webhook's certificate Secret that
    // ships empty was filled in the provider's namespace and its CA put into the installed
    // MutatingWebhookConfiguration.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(mgmt.clone(), NAMESPACE);
    let secret = secrets.get("ck8s-certs-webhook-cert").await.unwrap();
    let ca = secret.data.unwrap_or_default()["ca.crt"].clone();
    let configurations: Api<
        k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration,
    > = Api::all(mgmt.clone());
    let start = Instant::now();
    loop {
        let configuration = configurations
            .get("ck8s-certs-refresh-trigger")
            .await
            .unwrap();
        let bundles: Vec<_> = configuration
            .webhooks
            .unwrap_or_default()
            .into_iter()
            .map(|w| w.client_config.ca_bundle)
            .collect();
        if bundles.iter().all(|b| b.as_ref() == Some(&ca)) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "caBundle never set:\n{}",
            process.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // JSON logs at the level clusterctl set.
    let log = read(&running.log);
    let first = log.lines().next().unwrap_or_default();
    assert!(
        serde_json::from_str::<serde_json::Value>(first).is_ok(),
        "not a JSON log line: {first}"
    );
    assert!(
        log.contains("\"level\":\"DEBUG\""),
        "no debug lines:\n{}",
        process.log_tail(20)
    );
}

/// The fenced `sh` blocks of the repository's markdown file `doc` in the section under the
/// heading line `heading` (up to the next heading of its level or above), in order.
fn doc_blocks(doc: &str, heading: &str) -> Vec<String> {
    fenced_blocks(doc, heading, "sh")
}

/// The fenced blocks of language `lang` in a section, as [`doc_blocks`].
fn fenced_blocks(doc: &str, heading: &str, lang: &str) -> Vec<String> {
    let text = read(&repo_root().join(doc));
    let level = heading.split(' ').next().unwrap_or_default();
    // A `#` line inside a fenced block (a comment) is no heading.
    let mut fenced = false;
    let section: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != heading)
        .skip(1)
        .take_while(|l| {
            fenced ^= l.starts_with("```");
            let hashes = l.split(' ').next().unwrap_or_default();
            fenced
                || !(hashes.starts_with('#') && hashes.chars().all(|c| c == '#') && hashes <= level)
        })
        .collect();
    assert!(!section.is_empty(), "{doc} has no section {heading:?}");
    let mut blocks = Vec::new();
    let mut lines = section.into_iter();
    while let Some(line) = lines.next() {
        if line == format!("```{lang}") {
            let block: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
            blocks.push(block.join("\n") + "\n");
        }
    }
    blocks
}

/// A shell as the docs' reader has it, against the management cluster of the environment:
/// `kubectl` and `clusterctl` on PATH are the pinned ones, `KUBECONFIG` is the cluster's admin,
/// `HOME` is `home` (with clusterctl's configuration under it), and nothing else of the
/// developer's environment but PATH (no CK8S_CERTS_* variables for clusterctl to substitute).
///
/// One difference: `clusterctl init` cannot run against this cluster. It installs cert-manager
/// and waits until cert-manager issues a test certificate, and no pod runs here (API servers
/// only, no kubelet or container runtime); on a cluster without the clusterctl inventory (this
/// one: its Cluster API CRDs are installed by the harness) it also installs the default providers
/// (core, kubeadm) from GitHub. So `clusterctl init <args>` here applies with kubectl
/// what `clusterctl generate provider <args>` prints: the same repository read, version chosen
/// and variables substituted, without the cert-manager step and the inventory.
struct DocShell {
    bin: PathBuf,
    home: PathBuf,
    kubeconfig: PathBuf,
}

impl DocShell {
    fn new(env: &Environment, dir: &Path, home: &Path) -> Self {
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).expect("create the shell's bin");
        let kubectl = tool("CK8S_E2E_KUBECTL", "kubectl", "KUBE_VERSION");
        let clusterctl = tool("CK8S_E2E_CLUSTERCTL", "clusterctl", "CLUSTERCTL_VERSION");
        std::os::unix::fs::symlink(&kubectl, bin.join("kubectl")).expect("link kubectl");
        let shim = bin.join("clusterctl");
        write(
            &shim,
            format!(
                "#!/usr/bin/env bash\nset -euo pipefail\nif [[ \"${{1:-}}\" == init ]]; then\n  shift\n  '{clusterctl}' generate provider \"$@\" | '{kubectl}' apply -f -\nelse\n  exec '{clusterctl}' \"$@\"\nfi\n",
                clusterctl = clusterctl.display(),
                kubectl = kubectl.display(),
            ),
        );
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755))
            .expect("make the shim executable");
        let kubeconfig = dir.join("management.kubeconfig");
        write(&kubeconfig, &env.management_kubeconfig_yaml);
        std::fs::create_dir_all(home).expect("create HOME");
        Self {
            bin,
            home: home.to_owned(),
            kubeconfig,
        }
    }

    /// Runs `script` with `bash -euo pipefail` in `cwd`; panics with its output if it fails.
    fn run(&self, cwd: &Path, script: &str) -> String {
        let path = std::env::join_paths(std::iter::once(self.bin.clone()).chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
        ))
        .unwrap();
        let output = Command::new("bash")
            .args(["-euo", "pipefail", "-c", script])
            .current_dir(cwd)
            .env_clear()
            .env("PATH", path)
            .env("HOME", &self.home)
            .env("XDG_CONFIG_HOME", self.home.join(".config"))
            .env("KUBECONFIG", &self.kubeconfig)
            // It would ask the Go module proxy for a newer clusterctl after every command.
            .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
            // Where `make` finds the pinned tools already built (not under this HOME).
            .env("CK8S_CERTS_CACHE", ck8s_certs_e2e::cache_dir())
            .output()
            .expect("run bash");
        assert!(
            output.status.success(),
            "failed:\n{script}\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

/// The Deployment as the management cluster stores it.
async fn installed_deployment(env: &Environment) -> Deployment {
    Api::namespaced(env.management().await.unwrap(), NAMESPACE)
        .get(DEPLOYMENT)
        .await
        .unwrap()
}

/// README's "install today", line by line against the management cluster but for the image
/// build and push (`make docker-build … && docker push …`: no Docker engine here) and
/// `clusterctl init` (see [`DocShell`]): `make release` into a local clusterctl repository, a
/// clusterctl configuration naming it with a `file://` URL, the provider installed from it with
/// the image README builds; then the controller runs as installed (see [`run_as_installed`]: the
/// binary of this build in place of the image, which is not built here).
#[tokio::test]
async fn readme_install_today_installs_a_release_that_runs() {
    let blocks = doc_blocks("README.md", "### Today: from a checkout");
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    let image_build = |l: &&str| l.starts_with("make docker-build ");
    assert_eq!(
        blocks[0].lines().filter(image_build).count(),
        1,
        "{}",
        blocks[0]
    );
    let script: String = blocks
        .concat()
        .lines()
        .filter(|l| !image_build(l))
        .map(|l| format!("{l}\n"))
        .collect();
    let image = script
        .lines()
        .find_map(|l| l.strip_prefix("export IMG="))
        .expect("README sets IMG")
        .to_owned();
    assert!(
        script.contains(&format!("addon-ck8s-certs/{}", version())),
        "README's release version is not the workspace's {}:\n{script}",
        version()
    );

    let env = shared_of(CLUSTERS).await;
    let dir = scratch("readme");
    let shell = DocShell::new(&env, &dir, &dir.join("home"));
    let deployment = {
        let _installing = INSTALLING.lock().await;
        // From the checkout, as README's reader runs it; `make release` writes under HOME only.
        shell.run(&repo_root(), &script);
        installed_deployment(&env).await
    };
    assert_eq!(manager_image(&deployment), image);
    assert_eq!(manager_env(&deployment), expected_env(&[]));
    assert!(
        deployment
            .labels()
            .contains_key("clusterctl.cluster.x-k8s.io"),
        "not installed by clusterctl's components: {:?}",
        deployment.labels()
    );
    run_as_installed(&env, &deployment, "readme").await;
}

/// docs/kubeconfig-renewal.md's two install routes, as written (see [`DocShell`]), into the
/// management cluster: the clusterctl one (the provider declared in
/// `~/.config/cluster-api/clusterctl.yaml`, as docs/install.md says), then the one that
/// substitutes the release file and applies it with kubectl (in a folder laid out as a checkout
/// after `make release`: `_out/release/` and `config/`). Each leaves the Deployment with
/// `CK8S_CERTS_RENEW_MANAGEMENT_KUBECONFIG=on` and the role and policy of config/kubeconfig-renewal
/// in place; the controller run as installed (see [`run_as_installed`]) renews `solo`'s due
/// kubeconfig with them, and the workload API server accepts the new one.
#[tokio::test]
async fn kubeconfig_renewal_installed_as_its_doc_says_renews_a_kubeconfig() {
    let blocks = doc_blocks("docs/kubeconfig-renewal.md", "## Turning it on");
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    assert!(blocks[0].contains("clusterctl init"), "{}", blocks[0]);
    assert!(
        blocks[1].contains("clusterctl generate yaml"),
        "{}",
        blocks[1]
    );

    let env = shared_of(CLUSTERS).await;
    let mgmt = env.management().await.unwrap();
    let dir = scratch("kubeconfig-renewal");
    let clusterctl = Clusterctl::new(&dir, json!({}));
    write(
        &clusterctl.home.join(".config/cluster-api/clusterctl.yaml"),
        read(&clusterctl.config),
    );
    write(
        &dir.join("_out/release").join(COMPONENTS),
        read(&dir.join("release").join(COMPONENTS)),
    );
    std::os::unix::fs::symlink(repo_root().join("config"), dir.join("config"))
        .expect("link config/");
    let shell = DocShell::new(&env, &dir, &clusterctl.home);
    let renewing = expected_env(&[("CK8S_CERTS_RENEW_MANAGEMENT_KUBECONFIG", "on")]);
    let mut deployment = None;
    for block in &blocks {
        let _installing = INSTALLING.lock().await;
        shell.run(&dir, block);
        let installed = installed_deployment(&env).await;
        assert_eq!(manager_env(&installed), renewing, "after:\n{block}");
        deployment = Some(installed);
    }
    for (kind, name) in [
        ("ClusterRole", "ck8s-certs-kubeconfig-renewal"),
        ("ClusterRoleBinding", "ck8s-certs-kubeconfig-renewal"),
        ("ValidatingAdmissionPolicy", "ck8s-certs-kubeconfig-renewal"),
        (
            "ValidatingAdmissionPolicyBinding",
            "ck8s-certs-kubeconfig-renewal",
        ),
    ] {
        let output = Command::new(tool("CK8S_E2E_KUBECTL", "kubectl", "KUBE_VERSION"))
            .arg("--kubeconfig")
            .arg(&env.management_kubeconfig)
            .args(["get", kind, name, "-o", "name"])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{kind} {name}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    let (_, cert) = env.make_kubeconfig_due("solo").await;
    env.isolate_cluster("solo", "kubeconfig-renewal").await;
    let running = run_as_installed(&env, &deployment.unwrap(), "kubeconfig-renewal").await;

    let records: Api<ck8s_certs_api::cluster_certificates::ClusterCertificates> =
        Api::namespaced(mgmt.clone(), "fleet");
    let start = Instant::now();
    loop {
        let renewed = records.get_opt("solo").await.unwrap().and_then(|r| {
            let status = r.status?;
            let renewed = status.kubeconfig?.last_renewal_time.is_some();
            Some(renewed)
        });
        if renewed == Some(true) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "solo's kubeconfig was not renewed: {:#?}\n{}",
            records
                .get_opt("solo")
                .await
                .unwrap()
                .and_then(|r| r.status),
            running.process.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // A new certificate, which the workload API server takes for the same user.
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(mgmt.clone(), "fleet")
        .get("solo-kubeconfig")
        .await
        .unwrap();
    let yaml = String::from_utf8(secret.data.unwrap()["value"].0.clone()).unwrap();
    let kubeconfig: serde_yaml::Value = serde_yaml::from_str(&yaml).unwrap();
    let data = kubeconfig["users"][0]["user"]["client-certificate-data"]
        .as_str()
        .unwrap();
    let new_cert =
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, data).unwrap();
    assert_ne!(new_cert, cert.as_bytes());
    let file = dir.join("solo-renewed.kubeconfig");
    write(&file, &yaml);
    assert_eq!(
        ck8s_certs_e2e::kubeconfigs::whoami(&file),
        "kubernetes-admin"
    );
    let metrics = reqwest::get(format!("http://127.0.0.1:{}/metrics", running.metrics_port))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let series = "ck8s_certs_kubeconfig_renewals_total{result=\"renewed\"} ";
    assert_eq!(
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series))
            .and_then(|v| v.parse::<f64>().ok()),
        Some(1.0),
        "{metrics}"
    );
}

/// docs/install.md's kustomize route as written, from the release file on (its download names a
/// GitHub release nothing publishes yet: the release file here is `hack/release.sh`'s, which is
/// what a release publishes): `clusterctl generate yaml` with a variable set, the kustomization
/// the doc shows (its first line names the file), `kubectl apply --server-side -k .` against the
/// management cluster. The Deployment and admission policies other tests installed are deleted
/// first, as on a cluster without ck8s-certs: theirs hold other values, or atomic fields the API
/// server defaulted, owned by another field manager, which a server-side apply without
/// `--force-conflicts` refuses to take over.
#[tokio::test]
async fn install_md_kustomize_route_installs_the_patched_release() {
    let heading = "## With kustomize";
    let blocks = doc_blocks("docs/install.md", heading);
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    let kustomizations = fenced_blocks("docs/install.md", heading, "yaml");
    assert_eq!(kustomizations.len(), 1, "{kustomizations:?}");
    assert!(kustomizations[0].starts_with("# kustomization.yaml\n"));
    // The download, a command continued over lines ending in `\`, is the release file put here.
    let mut script = String::new();
    let mut in_download = false;
    for line in blocks[0].lines() {
        in_download = in_download || line.starts_with("curl ");
        if !in_download {
            script.push_str(line);
            script.push('\n');
        }
        in_download = in_download && line.ends_with('\\');
    }
    assert!(
        script.contains("clusterctl generate yaml") && !script.contains("curl"),
        "{script}"
    );

    let env = shared_of(CLUSTERS).await;
    let dir = scratch("install-md-kustomize");
    let work = dir.join("work");
    write(
        &work.join(COMPONENTS),
        read(&release(&dir).join(COMPONENTS)),
    );
    write(&work.join("kustomization.yaml"), &kustomizations[0]);
    let shell = DocShell::new(&env, &dir, &dir.join("home"));
    let deployment = {
        let _installing = INSTALLING.lock().await;
        // What other tests' installs left with values or defaulted atomic fields (the
        // policies' matchConstraints) that another field manager owns.
        let mut applier = Applier::new(env.management().await.unwrap(), "e2e-clusterctl");
        let release = manifests::parse(&read(&work.join(COMPONENTS))).unwrap();
        for object in release
            .iter()
            .filter(|o| matches!(kind(o), "Deployment" | "ValidatingAdmissionPolicy"))
        {
            let api = applier.api_for(object).await.unwrap();
            match api.delete(&object.name_any(), &Default::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => panic!("deleting {}: {e}", describe(object)),
            }
            let start = Instant::now();
            while api.get_opt(&object.name_any()).await.unwrap().is_some() {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "{} not deleted",
                    describe(object)
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        shell.run(&work, &script);
        shell.run(&work, &blocks[1]);
        installed_deployment(&env).await
    };
    assert_eq!(deployment.spec.as_ref().unwrap().replicas, Some(3));
    assert_eq!(
        manager_env(&deployment),
        expected_env(&[("CK8S_CERTS_LOG_LEVEL", "debug")])
    );
    assert_eq!(manager_image(&deployment), format!("{IMAGE}:{}", version()));
}
