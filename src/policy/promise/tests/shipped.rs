//! The policies the project ships keep their promise: `config/samples` and the examples of the
//! docs, as a user copies them.

use std::path::Path;

use super::*;

/// The ```yaml blocks of a Markdown text.
fn yaml_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let fence = line.trim_start().starts_with("```");
        match (current.as_mut(), fence) {
            (None, true) if line.trim_start().starts_with("```yaml") => {
                current = Some(String::new())
            }
            (Some(_), true) => blocks.extend(current.take()),
            (Some(block), false) => {
                block.push_str(line);
                block.push('\n');
            }
            _ => {}
        }
    }
    blocks
}

#[test]
fn the_samples_and_the_examples_of_the_docs_keep_their_promise() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut texts = Vec::new();
    for dir in ["config/samples", "docs"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            match path.extension().and_then(|e| e.to_str()) {
                Some("yaml") => texts.push((path, text)),
                Some("md") => {
                    texts.extend(yaml_blocks(&text).into_iter().map(|b| (path.clone(), b)))
                }
                _ => {}
            }
        }
    }
    let mut checked = 0;
    for (path, text) in texts {
        for document in serde_yaml::Deserializer::from_str(&text) {
            let Ok(object) = <Value as serde::Deserialize>::deserialize(document) else {
                continue;
            };
            if object["kind"] != "CertificateRenewalPolicy" {
                continue;
            }
            let spec: CertificateRenewalPolicySpec =
                serde_json::from_value(object["spec"].clone()).unwrap();
            let answer = check(&validate(&spec).unwrap(), Backoff::default(), utc(NOW));
            assert!(
                matches!(answer, Ok(Promise::Kept(_) | Promise::Nothing)),
                "{} {}: {answer:?}",
                path.display(),
                object["metadata"]["name"]
            );
            checked += 1;
        }
    }
    // The four samples and the example of docs/policies.md.
    assert!(checked >= 5, "{checked}");
}
