//! Reading a policy file as the API server would: the whole object, field problems with their
//! paths, unknown fields, then the controller's own checks.

use std::path::Path;

use ck8s_certs_api::renewal_policy::{CertificateRenewalPolicy, CertificateRenewalPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResourceExt, Resource};
use serde::Deserialize;
use serde_json::Value;

use super::PreviewError;
use crate::policy::{DayOfWeek, FailSafeMargin, Mode, PolicyDuration, Spread, Ttl, WallTime};

pub(super) const KIND: &str = "certificates.ck8s.io/v1alpha1 CertificateRenewalPolicy";

/// The policy as read from the file: its name, and its spec or why it could not be read.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub name: Option<String>,
    pub namespace: Option<String>,
    /// Problems found before validation: unknown fields, values of the wrong form.
    pub problems: Vec<String>,
    /// `None` when the spec could not be read at all (then `problems` says why).
    pub spec: Option<CertificateRenewalPolicySpec>,
}

/// Reads the one `CertificateRenewalPolicy` of a YAML (or JSON) text. Other objects and empty
/// documents are skipped, so a file holding a Namespace and the policy works too.
pub fn load(path: &Path, text: &str) -> Result<Loaded, PreviewError> {
    let yaml_error = |source| PreviewError::Yaml {
        path: path.to_owned(),
        source,
    };
    let documents = serde_yaml::Deserializer::from_str(text)
        .map(serde_yaml::Value::deserialize)
        .collect::<Result<Vec<_>, _>>()
        .map_err(yaml_error)?;
    let field = |value: &serde_yaml::Value, field: &str| {
        value
            .get(field)
            .and_then(serde_yaml::Value::as_str)
            .map(str::to_owned)
    };
    let is_policy = |value: &serde_yaml::Value| {
        field(value, "apiVersion").as_deref()
            == Some(CertificateRenewalPolicy::api_version(&()).as_ref())
            && field(value, "kind").as_deref() == Some(CertificateRenewalPolicy::kind(&()).as_ref())
    };
    let policies: Vec<usize> = (0..documents.len())
        .filter(|&index| is_policy(&documents[index]))
        .collect();
    let (&[index], Some(document)) = (
        policies.as_slice(),
        policies.first().and_then(|&index| documents.get(index)),
    ) else {
        let found: Vec<String> = documents
            .iter()
            .filter(|value| !value.is_null())
            .map(|value| {
                let api_version = field(value, "apiVersion");
                let kind = field(value, "kind");
                format!(
                    "{} {}",
                    api_version.as_deref().unwrap_or("<no apiVersion>"),
                    kind.as_deref().unwrap_or("<no kind>")
                )
            })
            .collect();
        return Err(PreviewError::PolicyCount {
            path: path.to_owned(),
            count: policies.len(),
            found: match found.is_empty() {
                true => "nothing".to_owned(),
                false => found.join(", "),
            },
        });
    };
    let metadata = document.get("metadata");
    let mut loaded = Loaded {
        name: metadata.and_then(|metadata| field(metadata, "name")),
        namespace: metadata.and_then(|metadata| field(metadata, "namespace")),
        problems: document.get("spec").map(unknown_fields).unwrap_or_default(),
        spec: None,
    };
    // Once more, typed this time, straight from the text so that serde's errors carry the path
    // and the line.
    let typed = serde_yaml::Deserializer::from_str(text)
        .nth(index)
        .map(CertificateRenewalPolicy::deserialize);
    match typed {
        Some(Ok(policy)) => loaded.spec = Some(policy.spec),
        Some(Err(error)) => {
            // serde stops at the first error and, for values it does not parse itself
            // (durations, times), names the enclosing object; check the fields one by one.
            let fields = document.get("spec").map(field_problems).unwrap_or_default();
            match fields.is_empty() {
                true => loaded.problems.push(spec_relative(&error.to_string())),
                false => loaded.problems.extend(fields),
            }
        }
        None => loaded
            .problems
            .push("the policy could not be read again".to_owned()),
    }
    Ok(loaded)
}

/// Every spec field whose value does not parse as its type, with its path. Covers every field
/// of the spec (a test checks this against the CRD schema) and those of each window.
pub(super) fn field_problems(spec: &serde_yaml::Value) -> Vec<String> {
    fn problem<T: serde::de::DeserializeOwned>(
        value: Option<&serde_yaml::Value>,
        path: &str,
    ) -> Option<String> {
        let error = serde_yaml::from_value::<T>(value?.clone()).err()?;
        Some(format!("{path}: {error}"))
    }
    // A top-level field: its key is its path.
    fn field<T: serde::de::DeserializeOwned>(
        spec: &serde_yaml::Value,
        key: &str,
    ) -> Option<String> {
        problem::<T>(spec.get(key), key)
    }
    let mut problems = Vec::new();
    problems.extend(field::<LabelSelector>(spec, "clusterSelector"));
    problems.extend(field::<LabelSelector>(spec, "machineSelector"));
    problems.extend(field::<Mode>(spec, "policy"));
    problems.extend(field::<PolicyDuration>(spec, "renewBefore"));
    problems.extend(field::<i32>(spec, "renewBeforePercentage"));
    problems.extend(field::<Ttl>(spec, "ttl"));
    let windows = spec.get("windows");
    problems.extend(problem::<Vec<serde_yaml::Mapping>>(windows, "windows"));
    let windows = windows.and_then(serde_yaml::Value::as_sequence);
    for (index, window) in windows.into_iter().flatten().enumerate() {
        let path = |field: &str| format!("windows[{index}].{field}");
        let days = window.get("daysOfWeek");
        problems.extend(problem::<Vec<serde_yaml::Value>>(days, &path("daysOfWeek")));
        let days = days.and_then(serde_yaml::Value::as_sequence);
        for (day, value) in days.into_iter().flatten().enumerate() {
            let path = format!("{}[{day}]", path("daysOfWeek"));
            problems.extend(problem::<DayOfWeek>(Some(value), &path));
        }
        problems.extend(problem::<WallTime>(window.get("start"), &path("start")));
        problems.extend(problem::<WallTime>(window.get("end"), &path("end")));
        problems.extend(problem::<String>(window.get("schedule"), &path("schedule")));
        let duration = window.get("duration");
        problems.extend(problem::<PolicyDuration>(duration, &path("duration")));
        let timezone = window.get("timezone");
        problems.extend(problem::<Option<String>>(timezone, &path("timezone")));
    }
    problems.extend(field::<FailSafeMargin>(spec, "failSafeMargin"));
    problems.extend(field::<Spread>(spec, "spread"));
    problems.extend(field::<ck8s_certs_api::renewal_policy::InPlaceImpossible>(
        spec,
        "inPlaceImpossible",
    ));
    problems.extend(field::<ck8s_certs_api::renewal_policy::CircuitBreaker>(
        spec,
        "circuitBreaker",
    ));
    problems.extend(field::<ck8s_certs_api::renewal_policy::Canary>(
        spec, "canary",
    ));
    problems
}

/// `spec.windows[0].start: …` as `windows[0].start: …`, the controller's paths.
pub(super) fn spec_relative(message: &str) -> String {
    message
        .strip_prefix("spec.")
        .or_else(|| message.strip_prefix("spec: "))
        .unwrap_or(message)
        .to_owned()
}

/// Fields of `spec` the CRD schema does not declare: the API server would refuse them
/// (kubectl's default strict field validation) or drop them, and a misspelt `renewbefore`
/// silently falling back to the default is exactly what a preview must catch.
pub(super) fn unknown_fields(spec: &serde_yaml::Value) -> Vec<String> {
    let crd = serde_json::to_value(CertificateRenewalPolicy::crd()).unwrap_or_default();
    let schema = crd
        .pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec")
        .cloned()
        .unwrap_or_default();
    // Keys that are not strings fail typed deserialisation, which reports them.
    let Ok(spec) = serde_json::to_value(spec) else {
        return Vec::new();
    };
    let mut unknown = Vec::new();
    walk_unknown(&spec, &schema, "", &mut unknown);
    unknown
}

pub(super) fn walk_unknown(value: &Value, schema: &Value, path: &str, unknown: &mut Vec<String>) {
    match value {
        Value::Object(fields) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            for (key, field) in fields {
                let path = match path {
                    "" => key.clone(),
                    _ => format!("{path}.{key}"),
                };
                match (properties.and_then(|p| p.get(key)), additional) {
                    (Some(schema), _) => walk_unknown(field, schema, &path, unknown),
                    (None, Some(schema)) if schema.is_object() => {
                        walk_unknown(field, schema, &path, unknown)
                    }
                    (None, _) if properties.is_some() => {
                        unknown.push(format!("{path}: unknown field"));
                    }
                    // No declared properties: a free-form object, or a type error that typed
                    // deserialisation reports.
                    (None, _) => {}
                }
            }
        }
        Value::Array(items) => {
            if let Some(schema) = schema.get("items") {
                for (index, item) in items.iter().enumerate() {
                    walk_unknown(item, schema, &format!("{path}[{index}]"), unknown);
                }
            }
        }
        _ => {}
    }
}
