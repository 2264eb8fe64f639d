use super::*;

fn held_by(holder: &str, seconds: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: Some(seconds),
        ..Default::default()
    }
}

fn settings() -> Settings {
    Settings {
        namespace: "ns".into(),
        name: "lease".into(),
        identity: "me".into(),
        lease_duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(2),
    }
}

#[test]
fn a_missing_or_released_lease_is_taken() {
    assert_eq!(claim(None, "me", Duration::ZERO), Claim::Take);
    let released = LeaseSpec::default();
    assert_eq!(claim(Some(&released), "me", Duration::ZERO), Claim::Take);
    let empty = held_by("", 15);
    assert_eq!(claim(Some(&empty), "me", Duration::ZERO), Claim::Take);
}

#[test]
fn our_own_lease_is_renewed_whatever_its_age() {
    let ours = held_by("me", 15);
    assert_eq!(
        claim(Some(&ours), "me", Duration::from_secs(3600)),
        Claim::Renew
    );
}

#[test]
fn another_holder_is_waited_for_until_a_whole_duration_without_change() {
    let theirs = held_by("other", 15);
    assert_eq!(
        claim(Some(&theirs), "me", Duration::ZERO),
        Claim::Wait(Duration::from_secs(15))
    );
    assert_eq!(
        claim(Some(&theirs), "me", Duration::from_secs(14)),
        Claim::Wait(Duration::from_secs(1))
    );
    assert_eq!(
        claim(Some(&theirs), "me", Duration::from_secs(15)),
        Claim::Take
    );
}

#[test]
fn odd_durations_fall_back_safely() {
    let no_duration = LeaseSpec {
        holder_identity: Some("other".into()),
        ..Default::default()
    };
    assert_eq!(
        claim(Some(&no_duration), "me", Duration::from_secs(14)),
        Claim::Wait(Duration::from_secs(1))
    );
    let negative = held_by("other", -5);
    assert_eq!(claim(Some(&negative), "me", Duration::ZERO), Claim::Take);
}

#[test]
fn taking_counts_a_transition_and_renewing_keeps_the_acquire_time() {
    let now = Timestamp::from_second(1_800_000_000).unwrap();
    let later = Timestamp::from_second(1_800_000_010).unwrap();
    let mut theirs = held_by("other", 15);
    theirs.lease_transitions = Some(4);
    let taken = next_spec(Some(&theirs), &settings(), now);
    assert_eq!(taken.holder_identity.as_deref(), Some("me"));
    assert_eq!(taken.lease_transitions, Some(5));
    assert_eq!(taken.acquire_time, Some(MicroTime(now)));
    assert_eq!(taken.lease_duration_seconds, Some(15));
    let renewed = next_spec(Some(&taken), &settings(), later);
    assert_eq!(renewed.lease_transitions, Some(5));
    assert_eq!(renewed.acquire_time, Some(MicroTime(now)));
    assert_eq!(renewed.renew_time, Some(MicroTime(later)));
    let first = next_spec(None, &settings(), now);
    assert_eq!(first.lease_transitions, Some(1));
}

#[test]
fn timings_must_nest() {
    assert!(settings().validate().is_ok());
    let mut s = settings();
    s.renew_deadline = Duration::from_secs(15);
    assert!(matches!(
        s.validate(),
        Err(SettingsError::LeaseNotLongerThanRenew { .. })
    ));
    let mut s = settings();
    s.retry_period = Duration::from_secs(10);
    assert!(matches!(
        s.validate(),
        Err(SettingsError::RenewNotLongerThanRetry { .. })
    ));
    let mut s = settings();
    s.lease_duration = Duration::from_millis(15_500);
    assert!(matches!(s.validate(), Err(SettingsError::LeaseDuration)));
    let mut s = settings();
    s.retry_period = Duration::from_millis(10);
    assert!(matches!(s.validate(), Err(SettingsError::RetryTooShort)));
}

#[test]
fn the_lease_outlasts_the_renew_deadline_by_a_margin() {
    let with = |lease: u64, renew_ms: u64| Settings {
        lease_duration: Duration::from_secs(lease),
        renew_deadline: Duration::from_millis(renew_ms),
        retry_period: Duration::from_millis(500),
        ..settings()
    };
    // 2 s at least…
    assert!(with(6, 4_000).validate().is_ok());
    assert!(matches!(
        with(6, 4_500).validate(),
        Err(SettingsError::MarginTooSmall { needed, .. }) if needed == Duration::from_secs(2)
    ));
    // …and a fifth of the lease.
    assert!(with(60, 48_000).validate().is_ok());
    assert!(matches!(
        with(60, 50_000).validate(),
        Err(SettingsError::MarginTooSmall { needed, .. }) if needed == Duration::from_secs(12)
    ));
}

#[test]
fn identities_are_unique_per_call() {
    assert_ne!(identity(None), identity(None));
}
