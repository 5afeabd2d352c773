//! The fault proxy between the worker processes and the mock server: TCP
//! in, TCP out, with what a network does to a lock client. The mode is
//! switched by the schedule; a partition also cuts the connections that
//! are open.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Passes everything.
    Pass,
    /// Refuses new connections and cuts open ones.
    Partition,
    /// Passes requests; holds each answer this long, then cuts the
    /// connection without delivering it (applied, never answered).
    Hold(Duration),
    /// Passes everything this much later.
    Delay(Duration),
    /// Passes requests; cuts the connection when the answer comes.
    Reset,
}

/// A running proxy: its address, and the switch.
pub(crate) struct Proxy {
    pub(crate) addr: SocketAddr,
    mode: watch::Sender<Mode>,
}

impl Proxy {
    /// Listens on a free loopback port, forwarding to `upstream`.
    pub(crate) async fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, watching) = watch::channel(Mode::Pass);
        let watching = Arc::new(watching);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let modes = (*watching).clone();
                if *modes.borrow() == Mode::Partition {
                    drop(client);
                    continue;
                }
                tokio::spawn(connection(client, upstream, modes));
            }
        });
        Ok(Proxy { addr, mode })
    }

    pub(crate) fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

async fn connection(mut client: TcpStream, upstream: SocketAddr, mut modes: watch::Receiver<Mode>) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut up, mut down) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    loop {
        tokio::select! {
            read = client.read(&mut up) => {
                let Ok(n @ 1..) = read else { return };
                let delay = match *modes.borrow() {
                    Mode::Delay(d) => Some(d),
                    _ => None,
                };
                if let Some(d) = delay {
                    tokio::time::sleep(d).await;
                }
                if server.write_all(&up[..n]).await.is_err() {
                    return;
                }
            }
            read = server.read(&mut down) => {
                let Ok(n @ 1..) = read else { return };
                let mode = *modes.borrow();
                match mode {
                    Mode::Pass => {}
                    Mode::Delay(d) => tokio::time::sleep(d).await,
                    Mode::Hold(d) => {
                        tokio::time::sleep(d).await;
                        return;
                    }
                    Mode::Reset | Mode::Partition => return,
                }
                if client.write_all(&down[..n]).await.is_err() {
                    return;
                }
            }
            changed = modes.changed() => {
                if changed.is_err() || *modes.borrow() == Mode::Partition {
                    return;
                }
            }
        }
    }
}
