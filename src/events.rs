//! Events, published as kube-runtime's `Recorder` publishes them (a repeat within six minutes
//! raises the count of one Event's series instead of making another), except that the note is
//! part of what makes two the same. kube-runtime's `Recorder` keys a series without the note, so
//! a repeat with a new message only raised the count of the first Event, whose message stayed:
//! a refresh that failed on a kubeconfig's `tokenFile`, then on its `exec`, still read
//! "`tokenFile`". Here a new message is a new Event.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};

pub use kube::runtime::events::{Event, EventType, Reporter};

/// How long an Event's series stays open to repeats (kube-runtime's and client-go's).
const SERIES_OPEN_FOR: SignedDuration = SignedDuration::from_mins(6);

/// The longest note the API server accepts, in bytes.
const NOTE_MAX: usize = 1024;

/// What makes two Events one series: all kube-runtime keys on, and the note.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    type_: &'static str,
    action: String,
    reason: String,
    note: Option<String>,
    regarding: Reference,
    related: Option<Reference>,
}

/// The fields of an object reference that name the object.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Reference {
    api_version: Option<String>,
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
}

impl From<&ObjectReference> for Reference {
    fn from(r: &ObjectReference) -> Self {
        Self {
            api_version: r.api_version.clone(),
            kind: r.kind.clone(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            uid: r.uid.clone(),
        }
    }
}

fn type_name(type_: EventType) -> &'static str {
    match type_ {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

fn key(event: &Event, regarding: &ObjectReference) -> Key {
    Key {
        type_: type_name(event.type_),
        action: event.action.clone(),
        reason: event.reason.clone(),
        note: event.note.clone(),
        regarding: regarding.into(),
        related: event.secondary.as_ref().map(Reference::from),
    }
}

/// Publishes Events for one controller (cheap to clone: clones share the open series).
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    reporter: Reporter,
    open: Arc<Mutex<HashMap<Key, K8sEvent>>>,
}

impl Recorder {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            open: Arc::default(),
        }
    }

    /// Publishes `event` about `regarding`: a new Event, or the next of an open series with the
    /// same type, action, reason, note and objects.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = key(event, regarding);
        let repeat = {
            let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
            open.retain(|_, e| last_seen(e).is_some_and(|at| at + SERIES_OPEN_FOR > now));
            open.get(&key).cloned()
        };
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        let published = match repeat {
            Some(mut series) => {
                let count = series.series.as_ref().map_or(2, |s| s.count + 1);
                series.series = Some(EventSeries {
                    count,
                    last_observed_time: MicroTime(now),
                });
                api.patch(
                    &series.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&series),
                )
                .await?;
                series
            }
            None => {
                let new = self.new_event(event, regarding, now);
                api.create(&PostParams::default(), &new).await?;
                new
            }
        };
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, published);
        Ok(())
    }

    fn new_event(&self, event: &Event, regarding: &ObjectReference, now: Timestamp) -> K8sEvent {
        let controller = &self.reporter.controller;
        K8sEvent {
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            // The API server refuses a longer note (the whole Event would be lost).
            note: event
                .note
                .clone()
                .map(|note| crate::text::truncate(note, NOTE_MAX)),
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_ref().unwrap_or(controller),
                    now.as_nanosecond()
                )),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            type_: Some(type_name(event.type_).to_owned()),
            related: event.secondary.clone(),
            ..K8sEvent::default()
        }
    }
}

/// When an Event (or its series) was last seen.
fn last_seen(event: &K8sEvent) -> Option<Timestamp> {
    event
        .series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or_else(|| event.event_time.as_ref().map(|t| t.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(note: &str) -> Event {
        Event {
            type_: EventType::Warning,
            reason: "CertificatesRefreshFailed".into(),
            note: Some(note.into()),
            action: "Refresh".into(),
            secondary: None,
        }
    }

    fn machine(uid: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("cluster.x-k8s.io/v1beta2".into()),
            kind: Some("Machine".into()),
            namespace: Some("fleet".into()),
            name: Some("alpha-cp-0".into()),
            uid: Some(uid.into()),
            ..ObjectReference::default()
        }
    }

    #[tokio::test]
    async fn a_note_is_cut_to_what_the_api_server_accepts() {
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap()))
                .unwrap();
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: "c".into(),
                instance: None,
            },
        );
        let long = "é".repeat(2000);
        let published = recorder.new_event(&event(&long), &machine("u1"), Timestamp::now());
        let note = published.note.unwrap();
        assert!(
            note.len() <= NOTE_MAX && note.ends_with('…'),
            "{} bytes",
            note.len()
        );
    }

    #[test]
    fn a_new_note_is_a_new_series_and_the_same_note_the_same() {
        let tokenfile = event("the kubeconfig is unusable: `tokenFile`");
        let exec = event("the kubeconfig is unusable: `exec`");
        let m = machine("u1");
        let again = event("the kubeconfig is unusable: `tokenFile`");
        assert_eq!(key(&tokenfile, &m), key(&again, &m.clone()));
        assert_ne!(key(&tokenfile, &m), key(&exec, &m));
        // As kube-runtime: another object, type or reason is another series too.
        assert_ne!(key(&tokenfile, &m), key(&tokenfile, &machine("u2")));
        let normal = Event {
            type_: EventType::Normal,
            ..event("the kubeconfig is unusable: `tokenFile`")
        };
        assert_ne!(key(&tokenfile, &m), key(&normal, &m));
    }

    #[test]
    fn a_series_is_open_for_six_minutes_after_it_was_last_seen() {
        let at = |s: i64| Timestamp::from_second(s).unwrap();
        let mut e = K8sEvent {
            event_time: Some(MicroTime(at(1000))),
            ..K8sEvent::default()
        };
        assert_eq!(last_seen(&e), Some(at(1000)));
        e.series = Some(EventSeries {
            count: 2,
            last_observed_time: MicroTime(at(1300)),
        });
        assert_eq!(last_seen(&e), Some(at(1300)));
        assert_eq!(SERIES_OPEN_FOR, SignedDuration::from_secs(360));
    }
}
