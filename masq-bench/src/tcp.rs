//! TCP through each path: connections opened and closed as fast as possible, and one bulk
//! stream (iperf3). Both run on every core, as a node's pods would.

use std::{
    net::{SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    process::{Child, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use crate::{
    cpu::CpuTimes,
    interleave::{Comparison, Side, Window, alternate},
    paths::{BenchPath, Cores},
    profile::{Profile, Sampled},
    tx::set_option,
};
use anyhow::{Context as _, Result, bail};

/// The outside host's port for connect-and-close.
const CRR_PORT: u16 = 7000;
/// The outside host's iperf3 port.
const IPERF_PORT: u16 = 5201;
/// Client threads per path opening connections (two cores: more only queue).
const CLIENTS: usize = 2;

/// Closes `stream` with a reset (`SO_LINGER` 0), so neither side keeps TIME_WAIT: the
/// clients would otherwise run out of ports, and the NAT entry ends as a reset flow.
fn reset(stream: TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // Without the option the connection simply closes normally.
    let _ = set_option(&stream, libc::SOL_SOCKET, libc::SO_LINGER, &linger);
    drop(stream);
}

/// Connect-and-close load on one path: a server on the outside host that accepts and closes,
/// clients in pod 2 that connect and reset while the gate says it is their path's turn.
struct CrrLoad {
    connections: Arc<AtomicU64>,
    failures: Arc<AtomicU64>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl CrrLoad {
    fn start(
        path: &BenchPath,
        side: usize,
        gate: &Arc<AtomicUsize>,
        stop: &Arc<AtomicBool>,
    ) -> Result<Self> {
        let address = SocketAddr::new(path.family.outside(), CRR_PORT);
        let listener = path
            .sandbox
            .outside
            .enter(|| TcpListener::bind(address))
            .context("binding the connect-and-close server")?;
        // A deep accept queue, and a blocking accept that wakes at once: a connection left
        // queued while the server thread waits for the core would be a dropped SYN (the
        // client then waits a second to retry). The timeout only lets it see `stop`.
        // SAFETY: listen on a socket this function owns.
        unsafe { libc::listen(listener.as_raw_fd(), 4096) };
        let wake = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        set_option(&listener, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &wake).context("SO_RCVTIMEO")?;
        let connections = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::new();
        let server_stop = Arc::clone(stop);
        threads.push(thread::spawn(move || {
            while !server_stop.load(Ordering::Relaxed) {
                // Timeouts and reset connections alike: go round again.
                if let Ok((stream, _)) = listener.accept() {
                    drop(stream);
                }
            }
        }));
        for _ in 0..CLIENTS {
            let (gate, stop) = (Arc::clone(gate), Arc::clone(stop));
            let (connections, failures) = (Arc::clone(&connections), Arc::clone(&failures));
            threads.push(path.sandbox.pod(2).spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if gate.load(Ordering::Relaxed) != side {
                        thread::sleep(Duration::from_micros(500));
                        continue;
                    }
                    match TcpStream::connect_timeout(&address, Duration::from_secs(1)) {
                        Ok(stream) => {
                            reset(stream);
                            connections.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
        Ok(Self {
            connections,
            failures,
            threads,
        })
    }
}

/// Connections opened and closed per second through each path, interleaved.
pub(crate) fn connect_close(
    reference: &BenchPath,
    test: &BenchPath,
    pairs: usize,
    length: Duration,
) -> Result<(Comparison, u64)> {
    // Nobody's turn (2) until a window opens.
    let gate = Arc::new(AtomicUsize::new(2));
    let stop = Arc::new(AtomicBool::new(false));
    let loads = [
        CrrLoad::start(reference, 0, &gate, &stop)?,
        CrrLoad::start(test, 1, &gate, &stop)?,
    ];
    let measured = alternate(
        pairs,
        |side| {
            let index = usize::from(side == Side::Test);
            let load = &loads[index];
            let cpu_before = CpuTimes::read()?;
            let before = load.connections.load(Ordering::Relaxed);
            let started = Instant::now();
            gate.store(index, Ordering::Relaxed);
            thread::sleep(length);
            let connections = load.connections.load(Ordering::Relaxed) - before;
            let seconds = started.elapsed().as_secs_f64();
            let cpu = CpuTimes::read()?.since(&cpu_before);
            gate.store(2, Ordering::Relaxed);
            // Let the connections in flight finish before the other path's window.
            thread::sleep(Duration::from_millis(20));
            Ok(Window {
                units: connections,
                seconds,
                cpu,
                ..Window::default()
            })
        },
        |_| Ok(()),
    );
    stop.store(true, Ordering::Relaxed);
    let mut failures = 0;
    for load in loads {
        failures += load.failures.load(Ordering::Relaxed);
        for thread in load.threads {
            let _ = thread.join();
        }
    }
    Ok((measured?, failures))
}

/// An iperf3 server on a path's outside host, stopped when dropped.
struct IperfServer(Child);

impl IperfServer {
    fn start(path: &BenchPath) -> Result<Self> {
        let child = path
            .sandbox
            .outside
            .command("iperf3")
            .args(["-s", "-p", &IPERF_PORT.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting iperf3 (cargo xtask bench installs it)")?;
        let server = Self(child);
        // A client that comes before the server listens is refused, and a probe connection
        // would count as a failed test on iperf3's side: the socket table is asked instead.
        // A fixed pause was too short once on a busy machine.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let listening = path
                .sandbox
                .outside
                .command("ss")
                .args(["-Hltn", &format!("sport = :{IPERF_PORT}")])
                .output()
                .context("running ss")?;
            if !listening.stdout.is_empty() {
                return Ok(server);
            }
            if Instant::now() >= deadline {
                bail!("iperf3 did not listen on the outside host within 5 s");
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for IperfServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One iperf3 run from pod 2: bytes received by the outside host and the run's seconds.
///
/// The client runs on one core and the server on the other, the same in every window.
/// Unpinned, the scheduler placed them differently from one run to the next, and single
/// windows of the same path differed by a third.
fn iperf_run(path: &BenchPath, seconds: u32, cores: Cores) -> Result<Window> {
    let cpu_before = CpuTimes::read()?;
    let output = path
        .sandbox
        .pod(2)
        .command("iperf3")
        .args([
            "-c",
            &path.family.outside().to_string(),
            "-p",
            &IPERF_PORT.to_string(),
        ])
        .args(["-t", &seconds.to_string(), "-J"])
        .args(["-A", &format!("{},{}", cores.generator, cores.path)])
        .output()
        .context("running iperf3")?;
    let cpu = CpuTimes::read()?.since(&cpu_before);
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).context("iperf3 printed no JSON")?;
    let received = &report["end"]["sum_received"];
    let (Some(bytes), Some(seconds)) = (received["bytes"].as_u64(), received["seconds"].as_f64())
    else {
        bail!(
            "iperf3 failed: {}",
            report["error"].as_str().unwrap_or("no result")
        );
    };
    Ok(Window {
        units: bytes,
        seconds,
        cpu,
        ..Window::default()
    })
}

/// Profiles of every core during one iperf3 run of `length` through each of `paths`, with all
/// cores' time (idle included, as `perf -a` samples it) per 1500 bytes.
pub(crate) fn profile_stream(
    paths: &[&BenchPath],
    length: Duration,
    cores: Cores,
) -> Result<Vec<Profile>> {
    let _servers: Vec<IperfServer> = paths
        .iter()
        .map(|path| IperfServer::start(path))
        .collect::<Result<_>>()?;
    // The profile takes every core: an agent's periodic work (its garbage collector's map
    // reads) would land in whichever stream ran at the time. The programs go on without it.
    let _agents: Vec<Paused> = paths
        .iter()
        .filter_map(|path| path.agent.as_ref()?.pid())
        .map(Paused::stop)
        .collect::<Result<_>>()?;
    let seconds = u32::try_from(length.as_secs()).unwrap_or(u32::MAX).max(1);
    paths
        .iter()
        .map(|path| {
            let mut measured = None;
            let mut profile = crate::profile::sample(Sampled::AllCores, || {
                measured = Some(iperf_run(path, seconds, cores)?);
                Ok(())
            })?;
            profile.path_ns_per_unit = measured
                .filter(|window| window.units > 0)
                .map(|window| window.cpu.seconds() * 1e9 * 1500.0 / window.units as f64);
            Ok(profile)
        })
        .collect()
}

/// A process stopped (`SIGSTOP`) until this is dropped.
struct Paused(nix::unistd::Pid);

impl Paused {
    fn stop(pid: u32) -> Result<Self> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).context("a process id")?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP)
            .with_context(|| format!("stopping process {pid}"))?;
        Ok(Self(pid))
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
    }
}

/// One TCP stream's throughput through each path, runs of `seconds` interleaved.
pub(crate) fn stream(
    reference: &BenchPath,
    test: &BenchPath,
    pairs: usize,
    seconds: u32,
    cores: Cores,
) -> Result<Comparison> {
    let _servers = [IperfServer::start(reference)?, IperfServer::start(test)?];
    alternate(
        pairs,
        |side| match side {
            Side::Reference => iperf_run(reference, seconds, cores),
            Side::Test => iperf_run(test, seconds, cores),
        },
        |_| Ok(()),
    )
}
