//! A TCP proxy that breaks connections on request: the fault harness puts it between the
//! services and PostgreSQL. It passes bytes through, delays every chunk by a set time, or cuts:
//! resets every open connection and refuses new ones until the cut ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does to traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Bytes pass as they come.
    Pass,
    /// Each chunk is held this long before it is passed on.
    Delay(Duration),
    /// Each chunk the upstream server sends is held this long; what the client sends passes at
    /// once (a client slow to read its answers, as a busy process is).
    DelayAnswers(Duration),
    /// Open connections are reset, new ones are reset as soon as they are accepted.
    Cut,
}

/// A running proxy; it stops when dropped.
pub(crate) struct FaultProxy {
    port: u16,
    fault: watch::Sender<Fault>,
    /// Connections reset by cuts, open ones and refused ones together.
    reset: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream` (`127.0.0.1:port`).
    pub(crate) async fn start(upstream: u16) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("the proxy binds");
        let port = listener.local_addr().expect("the proxy's address").port();
        let (fault, faults) = watch::channel(Fault::Pass);
        let reset = Arc::new(AtomicU64::new(0));
        let counted = reset.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { continue };
                let faults = faults.clone();
                let reset = counted.clone();
                tokio::spawn(async move {
                    if *faults.borrow() == Fault::Cut {
                        reset.fetch_add(1, Ordering::Relaxed);
                        abort(client);
                        return;
                    }
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        abort(client);
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    if forward(client, server, faults).await {
                        reset.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        FaultProxy { port, fault, reset, accept }
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// How many connections cuts have reset so far.
    pub(crate) fn resets(&self) -> u64 {
        self.reset.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.set(Fault::Cut);
    }
}

/// Closes a connection with a reset rather than an orderly end, as a failing network does.
fn abort(stream: TcpStream) {
    let _ = stream.set_zero_linger();
}

/// Pumps both ways until both sides end or a cut starts; true when a cut ended it (then both
/// connections are reset).
async fn forward(mut client: TcpStream, mut server: TcpStream, mut faults: watch::Receiver<Fault>) -> bool {
    let was_cut = {
        let (mut client_read, mut client_write) = client.split();
        let (mut server_read, mut server_write) = server.split();
        let (up_faults, down_faults) = (faults.clone(), faults.clone());
        let upstream = pump(&mut client_read, &mut server_write, &up_faults, false);
        let downstream = pump(&mut server_read, &mut client_write, &down_faults, true);
        let cut = async {
            loop {
                if faults.changed().await.is_err() || *faults.borrow() == Fault::Cut {
                    return;
                }
            }
        };
        tokio::select! {
            _ = async { tokio::join!(upstream, downstream) } => false,
            () = cut => true,
        }
    };
    if was_cut {
        let _ = client.set_zero_linger();
        let _ = server.set_zero_linger();
    }
    was_cut
}

/// Copies from `from` to `to`, passing each chunk on as long after it arrived as the fault
/// says (`answers`: the server's way), until `from` ends (then `to` is shut down) or a write
/// fails. Chunks are read as they come, so a delay holds each one that long from its arrival
/// (a round trip takes one delay however many chunks its answers come in), not one delay
/// after another.
async fn pump<R, W>(from: &mut R, to: &mut W, faults: &watch::Receiver<Fault>, answers: bool)
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let (arrivals, mut arrived) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let reading = async move {
        let mut buffer = vec![0u8; 16 * 1024];
        while let Ok(read) = from.read(&mut buffer).await {
            if read == 0 || arrivals.send((tokio::time::Instant::now(), buffer[..read].to_vec())).is_err() {
                return;
            }
        }
    };
    let writing = async move {
        while let Some((at, chunk)) = arrived.recv().await {
            let fault = *faults.borrow();
            match fault {
                Fault::Delay(delay) => tokio::time::sleep_until(at + delay).await,
                Fault::DelayAnswers(delay) if answers => tokio::time::sleep_until(at + delay).await,
                _ => {}
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reading, writing);
}

#[tokio::test]
async fn the_proxy_passes_delays_and_cuts() {
    let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let echo_port = echo.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = echo.accept().await {
            tokio::spawn(async move {
                let mut buffer = [0u8; 1024];
                while let Ok(read) = stream.read(&mut buffer).await {
                    if read == 0 || stream.write_all(&buffer[..read]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    let proxy = FaultProxy::start(echo_port).await;
    let round_trip = |mut stream: TcpStream| async move {
        stream.write_all(b"ping").await?;
        let mut answer = [0u8; 4];
        stream.read_exact(&mut answer).await?;
        assert_eq!(&answer, b"ping");
        Ok::<TcpStream, std::io::Error>(stream)
    };
    let open = TcpStream::connect(("127.0.0.1", proxy.port())).await.expect("connects");
    let open = round_trip(open).await.expect("passes");

    proxy.set(Fault::Delay(Duration::from_millis(200)));
    let started = std::time::Instant::now();
    let open = round_trip(open).await.expect("passes, late");
    assert!(started.elapsed() >= Duration::from_millis(400), "held both ways: {:?}", started.elapsed());

    // Held one way: a round trip takes the delay once, not twice.
    proxy.set(Fault::DelayAnswers(Duration::from_millis(300)));
    let started = std::time::Instant::now();
    let open = round_trip(open).await.expect("passes, late");
    let took = started.elapsed();
    assert!((Duration::from_millis(300)..Duration::from_millis(600)).contains(&took), "held one way: {took:?}");

    proxy.set(Fault::Cut);
    let mut open = open;
    let mut byte = [0u8; 1];
    let ended = tokio::time::timeout(Duration::from_secs(2), open.read(&mut byte)).await.expect("ends at once");
    assert!(matches!(ended, Ok(0) | Err(_)), "the open connection is cut: {ended:?}");
    let refused = TcpStream::connect(("127.0.0.1", proxy.port())).await.expect("accepted, then reset");
    assert!(round_trip(refused).await.is_err(), "a new connection is cut too");
    assert!(proxy.resets() >= 2);

    proxy.set(Fault::Pass);
    let again = TcpStream::connect(("127.0.0.1", proxy.port())).await.expect("connects");
    round_trip(again).await.expect("passes again after the cut");
}
