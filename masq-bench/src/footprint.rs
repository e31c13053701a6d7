//! The agent's own cost: memory and CPU when idle, while it loads a 10k-CIDR config, and while
//! its garbage collector walks (and then empties) a full NAT table; and how long `/healthz`
//! takes to answer meanwhile, as the kubelet's probe would see it.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use masq_testbed::agent::METRICS_ADDR;

use crate::{
    cpu::{process_time, resident_bytes},
    frames::Family,
    paths::{BenchPath, Cores, Mode},
    udp::{MasqFill, on_core},
};

/// What the agent did during one phase.
#[derive(Clone, Debug, Default)]
pub(crate) struct Phase {
    pub(crate) name: String,
    pub(crate) seconds: f64,
    /// CPU seconds the agent used.
    pub(crate) cpu_seconds: f64,
    /// Highest resident memory seen, bytes.
    pub(crate) peak_rss: u64,
    /// `/healthz` answers during the phase: count, slowest, and the slowest but 1 %.
    pub(crate) probes: usize,
    pub(crate) healthz_max: Duration,
    pub healthz_p99: Duration,
}

/// Sizes of the measurement.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FootprintSettings {
    pub(crate) nat_entries: u32,
    /// CIDRs of the reloaded config.
    pub(crate) reload_cidrs: usize,
    pub(crate) idle: Duration,
    /// How long the collector walks the full table before its flows expire.
    pub(crate) scan: Duration,
    /// Whether to wait for every flow to expire (UDP: 30 s) and time that collection.
    pub(crate) expire: bool,
}

/// The agent's footprint phases and the table it collected.
#[derive(Clone, Debug, Default)]
pub(crate) struct Footprint {
    pub(crate) phases: Vec<Phase>,
    pub(crate) table_entries: u64,
    pub(crate) gc_interval: &'static str,
}

/// Samples of the agent: memory and CPU every few milliseconds, `/healthz` latency as fast as
/// it answers (one request at a time, as a probe).
struct Monitor {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<(Instant, u64, Duration)>>>,
    probes: Arc<Mutex<Vec<(Instant, Duration)>>>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Monitor {
    fn start(path: &BenchPath, pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let probes = Arc::new(Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        {
            let (stop, samples) = (Arc::clone(&stop), Arc::clone(&samples));
            threads.push(thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let (Ok(rss), Ok(cpu)) = (resident_bytes(pid), process_time(pid)) {
                        samples
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .push((Instant::now(), rss, cpu));
                    }
                    thread::sleep(Duration::from_millis(10));
                }
            }));
        }
        {
            let (stop, probes) = (Arc::clone(&stop), Arc::clone(&probes));
            threads.push(path.sandbox.node.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    if healthz().is_ok() {
                        probes
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .push((started, started.elapsed()));
                    }
                    thread::sleep(Duration::from_millis(10));
                }
            }));
        }
        Self {
            stop,
            samples,
            probes,
            threads,
        }
    }

    /// What happened between `from` and `to`.
    fn phase(&self, name: &str, from: Instant, to: Instant) -> Phase {
        let samples = self
            .samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let inside: Vec<_> = samples
            .iter()
            .filter(|(at, _, _)| *at >= from && *at <= to)
            .collect();
        let cpu = match (inside.first(), inside.last()) {
            (Some(first), Some(last)) => last.2.saturating_sub(first.2).as_secs_f64(),
            _ => 0.0,
        };
        let mut latencies: Vec<Duration> = self
            .probes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|(at, _)| *at >= from && *at <= to)
            .map(|(_, latency)| *latency)
            .collect();
        latencies.sort();
        let p99 = latencies
            .get(latencies.len().saturating_sub(1) * 99 / 100)
            .copied()
            .unwrap_or_default();
        Phase {
            name: name.to_owned(),
            seconds: (to - from).as_secs_f64(),
            cpu_seconds: cpu,
            peak_rss: inside.iter().map(|(_, rss, _)| *rss).max().unwrap_or(0),
            probes: latencies.len(),
            healthz_max: latencies.last().copied().unwrap_or_default(),
            healthz_p99: p99,
        }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

/// One `GET /healthz`, from inside the node's namespace (the calling thread's).
fn healthz() -> Result<()> {
    let address: SocketAddr = METRICS_ADDR.parse()?;
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: masq\r\nConnection: close\r\n\r\n")?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    if !response.starts_with(b"HTTP/1.1 200") {
        bail!("/healthz did not answer 200");
    }
    Ok(())
}

/// Waits until `condition` holds (bounded), returning when it did.
fn wait_until(
    what: &str,
    timeout: Duration,
    mut condition: impl FnMut() -> bool,
) -> Result<Instant> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if condition() {
            return Ok(Instant::now());
        }
        if crate::interrupted() {
            bail!("interrupted");
        }
        thread::sleep(Duration::from_millis(20));
    }
    bail!("timed out waiting for {what}")
}

pub(crate) fn measure(settings: &FootprintSettings, cores: Cores) -> Result<Footprint> {
    let mut path = BenchPath::new(Mode::Masq, Family::V4, 3, settings.nat_entries, cores)?;
    let agent = path.agent.as_ref().context("no agent")?;
    let pid = agent.pid().context("the agent is not running")?;
    let monitor = Monitor::start(&path, pid);
    let mut phases = Vec::new();

    let idle_from = Instant::now();
    thread::sleep(settings.idle);
    phases.push(monitor.phase("idle (3 CIDRs, empty table)", idle_from, Instant::now()));

    let reload_from = Instant::now();
    path.config().replace(settings.reload_cidrs)?;
    let agent = path.agent.as_ref().context("no agent")?;
    let expected = settings.reload_cidrs as f64 + 1.0;
    let applied = wait_until("the reloaded config", Duration::from_secs(60), || {
        agent.metric("masq_nomasq_trie_entries") == Some(expected)
    })?;
    phases.push(monitor.phase(
        &format!("reload to {} CIDRs (until applied)", settings.reload_cidrs),
        reload_from,
        applied,
    ));

    let filled = on_core(cores.generator, || MasqFill::to_capacity(&path))?;
    let entries = filled.entries;
    let scan_from = Instant::now();
    thread::sleep(settings.scan);
    phases.push(monitor.phase(
        &format!("collecting a full table ({entries} entries), nothing expired"),
        scan_from,
        Instant::now(),
    ));
    if settings.expire {
        let expire_from = Instant::now();
        let agent = path.agent.as_ref().context("no agent")?;
        let emptied = wait_until("the flows to expire", Duration::from_secs(90), || {
            agent
                .metric("masq_nat_entries{family=\"ipv4\"}")
                .is_some_and(|value| value < 100.0)
        })?;
        // The pass that removed them ended before the gauge could say so.
        phases.push(monitor.phase(
            "until every flow has expired and been collected (UDP: 30 s)",
            expire_from,
            emptied,
        ));
    }
    monitor.stop();
    path.agent.take();
    Ok(Footprint {
        phases,
        table_entries: entries,
        gc_interval: crate::paths::GC_INTERVAL,
    })
}
