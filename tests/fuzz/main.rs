//! Fuzzing of every parser that reads user or node input (docs/security.md, "Fuzzing"): no
//! input may panic, and each must return within a generous bound.
//!
//! Each target starts from its seed corpus (`fuzz/corpus/<target>/`), then tries inputs from
//! its generator: real-looking values built from the grammar, and corpus entries mutated
//! (bytes flipped, inserted, repeated, truncated; JSON nodes swapped for huge numbers, odd
//! strings, deep nesting). `FUZZ_CASES` inputs per target, 2,000 by default so that `cargo
//! test` stays quick; `make fuzz` runs 1,000,000 each in release and prints the table.
//!
//! Environment: `FUZZ_CASES`, `FUZZ_SEED` (default 1), `FUZZ_ONLY=<index>` (one input, to
//! reproduce), `FUZZ_MAX_MS` (the per-input bound), `FUZZ_SHOW_SLOW_MS` (print inputs slower
//! than that), `FUZZ_REPORT` (a file the rows are appended to). A panicking input is saved
//! under `target/fuzz/crashes/`.

mod admission;
mod cca;
mod cron;
mod csr;
mod harness;
mod k8sd;
mod kubeconfig;
mod mutate;
mod ttl;
mod windows;
mod workload;

use harness::{corpus, run};

#[test]
fn fuzz_ttl() {
    run("ttl", &corpus("ttl"), ttl::generate, ttl::check);
}

#[test]
fn fuzz_cron() {
    run("cron", &corpus("cron"), cron::generate, cron::check);
}

#[test]
fn fuzz_windows() {
    run(
        "windows",
        &corpus("windows"),
        windows::generate,
        windows::check,
    );
}

#[test]
fn fuzz_k8sd() {
    run("k8sd", &k8sd::corpus(), k8sd::generate, k8sd::check);
}

#[test]
fn fuzz_admission() {
    run(
        "admission",
        &corpus("admission"),
        admission::generate,
        admission::check,
    );
}

#[test]
fn fuzz_kubeconfig() {
    run(
        "kubeconfig",
        &corpus("kubeconfig"),
        kubeconfig::generate,
        kubeconfig::check,
    );
}

#[test]
fn fuzz_csr() {
    run("csr", &csr::corpus(), csr::generate, csr::check);
}

#[test]
fn fuzz_cca() {
    run("cca", &cca::corpus(), cca::generate, cca::check);
}

#[test]
fn fuzz_workload() {
    run(
        "workload",
        &workload::corpus(),
        workload::generate,
        workload::check,
    );
}
