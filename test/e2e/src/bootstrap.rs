//! The test double of the CK8s bootstrap provider's certificates controller
//! (`test/bootstrapdouble`, Go), run beside the controller under test: on a real management
//! cluster that provider always reacts to the same Machine annotations (design.md section 8).
//!
//! The double runs with the admin kubeconfig of the management cluster, watches only the
//! Machines its label selector matches, and appends every action to a JSON-lines records file
//! that tests read through [`BootstrapDouble`] to prove that it did, or did not, act on a Machine.
//!
//! Like the controller, the process dies with the thread that started it (see
//! [`crate::process`]): start it from the test itself.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ck8s_certs_api::capi::WATCH_FILTER_LABEL;
use serde::Deserialize;

use crate::fixtures::NodeInfo;
use crate::process::Process;
use crate::{Environment, Error, controlplane};

/// The double's binary: `CK8S_E2E_BOOTSTRAPDOUBLE`, else `target/bin/bootstrapdouble` (built by
/// `make bootstrapdouble`, part of `make env`).
pub fn binary() -> Result<PathBuf, Error> {
    crate::executable(
        "CK8S_E2E_BOOTSTRAPDOUBLE",
        || crate::built("bin/bootstrapdouble"),
        "`make bootstrapdouble` (make env does)",
    )
}

/// One line of the records file: something the double did, or deliberately did not do, to a
/// Machine. `step` is one of `no-node-ref`, `skip`, `clear-status`, `scope`, `expiry`,
/// `in-progress`, `ttl`, `plan`, `run`, `approve`, `done`, `failed`; `outcome` is `ok`,
/// `error`, `skipped` or `requeued` (see `test/bootstrapdouble/records.go`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Record {
    pub time: String,
    pub namespace: String,
    pub machine: String,
    #[serde(default)]
    pub cluster: String,
    #[serde(default)]
    pub node: String,
    pub step: String,
    pub outcome: String,
    /// The plan's seed, on `plan`, `run` and `approve` records.
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub detail: String,
}

impl Record {
    pub fn is(&self, step: &str, outcome: &str) -> bool {
        self.step == step && self.outcome == outcome
    }

    fn about(&self, node: &NodeInfo) -> bool {
        self.namespace == node.namespace && self.machine == node.machine
    }
}

/// A running double; killed when dropped (its log is printed when the test panics).
pub struct BootstrapDouble {
    process: Process,
    records: PathBuf,
    /// The label selector it watches with.
    pub selector: String,
}

impl BootstrapDouble {
    /// Every record so far, oldest first. A line still being written is skipped.
    pub fn records(&self) -> Vec<Record> {
        let text = std::fs::read_to_string(&self.records).unwrap_or_default();
        let complete = match text.rfind('\n') {
            Some(end) => &text[..end],
            None => "",
        };
        complete
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("bad record line {l:?}: {e}"))
            })
            .collect()
    }

    /// The records about `node`'s Machine (namespace and name: Machines of different
    /// namespaces may share a name).
    pub fn records_for(&self, node: &NodeInfo) -> Vec<Record> {
        self.records()
            .into_iter()
            .filter(|r| r.about(node))
            .collect()
    }

    /// Whether it saw `node`'s Machine with a trigger and status `in-progress` and stood aside
    /// ("already in progress").
    pub fn skipped(&self, node: &NodeInfo) -> bool {
        self.records_for(node)
            .iter()
            .any(|r| r.is("skip", "skipped"))
    }

    /// Whether it started its own refresh of `node`'s Machine: it patched `in-progress` or
    /// asked the node for a plan (whatever came of it).
    pub fn started_refresh(&self, node: &NodeInfo) -> bool {
        self.records_for(node)
            .iter()
            .any(|r| r.is("in-progress", "ok") || r.step == "plan")
    }

    /// Whether it refreshed `node`'s certificates: a `run` on that node answered.
    pub fn refreshed(&self, node: &NodeInfo) -> bool {
        self.records_for(node).iter().any(|r| r.is("run", "ok"))
    }

    /// Whether it changed `node`'s Machine at all: a successful write of the status, trigger
    /// or expiry annotations.
    pub fn wrote(&self, node: &NodeInfo) -> bool {
        self.records_for(node).iter().any(|r| {
            r.outcome == "ok"
                && matches!(
                    r.step.as_str(),
                    "clear-status" | "expiry" | "in-progress" | "done" | "failed"
                )
        })
    }

    /// The seeds of the plans it obtained for `node`, in order.
    pub fn seeds(&self, node: &NodeInfo) -> Vec<i64> {
        self.records_for(node)
            .iter()
            .filter(|r| r.is("plan", "ok"))
            .filter_map(|r| r.seed)
            .collect()
    }

    /// Waits until the records about `node` satisfy `done`; panics with them and the log after
    /// `timeout`.
    pub async fn wait_for(
        &self,
        node: &NodeInfo,
        timeout: Duration,
        done: impl Fn(&[Record]) -> bool,
    ) -> Vec<Record> {
        let start = Instant::now();
        loop {
            let records = self.records_for(node);
            if done(&records) {
                return records;
            }
            assert!(
                start.elapsed() < timeout,
                "timed out waiting on the bootstrap double's records for {}/{}: {records:#?}\n--- log ---\n{}",
                node.namespace,
                node.machine,
                self.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    pub fn records_path(&self) -> &Path {
        &self.records
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.process.check_running().is_ok()
    }

    /// Stops it abruptly.
    pub fn kill(mut self) {
        self.process.kill();
    }
}

impl Drop for BootstrapDouble {
    fn drop(&mut self) {
        self.process.report_if_panicking();
    }
}

impl Environment {
    /// Starts the bootstrap double with the admin kubeconfig of the management cluster and waits
    /// until its Machine cache has synced. `selector_or_filter` is a label selector when it
    /// contains `=`, `!` or `,`; otherwise a watch-filter value, i.e. the selector
    /// `cluster.x-k8s.io/watch-filter=<value>` (the label [`Environment::isolate`] sets).
    pub async fn start_bootstrap_double(&self, selector_or_filter: &str) -> BootstrapDouble {
        self.start_bootstrap_double_with(selector_or_filter, &[])
            .await
    }

    /// [`Self::start_bootstrap_double`] with extra flags (e.g. `--k8sd-timeout=5s`,
    /// `--events=false`, `--namespace=fleet`).
    pub async fn start_bootstrap_double_with(
        &self,
        selector_or_filter: &str,
        extra: &[&str],
    ) -> BootstrapDouble {
        let selector = if selector_or_filter.contains(['=', '!', ',']) {
            selector_or_filter.to_owned()
        } else {
            format!("{WATCH_FILTER_LABEL}={selector_or_filter}")
        };
        let tag = controlplane::free_port().unwrap_or(0);
        let name = format!("bootstrapdouble-{tag}");
        let records = self.dir.join(format!("{name}.records.jsonl"));
        let mut command = std::process::Command::new(binary().expect("bootstrap double binary"));
        command
            .arg("--kubeconfig")
            .arg(&self.management_kubeconfig)
            .arg("--label-selector")
            .arg(&selector)
            .arg("--records")
            .arg(&records)
            .args(extra);
        let mut process =
            Process::spawn(&name, command, &self.dir).expect("bootstrap double starts");
        let start = Instant::now();
        loop {
            if let Err(e) = process.check_running() {
                panic!("the bootstrap double died: {e}\n{}", process.log_tail(30));
            }
            let log = std::fs::read_to_string(&process.log).unwrap_or_default();
            if log.lines().any(|l| l.trim() == "READY") {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the bootstrap double did not sync its cache:\n{}",
                process.log_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        BootstrapDouble {
            process,
            records,
            selector,
        }
    }
}
