use super::DurationErrorKind as E;
use super::*;
use proptest::prelude::*;

fn ttl(input: &str) -> Result<i64, DurationErrorKind> {
    input
        .parse::<Ttl>()
        .map(Ttl::as_seconds)
        .map_err(|error| error.kind)
}

/// cluster-api-k8s `TTLToSeconds` (pkg/time/duration.go, as of ae5973f), input by input:
/// what Go returns (`None` = error) and what we return. Rows where both accept give the
/// same seconds; every row where the answers differ says why.
#[test]
fn cluster_api_k8s_parity() {
    const Y: i64 = 365 * DAY;
    const MO: i64 = 30 * DAY;
    type Row = (&'static str, Option<i64>, Result<i64, DurationErrorKind>);
    let same: &[Row] = &[
        // Hand-parsed units y, mo, d (Go lower-cases a one-letter unit: 1Y, 1D).
        ("1y", Some(Y), Ok(Y)),
        ("1Y", Some(Y), Ok(Y)),
        ("6mo", Some(6 * MO), Ok(6 * MO)),
        ("90d", Some(90 * DAY), Ok(90 * DAY)),
        ("1D", Some(DAY), Ok(DAY)),
        ("01y", Some(Y), Ok(Y)),
        ("100y", Some(100 * Y), Ok(100 * Y)),
        // One number and one unit handed to time.ParseDuration: h, m, s.
        ("12h", Some(12 * HOUR), Ok(12 * HOUR)),
        ("90m", Some(90 * MINUTE), Ok(90 * MINUTE)),
        ("30s", Some(30), Ok(30)),
        ("3600s", Some(3600), Ok(3600)),
        // Rejected by both.
        ("", None, Err(E::Empty)),
        ("0", None, Err(E::Zero)),
        ("y", None, Err(E::Unexpected('y'))),
        ("10", None, Err(E::MissingUnit("10".into()))),
        ("abc", None, Err(E::Unexpected('a'))),
        ("1x", None, Err(E::UnknownUnit("x".into()))),
        ("1.5h", None, Err(E::Fraction)),
        ("1e3s", None, Err(E::UnknownUnit("e".into()))),
        ("1ms", None, Err(E::UnknownUnit("ms".into()))),
        ("1ns", None, Err(E::UnknownUnit("ns".into()))),
        ("1us", None, Err(E::UnknownUnit("us".into()))),
        ("30M", None, Err(E::AmbiguousUnit)),
        ("99999999999999999999y", None, Err(E::TooLong)),
    ];
    let go_accepts_we_reject: &[Row] = &[
        // Go sends zero and negative lifetimes to the node (design.md §7.4).
        ("0s", Some(0), Err(E::Zero)),
        ("0d", Some(0), Err(E::Zero)),
        ("0y", Some(0), Err(E::Zero)),
        ("0mo", Some(0), Err(E::Zero)),
        ("-1h", Some(-HOUR), Err(E::Negative)),
        ("-1d", Some(-DAY), Err(E::Negative)),
        ("-1mo", Some(-MO), Err(E::Negative)),
        // strconv.Atoi takes a plus sign; we take digits only.
        ("+1h", Some(HOUR), Err(E::Unexpected('+'))),
        ("+1y", Some(Y), Err(E::Unexpected('+'))),
        // Over 10000y: Go multiplies without an overflow check; no date could hold it.
        ("300000y", Some(300_000 * Y), Err(E::TooLong)),
    ];
    let extensions: &[Row] = &[
        // Compounds, largest unit first.
        ("1h30m", None, Ok(HOUR + 30 * MINUTE)),
        ("1y6mo", None, Ok(Y + 6 * MO)),
        ("1d12h", None, Ok(DAY + 12 * HOUR)),
        (
            "1y2mo3w4d5h6m7s",
            None,
            Ok(Y + 2 * MO + 21 * DAY + 4 * DAY + 5 * HOUR + 367),
        ),
        // Weeks.
        ("1w", None, Ok(7 * DAY)),
        ("2W", None, Ok(14 * DAY)),
        // Surrounding ASCII whitespace.
        (" 1y", None, Ok(Y)),
        ("1y ", None, Ok(Y)),
        ("\t90d\n", None, Ok(90 * DAY)),
        // Case-insensitive units where Go's time.ParseDuration is case-sensitive.
        ("12H", None, Ok(12 * HOUR)),
        ("30S", None, Ok(30)),
        ("6MO", None, Ok(6 * MO)),
        ("6Mo", None, Ok(6 * MO)),
        ("6mO", None, Ok(6 * MO)),
        // Go's ParseDuration overflows past ~292 years of hours; we go to 10000y.
        ("2562048h", None, Ok(2_562_048 * HOUR)),
    ];
    for (input, go, ours) in same.iter().chain(go_accepts_we_reject).chain(extensions) {
        assert_eq!(&ttl(input), ours, "input {input:?}");
        let agree = match (go, ours) {
            (Some(go), Ok(ours)) => go == ours,
            (None, Err(_)) => true,
            _ => false,
        };
        let listed_as_same = same.iter().any(|(same, _, _)| same == input);
        assert_eq!(
            agree, listed_as_same,
            "input {input:?}: classify the row correctly"
        );
    }
}

#[test]
fn ttl_table() {
    let rows: &[(&str, Result<i64, DurationErrorKind>)] = &[
        ("1y", Ok(31_536_000)),
        ("6mo", Ok(15_552_000)),
        ("90d", Ok(7_776_000)),
        ("12h", Ok(43_200)),
        ("1h30m", Ok(5_400)),
        ("1y6mo", Ok(47_088_000)),
        ("1w", Ok(604_800)),
        ("  1y6mo  ", Ok(47_088_000)),
        ("1Y6MO", Ok(47_088_000)),
        ("1H30m", Ok(5_400)),
        ("10000y", Ok(MAX_SECONDS)),
        ("0", Err(E::Zero)),
        ("0s", Err(E::Zero)),
        ("0h0m", Err(E::Zero)),
        ("-1h", Err(E::Negative)),
        ("abc", Err(E::Unexpected('a'))),
        ("1x", Err(E::UnknownUnit("x".into()))),
        ("1.5h", Err(E::Fraction)),
        ("1,5h", Err(E::Fraction)),
        ("99999999999999999999y", Err(E::TooLong)),
        ("9223372036854775807s", Err(E::TooLong)),
        ("29227716d", Err(E::TooLong)),
        ("10000y1s", Err(E::TooLong)),
        ("", Err(E::Empty)),
        ("   ", Err(E::Empty)),
        ("1h30", Err(E::MissingUnit("30".into()))),
        ("1h 30m", Err(E::Unexpected(' '))),
        ("30m1h", Err(E::UnitOrder("h"))),
        ("1h1h", Err(E::UnitOrder("h"))),
        ("6M", Err(E::AmbiguousUnit)),
        ("1month", Err(E::UnknownUnit("month".into()))),
        ("1hr", Err(E::UnknownUnit("hr".into()))),
        ("1h-30m", Err(E::Unexpected('-'))),
        ("１h", Err(E::Unexpected('１'))),
        ("1h\u{a0}", Err(E::Unexpected('\u{a0}'))),
    ];
    for (input, expected) in rows {
        assert_eq!(&ttl(input), expected, "input {input:?}");
    }
}

#[test]
fn errors_name_the_input_the_reason_and_the_accepted_forms() {
    let error = "abc".parse::<Ttl>().unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid TTL \"abc\": unexpected character 'a'; expected a positive duration such as 1y, 6mo, 90d, 12h, 1h30m or 1y6mo (units: y=365d, mo=30d, w, d, h, m, s)"
    );
    let error = "-1h".parse::<PolicyDuration>().unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid duration \"-1h\": negative durations are not allowed; expected a positive duration such as 30d, 12h, 1h30m or 1w2d (units: y=365d, mo=30d, w, d, h, m, s)"
    );
    let error = "1x".parse::<FailSafeMargin>().unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid fail-safe margin \"1x\": unknown unit \"x\"; expected 0 (no fail-safe) or a positive duration such as 24h, 2d or 1d12h (units: y=365d, mo=30d, w, d, h, m, s)"
    );
    let long = "9".repeat(200);
    let message = long.parse::<Ttl>().unwrap_err().to_string();
    assert!(
        message.contains(&format!("\"{}…\"", "9".repeat(64))),
        "{message}"
    );
    let message = "1\nh".parse::<Ttl>().unwrap_err().to_string();
    assert!(message.starts_with("invalid TTL \"1\\nh\""), "{message}");
}

#[test]
fn the_fail_safe_margin_may_be_zero_and_nothing_else_may() {
    for zero in ["0", "0s", " 0h ", "0d0h"] {
        assert_eq!(
            zero.parse::<FailSafeMargin>()
                .map(FailSafeMargin::as_seconds),
            Ok(0)
        );
        assert_eq!(zero.parse::<PolicyDuration>().unwrap_err().kind, E::Zero);
        assert_eq!(zero.parse::<Ttl>().unwrap_err().kind, E::Zero);
    }
    assert_eq!(FailSafeMargin::from_seconds(0).unwrap().to_string(), "0s");
    assert_eq!(PolicyDuration::from_seconds(0).unwrap_err().kind, E::Zero);
    assert_eq!(Ttl::from_seconds(-1).unwrap_err().kind, E::Negative);
    assert_eq!(
        Ttl::from_seconds(MAX_SECONDS + 1).unwrap_err().kind,
        E::TooLong
    );
    assert_eq!(
        "-0s".parse::<FailSafeMargin>().unwrap_err().kind,
        E::Negative
    );
}

#[test]
fn worker_lifetimes_fit_a_csr() {
    let fits = |_: Ttl| Ok(());
    let too_long = |ttl| Err(WorkerTtlError::TooLong(ttl));
    let too_short = |ttl| Err(WorkerTtlError::TooShort(ttl));
    type Expect = fn(Ttl) -> Result<(), WorkerTtlError>;
    let rows: &[(&str, Expect)] = &[
        ("2147483647s", fits),
        ("68y1mo5d3h14m7s", fits),
        ("2147483648s", too_long),
        ("100y", too_long),
        ("10m", fits),
        ("600s", fits),
        ("599s", too_short),
        ("1s", too_short),
        ("1y", fits),
    ];
    for (input, expected) in rows {
        let ttl: Ttl = input.parse().unwrap();
        assert_eq!(ttl.check_worker(), expected(ttl), "input {input}");
        assert_eq!(
            ttl.fits_worker_csr(),
            expected(ttl).is_ok(),
            "input {input}"
        );
    }
    let error = "100y".parse::<Ttl>().unwrap().check_worker().unwrap_err();
    assert_eq!(
        error.to_string(),
        "TTL 100y is too long for a worker node: workers get their certificates through CertificateSigningRequests whose spec.expirationSeconds is a 32-bit integer, so at most 2147483647 seconds (68y1mo5d3h14m7s)"
    );
    assert_eq!(
        "68y1mo5d3h14m7s".parse::<Ttl>().unwrap().as_seconds(),
        WORKER_TTL_MAX_SECONDS
    );
}

#[test]
fn display_is_canonical() {
    let rows = [
        ("1y", "1y"),
        ("90d", "3mo"),
        ("365d", "1y"),
        ("14d", "2w"),
        ("35d", "1mo5d"),
        ("90m", "1h30m"),
        ("3600s", "1h"),
        ("1y6mo", "1y6mo"),
        (" 1Y6MO ", "1y6mo"),
        ("2147483647s", "68y1mo5d3h14m7s"),
    ];
    for (input, canonical) in rows {
        assert_eq!(
            input.parse::<Ttl>().unwrap().to_string(),
            canonical,
            "input {input}"
        );
    }
}

#[test]
fn serde_uses_the_string_form() {
    let ttl: Ttl = serde_json::from_str("\"90d\"").unwrap();
    assert_eq!(ttl.as_seconds(), 90 * DAY);
    assert_eq!(serde_json::to_string(&ttl).unwrap(), "\"3mo\"");
    let error = serde_json::from_str::<PolicyDuration>("\"0s\"").unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("invalid duration \"0s\": it must be longer")
    );
    assert!(serde_json::from_str::<Ttl>("3600").is_err());
    let margin: FailSafeMargin = serde_json::from_str("\"0\"").unwrap();
    assert_eq!(margin.as_seconds(), 0);
}

#[test]
fn a_spread_is_zero_or_positive_and_names_itself() {
    for (input, seconds) in [
        ("0", 0),
        ("0s", 0),
        ("15m", 900),
        ("2h30m", 9000),
        ("7d", 7 * DAY),
    ] {
        assert_eq!(
            input.parse::<Spread>().map(Spread::as_seconds),
            Ok(seconds),
            "{input}"
        );
    }
    assert_eq!(Spread::ZERO.to_string(), "0s");
    assert_eq!("90m".parse::<Spread>().unwrap().to_string(), "1h30m");
    let error = "-15m".parse::<Spread>().unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid spread \"-15m\": negative durations are not allowed; expected 0 (no staggering) or a positive duration such as 15m, 1h or 2h30m (units: y=365d, mo=30d, w, d, h, m, s)"
    );
    assert_eq!(
        Spread::from_seconds(-1).unwrap_err().kind,
        DurationErrorKind::Negative
    );
    let schema = serde_json::to_value(schemars::schema_for!(Spread)).unwrap();
    assert_eq!(schema["pattern"], MARGIN_PATTERN);
    assert_eq!(
        schema["x-kubernetes-validations"][0]["rule"],
        NON_EMPTY_RULE
    );
    assert_eq!(
        schema["x-kubernetes-validations"][0]["message"],
        SPREAD_NON_EMPTY_MESSAGE
    );
}

#[test]
fn schema_is_an_inline_string_with_a_pattern() {
    let schema = serde_json::to_value(schemars::schema_for!(Ttl)).unwrap();
    assert_eq!(schema["type"], "string");
    assert_eq!(schema["pattern"], POSITIVE_PATTERN);
    assert_eq!(schema["x-kubernetes-validations"][0]["rule"], POSITIVE_RULE);
    let schema = serde_json::to_value(schemars::schema_for!(FailSafeMargin)).unwrap();
    assert_eq!(schema["pattern"], MARGIN_PATTERN);
    assert_eq!(
        schema["x-kubernetes-validations"][0]["rule"],
        NON_EMPTY_RULE
    );
}

/// What the API server lets through (the pattern, then the CEL rule, which is a regular
/// expression too) is what the parser accepts, except above the upper bound.
#[test]
fn the_schema_accepts_what_the_parser_accepts() {
    // RE2's `\s` is ASCII whitespace: so is regex's without Unicode.
    let regex = |pattern: &str| regex::Regex::new(&format!("(?-u){pattern}")).unwrap();
    let positive = (regex(POSITIVE_PATTERN), regex("[1-9]"));
    let margin = (regex(MARGIN_PATTERN), regex("[0-9]"));
    let rows = [
        "1y",
        "30d",
        " 1h30m ",
        "\t90d\n",
        "0",
        "0s",
        "00h0m",
        "",
        "   ",
        "1.5h",
        "-1h",
        "+1h",
        "30 d",
        "1h1h",
        "30m1h",
        "6M",
        "1Y6MO",
        "01s",
        "1w2d",
        "10000y",
        "10001y",
        "99999999999999999999y",
    ];
    for input in rows {
        let accepts = |(pattern, rule): &(regex::Regex, regex::Regex)| {
            pattern.is_match(input) && rule.is_match(input)
        };
        let too_long = matches!(input, "10001y" | "99999999999999999999y");
        assert_eq!(
            accepts(&positive),
            input.parse::<Ttl>().is_ok() || too_long,
            "ttl {input:?}"
        );
        assert_eq!(
            accepts(&positive),
            input.parse::<PolicyDuration>().is_ok() || too_long,
            "duration {input:?}"
        );
        assert_eq!(
            accepts(&margin),
            input.parse::<FailSafeMargin>().is_ok() || too_long,
            "margin {input:?}"
        );
    }
}

proptest! {
    #[test]
    fn parsing_never_panics(input in "\\PC*") {
        let _ = input.parse::<Ttl>();
        let _ = input.parse::<FailSafeMargin>();
    }

    #[test]
    fn parsing_near_misses_never_panics(input in "[ 0-9yYmMoOwWdDhHsS+.,-]{0,24}") {
        let _ = input.parse::<Ttl>();
        let _ = input.parse::<PolicyDuration>();
    }

    #[test]
    fn display_round_trips(seconds in 1..=MAX_SECONDS) {
        let ttl = Ttl::from_seconds(seconds).unwrap();
        prop_assert_eq!(ttl.to_string().parse::<Ttl>(), Ok(ttl));
        let margin = FailSafeMargin::from_seconds(seconds - 1).unwrap();
        prop_assert_eq!(margin.to_string().parse::<FailSafeMargin>(), Ok(margin));
    }

    #[test]
    fn compounds_add_up(y in 0..100i64, mo in 0..100i64, d in 0..1000i64, h in 0..100i64, s in 0..100_000i64) {
        let input = format!("{y}y{mo}mo{d}d{h}h{s}s");
        let seconds = y * 365 * DAY + mo * 30 * DAY + d * DAY + h * HOUR + s;
        let parsed = input.parse::<FailSafeMargin>().map(FailSafeMargin::as_seconds);
        prop_assert_eq!(parsed, Ok(seconds));
    }
}
