//! The standalone binary: prints where it listens and the keys, serves the
//! lock API and the controls, and stops cleanly on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[tokio::test]
async fn binary_serves_and_stops_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_volcano-mock-server"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--service-key",
            "bin-test-key",
            "--rate-limit",
            "100",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let url = first
        .rsplit(' ')
        .next()
        .filter(|u| u.starts_with("http://127.0.0.1:"))
        .unwrap_or_else(|| panic!("first line names the URL: {first}"))
        .to_owned();
    let banner: Vec<String> = lines.by_ref().take(5).map(Result::unwrap).collect();
    assert!(
        banner
            .iter()
            .any(|l| l.contains("VOLCANO_SERVICE_KEY=bin-test-key")),
        "{banner:?}"
    );
    assert!(
        banner
            .iter()
            .any(|l| l.contains("100 lock operations per minute")),
        "{banner:?}"
    );

    let http = reqwest::Client::new();
    let state = http
        .get(format!("{url}/locks/k"))
        .bearer_auth("bin-test-key")
        .header(
            "x-volcano-request-id",
            "11111111-2222-4333-8444-555555555555",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(state.status(), 200);
    let journal: serde_json::Value = http
        .get(format!("{url}/__mock/requests"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(journal[0]["operation"], "get");

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "clean exit on SIGTERM: {status}");
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    assert!(rest.iter().any(|l| l.contains("stopped")), "{rest:?}");
}

#[test]
fn binary_refuses_a_busy_port_with_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let output = Command::new(env!("CARGO_BIN_EXE_volcano-mock-server"))
        .args(["--listen", &addr])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot listen on"), "{stderr}");
}
