//! The loop every target shares: inputs (the seed corpus first, then generated ones), each run
//! under `catch_unwind` and timed, a watchdog for inputs that never return, and one report row.
//!
//! Input `i` of a target comes from an RNG seeded with (`FUZZ_SEED`, target, `i`) alone, so any
//! input can be rebuilt from its index: `FUZZ_ONLY=i` runs just that one.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// splitmix64: tiny, fast, and good enough to drive mutations.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        match n {
            0 => 0,
            n => (self.next() % n as u64) as usize,
        }
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: i64, hi: i64) -> i64 {
        let span = hi.wrapping_sub(lo) as u64;
        match span.checked_add(1) {
            Some(n) => lo.wrapping_add((self.next() % n) as i64),
            None => self.next() as i64,
        }
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    /// One of `items`, which must not be empty (the tables it is used on are constants).
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// [`Self::pick`] for values that are not `Copy`.
    pub fn pick_ref<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// FNV-1a: derives a check's extra parameters (zone, instants, status) from the input alone,
/// so that an input reproduces by itself.
pub fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    match value.replace(['_', ','], "").parse() {
        Ok(n) => Some(n),
        Err(_) => panic!("{name}={value:?} is not a number"),
    }
}

/// `FUZZ_CASES`: inputs per target. Small by default so that `cargo test` stays quick; `make
/// fuzz` sets 1,000,000.
pub fn cases() -> u64 {
    env_u64("FUZZ_CASES").unwrap_or(2_000)
}

/// The longest any one input may take. Generous: it is there to catch runaway work (an
/// exponential search, a quadratic blow-up on a long input), not to benchmark.
fn bound() -> Duration {
    let default = if cfg!(debug_assertions) {
        20_000
    } else {
        2_000
    };
    Duration::from_millis(env_u64("FUZZ_MAX_MS").unwrap_or(default))
}

thread_local! {
    /// Set while an input runs: its panic is recorded, not printed.
    static QUIET: Cell<bool> = const { Cell::new(false) };
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Panics of fuzzed inputs are collected and reported at the end; any other panic (a failing
/// assertion of the harness itself) is printed as usual.
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if QUIET.with(Cell::get) {
                let message = match info.location() {
                    Some(at) => format!("{info} (at {at})"),
                    None => info.to_string(),
                };
                LAST_PANIC.with(|last| *last.borrow_mut() = Some(message));
            } else {
                default(info);
            }
        }));
    });
}

/// Where panicking inputs are written, to be added to the corpus once the parser is fixed.
fn crash_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("fuzz").join("crashes")
}

/// The seed corpus of a target: `fuzz/corpus/<target>/`. A `.txt` file holds one input per
/// line (`#` starts a comment line; `\n`, `\t`, `\r`, `\0`, `\xNN`, `\u{N}` and `\\` are
/// unescaped); any other file is one input.
pub fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries.filter_map(|e| Some(e.ok()?.path())).collect(),
        Err(err) => panic!("reading the corpus {}: {err}", dir.display()),
    };
    files.sort();
    let mut inputs = Vec::new();
    for file in files {
        let bytes = match std::fs::read(&file) {
            Ok(bytes) => bytes,
            Err(err) => panic!("reading {}: {err}", file.display()),
        };
        if file.extension().is_some_and(|e| e == "txt") {
            for line in String::from_utf8_lossy(&bytes).lines() {
                if !line.starts_with('#') {
                    inputs.push(unescape(line).into_bytes());
                }
            }
        } else {
            inputs.push(bytes);
        }
    }
    assert!(!inputs.is_empty(), "the corpus {} is empty", dir.display());
    inputs
}

fn unescape(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (c, c == '\\') {
            (_, true) => match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('r') => out.push('\r'),
                Some('0') => out.push('\0'),
                Some('x') => {
                    let hex: String = chars.by_ref().take(2).collect();
                    out.push(u8::from_str_radix(&hex, 16).map_or('\u{fffd}', char::from));
                }
                Some('u') => {
                    let hex: String = chars.by_ref().skip(1).take_while(|c| *c != '}').collect();
                    let c = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32);
                    out.push(c.unwrap_or('\u{fffd}'));
                }
                Some(other) => out.push(other),
                None => out.push('\\'),
            },
            (c, false) => out.push(c),
        }
    }
    out
}

/// What a run found.
struct Finding {
    index: u64,
    input: Vec<u8>,
    message: String,
}

/// Runs `check` on the corpus and then on generated inputs, `cases()` in all, and fails the
/// test if any input panicked or took longer than the bound. `check` names how far the input
/// got (rejected early, parsed, accepted, …): the tally shows that the generators reach the
/// deep paths, not only the first error.
pub fn run(
    target: &str,
    corpus: &[Vec<u8>],
    generate: impl Fn(&mut Rng, &[Vec<u8>]) -> Vec<u8>,
    check: impl Fn(&[u8]) -> &'static str,
) {
    install_panic_hook();
    let cases = cases();
    let seed = env_u64("FUZZ_SEED").unwrap_or(1);
    let only = env_u64("FUZZ_ONLY");
    let bound = bound();
    let show_slow = env_u64("FUZZ_SHOW_SLOW_MS").map(Duration::from_millis);
    let input_of = |index: u64| match usize::try_from(index).ok().and_then(|i| corpus.get(i)) {
        Some(input) => input.clone(),
        None => {
            let mut rng = Rng::new(
                seed ^ hash(target.as_bytes()) ^ index.wrapping_mul(0x2545_F491_4F6C_DD1D),
            );
            generate(&mut rng, corpus)
        }
    };

    let watch = Watchdog::start(target, bound);
    let started = Instant::now();
    let mut panics: Vec<Finding> = Vec::new();
    let mut panic_count = 0u64;
    let mut slowest = (Duration::ZERO, 0u64, Vec::new());
    let mut tried = 0u64;
    let mut outcomes: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut bytes = 0u64;
    let indices = match only {
        Some(index) => index..index + 1,
        None => 0..cases,
    };
    for index in indices {
        let input = input_of(index);
        watch.begin(index);
        let at = Instant::now();
        QUIET.with(|q| q.set(true));
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| check(&input)));
        QUIET.with(|q| q.set(false));
        let took = at.elapsed();
        watch.end();
        tried += 1;
        bytes += input.len() as u64;
        match &outcome {
            Ok(label) => *outcomes.entry(label).or_default() += 1,
            Err(_) => *outcomes.entry("panicked").or_default() += 1,
        }
        if outcome.is_err() {
            panic_count += 1;
            let message = LAST_PANIC
                .with(|last| last.borrow_mut().take())
                .unwrap_or_else(|| "a panic without a message".into());
            if panics.len() < 10 {
                panics.push(Finding {
                    index,
                    input: input.clone(),
                    message,
                });
            }
        }
        if show_slow.is_some_and(|limit| took > limit) {
            println!("{target}: input #{index} took {took:?}: {}", shown(&input));
        }
        if took > slowest.0 {
            slowest = (took, index, input);
        }
    }
    let elapsed = started.elapsed();
    watch.stop();

    let row = format!(
        "{target:<12} {tried:>10} {panic_count:>6} {secs:>9.1} {rate:>9} {slow:>11.2} {avg:>8}",
        secs = elapsed.as_secs_f64(),
        rate = (tried as f64 / elapsed.as_secs_f64().max(1e-9)).round() as u64,
        slow = slowest.0.as_secs_f64() * 1000.0,
        avg = bytes / tried.max(1),
    );
    let tally: Vec<String> = outcomes
        .iter()
        .map(|(label, n)| format!("{label} {:.1}%", *n as f64 * 100.0 / tried.max(1) as f64))
        .collect();
    let row = format!("{row}\n  ({})", tally.join(", "));
    println!("{row}");
    if let Some(path) = std::env::var_os("FUZZ_REPORT") {
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut file| writeln!(file, "{row}"));
        if let Err(err) = written {
            panic!("writing the report {}: {err}", Path::new(&path).display());
        }
    }

    if !panics.is_empty() {
        let dir = crash_dir();
        let mut report = format!("{target}: {panic_count} of {tried} inputs panicked\n");
        for finding in &panics {
            let file = dir.join(format!("{target}-{}.bin", finding.index));
            let saved = std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(&file, &finding.input))
                .map_or_else(
                    |e| format!("not saved: {e}"),
                    |()| format!("saved to {}", file.display()),
                );
            report.push_str(&format!(
                "- input #{} (FUZZ_ONLY={}; {saved}): {}\n  {}\n",
                finding.index,
                finding.index,
                shown(&finding.input),
                finding.message,
            ));
        }
        panic!("{report}");
    }
    assert!(
        slowest.0 <= bound,
        "{target}: input #{} took {:?}, over the bound of {bound:?}: {}",
        slowest.1,
        slowest.0,
        shown(&slowest.2),
    );
}

/// An input for a message: escaped, and cut if long.
fn shown(input: &[u8]) -> String {
    let text = String::from_utf8_lossy(input);
    let mut out: String = format!("{text:?}").chars().take(2_000).collect();
    if out.len() < format!("{text:?}").len() {
        out.push_str(&format!("… ({} bytes)", input.len()));
    }
    out
}

/// Ends the process when one input runs far past the bound: `catch_unwind` cannot stop an
/// input that loops, and a hung test would otherwise say nothing about which input it was.
struct Watchdog {
    /// Milliseconds since `epoch` at which the current input started, plus one; 0: idle.
    since: Arc<AtomicU64>,
    index: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    epoch: Instant,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn start(target: &str, bound: Duration) -> Self {
        let since = Arc::new(AtomicU64::new(0));
        let index = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let epoch = Instant::now();
        let limit = (bound * 30).max(Duration::from_secs(60));
        let thread = {
            let (since, index, done) = (since.clone(), index.clone(), done.clone());
            let target = target.to_owned();
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(200));
                    let began = since.load(Ordering::Relaxed);
                    let now = epoch.elapsed().as_millis() as u64 + 1;
                    if began != 0 && now.saturating_sub(began) > limit.as_millis() as u64 {
                        let index = index.load(Ordering::Relaxed);
                        eprintln!(
                            "{target}: input #{index} has run for more than {limit:?}: it hangs (reproduce with FUZZ_ONLY={index})"
                        );
                        std::process::exit(3);
                    }
                }
            })
        };
        Self {
            since,
            index,
            done,
            epoch,
            thread: Some(thread),
        }
    }

    fn begin(&self, index: u64) {
        self.index.store(index, Ordering::Relaxed);
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        self.since.store(now, Ordering::Relaxed);
    }

    fn end(&self) {
        self.since.store(0, Ordering::Relaxed);
    }

    fn stop(mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
