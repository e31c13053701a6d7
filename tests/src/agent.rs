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

use crate::sandbox::{Sandbox, UPLINK};

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

/// A `masq agent` process in a node namespace; killed and uninstalled when dropped.
#[derive(Debug)]
pub struct Agent {
    node: PathBuf,
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

    /// Starts `masq agent` without waiting for anything.
    pub fn launch(sandbox: &Sandbox, args: &[&str]) -> Self {
        let pin_path = PathBuf::from("/sys/fs/bpf").join(&sandbox.tag);
        let log_path = env::temp_dir().join(format!("{}-agent.log", sandbox.tag));
        let mut agent = Self {
            node: sandbox.node.path(),
            node_name: sandbox.node.name().to_owned(),
            pin_path,
            log_path,
            args: args.iter().map(|&arg| arg.to_owned()).collect(),
            env: Vec::new(),
            child: None,
        };
        agent.spawn();
        agent
    }

    fn spawn(&mut self) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .unwrap_or_else(|error| panic!("opening {}: {error}", self.log_path.display()));
        let log_err = log.try_clone().unwrap_or_else(|error| panic!("{error}"));
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net={}", self.node.display()))
            .arg(masq_binary())
            .args(["--log-level", "info", "agent", "--interface", UPLINK])
            .arg("--pin-path")
            .arg(&self.pin_path)
            .args(["--metrics-addr", METRICS_ADDR, "--gc-interval", "1s"])
            .args(&self.args)
            .envs(self.env.iter().map(|(key, value)| (key, value)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        self.child = Some(
            command
                .spawn()
                .unwrap_or_else(|error| panic!("starting masq agent: {error}")),
        );
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

    /// Waits until `/metrics` answers, whether or not the agent is ready.
    pub fn wait_serving(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.http_get("/metrics").is_some() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
        panic!("masq agent serves no metrics after 20s:\n{}", self.log());
    }

    /// The value of metric `name` (with its label set, e.g. `masq_x{a="b"}`), if present.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let (_, body) = self.http_get("/metrics")?;
        body.lines().find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            (series == name).then(|| value.parse().ok()).flatten()
        })
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

    /// Runs `masq ARGS...` in the node namespace as given.
    pub fn masq_command(&self, args: &[&str]) -> Output {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net={}", self.node.display()))
            .arg(masq_binary())
            .args(args);
        command
            .output()
            .unwrap_or_else(|error| panic!("running masq {args:?}: {error}"))
    }

    /// The node namespace's name.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
        uninstall_quietly(&self.node, &self.pin_path);
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
        let _ = Command::new("nsenter")
            .arg(format!("--net={}", node.display()))
            .arg(binary)
            .args(["uninstall", "--pin-path"])
            .arg(pin_path)
            .output();
    }
}
