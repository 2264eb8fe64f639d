//! A workload API server's answers about a node, as a refresh reads them before it reaches the
//! node's k8sd: `GET nodes/<node>` and the k8sd-proxy pods of that node, decoded as kube-rs
//! decodes them (serde into `Node` and `ObjectList<Pod>`), then `endpoint::located`. The server
//! is the tenant's (`<cluster>-kubeconfig` may point anywhere): its body size and time are
//! bounded by the transport (`workload::bounded`), what it says is fuzzed here.
//!
//! An input is the Node body, a NUL byte, then the pod list body (none: direct transport).

use std::net::IpAddr;

use ck8s_certs::workload::endpoint::located;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::core::ObjectList;
use serde_json::{Value, json};

use super::harness::Rng;
use super::mutate;

pub const WORDS: &[&str] = &[
    "InternalIP",
    "ExternalIP",
    "Hostname",
    "Ready",
    "True",
    "False",
    "Unknown",
    "Running",
    "Pending",
    "10.0.0.7",
    "fd00::7",
    "::ffff:10.0.0.7",
    "w0",
    "k8sd-proxy",
    "deletionTimestamp",
    "2026-01-01T00:00:00Z",
];

fn address(rng: &mut Rng) -> Value {
    json!({
        "type": rng.pick(&["InternalIP", "InternalIP", "ExternalIP", "Hostname", ""]),
        "address": match rng.chance(80) {
            true => rng.pick(&["10.0.0.7", "fd00::7", "w0", "10.0.0.256", "", "::ffff:10.0.0.7"]).to_owned(),
            false => mutate::string(rng, WORDS),
        },
    })
}

fn node(rng: &mut Rng) -> Value {
    let addresses: Vec<Value> = (0..rng.below(5)).map(|_| address(rng)).collect();
    let conditions: Vec<Value> = (0..rng.below(4))
        .map(|_| {
            json!({
                "type": rng.pick(&["Ready", "MemoryPressure", "ready"]),
                "status": rng.pick(&["True", "False", "Unknown", "true"]),
            })
        })
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": "w0" },
        "status": { "addresses": addresses, "conditions": conditions },
    })
}

fn pods(rng: &mut Rng) -> Value {
    let items: Vec<Value> = (0..rng.below(4))
        .map(|i| {
            let mut pod = json!({
                "metadata": { "name": format!("k8sd-proxy-{i}") },
                "status": { "phase": rng.pick(&["Running", "Pending", "Failed", "running"]) },
            });
            if rng.chance(20) {
                pod["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            if rng.chance(5) {
                pod["metadata"]["name"] = Value::Null;
            }
            pod
        })
        .collect();
    json!({ "apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items })
}

fn input(node: &Value, pods: Option<&Value>) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(node).unwrap_or_default();
    if let Some(pods) = pods {
        bytes.push(0);
        bytes.extend(serde_json::to_vec(pods).unwrap_or_default());
    }
    bytes
}

pub fn corpus() -> Vec<Vec<u8>> {
    let ready = json!({
        "apiVersion": "v1", "kind": "Node", "metadata": { "name": "w0" },
        "status": {
            "addresses": [{ "type": "InternalIP", "address": "10.0.0.7" }, { "type": "Hostname", "address": "w0" }],
            "conditions": [{ "type": "Ready", "status": "True" }],
        },
    });
    let running = json!({ "apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [
        { "metadata": { "name": "k8sd-proxy-x" }, "status": { "phase": "Running" } },
    ] });
    vec![
        input(&ready, Some(&running)),
        input(&ready, None),
        input(
            &json!({ "kind": "Node", "metadata": {} }),
            Some(&json!({ "items": [] })),
        ),
    ]
}

pub fn generate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    match rng.below(10) {
        0..=4 => {
            let pods = rng.chance(70).then(|| pods(rng));
            input(&node(rng), pods.as_ref())
        }
        5..=6 => {
            let mut node = node(rng);
            mutate::json(rng, &mut node, WORDS);
            let mut pods = pods(rng);
            mutate::json(rng, &mut pods, WORDS);
            input(&node, Some(&pods))
        }
        7..=8 => {
            let mut bytes = rng.pick_ref(corpus).clone();
            mutate::bytes(rng, &mut bytes, WORDS, corpus);
            bytes
        }
        _ => mutate::deep_text(rng),
    }
}

pub fn check(input: &[u8]) -> &'static str {
    let at = input.iter().position(|b| *b == 0);
    let (node_body, pods_body) = match at {
        Some(at) => (&input[..at], Some(&input[at + 1..])),
        None => (input, None),
    };
    let Ok(node) = serde_json::from_slice::<Node>(node_body) else {
        return "Node not decoded";
    };
    let pods = match pods_body.map(serde_json::from_slice::<ObjectList<Pod>>) {
        None => None,
        Some(Ok(list)) => Some(list.items),
        Some(Err(_)) => return "pods not decoded",
    };
    let addresses: Vec<IpAddr> = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| {
            a.iter()
                .filter(|a| a.type_ == "InternalIP")
                .filter_map(|a| a.address.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let running: Vec<String> = pods
        .iter()
        .flatten()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let port_forward = pods.is_some();
    match located(node, pods, "alpha", "w0") {
        Ok(found) => {
            assert_eq!(
                Some(&found.address),
                addresses.first(),
                "not the first InternalIP"
            );
            match &found.pod {
                Some(pod) => assert!(running.contains(pod), "a pod that is not Running: {pod}"),
                None => assert!(!port_forward, "no pod for a port-forward"),
            }
            if port_forward {
                "located, pod"
            } else {
                "located, direct"
            }
        }
        Err(err) => {
            let _ = err.to_string();
            "not located"
        }
    }
}
