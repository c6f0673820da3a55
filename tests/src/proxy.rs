//! A TCP proxy between clients and one Redis, for network faults that a signal to
//! `redis-server` cannot make: added latency, a partition (nothing passes, nothing is
//! refused), a half-open connection (requests reach Redis, replies never come back) and
//! connections reset under the client.
//!
//! ```no_run
//! use std::time::Duration;
//! use redguard_tests::{RedisServer, proxy::{Fault, Proxy}};
//!
//! let server = RedisServer::start();
//! let proxy = Proxy::start(server.port());
//! let url = proxy.url(); // give this to the clients under test
//! proxy.set(Fault::Latency(Duration::from_millis(100)));
//! proxy.set(Fault::HalfOpen);
//! proxy.set(Fault::Pass); // stalled bytes are delivered now, in order
//! proxy.reset();          // every open connection gets an RST
//! # let _ = url;
//! ```
//!
//! The proxy runs on its own thread and runtime, so faults are switched from synchronous
//! test code and a busy test runtime never delays the bytes. TCP never loses bytes in the
//! middle of a stream, so neither does the proxy: a stalled direction holds its bytes (and,
//! once its buffer is full, stops reading, so the sender sees backpressure as on a real
//! partition) and delivers them when the fault ends, unless the connection is reset first.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the proxy does to the bytes it forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward at once.
    Pass,
    /// Forward each chunk this long after it arrived, both directions, in order.
    Latency(Duration),
    /// A partition: nothing passes in either direction, new connections are accepted but
    /// not connected through (a client's first command hangs, as on a dropped SYN).
    Blackhole,
    /// Requests reach Redis; replies are held (Redis acts, the client never hears of it).
    HalfOpen,
}

/// A direction of a proxied connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Client to Redis.
    Request,
    /// Redis to client.
    Reply,
}

impl Fault {
    /// `None` while `direction` is stalled, else how long each chunk is held.
    fn delay(self, direction: Direction) -> Option<Duration> {
        match (self, direction) {
            (Fault::Pass, _) | (Fault::HalfOpen, Direction::Request) => Some(Duration::ZERO),
            (Fault::Latency(latency), _) => Some(latency),
            (Fault::Blackhole, _) | (Fault::HalfOpen, Direction::Reply) => None,
        }
    }
}

/// A running proxy to `127.0.0.1:<upstream port>`; stopped (every connection closed) on drop.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    fault: watch::Sender<Fault>,
    /// Bumped by [`Proxy::reset`]: every connection open at that moment is reset.
    resets: watch::Sender<u64>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream_port` (re-connecting for each
    /// new client connection, so a restarted Redis on the same port is reached again).
    pub fn start(upstream_port: u16) -> Proxy {
        let listener = StdListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        listener
            .set_nonblocking(true)
            .expect("non-blocking proxy listener");
        let (fault, fault_rx) = watch::channel(Fault::Pass);
        let (resets, resets_rx) = watch::channel(0);
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel();
        let upstream = SocketAddr::from(([127, 0, 0, 1], upstream_port));
        let thread = std::thread::Builder::new()
            .name(format!("proxy-{port}"))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("proxy runtime");
                runtime.block_on(async move {
                    let listener = TcpListener::from_std(listener).expect("proxy listener");
                    tokio::select! {
                        () = accept(listener, upstream, fault_rx, resets_rx) => {}
                        _ = shutdown_rx => {}
                    }
                });
                // Dropping the runtime drops every connection task, closing their sockets.
            })
            .expect("spawn the proxy thread");
        Proxy {
            port,
            fault,
            resets,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    /// `redis://127.0.0.1:<proxy port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Switches every connection, open or future, to `fault`.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// Resets every open connection (RST to the client, the upstream socket closed); bytes
    /// held by a fault are dropped with it. New connections are not affected.
    pub fn reset(&self) {
        self.resets.send_modify(|generation| *generation += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    fault: watch::Receiver<Fault>,
    resets: watch::Receiver<u64>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let _ = client.set_nodelay(true);
        tokio::spawn(connection(client, upstream, fault.clone(), resets.clone()));
    }
}

/// One client connection, until either side closes it or it is reset.
async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    mut fault: watch::Receiver<Fault>,
    mut resets: watch::Receiver<u64>,
) {
    let generation = *resets.borrow_and_update();
    let forward = async {
        // A partition also holds connection attempts.
        while *fault.borrow_and_update() == Fault::Blackhole {
            if fault.changed().await.is_err() {
                return None;
            }
        }
        // Redis down (killed, restarting): the client sees its connection closed.
        let server = TcpStream::connect(upstream).await.ok()?;
        let _ = server.set_nodelay(true);
        Some(server)
    };
    let server = tokio::select! {
        server = forward => server,
        _ = resets.wait_for(|now| *now != generation) => None,
    };
    let Some(server) = server else {
        abort(client);
        return;
    };
    let mut client = client;
    let mut server = server;
    let reset = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        let pumps = async {
            tokio::join!(
                pump(client_read, server_write, Direction::Request, fault.clone()),
                pump(server_read, client_write, Direction::Reply, fault.clone()),
            )
        };
        tokio::select! {
            _ = pumps => false,
            _ = resets.wait_for(|now| *now != generation) => true,
        }
    };
    if reset {
        abort(client);
    }
}

/// Closes `stream` with an RST rather than a FIN.
fn abort(stream: TcpStream) {
    // SO_LINGER 0 is deprecated in Tokio because a non-zero linger blocks the thread on
    // close; a zero linger never blocks, it only turns the close into an RST.
    #[allow(deprecated)]
    let _ = stream.set_linger(Some(Duration::ZERO));
    drop(stream);
}

/// Forwards one direction, holding each chunk as `fault` says. Returns when the source closes
/// or the destination fails.
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    direction: Direction,
    mut fault: watch::Receiver<Fault>,
) {
    // A few chunks of slack; beyond that the reader stops and TCP pushes back on the sender.
    let (chunks, mut held) = mpsc::channel::<(Instant, Vec<u8>)>(64);
    let read = async move {
        loop {
            let mut buffer = vec![0u8; 16 * 1024];
            match from.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    buffer.truncate(n);
                    if chunks.send((Instant::now(), buffer)).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let write = async move {
        while let Some((arrived, chunk)) = held.recv().await {
            loop {
                let current = *fault.borrow_and_update();
                match current.delay(direction) {
                    Some(delay) if Instant::now() >= arrived + delay => break,
                    Some(delay) => tokio::select! {
                        () = tokio::time::sleep_until(arrived + delay) => {}
                        _ = fault.changed() => {}
                    },
                    None => {
                        if fault.changed().await.is_err() {
                            return;
                        }
                    }
                }
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}
