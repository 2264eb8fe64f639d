//! CRDs of the management cluster: the real Cluster API CRDs, read from the pinned
//! `sigs.k8s.io/cluster-api` module in the Go module cache, and the CK8sConfig CRD of
//! `crds/`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::{Api, Client};

use crate::Error;

/// A Cluster API release whose CRDs the environment installs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapiVersion(pub String);

impl CapiVersion {
    /// The Machine/Cluster version the release stores (and the fixtures are written in).
    /// v1.11 introduced v1beta2; v1.10 and older store v1beta1.
    pub fn storage_version(&self) -> &'static str {
        let minor = self
            .0
            .trim_start_matches("v1.")
            .split('.')
            .next()
            .and_then(|m| m.parse::<u32>().ok());
        match minor {
            Some(minor) if minor >= 11 => "v1beta2",
            _ => "v1beta1",
        }
    }

    /// Downloads the module (a no-op when cached) and returns its CRD folder.
    pub fn crd_dir(&self) -> Result<PathBuf, Error> {
        let module = format!("sigs.k8s.io/cluster-api@{}", self.0);
        let output = Command::new("go")
            .args(["mod", "download", "-json", &module])
            .env("GOFLAGS", "-mod=mod")
            .env("GOTOOLCHAIN", "local")
            .output()
            .map_err(|e| Error::Spawn {
                name: "go mod download".into(),
                source: e,
            })?;
        let info: serde_json::Value = serde_json::from_slice(&output.stdout).map_err(|e| {
            Error::Setup(format!(
                "go mod download {module}: {e}: {}",
                String::from_utf8_lossy(&output.stderr)
            ))
        })?;
        let dir = info["Dir"].as_str().ok_or_else(|| {
            Error::Setup(format!("go mod download {module} returned no Dir: {info}"))
        })?;
        let dir = Path::new(dir);
        // The CRDs moved under core/ when v1beta2 arrived.
        let bases = [
            dir.join("core/config/crd/bases"),
            dir.join("config/crd/bases"),
        ];
        bases
            .into_iter()
            .find(|p| p.is_dir())
            .ok_or_else(|| Error::Setup(format!("no CRD folder in {}", dir.display())))
    }
}

/// Reads every CRD in `dir`; `spec.conversion` is dropped because its webhook (CAPI's own
/// manager) does not run here. Versions are therefore not converted by the API server: objects
/// are written and read in the stored version.
pub fn read_dir(dir: &Path) -> Result<Vec<CustomResourceDefinition>, Error> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
            let mut crd: CustomResourceDefinition = serde_yaml::from_str(&text)
                .map_err(|e| Error::Setup(format!("{}: {e}", path.display())))?;
            crd.spec.conversion = None;
            crd.metadata.annotations = None;
            Ok(crd)
        })
        .collect()
}

/// Creates the CRDs and waits until the API server serves them.
/// clusterctl's label on every object it installs.
pub const CLUSTERCTL_LABEL: &str = "clusterctl.cluster.x-k8s.io";

pub async fn install(client: &Client, crds: Vec<CustomResourceDefinition>) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for mut crd in crds {
        // As `clusterctl init` installs them: `clusterctl move` moves the kinds of the CRDs
        // with this label.
        crd.metadata
            .labels
            .get_or_insert_default()
            .entry(CLUSTERCTL_LABEL.to_owned())
            .or_default();
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), &crd)
            .await
            .map_err(Error::Kube)?;
        names.push(name);
    }
    let start = Instant::now();
    for name in names {
        loop {
            let crd = api.get(&name).await.map_err(Error::Kube)?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if start.elapsed() > Duration::from_secs(60) {
                return Err(Error::Timeout {
                    what: format!("CRD {name} to be established"),
                    log: String::new(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}
