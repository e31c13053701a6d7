//! Running `masq` in a sandbox's node namespace.

use std::{
    env, fs,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::{
    caps::{CapabilitySet, daemonset_capabilities, effective_capabilities, run_restricted},
    sandbox::{Sandbox, UPLINK},
};

/// Where the agent serves metrics inside the node namespace.
pub const METRICS_ADDR: &str = "127.0.0.1:9523";

/// Where the `masq` binary built alongside this one is (override with `MASQ_BIN`).
fn locate_masq_binary() -> Option<PathBuf> {
    if let Some(path) = env::var_os("MASQ_BIN") {
        return Some(PathBuf::from(path));
    }
    // Tests run from target/<profile>/deps/, binaries from target/<profile>/.
    let current = env::current_exe().ok()?;
    let mut dir = current.parent()?;
    if dir.file_name().is_some_and(|name| name == "deps") {
        dir = dir.parent()?;
    }
    Some(dir.join("masq")).filter(|binary| binary.is_file())
}

/// The `masq` binary built alongside the tests; fails the test when it is missing.
pub fn masq_binary() -> PathBuf {
    locate_masq_binary()
        .unwrap_or_else(|| panic!("the masq binary is missing; build it with `cargo build -p masq-userspace` (cargo xtask test does)"))
}

/// The capabilities every `masq` process of the tests holds: the DaemonSet's, read once.
pub fn agent_capabilities() -> CapabilitySet {
    static CAPABILITIES: std::sync::OnceLock<CapabilitySet> = std::sync::OnceLock::new();
    *CAPABILITIES.get_or_init(daemonset_capabilities)
}

/// `masq ARGS...` (`binary`, or the `masq` built alongside) in the namespace at `netns`, holding
/// only the DaemonSet's capabilities.
fn restricted_masq(binary: Option<&Path>, netns: &Path) -> Command {
    let mut command = Command::new(binary.map_or_else(masq_binary, Path::to_path_buf));
    run_restricted(&mut command, netns, agent_capabilities());
    command
}

/// A `masq agent` process in a node namespace; killed and uninstalled when dropped.
#[derive(Debug)]
pub struct Agent {
    /// The `masq` binary to run; `None`: the one built alongside (see [`masq_binary`]).
    binary: Option<PathBuf>,
    node: PathBuf,
    /// `--interface` values; empty lets the agent find the uplinks itself.
    interfaces: Vec<String>,
    attach_mode: &'static str,
    node_name: String,
    pin_path: PathBuf,
    log_path: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
}

impl Agent {
    /// Starts `masq agent` on the sandbox's uplink with `args` (config source, flags) and waits
    /// until it reports ready.
    pub fn start(sandbox: &Sandbox, args: &[&str]) -> Self {
        let mut agent = Self::launch(sandbox, args);
        agent.wait_ready();
        agent
    }

    /// Like [`Agent::start`], running `binary` instead of the `masq` built alongside (another
    /// revision's, which embeds its own datapath). Its own `uninstall` cleans up after it.
    pub fn start_binary(sandbox: &Sandbox, binary: &Path, args: &[&str]) -> Self {
        let mut agent = Self::prepare(sandbox, args);
        agent.binary = Some(binary.to_path_buf());
        agent.spawn();
        agent.wait_ready();
        agent
    }

    /// Like [`Agent::start`], with extra environment variables for the agent process.
    pub fn start_with_env(sandbox: &Sandbox, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut agent = Self::launch(sandbox, args);
        agent.kill();
        agent.env = env
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        agent.spawn();
        agent.wait_ready();
        agent
    }

    /// Starts `masq agent` with `--interface` for each of `interfaces` (none: the agent finds
    /// the uplinks itself) and waits until it reports ready.
    pub fn start_on(sandbox: &Sandbox, interfaces: &[&str], args: &[&str]) -> Self {
        let mut agent = Self::prepare(sandbox, args);
        agent.interfaces = interfaces.iter().map(|&name| name.to_owned()).collect();
        agent.spawn();
        agent.wait_ready();
        agent
    }

    /// Starts `masq agent` without waiting for anything.
    pub fn launch(sandbox: &Sandbox, args: &[&str]) -> Self {
        let mut agent = Self::prepare(sandbox, args);
        agent.spawn();
        agent
    }

    /// An agent that is not started: its pin path and `masq` commands in the node namespace,
    /// for running `masq` by hand.
    pub fn unstarted(sandbox: &Sandbox) -> Self {
        Self::prepare(sandbox, &[])
    }

    /// The agent, not started yet, on the sandbox's uplink.
    fn prepare(sandbox: &Sandbox, args: &[&str]) -> Self {
        let pin_path = PathBuf::from("/sys/fs/bpf").join(&sandbox.tag);
        let log_path = env::temp_dir().join(format!("{}-agent.log", sandbox.tag));
        Self {
            binary: None,
            node: sandbox.node.path(),
            interfaces: vec![UPLINK.to_owned()],
            attach_mode: sandbox.attach_mode.flag(),
            node_name: sandbox.node.name().to_owned(),
            pin_path,
            log_path,
            args: args.iter().map(|&arg| arg.to_owned()).collect(),
            env: Vec::new(),
            child: None,
        }
    }

    fn spawn(&mut self) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .unwrap_or_else(|error| panic!("opening {}: {error}", self.log_path.display()));
        let log_err = log.try_clone().unwrap_or_else(|error| panic!("{error}"));
        let mut command = restricted_masq(self.binary.as_deref(), &self.node);
        command
            .args(["--log-level", "info", "agent"])
            .args(
                self.interfaces
                    .iter()
                    .flat_map(|interface| ["--interface", interface.as_str()]),
            )
            .args(["--attach-mode", self.attach_mode])
            .arg("--pin-path")
            .arg(&self.pin_path)
            .args(["--metrics-addr", METRICS_ADDR])
            // Tests want expired flows gone quickly; a caller's own interval wins.
            .args(
                (!self.args.iter().any(|arg| arg.starts_with("--gc-interval")))
                    .then_some(["--gc-interval", "1s"])
                    .into_iter()
                    .flatten(),
            )
            .args(&self.args)
            .envs(self.env.iter().map(|(key, value)| (key, value)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        let child = command
            .spawn()
            .unwrap_or_else(|error| panic!("starting masq agent: {error}"));
        let held = effective_capabilities(child.id());
        self.child = Some(child);
        assert_eq!(
            held,
            agent_capabilities(),
            "the agent must hold exactly the DaemonSet's capabilities {:?}, it holds {:?}",
            agent_capabilities().names(),
            held.names()
        );
    }

    /// The agent's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The pin directory the agent uses.
    pub fn pin_path(&self) -> &Path {
        &self.pin_path
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// An HTTP GET on the agent's metrics server; `(status line, body)`.
    pub fn http_get(&self, path: &str) -> Option<(String, String)> {
        let address = METRICS_ADDR.parse().ok()?;
        http_get(&self.node, address, path)
    }

    /// Waits up to 20 s for `/readyz` to answer 200.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("masq agent exited with {status}:\n{}", self.log());
            }
            if matches!(self.http_get("/readyz"), Some((status, _)) if status.contains(" 200 ")) {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
        panic!("masq agent not ready after 20s:\n{}", self.log());
    }

    /// Waits until the endpoints answer and the agent is past its start, whether or not it is
    /// ready.
    pub fn wait_serving(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            // The endpoints answer from the first moment; "starting" means the first config
            // load and the datapath setup are still under way.
            if self
                .http_get("/readyz")
                .is_some_and(|(_, body)| !body.contains("starting"))
            {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
        panic!("masq agent not past its start after 20s:\n{}", self.log());
    }

    /// The value of metric `name` (with its label set, e.g. `masq_x{a="b"}`), if present.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let (_, body) = self.http_get("/metrics")?;
        body.lines().find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            (series == name).then(|| value.parse().ok()).flatten()
        })
    }

    /// The sum of every series of metric family `name` whose labels include all of `labels`
    /// (`key="value"` each), or `None` when the page has none.
    pub fn metric_sum(&self, name: &str, labels: &[&str]) -> Option<f64> {
        let (_, body) = self.http_get("/metrics")?;
        let values: Vec<f64> = body
            .lines()
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let (family, label_set) = series.split_once('{').unwrap_or((series, ""));
                let matches = family == name
                    && labels.iter().all(|label| {
                        label_set
                            .split(',')
                            .any(|pair| pair.trim_end_matches('}') == *label)
                    });
                matches.then(|| value.parse().ok()).flatten()
            })
            .collect();
        (!values.is_empty()).then(|| values.iter().sum())
    }

    /// The datapath counter `name` (IPv4's, or with `ipv6` IPv6's) as `masq status` reads it
    /// (0 when it never moved).
    pub fn counter(&self, name: &str, ipv6: bool) -> u64 {
        let status = self.status();
        let key = if ipv6 { "counters_v6" } else { "counters" };
        status[key]
            .as_array()
            .into_iter()
            .flatten()
            .find(|pair| pair[0] == name)
            .and_then(|pair| pair[1].as_u64())
            .unwrap_or(0)
    }

    /// Flows of `family` (`ipv4`, `ipv6`) evicted to make room, whatever the cause and class.
    pub fn evictions(&self, family: &str) -> f64 {
        self.metric_sum(
            "masq_nat_evictions_total",
            &[&format!("family=\"{family}\"")],
        )
        .unwrap_or(0.0)
    }

    /// Waits up to `timeout` for the agent to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Kills the agent with SIGKILL, leaving its datapath in place.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the agent with SIGTERM and waits for it.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self
            .child
            .take()
            .unwrap_or_else(|| panic!("the agent is not running"));
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(0));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)
            .unwrap_or_else(|error| panic!("{error}"));
        child.wait().unwrap_or_else(|error| panic!("{error}"))
    }

    /// Stops the agent (SIGKILL) and starts it again with `args` instead of the original
    /// arguments, without waiting. The pins stay.
    pub fn relaunch(&mut self, args: &[&str]) {
        self.kill();
        self.args = args.iter().map(|&arg| arg.to_owned()).collect();
        self.spawn();
    }

    /// Starts the agent again with the same arguments and waits until it is ready.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
        self.wait_ready();
    }

    /// Runs a `masq` command (status, nat list, uninstall...) in the node namespace against
    /// this agent's pins.
    pub fn masq(&self, args: &[&str]) -> Output {
        let mut with_pins: Vec<&str> = args.to_vec();
        let pin_path = self.pin_path.to_string_lossy();
        with_pins.extend(["--pin-path", &pin_path]);
        self.masq_command(&with_pins)
    }

    /// Runs `masq ARGS...` in the node namespace as given, with the DaemonSet's capabilities
    /// (as `kubectl exec` into the agent's pod would).
    pub fn masq_command(&self, args: &[&str]) -> Output {
        restricted_masq(self.binary.as_deref(), &self.node)
            .args(args)
            .output()
            .unwrap_or_else(|error| panic!("running masq {args:?}: {error}"))
    }

    /// `masq status --output json`, asserting it succeeds.
    pub fn status(&self) -> serde_json::Value {
        let output = self.masq(&["status", "--output", "json"]);
        assert!(
            output.status.success(),
            "masq status: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|error| panic!("masq status printed no JSON: {error}"))
    }

    /// The node namespace's name.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
        match &self.binary {
            Some(binary) => uninstall_with(binary, &self.node, &self.pin_path),
            None => uninstall_quietly(&self.node, &self.pin_path),
        }
        let _ = fs::remove_file(&self.log_path);
    }
}

/// An HTTP GET from inside the network namespace at `netns` (where a probe or a scraper on the
/// node would send it); `(status line, body)`, or `None` when nothing answers.
pub fn http_get(netns: &Path, address: SocketAddr, path: &str) -> Option<(String, String)> {
    let netns = netns.to_path_buf();
    let path = path.to_owned();
    thread::spawn(move || {
        crate::netns::enter_thread(&netns);
        let mut stream = TcpStream::connect_timeout(&address, Duration::from_millis(500)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(stream, "GET {path} HTTP/1.1\r\nHost: masq\r\n\r\n").ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        Some((head.lines().next()?.to_owned(), body.to_owned()))
    })
    .join()
    .ok()
    .flatten()
}

/// Removes whatever a test's agent left pinned under `pin_path`, with the `masq` built alongside
/// the tests, in the node namespace at `node`. Never panics: this runs while failed tests unwind.
pub fn uninstall_quietly(node: &Path, pin_path: &Path) {
    if let Some(binary) = locate_masq_binary() {
        uninstall_with(&binary, node, pin_path);
    }
}

/// [`uninstall_quietly`] with `binary`.
fn uninstall_with(binary: &Path, node: &Path, pin_path: &Path) {
    // Full root here: cleaning up must work even when the restricted path is broken.
    let _ = Command::new("nsenter")
        .arg(format!("--net={}", node.display()))
        .arg(binary)
        .args(["uninstall", "--pin-path"])
        .arg(pin_path)
        .output();
}
