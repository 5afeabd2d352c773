//! Recovery with the library API: inspect a lock, force-release it, verify.
//!
//! ```sh
//! cargo run --example admin                 # against an in-process mock server
//! VOLCANO_API_URL=... VOLCANO_SERVICE_KEY=... VOLCANO_ANON_KEY=... \
//!     cargo run --example admin -- some-stuck-lock
//! ```
//!
//! Force-releasing breaks mutual exclusion: the displaced holder keeps
//! running until its next renewal fails. Do it only when the protected
//! resource checks fencing tokens.

use std::time::Duration;

use volcano::mock::MockServer;
use volcano::Client;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (client, _mock, key) = if configured() {
        let key = std::env::args()
            .nth(1)
            .ok_or("usage: admin <lock-key> (with VOLCANO_API_URL set)")?;
        (Client::from_env()?, None, key)
    } else {
        // Stage a stuck lock on a local mock server.
        let server = MockServer::start().await;
        let client = Client::for_mock(&server);
        let stuck = client
            .locks()
            .acquire("nightly-report", Duration::from_secs(3_600))
            .await?;
        println!(
            "(mock server at {}; a crashed worker left \"nightly-report\" held with fence {})\n",
            server.url(),
            stuck.fencing_token()
        );
        (client, Some(server), "nightly-report".to_owned())
    };
    let locks = client.locks();

    // 1. Inspect.
    let state = locks.get(&key).await?;
    if !state.held() {
        println!("{key} is free; nothing to recover.");
        return Ok(());
    }
    println!(
        "{key} is held until {} by fencing token {}.",
        state.expires_at().map_or("?".into(), |t| t.to_rfc3339()),
        state.fencing_token().map_or("?".into(), |f| f.to_string())
    );

    // 2. Force-release.
    locks.force_release(&key).await?;
    println!("force-released {key}: the next holder gets a higher fencing token.");

    // 3. Verify.
    let after = locks.get(&key).await?;
    println!(
        "{key} is now {}.",
        if after.held() {
            "held again (someone was quick)"
        } else {
            "free"
        }
    );
    Ok(())
}

/// Whether the environment names a lock service: `VOLCANO_API_URL` or
/// `VOLCANO_SERVICE_KEY` set. Only when neither is does this example run on
/// an in-process mock server. (In your app, keep the SDK's `mock` feature
/// under `[dev-dependencies]`: a mock is for tests.)
fn configured() -> bool {
    [volcano::ENV_API_URL, volcano::ENV_SERVICE_KEY]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
}
