//! Real traffic for the namespace tests: servers that report who they saw, and clients.
//!
//! Every server and client has a deadline, so a broken datapath fails a test instead of
//! hanging it.

use std::{
    io::{self, BufRead as _, BufReader, Read as _, Write as _},
    net::{IpAddr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::netns::Netns;

/// How long any server lives at most.
const SERVER_LIFETIME: Duration = Duration::from_secs(180);

/// A server running in a namespace until dropped.
#[derive(Debug)]
pub struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Peer addresses seen, in order.
    pub peers: Arc<Mutex<Vec<SocketAddr>>>,
}

impl Server {
    /// The peers seen so far.
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.peers
            .lock()
            .map(|peers| peers.clone())
            .unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// FNV-1a over `data`: a cheap integrity check for transfers.
/// `size` bytes of a pattern that depends on `seed`, for transfers whose content is checked.
pub fn payload(size: usize, seed: u8) -> Vec<u8> {
    (0..size)
        .map(|index| (index as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What a server thread needs: when to stop, and where to record the peers it saw.
#[derive(Clone)]
struct ServerContext {
    stop: Arc<AtomicBool>,
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    deadline: Instant,
}

impl ServerContext {
    fn running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed) && Instant::now() < self.deadline
    }

    fn saw(&self, peer: SocketAddr) {
        if let Ok(mut seen) = self.peers.lock() {
            seen.push(peer);
        }
    }
}

/// Runs a server in `netns`: `bind` opens its socket (the call returns once it has), `serve`
/// runs until the returned [`Server`] is dropped or the lifetime ends.
fn spawn_server<S: 'static>(
    netns: &Netns,
    bind: impl FnOnce() -> S + Send + 'static,
    serve: impl FnOnce(S, &ServerContext) + Send + 'static,
) -> Server {
    let context = ServerContext {
        stop: Arc::new(AtomicBool::new(false)),
        peers: Arc::new(Mutex::new(Vec::new())),
        deadline: Instant::now() + SERVER_LIFETIME,
    };
    let (stop, peers) = (context.stop.clone(), context.peers.clone());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let thread = netns.spawn(move || {
        let socket = bind();
        let _ = ready_tx.send(());
        serve(socket, &context);
    });
    let _ = ready_rx.recv_timeout(Duration::from_secs(5));
    Server {
        stop,
        thread: Some(thread),
        peers,
    }
}

/// A TCP server. Per connection it reads one line (an id), then either:
/// * `sink`: reads everything until EOF and answers `<id> <peer> <bytes> <fnv>`;
/// * `hold`: answers `<id> <peer>` immediately and then echoes lines until EOF.
pub fn tcp_server(netns: &Netns, bind: impl Into<SocketAddr>) -> Server {
    let bind = bind.into();
    let listen = move || {
        let listener =
            TcpListener::bind(bind).unwrap_or_else(|error| panic!("binding {bind}: {error}"));
        listener
            .set_nonblocking(true)
            .unwrap_or_else(|error| panic!("{error}"));
        listener
    };
    spawn_server(netns, listen, |listener, context| {
        let mut workers = Vec::new();
        while context.running() {
            match listener.accept() {
                Ok((stream, peer)) => {
                    context.saw(peer);
                    let stop = context.stop.clone();
                    workers.push(std::thread::spawn(move || serve_tcp(stream, peer, &stop)));
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => break,
            }
        }
        for worker in workers {
            let _ = worker.join();
        }
    })
}

fn serve_tcp(stream: TcpStream, peer: SocketAddr, stop: &AtomicBool) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut writer = match stream.try_clone() {
        Ok(writer) => writer,
        Err(_) => return,
    };
    let mut reader = BufReader::new(stream);
    let deadline = Instant::now() + SERVER_LIFETIME;
    let mut line = String::new();
    while !line.ends_with('\n') {
        if stop.load(Ordering::Relaxed) || Instant::now() > deadline {
            return;
        }
        match reader.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {}
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
    let header = line.trim().to_owned();
    let (mode, id) = header.split_once(' ').unwrap_or(("sink", header.as_str()));
    if mode == "hold" {
        let _ = writeln!(writer, "{id} {peer}");
        let mut line = String::new();
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) => return,
                Ok(_) => {
                    let _ = write!(writer, "{line}");
                }
                Err(error)
                    if matches!(
                        error.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return,
            }
        }
        return;
    }
    let mut data = Vec::new();
    let mut buffer = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        match reader.read(&mut buffer) {
            Ok(0) => {
                let _ = writeln!(writer, "{id} {peer} {} {:016x}", data.len(), fnv1a(&data));
                let _ = writer.shutdown(Shutdown::Write);
                return;
            }
            Ok(read) => data.extend_from_slice(&buffer[..read]),
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

/// What a `sink` transfer reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// The id sent.
    pub id: String,
    /// The client address the server saw.
    pub peer: SocketAddr,
    /// Bytes the server received.
    pub bytes: usize,
    /// Their FNV-1a hash.
    pub hash: u64,
}

fn connect(
    server: SocketAddr,
    bind: Option<SocketAddrV4>,
    timeout: Duration,
) -> io::Result<TcpStream> {
    match (bind, server) {
        (None, _) => TcpStream::connect_timeout(&server, timeout),
        (Some(_), SocketAddr::V6(_)) => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "binding before connecting is IPv4 only",
        )),
        (Some(local), SocketAddr::V4(server)) => {
            // std cannot bind before connecting; go through a raw socket.
            let socket = nix::sys::socket::socket(
                nix::sys::socket::AddressFamily::Inet,
                nix::sys::socket::SockType::Stream,
                nix::sys::socket::SockFlag::SOCK_CLOEXEC,
                None,
            )?;
            nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::ReuseAddr, &true)?;
            nix::sys::socket::bind(
                std::os::fd::AsRawFd::as_raw_fd(&socket),
                &nix::sys::socket::SockaddrIn::from(local),
            )?;
            let stream = TcpStream::from(socket);
            let address = nix::sys::socket::SockaddrIn::from(server);
            nix::sys::socket::connect(std::os::fd::AsRawFd::as_raw_fd(&stream), &address)?;
            Ok(stream)
        }
    }
}

/// Sends `payload` to a [`tcp_server`] and returns its report. Fails after `timeout`.
pub fn tcp_transfer(
    server: impl Into<SocketAddr>,
    id: &str,
    payload: &[u8],
    timeout: Duration,
) -> io::Result<Transfer> {
    tcp_transfer_paced(server, id, payload, payload.len(), Duration::ZERO, timeout)
}

/// Like [`tcp_transfer`], but writes `chunk` bytes at a time with `pause` in between, so the
/// transfer spans events such as an agent restart.
pub fn tcp_transfer_paced(
    server: impl Into<SocketAddr>,
    id: &str,
    payload: &[u8],
    chunk: usize,
    pause: Duration,
    timeout: Duration,
) -> io::Result<Transfer> {
    let mut stream = connect(server.into(), None, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    writeln!(stream, "sink {id}")?;
    for piece in payload.chunks(chunk.max(1)) {
        stream.write_all(piece)?;
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
    }
    stream.shutdown(Shutdown::Write)?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    let fields: Vec<&str> = reply.split_whitespace().collect();
    let invalid = || io::Error::new(io::ErrorKind::InvalidData, format!("bad report {reply:?}"));
    let [reported_id, peer, bytes, hash] = fields.as_slice() else {
        return Err(invalid());
    };
    Ok(Transfer {
        id: (*reported_id).to_owned(),
        peer: peer.parse().map_err(|_| invalid())?,
        bytes: bytes.parse().map_err(|_| invalid())?,
        hash: u64::from_str_radix(hash, 16).map_err(|_| invalid())?,
    })
}

/// The address a [`tcp_server`] at `server` sees a new connection from `client` come from:
/// what masq (or nothing) made of the client's address.
pub fn tcp_source(client: &Netns, server: impl Into<SocketAddr>, timeout: Duration) -> IpAddr {
    let server = server.into();
    client
        .enter(|| tcp_transfer(server, "probe", b"probe", timeout))
        .unwrap_or_else(|error| panic!("flow to {server} failed: {error}"))
        .peer
        .ip()
}

/// A UDP socket that keeps its source port across requests (one flow).
#[derive(Debug)]
pub struct UdpFlow {
    socket: UdpSocket,
    server: SocketAddr,
}

impl UdpFlow {
    /// Opens the socket, of the server's family; call from inside the client's namespace.
    pub fn open(server: impl Into<SocketAddr>, timeout: Duration) -> io::Result<Self> {
        let server = server.into();
        let socket = udp_client(server, timeout)?;
        Ok(Self { socket, server })
    }

    /// One request/response (retried a few times); returns the peer the server saw.
    pub fn request(&self, payload: &[u8]) -> io::Result<SocketAddr> {
        let mut buffer = vec![0u8; 65_536];
        for _ in 0..4 {
            self.socket.send_to(payload, self.server)?;
            if let Ok((read, _)) = self.socket.recv_from(&mut buffer) {
                let reply = &buffer[..read];
                let split = reply.iter().position(|byte| *byte == b' ').unwrap_or(read);
                return std::str::from_utf8(&reply[..split])
                    .ok()
                    .and_then(|text| text.parse().ok())
                    .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad UDP reply"));
            }
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no UDP reply from {}", self.server),
        ))
    }
}

/// A connection held open to a [`tcp_server`]; `echo` checks it still carries data.
#[derive(Debug)]
pub struct HeldConnection {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    /// The client address the server saw.
    pub peer: SocketAddr,
}

impl HeldConnection {
    /// Opens a connection (optionally from `bind`) and reads the server's greeting.
    pub fn open(
        server: impl Into<SocketAddr>,
        id: &str,
        bind: Option<SocketAddrV4>,
        timeout: Duration,
    ) -> io::Result<Self> {
        let stream = connect(server.into(), bind, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        let mut writer = stream.try_clone()?;
        writeln!(writer, "hold {id}")?;
        let mut reader = BufReader::new(stream);
        let mut greeting = String::new();
        reader.read_line(&mut greeting)?;
        let mut fields = greeting.split_whitespace();
        let invalid = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad greeting {greeting:?}"),
            )
        };
        if fields.next() != Some(id) {
            return Err(invalid());
        }
        let peer = fields
            .next()
            .ok_or_else(invalid)?
            .parse()
            .map_err(|_| invalid())?;
        Ok(Self {
            reader,
            writer,
            peer,
        })
    }

    /// Sends a line and expects it back.
    pub fn echo(&mut self, text: &str) -> io::Result<()> {
        writeln!(self.writer, "{text}")?;
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        if line.trim_end() == text {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("echoed {line:?} instead of {text:?}"),
            ))
        }
    }
}

/// A UDP server answering each datagram with `<peer> <payload>`.
pub fn udp_server(netns: &Netns, bind: impl Into<SocketAddr>) -> Server {
    let bind = bind.into();
    let open = move || {
        let socket =
            UdpSocket::bind(bind).unwrap_or_else(|error| panic!("binding {bind}: {error}"));
        let _ = socket.set_read_timeout(Some(Duration::from_millis(100)));
        socket
    };
    spawn_server(netns, open, |socket, context| {
        let mut buffer = vec![0u8; 65_536];
        while context.running() {
            if let Ok((read, peer)) = socket.recv_from(&mut buffer) {
                context.saw(peer);
                let mut reply = format!("{peer} ").into_bytes();
                reply.extend_from_slice(&buffer[..read]);
                let _ = socket.send_to(&reply, peer);
            }
        }
    })
}

/// A UDP server answering each datagram as [`udp_server`] does, `delay` after it came: a
/// resolver that has to ask further.
pub fn udp_delayed_server(netns: &Netns, bind: impl Into<SocketAddr>, delay: Duration) -> Server {
    let bind = bind.into();
    let open = move || {
        let socket =
            UdpSocket::bind(bind).unwrap_or_else(|error| panic!("binding {bind}: {error}"));
        let _ = socket.set_read_timeout(Some(Duration::from_millis(5)));
        socket
    };
    spawn_server(netns, open, move |socket, context| {
        let mut buffer = vec![0u8; 65_536];
        let mut pending: std::collections::VecDeque<(Instant, SocketAddr, Vec<u8>)> =
            std::collections::VecDeque::new();
        while context.running() {
            if let Ok((read, peer)) = socket.recv_from(&mut buffer) {
                context.saw(peer);
                let mut reply = format!("{peer} ").into_bytes();
                reply.extend_from_slice(&buffer[..read]);
                pending.push_back((Instant::now() + delay, peer, reply));
            }
            while pending
                .front()
                .is_some_and(|(due, _, _)| *due <= Instant::now())
            {
                if let Some((_, peer, reply)) = pending.pop_front() {
                    let _ = socket.send_to(&reply, peer);
                }
            }
        }
    })
}

/// Sends one query to a [`udp_server`] from a new socket (a new flow) and waits up to
/// `timeout` for its answer, without retrying: whether this flow was answered.
pub fn udp_query_once(server: SocketAddr, payload: &[u8], timeout: Duration) -> bool {
    let Ok(socket) = UdpSocket::bind(if server.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }) else {
        return false;
    };
    let mut buffer = vec![0u8; 65_536];
    socket.set_read_timeout(Some(timeout)).is_ok()
        && socket.send_to(payload, server).is_ok()
        && socket.recv_from(&mut buffer).is_ok()
}

/// A UDP socket of `server`'s family on an ephemeral port, whose reads give up after a quarter
/// of `timeout` (requests are retried four times).
pub fn udp_client(server: SocketAddr, timeout: Duration) -> io::Result<UdpSocket> {
    let socket = UdpSocket::bind(if server.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    })?;
    socket.set_read_timeout(Some(timeout / 4))?;
    Ok(socket)
}

/// Sends `payload` to a [`udp_server`] (retrying a few times) and returns the peer address the
/// server saw and the echoed payload.
pub fn udp_request(
    server: impl Into<SocketAddr>,
    payload: &[u8],
    timeout: Duration,
) -> io::Result<(SocketAddr, Vec<u8>)> {
    let server = server.into();
    let socket = udp_client(server, timeout)?;
    let mut buffer = vec![0u8; 65_536];
    for _ in 0..4 {
        socket.send_to(payload, server)?;
        if let Ok((read, _)) = socket.recv_from(&mut buffer) {
            let reply = &buffer[..read];
            let split = reply.iter().position(|byte| *byte == b' ').unwrap_or(read);
            let peer = std::str::from_utf8(&reply[..split])
                .ok()
                .and_then(|text| text.parse().ok())
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad UDP reply"))?;
            return Ok((peer, reply[(split + 1).min(read)..].to_vec()));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        format!("no UDP reply from {server}"),
    ))
}

/// Runs `ping -c COUNT -W 1 DEST` in `netns`; true when every reply came back.
pub fn ping(netns: &Netns, destination: &str, count: u32) -> bool {
    netns
        .command("ping")
        .args([
            "-n",
            "-q",
            "-c",
            &count.to_string(),
            "-i",
            "0.2",
            "-W",
            "1",
            destination,
        ])
        .output()
        .is_ok_and(|output| output.status.success())
}
