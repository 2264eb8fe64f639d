//! A reconcile that panics fails that object's reconcile, not the process: it is logged with its
//! message, counted (`ck8s_certs_reconcile_errors_total{category="panic"}` where the reconcile is
//! observed) and the object is looked at again after [`RETRY_AFTER`]. One malformed object, or a
//! bug on one path, must not stop the fleet's renewals; the leader would otherwise crash-loop on
//! the same object. (Guards held by the reconcile, such as a refresh's place, are released as
//! the panic unwinds.)

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use kube::runtime::controller::Action;

/// When an object whose reconcile panicked is reconciled again (unless it changes first).
pub const RETRY_AFTER: Duration = Duration::from_secs(60);

/// Runs `reconcile`; a panic becomes a requeue after [`RETRY_AFTER`], and `Err` its message.
pub async fn contained<E>(
    reconcile: impl Future<Output = Result<Action, E>>,
) -> Result<Result<Action, E>, String> {
    match AssertUnwindSafe(reconcile).catch_unwind().await {
        Ok(result) => Ok(result),
        Err(payload) => {
            let message = message_of(payload.as_ref());
            tracing::error!(
                panic = %message,
                "A reconcile panicked: this object's reconcile failed, and is tried again in {}s",
                RETRY_AFTER.as_secs()
            );
            Err(message)
        }
    }
}

/// [`contained`] for a reconcile nobody times: a panic is a requeue.
pub async fn guarded<E>(reconcile: impl Future<Output = Result<Action, E>>) -> Result<Action, E> {
    contained(reconcile)
        .await
        .unwrap_or_else(|_| Ok(Action::requeue(RETRY_AFTER)))
}

fn message_of(payload: &(dyn Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into());
    crate::text::truncate(text, 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_reconcile_is_a_requeue_with_its_message_and_others_go_on() {
        let panicking = async {
            let items: Vec<u8> = Vec::new();
            // An out-of-bounds index: a bug on one object's path.
            let _ = items[usize::from(items.is_empty())];
            Ok::<Action, String>(Action::await_change())
        };
        let message = contained(panicking).await.unwrap_err();
        assert!(message.contains("index out of bounds"), "{message}");
        let formatted = async { panic!("object {} is odd", "m-1") };
        let guarded_result: Result<Action, String> = guarded(formatted).await;
        assert_eq!(guarded_result, Ok(Action::requeue(RETRY_AFTER)));
        // A reconcile that does not panic is untouched, errors included.
        let failing = async { Err::<Action, String>("kube".into()) };
        assert_eq!(contained(failing).await, Ok(Err("kube".into())));
    }
}
