//! Network namespaces owned by a test: created with a `masq-` prefix, deleted on drop (also
//! when the test fails), and usable from threads of this process.

use std::{
    fs::File,
    path::PathBuf,
    process::{Command, Output},
    sync::atomic::{AtomicU32, Ordering},
    thread,
};

use nix::sched::{CloneFlags, setns};

/// Fails the test loudly when not root: namespaces need CAP_SYS_ADMIN.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the namespace tests must run as root (cargo xtask test)"
    );
}

/// A prefix unique to this process and call, so parallel tests never share a namespace.
pub fn unique_tag(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let serial = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("masq-{prefix}{}-{serial}", std::process::id() % 100_000)
}

/// Runs `command`, panicking with its output when it fails.
pub fn run(command: &mut Command) -> Output {
    let line = format!("{command:?}");
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("cannot run {line}: {error}"));
    assert!(
        output.status.success(),
        "{line} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Runs `ip ARGS...`.
pub fn ip(args: &[&str]) -> Output {
    run(Command::new("ip").args(args))
}

/// A network namespace, deleted when dropped.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates namespace `name` (which must start with `masq-`), replacing a stale one left by
    /// a crashed run, with loopback up.
    pub fn new(name: &str) -> Self {
        assert!(
            name.starts_with("masq-"),
            "test namespaces are named masq-*: {name}"
        );
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        ip(&["netns", "add", name]);
        let netns = Self {
            name: name.to_owned(),
        };
        netns.ip(&["link", "set", "lo", "up"]);
        netns
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its bind mount, for `nsenter --net=`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// `ip -n NAME ARGS...`.
    pub fn ip(&self, args: &[&str]) -> Output {
        let mut command = Command::new("ip");
        command.arg("-n").arg(&self.name).args(args);
        run(&mut command)
    }

    /// Creates a veth pair: `name` here, `peer_name` in `peer`.
    pub fn add_veth(&self, name: &str, peer: &Self, peer_name: &str) {
        self.add_veth_at(name, None, peer, peer_name);
    }

    /// As [`Self::add_veth`], with this side at interface index `index` when given.
    pub fn add_veth_at(&self, name: &str, index: Option<u32>, peer: &Self, peer_name: &str) {
        let index = index.map(|index| index.to_string());
        let at: Vec<&str> = index
            .iter()
            .flat_map(|index| ["index", index.as_str()])
            .collect();
        let mut args = vec!["link", "add", name];
        args.extend(at);
        args.extend([
            "type",
            "veth",
            "peer",
            "name",
            peer_name,
            "netns",
            peer.name(),
        ]);
        self.ip(&args);
    }

    /// A command that runs inside the namespace (`nsenter --net`, which keeps the host's
    /// /sys and so its bpffs visible, unlike `ip netns exec`).
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net={}", self.path().display()))
            .arg(program);
        command
    }

    /// Runs `program ARGS...` inside the namespace and asserts success.
    pub fn exec(&self, program: &str, args: &[&str]) -> Output {
        run(self.command(program).args(args))
    }

    /// Sets a sysctl inside the namespace.
    pub fn sysctl(&self, key: &str, value: &str) {
        self.exec("sysctl", &["-qw", &format!("{key}={value}")]);
    }

    /// Runs `work` on a thread that has entered the namespace; sockets it opens live there.
    pub fn enter<T: Send>(&self, work: impl FnOnce() -> T + Send) -> T {
        let path = self.path();
        thread::scope(|scope| {
            scope
                .spawn(move || {
                    enter_thread(&path);
                    work()
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Starts `work` on a detached thread inside the namespace.
    pub fn spawn<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> thread::JoinHandle<T> {
        let path = self.path();
        thread::spawn(move || {
            enter_thread(&path);
            work()
        })
    }

    /// The tc filters on `hook` (`ingress` or `egress`) of `device`, as `tc` prints them
    /// (`filter protocol all pref 1 bpf chain 0 handle 0x1 masq_egress ...`; a u32 filter
    /// prints several lines).
    pub fn tc_filters(&self, device: &str, hook: &str) -> Vec<String> {
        let output = self.exec("tc", &["filter", "show", "dev", device, hook]);
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|line| line.starts_with("filter"))
            .map(str::to_owned)
            .collect()
    }

    /// Whether `device` has a clsact qdisc.
    pub fn has_clsact(&self, device: &str) -> bool {
        let output = self.exec("tc", &["qdisc", "show", "dev", device]);
        String::from_utf8_lossy(&output.stdout).contains("qdisc clsact")
    }

    /// Absolute values of `nstat` counters inside the namespace.
    pub fn nstat(&self) -> std::collections::BTreeMap<String, u64> {
        let output = self.exec("nstat", &["-az", "--json"]);
        let text = String::from_utf8_lossy(&output.stdout);
        parse_nstat_json(&text)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Moves the calling thread into the namespace at `path`.
pub fn enter_thread(path: &std::path::Path) {
    let file =
        File::open(path).unwrap_or_else(|error| panic!("opening {}: {error}", path.display()));
    setns(&file, CloneFlags::CLONE_NEWNET)
        .unwrap_or_else(|error| panic!("entering {}: {error}", path.display()));
}

/// Extracts `"Name": value` pairs from nstat's JSON (`{"kernel":{"IpInReceives":1,...}}`).
fn parse_nstat_json(text: &str) -> std::collections::BTreeMap<String, u64> {
    let mut counters = std::collections::BTreeMap::new();
    let body = text.split_once("\"kernel\"").map_or(text, |(_, rest)| rest);
    for pair in body.split(',') {
        let pair =
            pair.trim_matches(|c: char| c == '{' || c == '}' || c == ':' || c.is_whitespace());
        if let Some((name, value)) = pair.split_once(':') {
            let name = name.trim().trim_matches('"');
            if let Ok(value) = value.trim().trim_end_matches('}').trim().parse() {
                counters.insert(name.to_owned(), value);
            }
        }
    }
    counters
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nstat_json_parses() {
        let counters = parse_nstat_json(
            "{\"kernel\":{\"IpInReceives\":12,\"TcpInCsumErrors\":0,\n\"UdpInCsumErrors\":3}}",
        );
        assert_eq!(counters.get("IpInReceives"), Some(&12));
        assert_eq!(counters.get("TcpInCsumErrors"), Some(&0));
        assert_eq!(counters.get("UdpInCsumErrors"), Some(&3));
    }
}
