//! `volcano-mock-server`: the mock lock service as a standalone process, for
//! tests written in any language.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use volcano_mock_server::{MockServer, DEFAULT_ANON_KEY, DEFAULT_SERVICE_KEY};

/// A faithful, stateful mock of the Volcano lock service.
///
/// Test controls (no credential): POST /__mock/faults, DELETE /__mock/faults,
/// POST /__mock/advance {"seconds": N}, GET /__mock/requests,
/// GET /__mock/locks, POST /__mock/reset.
#[derive(Debug, Parser)]
#[command(name = "volcano-mock-server", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000", env = "VOLCANO_MOCK_LISTEN")]
    listen: SocketAddr,
    /// Service key the server accepts.
    #[arg(long, default_value = DEFAULT_SERVICE_KEY, env = "VOLCANO_MOCK_SERVICE_KEY")]
    service_key: String,
    /// Anon key the server recognises (and refuses for locks with 403).
    #[arg(long, default_value = DEFAULT_ANON_KEY, env = "VOLCANO_MOCK_ANON_KEY")]
    anon_key: String,
    /// Lock operations allowed per one-minute window (the service allows 600).
    #[arg(long)]
    rate_limit: Option<u32>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();

    let mut builder = MockServer::builder()
        .listen(args.listen)
        .service_key(&args.service_key)
        .anon_key(&args.anon_key);
    if let Some(limit) = args.rate_limit {
        builder = builder.rate_limit(limit);
    }
    let server = match builder.try_start().await {
        Ok(server) => server,
        Err(err) => {
            eprintln!(
                "volcano-mock-server: cannot listen on {}: {err}",
                args.listen
            );
            return ExitCode::FAILURE;
        }
    };
    println!("volcano mock lock server listening on {}", server.url());
    println!("  VOLCANO_API_URL={}", server.url());
    println!("  VOLCANO_SERVICE_KEY={}", server.service_key());
    println!("  VOLCANO_ANON_KEY={}", server.anon_key());
    match args.rate_limit {
        Some(limit) => println!("  quota: {limit} lock operations per minute"),
        None => println!("  quota: none"),
    }
    println!(
        "  controls: {}/__mock/{{faults,advance,requests,locks,reset}}",
        server.url()
    );

    wait_for_stop().await;
    drop(server);
    println!("volcano mock lock server stopped");
    ExitCode::SUCCESS
}

async fn wait_for_stop() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
