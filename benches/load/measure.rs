//! What the benchmarks measure with and how they report: CPU time, wake-ups
//! and memory from `/proc`, medians and percentiles, and the report of a
//! section (printed, kept in `target/benchmarks/`, at times written to
//! `docs/benchmarks.md`).

use std::time::Duration;

pub(crate) fn cpu_seconds(stat_path: &str) -> f64 {
    let stat = std::fs::read_to_string(stat_path).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15; after the ')' they are 11 and 12.
    (ticks(11) + ticks(12)) / 100.0
}

/// Voluntary context switches of every thread of this process so far: how
/// often its threads went to sleep, i.e. were woken up.
pub(crate) fn wakeups() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("status")).ok())
        .filter_map(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .sum()
}

pub(crate) fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

pub(crate) fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

pub(crate) fn micros(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

/// Prints a section and keeps it in `target/benchmarks/<name>.md`. With
/// `VOLCANO_BENCH_UPDATE_DOCS=1` it also replaces that section of the
/// tracked docs/benchmarks.md (between its markers); otherwise a run
/// changes no tracked file.
pub(crate) fn report(name: &str, title: &str, body: &str) {
    let section = format!("<!-- bench:{name} -->\n## {title}\n\n{body}\n<!-- /bench:{name} -->");
    println!("\n{section}\n");
    let out = concat!(env!("CARGO_MANIFEST_DIR"), "/target/benchmarks");
    std::fs::create_dir_all(out).unwrap();
    std::fs::write(format!("{out}/{name}.md"), format!("{section}\n")).unwrap();
    if std::env::var_os("VOLCANO_BENCH_UPDATE_DOCS").is_none_or(|v| v != "1") {
        return;
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/benchmarks.md");
    let mut doc = std::fs::read_to_string(path).unwrap_or_default();
    if doc.is_empty() {
        doc = "# Benchmarks\n\nProduced by `cargo bench -p volcano --bench load` (release build). \
               Each section says when and where it was measured.\n"
            .to_owned();
    }
    let start = format!("<!-- bench:{name} -->");
    let end = format!("<!-- /bench:{name} -->");
    match (doc.find(&start), doc.find(&end)) {
        (Some(a), Some(b)) => doc.replace_range(a..b + end.len(), &section),
        _ => doc = format!("{}\n\n{section}\n", doc.trim_end()),
    }
    std::fs::write(path, doc).unwrap();
}

pub(crate) fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "Measured {} on {cores} cores, {} build.",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    )
}

/// CPU seconds the calling thread has used.
pub(crate) fn thread_cpu_seconds() -> f64 {
    // Linux: /proc/thread-self/stat has the thread's utime and stime.
    cpu_seconds("/proc/thread-self/stat")
}
