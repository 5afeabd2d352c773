//! A partner's API allows 3 calls at once from your whole fleet: two hosts
//! (two clients) each put their calls behind `volcano::tower::PermitLayer`,
//! and the partner never sees a fourth. tower's own `ConcurrencyLimitLayer`
//! would allow 3 per host, 6 in all.
//!
//! ```sh
//! cargo run --example tower_permits
//! ```
//!
//! On an in-process mock lock server unless `VOLCANO_API_URL` or
//! `VOLCANO_SERVICE_KEY` is set (semaphore `volcano-example-partner-api`
//! then). Exits non-zero if the story did not happen: more than 3 calls at
//! once, fewer (the limit never reached), or a call that did not run.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower::{BoxError, ServiceBuilder, ServiceExt as _};
use volcano::mock::MockServer;
use volcano::tower::PermitLayer;
use volcano::Client;

const PERMITS: u32 = 3;
const CALLS_PER_HOST: usize = 8;

/// The partner's side: counts the calls it is serving, and the most at once.
#[derive(Default)]
struct Partner {
    serving: AtomicUsize,
    most: AtomicUsize,
    served: AtomicUsize,
}

impl Partner {
    async fn quote(&self, item: usize) -> Result<String, BoxError> {
        let now = self.serving.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.serving.fetch_sub(1, Ordering::SeqCst);
        self.served.fetch_add(1, Ordering::SeqCst);
        Ok(format!("quote for item {item}"))
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (mock, name) = if configured() {
        (None, "volcano-example-partner-api")
    } else {
        (Some(MockServer::start().await), "partner-api")
    };
    let client = || match &mock {
        Some(server) => Ok(Client::for_mock(server)),
        None => Client::from_env(),
    };
    let partner = Arc::new(Partner::default());
    let mut calls = Vec::new();
    let mut hosts = Vec::new();
    for host in 0..2 {
        // Each host builds its own client and its own service stack.
        let client = client()?;
        let partner_api = {
            let partner = partner.clone();
            tower::service_fn(move |item: usize| {
                let partner = partner.clone();
                async move { partner.quote(item).await }
            })
        };
        let svc = ServiceBuilder::new()
            .layer(
                PermitLayer::new(
                    client.locks().semaphore(name, PERMITS),
                    Duration::from_secs(30),
                )
                .wait(Duration::from_secs(60)),
            )
            .service(partner_api);
        for i in 0..CALLS_PER_HOST {
            // The call's future itself, spawned (see the tower guide on
            // `From` "not general enough").
            calls.push(tokio::spawn(svc.clone().oneshot(host * 100 + i)));
        }
        hosts.push(client);
    }
    let mut failed = 0;
    for call in calls {
        if let Err(err) = call.await? {
            eprintln!("a call failed: {err}");
            failed += 1;
        }
    }
    for client in hosts {
        client.shutdown(Duration::from_secs(10)).await;
    }
    let (most, served) = (
        partner.most.load(Ordering::SeqCst),
        partner.served.load(Ordering::SeqCst),
    );
    println!(
        "2 hosts, {} calls, {PERMITS} permits: the partner served {served}, at most {most} at once",
        2 * CALLS_PER_HOST
    );
    if most != PERMITS as usize || served != 2 * CALLS_PER_HOST || failed > 0 {
        return Err(format!(
            "the story did not happen: at most {most} at once (want {PERMITS}), {served} served, \
             {failed} failed"
        )
        .into());
    }
    Ok(())
}

/// Whether the environment names a lock service (else the mock is used).
fn configured() -> bool {
    [volcano::ENV_API_URL, volcano::ENV_SERVICE_KEY]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
}
