//! The duration grammar (`ck8s_certs_api::duration`): the `refresh-certificates` annotation,
//! a policy's `ttl`, `renewBefore`, `failSafeMargin`, `spread`, `duration` and the backoff flags.
//! Every type parses the same text; a parsed value must print canonically and parse back to
//! itself (the docs promise it).

use ck8s_certs::policy::{FailSafeMargin, PolicyDuration, Spread, Ttl};
use ck8s_certs::refresh::band::TtlBand;
use ck8s_certs::refresh::trigger::check_trigger;
use ck8s_certs_api::machine::MachineView;

use super::harness::Rng;
use super::mutate;

const UNITS: &[&str] = &[
    "y", "Y", "mo", "MO", "Mo", "mO", "w", "W", "d", "D", "h", "H", "m", "M", "s", "S", "ms", "us",
    "µs", "ns", "yr", "min", "sec", "months", "x", "",
];

const NUMBERS: &[&str] = &[
    "0",
    "00",
    "1",
    "6",
    "7",
    "10",
    "12",
    "24",
    "30",
    "36",
    "59",
    "60",
    "68",
    "69",
    "90",
    "365",
    "600",
    "8760",
    "9999",
    "10000",
    "10001",
    "31536000",
    "2147483647",
    "2147483648",
    "315360000000",
    "315360000001",
    "9223372036854775807",
    "9223372036854775808",
    "99999999999999999999999",
];

pub const WORDS: &[&str] = &[
    "1y", "6mo", "90d", "12h", "1h30m", "1y6mo", "8760h", "10m", "30d", "2w", "24h", "0", "0s",
    "1yr", "1M", "1.5h", "-1h", "+1h", "1e3s", "10000y", "10001y", "1h 30m", "30m1h", "1h1h",
];

/// A value of the grammar or near it: components in order or not, edge numbers, odd units,
/// whitespace, signs and fractions.
fn generate_text(rng: &mut Rng) -> String {
    let mut text = String::new();
    match rng.below(10) {
        0..=5 => {
            for _ in 0..=rng.below(4) {
                let number = match rng.chance(70) {
                    true => rng.pick(NUMBERS).to_string(),
                    false => rng.between(0, 1_000_000).to_string(),
                };
                text.push_str(&number);
                text.push_str(rng.pick(UNITS));
                if rng.chance(5) {
                    text.push_str(rng.pick(&[" ", ".5", ",5", "_", "\u{a0}"]));
                }
            }
        }
        6 => text.push_str(rng.pick(WORDS)),
        7 => text.push_str(rng.pick(NUMBERS)),
        8 => text = mutate::string(rng, WORDS),
        _ => {
            text.push_str(rng.pick(&["-", "+", "", "."]));
            text.push_str(rng.pick(NUMBERS));
            text.push_str(rng.pick(&[".5", "e3", ".", ""]));
            text.push_str(rng.pick(UNITS));
        }
    }
    if rng.chance(20) {
        let pad = rng.pick(&[" ", "\t", "\n", "\r", "\x0b", "\x0c", "\u{a0}", "\u{3000}"]);
        match rng.below(3) {
            0 => text.insert_str(0, pad),
            1 => text.push_str(pad),
            _ => text = format!("{pad}{text}{pad}"),
        }
    }
    text
}

pub fn generate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut input = match rng.chance(50) {
        true => rng.pick_ref(corpus).clone(),
        false => generate_text(rng).into_bytes(),
    };
    if rng.chance(60) {
        mutate::bytes(rng, &mut input, WORDS, corpus);
    }
    input
}

/// Parses as each type; whatever parses prints canonically and parses back to the same value.
pub fn check(input: &[u8]) -> &'static str {
    let text = String::from_utf8_lossy(input);
    round_trip::<Ttl>(&text, Ttl::as_seconds);
    round_trip::<PolicyDuration>(&text, PolicyDuration::as_seconds);
    round_trip::<FailSafeMargin>(&text, FailSafeMargin::as_seconds);
    round_trip::<Spread>(&text, Spread::as_seconds);
    if let Ok(ttl) = text.parse::<Ttl>() {
        let _ = ttl.fits_worker_csr();
        if let Err(err) = ttl.check_worker() {
            let _ = err.to_string();
        }
    }
    // As the CRD fields deserialise (JSON string) and as the trigger annotation is checked.
    let json = serde_json::Value::String(text.clone().into_owned()).to_string();
    let _ = serde_json::from_str::<Ttl>(&json);
    for control_plane in [true, false] {
        let machine = MachineView {
            namespace: "fleet".into(),
            name: "m".into(),
            control_plane,
            ..Default::default()
        };
        // The default band, and one as wide as the grammar (the other checks alone).
        let wide = TtlBand::new(
            Ttl::from_secs_const(1),
            Ttl::from_secs_const(ck8s_certs_api::duration::MAX_SECONDS),
        );
        for band in [Ok(TtlBand::default()), wide].into_iter().flatten() {
            if let Err(refusal) = check_trigger(&machine, &text, band) {
                let _ = refusal.message(&machine);
            }
            let _ = band.refuse_request(&text);
        }
    }
    match (text.parse::<Ttl>(), text.parse::<Spread>()) {
        (Ok(ttl), _) if ttl.fits_worker_csr() => "valid",
        (Ok(_), _) => "valid, not for a worker",
        (Err(_), Ok(_)) => "zero",
        (Err(_), Err(_)) => "refused",
    }
}

fn round_trip<T>(text: &str, seconds: fn(T) -> i64)
where
    T: std::str::FromStr<Err: std::fmt::Display> + std::fmt::Display + Copy + PartialEq,
{
    match text.parse::<T>() {
        Ok(value) => {
            let printed = value.to_string();
            match printed.parse::<T>() {
                Ok(again) => assert!(
                    again == value,
                    "{text:?} printed as {printed:?}, which parses to {} s, not {} s",
                    seconds(again),
                    seconds(value)
                ),
                Err(err) => panic!("{text:?} printed as {printed:?}, which does not parse: {err}"),
            }
        }
        Err(err) => {
            let _ = err.to_string();
        }
    }
}
