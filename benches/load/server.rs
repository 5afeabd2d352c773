//! The server a benchmark runs against, in a child process (this binary
//! again, `--serve`): the mock lock server or the no-op
//! [`baseline`](crate::baseline), and [`Server`], the handle that starts
//! one and talks to it.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use volcano::Client;
use volcano_mock_server::MockServer;

use crate::baseline;
use crate::measure::cpu_seconds;

/// Child-process mode: serve until standard input closes. `kind` is
/// `mock` (the mock lock server) or `baseline` (the no-op server).
pub(crate) fn serve(kind: &str) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        if kind == "baseline" {
            let server = baseline::start().await;
            // It checks no credential; the key is only there to be sent.
            announce(&format!("http://{}", server.addr), "baseline-key");
            stdin_closed().await;
            drop(server);
        } else {
            let server = MockServer::start().await;
            announce(server.url(), server.service_key());
            stdin_closed().await;
            drop(server);
        }
    });
}

/// The line `Server::start` reads: the URL and the key to use.
fn announce(url: &str, key: &str) {
    println!("{url} {key}");
    std::io::stdout().flush().unwrap();
}

async fn stdin_closed() {
    tokio::task::spawn_blocking(|| {
        let mut sink = String::new();
        while std::io::stdin()
            .read_line(&mut sink)
            .map(|n| n > 0)
            .unwrap_or(false)
        {}
    })
    .await
    .unwrap();
}

pub(crate) struct Server {
    child: Child,
    pub(crate) url: String,
    pub(crate) key: String,
}

impl Server {
    pub(crate) fn start(kind: &str) -> Server {
        Server::spawn(Command::new(std::env::current_exe().unwrap()).args(["--serve", kind]))
    }

    /// Starts a server process (`--serve`, perhaps under a wrapper such as
    /// valgrind) and reads the line it announces itself with.
    pub(crate) fn spawn(command: &mut Command) -> Server {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the server process starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let (url, key) = line.trim().split_once(' ').expect("url and key");
        Server {
            url: url.to_owned(),
            key: key.to_owned(),
            child,
        }
    }

    /// The server's loopback address (it announces a plain `http://` URL).
    pub(crate) fn addr(&self) -> std::net::SocketAddr {
        self.url
            .trim_start_matches("http://")
            .parse()
            .expect("a loopback address")
    }

    pub(crate) fn client(&self) -> Client {
        Client::builder()
            .anon_key("bench")
            .service_key(&self.key)
            .api_url(&self.url)
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap()
    }

    pub(crate) async fn control(&self, path: &str, body: &str) {
        let response = reqwest::Client::new()
            .post(format!("{}/__mock/{path}", self.url))
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        assert!(
            response.status().is_success(),
            "{path}: {}",
            response.status()
        );
    }

    pub(crate) async fn journal(&self) -> Vec<serde_json::Value> {
        let body = reqwest::Client::new()
            .get(format!("{}/__mock/requests", self.url))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    pub(crate) fn cpu_seconds(&self) -> f64 {
        cpu_seconds(&format!("/proc/{}/stat", self.child.id()))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}
