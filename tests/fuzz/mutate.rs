//! Mutations shared by the targets: byte-level (flips, inserts, deletions, repeats, splices,
//! dictionary tokens, truncation) and, for JSON, structural (a random node replaced by a value
//! of another type, a huge number, a long or strange string, deep nesting, extra keys).

use serde_json::{Map, Value};

use super::harness::Rng;

/// No input is larger: the k8sd client reads at most 1 MiB, a Secret holds at most 1 MiB, and
/// the API server sends smaller reviews and objects.
pub const MAX_INPUT: usize = 1 << 20;

/// Tokens that tend to break parsers: signs, separators, numbers at the edges of integer types,
/// Unicode that changes length under case mapping or is invisible, controls.
pub const TOKENS: &[&str] = &[
    "0",
    "-",
    "+",
    "-1",
    "-0",
    ".",
    ",",
    ":",
    "/",
    "*",
    "@",
    "#",
    "?",
    "%",
    "e",
    "E",
    "1e308",
    "1e-400",
    "NaN",
    "Infinity",
    "255",
    "256",
    "32767",
    "65535",
    "65536",
    "2147483647",
    "2147483648",
    "4294967296",
    "9007199254740993",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999999999999999999",
    "00000000000000000000000000000000000001",
    "\0",
    "\t",
    "\n",
    "\r\n",
    "\x0b",
    "\x0c",
    " ",
    "\u{a0}",
    "\u{85}",
    "\u{2028}",
    "\u{3000}",
    "\u{feff}",
    "\u{200b}",
    "\u{202e}",
    "\u{fffd}",
    "é",
    "ß",
    "ı",
    "İ",
    "\u{212a}",
    "ﬀ",
    "𝟙",
    "١",
    "🦀",
    "\u{10ffff}",
    "\"",
    "'",
    "\\",
    "\\u0000",
    "\\ud800",
    "{",
    "}",
    "[",
    "]",
    "null",
    "true",
    "{}",
    "[]",
    "\"\"",
];

/// Replaces `input` by 1 to 4 stacked byte-level mutations. `dict` adds the target's own words;
/// `others` are spliced in.
pub fn bytes(rng: &mut Rng, input: &mut Vec<u8>, dict: &[&str], others: &[Vec<u8>]) {
    for _ in 0..=rng.below(4) {
        one_byte_mutation(rng, input, dict, others);
    }
    input.truncate(MAX_INPUT);
}

fn one_byte_mutation(rng: &mut Rng, input: &mut Vec<u8>, dict: &[&str], others: &[Vec<u8>]) {
    let len = input.len();
    let at = rng.below(len + 1);
    match rng.below(12) {
        0 if len > 0 => {
            let i = rng.below(len);
            input[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len);
            input[i] = rng.pick(&[0x00, 0x20, 0x7f, 0x80, 0xc0, 0xff, b'0', b'9', b'-']);
        }
        2 => {
            let count = 1 + rng.below(8);
            let random: Vec<u8> = (0..count).map(|_| rng.next() as u8).collect();
            input.splice(at..at, random);
        }
        3 if len > 0 => {
            let end = (at + 1 + rng.below(16)).min(len);
            input.drain(at.min(len - 1)..end);
        }
        4 if len > 0 => {
            // Repeat a chunk: long strings, long digit runs, many components.
            let start = rng.below(len);
            let end = (start + 1 + rng.below(32)).min(len);
            let chunk = input[start..end].to_vec();
            let times = rng.pick(&[2, 3, 10, 100, 1000, 10_000]);
            let repeated: Vec<u8> = chunk
                .iter()
                .copied()
                .cycle()
                .take(chunk.len() * times)
                .collect();
            input.splice(start..start, repeated);
        }
        5 => input.truncate(at),
        6 | 7 => {
            let token = match rng.chance(50) && !dict.is_empty() {
                true => rng.pick(dict),
                false => rng.pick(TOKENS),
            };
            input.splice(at..at, token.bytes());
        }
        8 if len > 0 => {
            // Replace a run with a token (a number with another number, say).
            let end = (at + 1 + rng.below(8)).min(len);
            let token = rng.pick(TOKENS);
            input.splice(at.min(len - 1)..end, token.bytes());
        }
        9 if !others.is_empty() => {
            let other = rng.pick_ref(others);
            let from = rng.below(other.len() + 1);
            input.truncate(at);
            input.extend_from_slice(&other[from..]);
        }
        10 if len > 1 => {
            let (a, b) = (rng.below(len), rng.below(len));
            input.swap(a, b);
        }
        _ => {
            // An ASCII case flip: units and names are case-sensitive in places.
            if len > 0 {
                let i = rng.below(len);
                input[i] = match input[i] {
                    b @ b'a'..=b'z' => b.to_ascii_uppercase(),
                    b @ b'A'..=b'Z' => b.to_ascii_lowercase(),
                    b => b,
                };
            }
        }
    }
}

/// A string of `words` and tokens, sometimes very long.
pub fn string(rng: &mut Rng, words: &[&str]) -> String {
    match rng.below(10) {
        0 => String::new(),
        1 => "x".repeat(rng.pick(&[63, 64, 65, 253, 254, 4096, 100_000])),
        2 => {
            let count = 1 + rng.below(20);
            (0..count)
                .map(|_| char::from_u32(rng.next() as u32 % 0x11_0000).unwrap_or('\u{fffd}'))
                .collect()
        }
        3 => rng.pick(TOKENS).to_string(),
        _ if !words.is_empty() => {
            let mut text = rng.pick(words).to_string();
            if rng.chance(30) {
                let mut raw = text.into_bytes();
                bytes(rng, &mut raw, words, &[]);
                text = String::from_utf8_lossy(&raw).into_owned();
            }
            text
        }
        _ => rng.pick(TOKENS).to_string(),
    }
}

/// A number at an edge: of i32, i64, u64, f64, or zero and small negatives.
pub fn number(rng: &mut Rng) -> Value {
    match rng.below(12) {
        0 => Value::from(0),
        1 => Value::from(-1),
        2 => Value::from(i64::MAX),
        3 => Value::from(i64::MIN),
        4 => Value::from(u64::MAX),
        5 => Value::from(i32::MAX),
        6 => Value::from(i64::from(i32::MAX) + 1),
        7 => Value::from(1.5),
        8 => Value::from(1e300),
        9 => Value::from(-0.0),
        10 => Value::from(rng.next() as i64),
        _ => Value::from(rng.between(-100, 100_000)),
    }
}

/// A small random JSON value.
pub fn value(rng: &mut Rng, words: &[&str], depth: usize) -> Value {
    match rng.below(if depth == 0 { 5 } else { 7 }) {
        0 => Value::Null,
        1 => Value::Bool(rng.chance(50)),
        2 => number(rng),
        3 | 4 => Value::String(string(rng, words)),
        5 => Value::Array(
            (0..rng.below(4))
                .map(|_| value(rng, words, depth - 1))
                .collect(),
        ),
        _ => Value::Object(
            (0..rng.below(4))
                .map(|_| (string(rng, words), value(rng, words, depth - 1)))
                .collect(),
        ),
    }
}

/// `depth` nested arrays or objects (past serde's recursion limit of 128 at times).
pub fn nested(rng: &mut Rng, depth: usize) -> Value {
    let object = rng.chance(50);
    (0..depth).fold(Value::Null, |inner, _| match object {
        true => Value::Object(Map::from_iter([("a".to_owned(), inner)])),
        false => Value::Array(vec![inner]),
    })
}

/// Text for deep nesting, written directly (a `Value` that deep would overflow the stack
/// when serialised or dropped).
pub fn deep_text(rng: &mut Rng) -> Vec<u8> {
    let depth = rng.pick(&[127, 128, 129, 1_000, 100_000]);
    let (open, close): (&[u8], &[u8]) = match rng.below(3) {
        0 => (b"[", b"]"),
        1 => (b"{\"a\":", b"}"),
        _ => (b"- ", b""),
    };
    let mut text = open.repeat(depth);
    text.extend_from_slice(b"1");
    if rng.chance(80) {
        text.extend_from_slice(&close.repeat(depth));
    }
    text
}

/// Mutates one random node of `root`, 1 to 3 times.
pub fn json(rng: &mut Rng, root: &mut Value, words: &[&str]) {
    for _ in 0..=rng.below(3) {
        let donor = pick(rng, &mut root.clone()).clone();
        let node = pick(rng, root);
        match rng.below(10) {
            0 => *node = Value::Null,
            1 => *node = number(rng),
            2 => *node = Value::String(string(rng, words)),
            3 => *node = value(rng, words, 3),
            4 => {
                let depth = rng.pick(&[10, 100, 127, 128, 129, 200]);
                *node = nested(rng, depth);
            }
            5 => *node = donor,
            6 => match node {
                Value::Object(map) => {
                    map.insert(string(rng, words), value(rng, words, 2));
                }
                Value::Array(items) => items.push(value(rng, words, 2)),
                other => *other = Value::Array(vec![other.take()]),
            },
            7 => match node {
                Value::Object(map) if !map.is_empty() => {
                    let key = map.keys().nth(rng.below(map.len())).cloned();
                    if let Some(key) = key {
                        map.remove(&key);
                    }
                }
                Value::Array(items) if !items.is_empty() => {
                    items.remove(rng.below(items.len()));
                }
                other => *other = Value::Object(Map::new()),
            },
            8 => {
                // Many copies: large lists of windows, CSR names, managed fields.
                let size = node.to_string().len().max(1);
                let copies = (rng.pick(&[2, 20, 1_000])).min((256 << 10) / size).max(2);
                *node = Value::Array(vec![node.take(); copies]);
            }
            _ => {
                if let Value::String(text) = node {
                    let mut raw = std::mem::take(text).into_bytes();
                    bytes(rng, &mut raw, words, &[]);
                    *text = String::from_utf8_lossy(&raw).into_owned();
                } else {
                    *node = Value::String(string(rng, words));
                }
            }
        }
    }
}

/// A random node of `root` (the root itself at times).
fn pick<'a>(rng: &mut Rng, mut node: &'a mut Value) -> &'a mut Value {
    loop {
        let len = match &*node {
            Value::Array(items) => items.len(),
            Value::Object(map) => map.len(),
            _ => 0,
        };
        if len == 0 || rng.chance(25) {
            return node;
        }
        let i = rng.below(len);
        node = match node {
            Value::Array(items) => &mut items[i],
            Value::Object(map) => match map.values_mut().nth(i) {
                Some(child) => child,
                None => unreachable!("{i} < {len}"),
            },
            _ => unreachable!("scalars have no children"),
        };
    }
}

/// A corpus or generated JSON document, mutated: structurally when it parses, then (sometimes)
/// byte by byte, so that both well-formed-but-wrong and malformed bodies are tried.
pub fn json_bytes(rng: &mut Rng, seed: &[u8], words: &[&str], others: &[Vec<u8>]) -> Vec<u8> {
    let mut out = match serde_json::from_slice::<Value>(seed) {
        Ok(mut root) if rng.chance(80) => {
            json(rng, &mut root, words);
            let text = match rng.chance(70) {
                true => serde_json::to_vec(&root),
                false => serde_json::to_vec_pretty(&root),
            };
            text.unwrap_or_default()
        }
        _ => seed.to_vec(),
    };
    if out == seed || rng.chance(25) {
        bytes(rng, &mut out, words, others);
    }
    out.truncate(MAX_INPUT);
    out
}
