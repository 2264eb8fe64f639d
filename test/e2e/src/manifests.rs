//! Multi-document YAML written by someone else (the provider components that clusterctl
//! generates), applied to an API server the way `kubectl apply --server-side` does.
//!
//! Each object's kind is resolved through API discovery, so any kind the server serves works
//! without code here; resolutions are remembered per [`Applier`]. Objects are applied in the
//! order given (clusterctl already puts Namespaces first), with one field manager, forcing
//! ownership of fields another manager set (the environment created the product's CRDs itself).

use std::collections::HashMap;

use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{self, ApiCapabilities, Scope};
use kube::{Api, Client, ResourceExt};
use serde::Deserialize;

use crate::Error;

/// Every object of a multi-document YAML stream, in order; empty documents are skipped.
pub fn parse(yaml: &str) -> Result<Vec<DynamicObject>, Error> {
    let mut objects = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(yaml).enumerate() {
        let value = serde_yaml::Value::deserialize(document)
            .map_err(|e| Error::Setup(format!("YAML document {index}: {e}")))?;
        if value.is_null() {
            continue;
        }
        let object: DynamicObject = serde_yaml::from_value(value)
            .map_err(|e| Error::Setup(format!("YAML document {index}: {e}")))?;
        if object.types.is_none() {
            return Err(Error::Setup(format!(
                "YAML document {index} ({}) has no apiVersion/kind",
                object.name_any()
            )));
        }
        objects.push(object);
    }
    Ok(objects)
}

/// `Kind namespace/name` (or `Kind name`), for messages.
pub fn describe(object: &DynamicObject) -> String {
    let kind = object.types.as_ref().map_or("?", |t| t.kind.as_str());
    match object.namespace() {
        Some(namespace) => format!("{kind} {namespace}/{}", object.name_any()),
        None => format!("{kind} {}", object.name_any()),
    }
}

/// Applies and reads back objects of any kind the server serves.
pub struct Applier {
    client: Client,
    field_manager: String,
    resolved: HashMap<GroupVersionKind, (ApiResource, ApiCapabilities)>,
}

impl Applier {
    pub fn new(client: Client, field_manager: &str) -> Self {
        Self {
            client,
            field_manager: field_manager.to_owned(),
            resolved: HashMap::new(),
        }
    }

    /// The API of the object's kind, in its namespace if the kind is namespaced.
    pub async fn api_for(&mut self, object: &DynamicObject) -> Result<Api<DynamicObject>, Error> {
        let types = object
            .types
            .as_ref()
            .ok_or_else(|| Error::Setup(format!("{} has no apiVersion/kind", describe(object))))?;
        let gvk = GroupVersionKind::try_from(types)
            .map_err(|e| Error::Setup(format!("{}: {e}", describe(object))))?;
        if !self.resolved.contains_key(&gvk) {
            let found = discovery::pinned_kind(&self.client, &gvk)
                .await
                .map_err(Error::Kube)?;
            self.resolved.insert(gvk.clone(), found);
        }
        let (resource, capabilities) = &self.resolved[&gvk];
        match (&capabilities.scope, object.namespace()) {
            (Scope::Cluster, _) => Ok(Api::all_with(self.client.clone(), resource)),
            (Scope::Namespaced, Some(namespace)) => Ok(Api::namespaced_with(
                self.client.clone(),
                &namespace,
                resource,
            )),
            (Scope::Namespaced, None) => Err(Error::Setup(format!(
                "{} is namespaced but has no namespace",
                describe(object)
            ))),
        }
    }

    /// Server-side applies the object (forcing conflicts) and returns what the server stored.
    pub async fn apply(&mut self, object: &DynamicObject) -> Result<DynamicObject, Error> {
        let api = self.api_for(object).await?;
        let params = PatchParams::apply(&self.field_manager).force();
        api.patch(&object.name_any(), &params, &Patch::Apply(object))
            .await
            .map_err(Error::Kube)
    }

    /// Reads the object back from the server.
    pub async fn get(&mut self, object: &DynamicObject) -> Result<DynamicObject, Error> {
        let api = self.api_for(object).await?;
        api.get(&object.name_any()).await.map_err(Error::Kube)
    }
}
