//! The real test environment of ck8s-certs.
//!
//! [`Environment::start`] brings up, on loopback only:
//! - one etcd and one kube-apiserver per cluster (a management cluster and the workload
//!   clusters of [`EnvSpec`]), TLS from a fresh CA, RBAC on, an admin token;
//! - the real Cluster API CRDs of the chosen release plus the CK8sConfig CRD, and the fixtures
//!   of [`fixtures`] in the management and workload clusters;
//! - the node simulator (`test/nodesim`), which plays every node's kubelet (port-forward) and
//!   k8sd, each node on its own loopback address `127.E.C.N`, like released k8sd (a lost `run`
//!   answer skips the restart, the restart takes the node's k8sd and kubelet away for
//!   [`EnvSpec::restart_seconds`]);
//! - a restart hook for the simulator: when the only control plane of a workload cluster
//!   restarts its services, the environment restarts that cluster's kube-apiserver (down for
//!   [`EnvSpec::apiserver_restart_seconds`], then started again with the same flags and port);
//!   see [`Environment::apiserver_restarts`].
//!
//! Tests share one environment per test binary ([`shared`]) and isolate by cluster and node.
//! Binaries come from `make control-plane` / `make nodesim` (see the Makefile); their paths can
//! be overridden with `CK8S_E2E_KUBE_APISERVER`, `CK8S_E2E_ETCD`, `CK8S_E2E_NODESIM`, and the CAPI
//! release with `CK8S_E2E_CAPI_VERSION`.

pub mod bench;
pub mod bootstrap;
pub mod capi_manager;
pub mod controller;
pub mod controlplane;
pub mod crds;
pub mod docsgen;
pub mod drill;
pub mod fixtures;
pub mod k8sd;
pub mod kubeconfigs;
pub mod manifests;
pub mod pki;
pub mod policies;
pub mod process;
pub mod sim;
pub mod users;
pub mod webhook;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::Client;

use crate::controlplane::{ApiServer, ApiServerRestarts, RestartCount, SharedPki};
use crate::crds::CapiVersion;
use crate::fixtures::{ClusterSpec, ClusterTokens, NodeInfo, Role};
use crate::pki::{Ca, Leaf, Usage};
use crate::process::{Process, Processes};
use crate::sim::SimControl;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("starting {name} failed: {source}")]
    Spawn {
        name: String,
        source: std::io::Error,
    },
    #[error("{name} exited ({status}); see {log}", log = log.display())]
    Exited {
        name: String,
        status: String,
        log: PathBuf,
    },
    #[error("timed out waiting for {what}; last log lines:\n{log}")]
    Timeout { what: String, log: String },
    #[error("certificate generation failed: {0}")]
    Pki(String),
    #[error("Kubernetes API call failed: {0}")]
    Kube(#[source] kube::Error),
    #[error("node simulator control API: {0}")]
    Sim(String),
    #[error("{0}")]
    Setup(String),
}

impl Error {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_owned(),
            source,
        }
    }
}

/// Pinned versions, from `hack/versions.env` (the Makefile and the build script read it too).
pub fn pinned_version(key: &str) -> Option<String> {
    include_str!("../../../hack/versions.env")
        .lines()
        .find_map(|line| {
            let (k, v) = line.split_once('=')?;
            (k.trim() == key).then(|| v.trim().to_owned())
        })
}

/// Where hack/lib.sh keeps what it builds and downloads: `$CK8S_CERTS_CACHE`, else
/// `$XDG_CACHE_HOME/ck8s-certs`, else `~/.cache/ck8s-certs`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("CK8S_CERTS_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache")
                })
                .join("ck8s-certs")
        })
}

/// An executable: `$var`, else `default`; an error saying how to build it (`run …`) when it is
/// not there.
pub fn executable(
    var: &str,
    default: impl FnOnce() -> PathBuf,
    run: &str,
) -> Result<PathBuf, Error> {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(default);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Setup(format!(
            "{} is missing: run {run}",
            path.display()
        )))
    }
}

/// `target/<path>` of this workspace.
pub fn built(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target")
        .join(path)
}

/// A pinned tool (kubectl, clusterctl, promtool): `$var`, else `<cache>/bin/<name>-<version>`
/// as hack/lib.sh builds it (`make tools promtool`; `make e2e` does).
pub fn tool(var: &str, name: &str, version_key: &str) -> PathBuf {
    let pinned = || {
        let version = pinned_version(version_key).expect("hack/versions.env pins the tool");
        cache_dir().join("bin").join(format!("{name}-{version}"))
    };
    executable(var, pinned, "`make tools promtool` (make e2e does)")
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Paths of the environment's executables.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub kube_apiserver: PathBuf,
    pub etcd: PathBuf,
    pub nodesim: PathBuf,
}

impl Binaries {
    /// From the environment variables, else the cache of `hack/build-control-plane.sh` and
    /// `target/bin/nodesim`.
    pub fn locate() -> Result<Self, Error> {
        let cached = |name: &str, key: &str| {
            let version = pinned_version(key).unwrap_or_default();
            let path = cache_dir().join("bin").join(format!("{name}-{version}"));
            move || path
        };
        let run = "`make test` (or `make control-plane nodesim`) to build the test environment";
        Ok(Self {
            kube_apiserver: executable(
                "CK8S_E2E_KUBE_APISERVER",
                cached("kube-apiserver", "KUBE_VERSION"),
                run,
            )?,
            etcd: executable("CK8S_E2E_ETCD", cached("etcd", "ETCD_VERSION"), run)?,
            nodesim: executable("CK8S_E2E_NODESIM", || built("bin/nodesim"), run)?,
        })
    }
}

impl Binaries {
    /// The controller binary under test (`CK8S_E2E_CONTROLLER`, else `target/debug/ck8s-certs`,
    /// which `make e2e` builds first).
    pub fn controller() -> Result<PathBuf, Error> {
        executable(
            "CK8S_E2E_CONTROLLER",
            || built("debug/ck8s-certs"),
            "`cargo build --bin ck8s-certs` (make e2e does)",
        )
    }
}

/// What to start.
#[derive(Clone, Debug)]
pub struct EnvSpec {
    pub capi_version: CapiVersion,
    pub clusters: Vec<ClusterSpec>,
    /// How long a node's k8sd and kubelet are down after a `run` whose answer was delivered
    /// (the real one restarts its services).
    pub restart_seconds: u64,
    /// How long a workload cluster's kube-apiserver is down (killed, then started again) after
    /// a delivered `run` on its only control plane; plus its start-up time (~3 s).
    pub apiserver_restart_seconds: u64,
    /// `None`: one kube-apiserver per workload cluster. `Some(k)`: the workload clusters share
    /// k kube-apiservers, round robin (a fleet of dozens of clusters on a 2-core machine).
    pub workload_servers: Option<usize>,
    /// What the API servers audit: writes (tests count them) or every request (benchmarks).
    pub audit: controlplane::Audit,
    /// Annotations every Machine is created with (e.g. a known certificate expiry).
    pub machine_annotations: BTreeMap<String, String>,
    /// A second management cluster (an empty kube-apiserver with the same CRDs), the target of
    /// `clusterctl move`.
    pub move_target: bool,
    /// The CK8sControlPlane CRD and a CK8sControlPlane per cluster (as the CK8s control plane
    /// provider installs them); `false`: a management cluster without that provider (yet).
    pub control_plane_crd: bool,
    /// The real Cluster API core manager of `capi_version`, which watches every namespace: all
    /// clusters must be in [`capi_manager::NAMESPACE`] (made coherent for it); see
    /// [`capi_manager`].
    pub capi_manager: bool,
}

/// The CK8s control plane provider's CRD in `crds/`.
pub const CONTROL_PLANE_CRD: &str = "ck8scontrolplanes.controlplane.cluster.x-k8s.io";

impl EnvSpec {
    /// Five workload clusters. Three with two control planes and two workers each: `alpha` and
    /// `beta` in namespace `fleet` (`beta` with a non-default microcluster port and extra SANs),
    /// and `gamma` in namespace `edge` whose Machines are named exactly like `alpha`'s. And two
    /// in `fleet` with three workers each: `solo` with a single control plane (its refresh
    /// restarts the whole workload API) and `trio` with three control planes.
    pub fn standard() -> Self {
        let capi_version = CapiVersion(
            std::env::var("CK8S_E2E_CAPI_VERSION")
                .ok()
                .filter(|v| !v.is_empty())
                .or_else(|| {
                    pinned_version("CAPI_VERSIONS")
                        .and_then(|v| v.split_whitespace().last().map(str::to_owned))
                })
                .unwrap_or_else(|| "v1.14.2".into()),
        );
        let cluster =
            |name: &str, namespace: &str, prefix: &str, port: Option<u16>, sans: &[&str]| {
                ClusterSpec {
                    name: name.into(),
                    namespace: namespace.into(),
                    machine_prefix: prefix.into(),
                    control_planes: 2,
                    workers: 2,
                    microcluster_port: port,
                    extra_sans: sans.iter().map(|s| s.to_string()).collect(),
                    endpoint_host: format!("{name}.k8s.example.internal"),
                }
            };
        let sized = |name: &str, control_planes: usize, workers: usize| ClusterSpec {
            control_planes,
            workers,
            ..cluster(name, "fleet", name, None, &[])
        };
        Self {
            capi_version,
            clusters: vec![
                cluster("alpha", "fleet", "alpha", None, &[]),
                cluster(
                    "beta",
                    "fleet",
                    "beta",
                    Some(6543),
                    &["beta-api.example.com", "10.20.30.40"],
                ),
                // Another namespace, Machines named exactly like alpha's: mix-ups fail tests.
                cluster("gamma", "edge", "alpha", None, &[]),
                // An edge cluster: its only control plane takes the workload API with it.
                sized("solo", 1, 3),
                sized("trio", 3, 3),
            ],
            restart_seconds: 2,
            apiserver_restart_seconds: 3,
            workload_servers: None,
            audit: controlplane::Audit::Writes,
            machine_annotations: BTreeMap::new(),
            move_target: false,
            control_plane_crd: true,
            capi_manager: false,
        }
    }

    /// [`Self::standard`] with only the named clusters: a test binary that uses one or two of
    /// them starts one or two workload kube-apiservers with their nodes, not five (each costs
    /// the suite about 2 CPU-seconds, and the controller reads every Machine's expiry).
    pub fn standard_of(names: &[&str]) -> Self {
        let mut spec = Self::standard();
        if let Some(unknown) = names
            .iter()
            .find(|name| !spec.clusters.iter().any(|c| c.name == **name))
        {
            panic!("the standard environment has no cluster {unknown}");
        }
        spec.clusters.retain(|c| names.contains(&c.name.as_str()));
        spec
    }

    /// The index of the workload kube-apiserver that cluster `index` uses, and how many
    /// workload kube-apiservers there are.
    fn workload_server(&self, index: usize) -> usize {
        match self.workload_servers {
            Some(k) => index % k.max(1),
            None => index,
        }
    }

    /// The clusters of each node simulator process. Each process holds two listening sockets
    /// per node, and this machine lets a process open at most 20,000 files: a fleet larger than
    /// [`Self::NODES_PER_SIMULATOR`] nodes is played by several processes, each taking whole
    /// workload API servers (a server's CSR signer lives in one process).
    fn simulator_parts(&self, clusters: Vec<sim::ClusterConfig>) -> Vec<Vec<sim::ClusterConfig>> {
        let nodes: usize = clusters.iter().map(|c| c.nodes.len()).sum();
        let parts = nodes
            .div_ceil(Self::NODES_PER_SIMULATOR)
            .clamp(1, self.workload_server_count().max(1));
        let mut split: Vec<Vec<sim::ClusterConfig>> = (0..parts).map(|_| Vec::new()).collect();
        for (index, cluster) in clusters.into_iter().enumerate() {
            split[self.workload_server(index) % parts].push(cluster);
        }
        split
    }

    /// Nodes one simulator process plays at most (when the servers allow a split).
    pub const NODES_PER_SIMULATOR: usize = 6_000;

    fn workload_server_count(&self) -> usize {
        match self.workload_servers {
            Some(k) => k.max(1).min(self.clusters.len()),
            None => self.clusters.len(),
        }
    }
}

/// One workload cluster of a running environment.
pub struct WorkloadCluster {
    pub spec: ClusterSpec,
    pub nodes: Vec<NodeInfo>,
    pub tokens: ClusterTokens,
    pub kubeconfig_yaml: String,
    pub kubeconfig: PathBuf,
}

impl WorkloadCluster {
    pub fn node(&self, machine: &str) -> &NodeInfo {
        self.nodes
            .iter()
            .find(|n| n.machine == machine)
            .unwrap_or_else(|| panic!("no machine {machine} in cluster {}", self.spec.name))
    }

    pub fn nodes_with_role(&self, role: Role) -> impl Iterator<Item = &NodeInfo> {
        self.nodes.iter().filter(move |n| n.role == role)
    }

    pub async fn client(&self) -> Result<Client, Error> {
        controlplane::client_from_kubeconfig(&self.kubeconfig_yaml).await
    }
}

/// Start-up timings and memory, for the closing notes and benchmarks.
#[derive(Clone, Debug, Default)]
pub struct Measurements {
    pub start: Duration,
    pub control_planes_ready: Duration,
    pub rss_kib: BTreeMap<String, u64>,
}

/// A second management cluster: the same CRDs and controller identity, no objects.
pub struct MoveTarget {
    /// Admin.
    pub kubeconfig: PathBuf,
    /// The controller's ServiceAccount there.
    pub controller_kubeconfig: PathBuf,
}

pub struct Environment {
    pub spec: EnvSpec,
    pub dir: PathBuf,
    pub management_kubeconfig_yaml: String,
    pub management_kubeconfig: PathBuf,
    /// Kubeconfig with the controller's ServiceAccount token (the rights of `config/rbac`).
    pub controller_kubeconfig: PathBuf,
    pub clusters: Vec<WorkloadCluster>,
    /// The second management cluster ([`EnvSpec::move_target`]).
    pub move_target: Option<MoveTarget>,
    /// The Cluster API core manager ([`EnvSpec::capi_manager`]).
    pub capi_manager: Option<capi_manager::CapiManager>,
    pub sim: SimControl,
    pub measurements: Measurements,
    processes: Arc<Processes>,
    apiserver_restarts: Arc<ApiServerRestarts>,
    restart_hook: std::net::SocketAddr,
    /// Held while the environment lives: no other test binary takes its addresses.
    _octet_lock: std::fs::File,
}

/// The restart hook's name for the management kube-apiserver (no cluster name has a colon).
const MANAGEMENT_SERVER: &str = ":management";

impl Environment {
    /// Starts everything. Child processes die with the thread that calls this (see
    /// [`process`]), so call it from a thread that lives as long as the environment.
    pub async fn start(spec: EnvSpec) -> Result<Self, Error> {
        let started = Instant::now();
        let bins = Binaries::locate()?;
        let crd_dir = spec.capi_version.crd_dir()?;
        let dir = make_dir()?;
        // Every child is killed when this is dropped (a failed start included).
        let processes = Arc::new(Processes::default());

        let ca = Ca::new(&dir)?;
        let localhost = [IpAddr::V4(Ipv4Addr::LOCALHOST)];
        let serving = |file_name| Leaf {
            file_name,
            common_name: "kube-apiserver",
            organization: None,
            ips: &localhost,
            dns: &["localhost", "kubernetes"],
            usage: Usage::Server,
        };
        let pki = SharedPki {
            serving: ca.issue(&dir, serving("apiserver"))?,
            expired_serving: ca.issue_expired(&dir, serving("apiserver-expired"))?,
            kubelet_client: ca.issue(
                &dir,
                Leaf {
                    file_name: "apiserver-kubelet-client",
                    common_name: "kube-apiserver-kubelet-client",
                    organization: Some("system:masters"),
                    ips: &[],
                    dns: &[],
                    usage: Usage::Client,
                },
            )?,
            service_account: pki::service_account_keys(&dir)?,
            admin_token: fixtures::token(),
            token_file: dir.join("tokens.csv"),
            ca,
        };
        std::fs::write(
            &pki.token_file,
            format!("{},admin,admin-uid,\"system:masters\"\n", pki.admin_token),
        )
        .map_err(|e| Error::io(&pki.token_file, e))?;

        let (mut etcd, etcd_url) = controlplane::start_etcd(&bins, &dir)?;
        controlplane::wait_for_etcd(&mut etcd, &etcd_url, Duration::from_secs(30)).await?;
        processes.push(etcd);

        let mut servers = vec![ApiServer::start(
            &bins,
            &pki,
            &etcd_url,
            "management",
            &dir,
            spec.audit,
        )?];
        // Named after their (first) cluster; shared ones after their index.
        for index in 0..spec.workload_server_count() {
            let name = match spec.workload_servers {
                None => spec.clusters[index].name.clone(),
                Some(_) => format!("workload-{index}"),
            };
            servers.push(ApiServer::start(
                &bins, &pki, &etcd_url, &name, &dir, spec.audit,
            )?);
        }
        let mut move_target = match spec.move_target {
            true => Some(ApiServer::start(
                &bins,
                &pki,
                &etcd_url,
                "move-target",
                &dir,
                spec.audit,
            )?),
            false => None,
        };
        for server in servers.iter_mut().chain(move_target.as_mut()) {
            server.wait_ready(Duration::from_secs(90)).await?;
        }
        let control_planes_ready = started.elapsed();

        let management = servers.remove(0);
        let mut launches: BTreeMap<String, controlplane::Launch> = spec
            .clusters
            .iter()
            .enumerate()
            .map(|(index, cluster)| {
                let server = &servers[spec.workload_server(index)];
                (cluster.name.clone(), server.launch.clone())
            })
            .collect();
        launches.insert(MANAGEMENT_SERVER.to_owned(), management.launch.clone());
        let mgmt = management.client().await?;
        let mut crds = crds::read_dir(&crd_dir)?;
        crds.extend(crds::read_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("crds"),
        )?);
        if !spec.control_plane_crd {
            crds.retain(|crd| crd.metadata.name.as_deref() != Some(CONTROL_PLANE_CRD));
        }
        // The product's own CRDs, as `config/` installs them.
        crds.extend(crds::read_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/crd/bases"),
        )?);
        let mut target_controller_kubeconfig = None;
        if let Some(target) = &move_target {
            let client = target.client().await?;
            crds::install(&client, crds.clone()).await?;
            let target_dir = dir.join("move-target");
            std::fs::create_dir_all(&target_dir).map_err(|e| Error::io(&target_dir, e))?;
            let (path, _) = controller::service_account_kubeconfig(
                &client,
                target.port,
                &pki.ca.pem,
                &target_dir,
            )
            .await?;
            target_controller_kubeconfig = Some(path);
        }
        crds::install(&mgmt, crds).await?;
        let (controller_kubeconfig, _) =
            controller::service_account_kubeconfig(&mgmt, management.port, &pki.ca.pem, &dir)
                .await?;

        let (env_octet, octet_lock) = pick_env_octet(&spec)?;
        let workload_clients =
            futures::future::try_join_all(servers.iter().map(ApiServer::client)).await?;
        // Clusters are set up a few at a time: a fleet has thousands of objects.
        let set_up: Vec<(WorkloadCluster, sim::ClusterConfig)> =
            futures::stream::iter(spec.clusters.iter().enumerate())
                .map(|(index, cluster_spec)| {
                    let server = &servers[spec.workload_server(index)];
                    let workload = &workload_clients[spec.workload_server(index)];
                    set_up_cluster(SetUp {
                        spec: &spec,
                        cluster_spec,
                        nodes: cluster_spec.nodes(env_octet, (index + 1) as u8),
                        server,
                        workload,
                        mgmt: &mgmt,
                        pki: &pki,
                        dir: &dir,
                    })
                })
                .buffered(8)
                .try_collect()
                .await?;
        let (clusters, sim_clusters): (Vec<_>, Vec<_>) = set_up.into_iter().unzip();
        let sim_parts = spec.simulator_parts(sim_clusters);
        // Bound now so that its address goes into the simulator's config; served once
        // everything runs (the simulator calls it only after a `run`).
        let hook_listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| Error::io(Path::new("127.0.0.1:0"), e))?;
        let hook_address = hook_listener
            .local_addr()
            .map_err(|e| Error::io(Path::new("restart hook"), e))?;
        let mut sim_configs = Vec::new();
        for (index, part) in sim_parts.into_iter().enumerate() {
            let name = match index {
                0 => "nodesim".to_owned(),
                _ => format!("nodesim-{index}"),
            };
            let config_path = dir.join(format!("{name}.json"));
            let control =
                std::net::SocketAddr::from((Ipv4Addr::LOCALHOST, controlplane::free_port()?));
            let names: Vec<String> = part.iter().map(|c| c.name.clone()).collect();
            sim::write_config(
                &config_path,
                &sim::Config {
                    control,
                    kubelet_client_ca: pki.ca.files.cert.clone(),
                    management_kubeconfig: management.kubeconfig.clone(),
                    restart_seconds: spec.restart_seconds,
                    restart_hook: Some(format!("http://{hook_address}")),
                    clusters: part,
                },
            )?;
            sim_configs.push((name, config_path, control, names));
        }
        let management_kubeconfig_yaml = management.kubeconfig_yaml.clone();
        let management_kubeconfig = management.kubeconfig.clone();
        let management_port = management.port;
        processes.push(management.process);
        for server in servers {
            processes.push(server.process);
        }
        let move_target =
            move_target
                .zip(target_controller_kubeconfig)
                .map(|(target, controller_kubeconfig)| {
                    processes.push(target.process);
                    MoveTarget {
                        kubeconfig: target.kubeconfig,
                        controller_kubeconfig,
                    }
                });

        let mut sim_controls = Vec::new();
        for (name, config_path, control, names) in sim_configs {
            let mut command = std::process::Command::new(&bins.nodesim);
            command.arg("--config").arg(&config_path);
            let mut nodesim = Process::spawn(&name, command, &dir)?;
            sim::wait_ready(&mut nodesim, Duration::from_secs(60)).await?;
            processes.push(nodesim);
            sim_controls.push((control, names));
        }

        let capi_manager = match spec.capi_manager {
            true => {
                let (process, manager) = capi_manager::start(capi_manager::Start {
                    mgmt: &mgmt,
                    port: management_port,
                    ca: &pki.ca,
                    dir: &dir,
                    capi_version: &spec.capi_version,
                    crd_dir: &crd_dir,
                    clusters: &clusters,
                })
                .await?;
                processes.push(process);
                Some(manager)
            }
            false => None,
        };

        let apiserver_restarts = Arc::new(ApiServerRestarts::new(
            Arc::clone(&processes),
            launches,
            pki.expired_serving.clone(),
            Duration::from_secs(spec.apiserver_restart_seconds),
        ));
        apiserver_restarts.serve(hook_listener)?;

        let measurements = Measurements {
            start: started.elapsed(),
            control_planes_ready,
            rss_kib: processes.rss_kib(),
        };
        Ok(Self {
            spec,
            dir,
            management_kubeconfig_yaml,
            management_kubeconfig,
            controller_kubeconfig,
            clusters,
            move_target,
            capi_manager,
            sim: SimControl::sharded(sim_controls),
            restart_hook: hook_address,
            _octet_lock: octet_lock,
            measurements,
            processes,
            apiserver_restarts,
        })
    }

    /// How many times the kube-apiserver of workload cluster `cluster` was restarted (killed)
    /// because its only control plane restarted its services.
    pub fn apiserver_restarts(&self, cluster: &str) -> u32 {
        self.apiserver_restarts.count(cluster).begun
    }

    /// The restart counters of workload cluster `cluster`'s kube-apiserver.
    pub fn apiserver_restart_count(&self, cluster: &str) -> RestartCount {
        self.apiserver_restarts.count(cluster)
    }

    /// Waits until workload cluster `cluster`'s API server is up: no restart under way (one
    /// that is about to begin, ~300 ms after a lone control plane's `run` answer, is not
    /// seen) and /readyz ok.
    pub async fn wait_for_workload_api(
        &self,
        cluster: &str,
        deadline: Duration,
    ) -> Result<(), Error> {
        let start = Instant::now();
        let workload = self.cluster(cluster);
        loop {
            if !self.apiserver_restart_count(cluster).in_progress()
                && let Ok(client) = workload.client().await
                && controlplane::is_ready(&client).await
            {
                return Ok(());
            }
            if start.elapsed() > deadline {
                let log =
                    std::fs::read_to_string(self.dir.join(format!("kube-apiserver-{cluster}.log")))
                        .unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                return Err(Error::Timeout {
                    what: format!("the {cluster} workload API to be ready"),
                    log: lines[lines.len().saturating_sub(30)..].join("\n"),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Restarts the management kube-apiserver (killed, down for
    /// [`EnvSpec::apiserver_restart_seconds`], started again with the same flags and port, as
    /// after an upgrade of the management cluster) and waits until it is ready again.
    pub async fn restart_management_apiserver(&self, deadline: Duration) -> Result<(), Error> {
        let before = self.apiserver_restarts.count(MANAGEMENT_SERVER).completed;
        self.call_restart_hook(MANAGEMENT_SERVER, "restart-apiserver")
            .await?;
        let start = Instant::now();
        loop {
            if self.apiserver_restarts.count(MANAGEMENT_SERVER).completed > before
                && let Ok(client) = self.management().await
                && controlplane::is_ready(&client).await
            {
                return Ok(());
            }
            if start.elapsed() > deadline {
                return Err(Error::Timeout {
                    what: "the management kube-apiserver to be ready after its restart".into(),
                    log: String::new(),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Switches workload cluster `cluster` "off past its expiry": its kube-apiserver is started
    /// again serving an expired certificate (clients fail TLS with `certificate expired`), and
    /// the simulator is told, so that the first control plane refreshed afterwards has it
    /// started again with a valid one (through the restart hook, as a lone control plane's
    /// restart is). Returns once a client sees the expired certificate.
    pub async fn expire_workload_api(
        &self,
        cluster: &str,
        deadline: Duration,
    ) -> Result<(), Error> {
        let before = self.apiserver_restarts.count(cluster).completed;
        self.call_restart_hook(cluster, "expire-apiserver").await?;
        let start = Instant::now();
        let mut last = String::new();
        loop {
            if self.apiserver_restarts.count(cluster).completed > before {
                let client = self.cluster(cluster).client().await?;
                let readyz = http::Request::get("/readyz")
                    .body(Vec::new())
                    .map_err(|e| Error::Setup(e.to_string()))?;
                match client.request_text(readyz).await {
                    Err(err) if format!("{err:?}").contains("Expired") => break,
                    other => last = format!("{other:?}"),
                }
            }
            if start.elapsed() > deadline {
                return Err(Error::Timeout {
                    what: format!(
                        "the kube-apiserver of {cluster} to serve an expired certificate (last: {last})"
                    ),
                    log: String::new(),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.sim.set_api_certificate_expired(cluster, true).await?;
        Ok(())
    }

    /// Stops workload cluster `cluster`'s kube-apiserver as a node's shutdown does: SIGTERM,
    /// after which it serves on for [`controlplane::SHUTDOWN_DELAY`] with /readyz failing, then
    /// exits, and is started again (see [`Self::wait_for_workload_api`]). Returns once /readyz
    /// fails while the API still answers.
    pub async fn drain_workload_api(&self, cluster: &str, deadline: Duration) -> Result<(), Error> {
        self.call_restart_hook(cluster, "drain-apiserver").await?;
        let start = Instant::now();
        let client = self.cluster(cluster).client().await?;
        loop {
            let readyz = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| Error::Setup(e.to_string()))?;
            if let Err(kube::Error::Api(status)) = client.request_text(readyz).await
                && status.code == 500
            {
                return Ok(());
            }
            if start.elapsed() > deadline {
                return Err(Error::Timeout {
                    what: format!("the kube-apiserver of {cluster} to fail /readyz"),
                    log: String::new(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `POST /clusters/<server>/<action>` on the restart hook (it answers at once; the restart
    /// goes on in the background).
    async fn call_restart_hook(&self, server: &str, action: &str) -> Result<(), Error> {
        let url = format!("http://{}/clusters/{server}/{action}", self.restart_hook);
        let response = reqwest::Client::new()
            .post(url)
            .send()
            .await
            .map_err(|e| Error::Setup(format!("restart hook: {e}")))?;
        if !response.status().is_success() {
            return Err(Error::Setup(format!(
                "restart hook: {}",
                response.text().await.unwrap_or_default()
            )));
        }
        Ok(())
    }

    /// A fresh admin client of the management cluster (clients are per test: each test has its
    /// own tokio runtime).
    pub async fn management(&self) -> Result<Client, Error> {
        controlplane::client_from_kubeconfig(&self.management_kubeconfig_yaml).await
    }

    pub fn cluster(&self, name: &str) -> &WorkloadCluster {
        self.clusters
            .iter()
            .find(|c| c.spec.name == name)
            .unwrap_or_else(|| panic!("no workload cluster {name}"))
    }

    /// Current RSS of every process, in KiB.
    pub fn rss_kib(&self) -> BTreeMap<String, u64> {
        self.processes.rss_kib()
    }

    /// Kills every process and removes the environment's folder.
    pub fn stop(&self) {
        self.apiserver_restarts.stop();
        self.processes.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Environment {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What [`set_up_cluster`] needs.
struct SetUp<'a> {
    spec: &'a EnvSpec,
    cluster_spec: &'a ClusterSpec,
    nodes: Vec<NodeInfo>,
    server: &'a ApiServer,
    workload: &'a Client,
    mgmt: &'a Client,
    pki: &'a SharedPki,
    dir: &'a Path,
}

/// Creates one workload cluster's objects (workload and management) and its nodes' kubelet
/// certificates.
async fn set_up_cluster(
    SetUp {
        spec,
        cluster_spec,
        nodes,
        server,
        workload,
        mgmt,
        pki,
        dir,
    }: SetUp<'_>,
) -> Result<(WorkloadCluster, sim::ClusterConfig), Error> {
    fixtures::create_workload_objects(workload, &nodes).await?;
    let tokens = fixtures::create_management_objects(
        mgmt,
        &spec.capi_version,
        cluster_spec,
        &nodes,
        &server.kubeconfig_yaml,
        &spec.machine_annotations,
        spec.control_plane_crd,
    )
    .await?;
    let mut sim_nodes = Vec::new();
    for node in &nodes {
        let file_name = format!("kubelet-{}", node.node);
        let common_name = format!("system:node:{}", node.node);
        let (ips, dns) = ([IpAddr::V4(node.address)], [node.node.as_str()]);
        let leaf = |file_name| Leaf {
            file_name,
            common_name: &common_name,
            organization: Some("system:nodes"),
            ips: &ips,
            dns: &dns,
            usage: Usage::Server,
        };
        let kubelet = pki.ca.issue(dir, leaf(&file_name))?;
        let expired = pki
            .ca
            .issue_expired(dir, leaf(&format!("{file_name}-expired")))?;
        sim_nodes.push(sim::NodeConfig::new(node, &kubelet, Some(&expired)));
    }
    let sim_cluster = sim::ClusterConfig {
        name: cluster_spec.name.clone(),
        namespace: cluster_spec.namespace.clone(),
        kubeconfig: server.kubeconfig.clone(),
        honour_csr_expiration: false,
        annotations: BTreeMap::new(),
        nodes: sim_nodes,
    };
    let cluster = WorkloadCluster {
        spec: cluster_spec.clone(),
        nodes,
        tokens,
        kubeconfig_yaml: server.kubeconfig_yaml.clone(),
        kubeconfig: server.kubeconfig.clone(),
    };
    Ok((cluster, sim_cluster))
}

/// `target/e2e-env/<pid>-<n>`; folders of processes that no longer exist are removed first (a
/// killed test run cannot clean up after itself).
fn make_dir() -> Result<PathBuf, Error> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/e2e-env");
    std::fs::create_dir_all(&root).map_err(|e| Error::io(&root, e))?;
    let root = std::fs::canonicalize(&root).map_err(|e| Error::io(&root, e))?;
    if let Ok(entries) = std::fs::read_dir(&root) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let pid = name.split('-').next().and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    for n in 0.. {
        let dir = root.join(format!("{}-{n}", std::process::id()));
        if std::fs::create_dir(&dir).is_ok() {
            return Ok(dir);
        }
    }
    unreachable!("an unbounded range always yields a free name")
}

/// Picks the second octet of the nodes' addresses `127.E.C.N` so that environments running at
/// the same time (several test binaries, `make run`) do not collide: E is random and every
/// node's kubelet and k8sd port must be free on it.
fn pick_env_octet(spec: &EnvSpec) -> Result<(u8, std::fs::File), Error> {
    use rand::Rng;
    for _ in 0..50 {
        let octet: u8 = rand::rng().random_range(10..=250);
        // Test binaries run side by side (hack/e2e.sh): a free port says nothing about another
        // environment that picked the octet and has not bound it yet, so each holds a lock.
        let Some(lock) = octet_lock(octet) else {
            continue;
        };
        let free = spec.clusters.iter().enumerate().all(|(c, cluster)| {
            cluster.nodes(octet, (c + 1) as u8).iter().all(|node| {
                [fixtures::KUBELET_PORT, node.microcluster_port]
                    .iter()
                    .all(|port| TcpListener::bind((node.address, *port)).is_ok())
            })
        });
        if free {
            return Ok((octet, lock));
        }
    }
    Err(Error::Setup(
        "no free 127.E.0.0/16 block for the simulated nodes".into(),
    ))
}

/// An exclusive lock on `127.<octet>.0.0/16` for this process's life (the kernel drops it when
/// the process ends, however it ends); `None` while another process holds it.
fn octet_lock(octet: u8) -> Option<std::fs::File> {
    use std::os::fd::AsRawFd;
    let dir = std::env::temp_dir().join("ck8s-certs-e2e-octets");
    std::fs::create_dir_all(&dir).ok()?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(format!("{octet}.lock")))
        .ok()?;
    // SAFETY: flock on a descriptor this function owns; no memory is involved.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    locked.then_some(file)
}

static SHARED: OnceLock<Result<Arc<Environment>, String>> = OnceLock::new();

extern "C" fn stop_shared() {
    if let Some(Ok(env)) = SHARED.get() {
        env.stop();
    }
}

/// The environment shared by every test of this test binary, started on first use.
///
/// It runs on a dedicated thread with its own runtime, which lives until the process exits:
/// tests each have their own tokio runtime, and the children's parent-death signal is tied to
/// the spawning thread. When the test process exits, that thread dies and the kernel kills
/// every child.
pub async fn shared() -> Arc<Environment> {
    shared_with(EnvSpec::standard).await
}

/// [`shared`] with only the named clusters of the standard environment
/// ([`EnvSpec::standard_of`]).
pub async fn shared_of(names: &'static [&'static str]) -> Arc<Environment> {
    shared_with(move || EnvSpec::standard_of(names)).await
}

/// [`shared`] with another environment: the first call of the test binary decides which.
pub async fn shared_with(spec: impl FnOnce() -> EnvSpec + Send + 'static) -> Arc<Environment> {
    let result = tokio::task::spawn_blocking(move || {
        SHARED
            .get_or_init(|| {
                let _ = rustls::crypto::ring::default_provider().install_default();
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::Builder::new()
                    .name("e2e-environment".into())
                    .spawn(move || {
                        let runtime = match tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                        {
                            Ok(runtime) => runtime,
                            Err(e) => {
                                let _ = tx.send(Err(e.to_string()));
                                return;
                            }
                        };
                        let env = runtime.block_on(Environment::start(spec()));
                        // Statics are never dropped: stop the environment when the test
                        // binary exits normally (a killed one relies on the parent-death
                        // signal, and its folder is removed by the next start).
                        // SAFETY: registering a plain extern "C" function.
                        unsafe {
                            libc::atexit(stop_shared);
                        }
                        let _ = tx.send(env.map(Arc::new).map_err(|e| e.to_string()));
                        // Keep this thread (and so the children) alive for the whole test run.
                        runtime.block_on(std::future::pending::<()>());
                    })
                    .map_err(|e| e.to_string())?;
                rx.recv().map_err(|e| e.to_string())?
            })
            .clone()
    })
    .await;
    match result {
        Ok(Ok(env)) => env,
        Ok(Err(message)) => panic!("the test environment did not start: {message}"),
        Err(join) => panic!("the test environment did not start: {join}"),
    }
}
