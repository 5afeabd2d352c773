//! Micro-benchmarks of the SDK's own work, without the network:
//! `cargo bench -p volcano --features bench --bench micro` (the feature compiles the
//! hooks into the crate; nothing else enables it).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use volcano::__bench;

const LEASE: &[u8] =
    br#"{"expires_at":"2026-07-20T14:00:10.123Z","fencing_token":4503599627370497}"#;
const STATE: &[u8] = br#"{"held":true,"expires_at":"2026-07-20T14:00:10.123Z","fencing_token":7}"#;
const TOKEN: &str = "0b6f1a43-5b52-4f4e-9d51-1f6c3c7e2a10";
const REQUEST_ID: &str = "6d0c8f5e-1f0a-4b7e-9f43-6a1d2b3c4d5e";

fn decoding(c: &mut Criterion) {
    c.bench_function("decode lease (201 body)", |b| {
        b.iter(|| __bench::decode_lease(black_box(LEASE)).unwrap())
    });
    c.bench_function("decode state (200 body)", |b| {
        b.iter(|| __bench::decode_state(black_box(STATE)).unwrap())
    });
    c.bench_function("reject a non-object body", |b| {
        b.iter(|| __bench::decode_lease(black_box(b"[1,2,3]")).unwrap_err())
    });
}

fn request_building(c: &mut Criterion) {
    let client = volcano::Client::builder()
        .anon_key("anon")
        .service_key("service")
        .api_url("http://127.0.0.1:9/prefix")
        .build()
        .unwrap();
    c.bench_function("validate and build an acquire request", |b| {
        b.iter(|| {
            __bench::build_acquire(
                &client,
                black_box("build:queue"),
                Duration::from_secs(30),
                TOKEN,
                REQUEST_ID,
            )
            .unwrap()
        })
    });
}

criterion_group!(micro, decoding, request_building);
criterion_main!(micro);
