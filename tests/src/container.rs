//! masq's image under podman, run the way the kubelet runs a container of a rendered DaemonSet:
//! its image, command and arguments, its security context (capabilities, read-only root,
//! seccomp, AppArmor, SELinux, no privilege escalation) and its volume mounts (hostPaths from
//! this machine, ConfigMap volumes from directories laid out as the kubelet writes them), in a
//! sandbox node's network namespace instead of the host network.
//!
//! Podman runs with runc and cgroupfs, which work on every machine `cargo xtask test` prepares
//! (see its setup); `--pull=never` because no registry is reachable: the image comes from
//! `cargo xtask image`.

use std::{
    fs,
    path::Path,
    process::{Command, Output, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    manifest::{container, strings},
    netns::Netns,
};

/// `podman` with the runtime settings this testbed uses.
pub fn podman() -> Command {
    let mut command = Command::new("podman");
    command.args(["--runtime", "runc", "--cgroup-manager", "cgroupfs"]);
    command
}

fn podman_output(args: &[&str]) -> Output {
    podman()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|error| panic!("cannot run podman (cargo xtask test installs it): {error}"))
}

/// Fails the test unless podman has `image`.
pub fn require_image(image: &str) {
    let exists = podman_output(&["image", "exists", image]);
    assert!(
        exists.status.success(),
        "podman has no image {image}; build it with `cargo xtask image` (cargo xtask test does): {}",
        String::from_utf8_lossy(&exists.stderr)
    );
}

/// The image the tests run in place of the manifests' `masq:<version>`: `cargo xtask test` sets
/// `MASQ_TEST_IMAGE` to its checkout's own name for the image it just built, because every
/// checkout on a machine builds `masq:<version>` into the same container storage.
fn image_under_test(manifest_image: &str) -> String {
    std::env::var("MASQ_TEST_IMAGE").unwrap_or_else(|_| manifest_image.to_owned())
}

/// One container of a workload, translated to `podman run` arguments.
#[derive(Clone, Debug)]
pub struct ContainerSpec {
    /// The image: the manifest's, or the one under test (see [`image_under_test`]).
    pub image: String,
    /// `podman run` options: network, security, mounts, entrypoint.
    pub options: Vec<String>,
    /// The container's arguments (the manifest's, then any the test adds).
    pub args: Vec<String>,
}

/// A security setting of the container, or of the pod when the container has none.
fn security<'a>(workload: &'a Value, container: &'a Value, key: &str) -> &'a Value {
    let own = &container["securityContext"][key];
    if own.is_null() {
        &workload["spec"]["template"]["spec"]["securityContext"][key]
    } else {
        own
    }
}

fn capability(name: &str) -> String {
    if name.starts_with("CAP_") {
        name.to_owned()
    } else {
        format!("CAP_{name}")
    }
}

impl ContainerSpec {
    /// Container `name` of `workload` (a rendered DaemonSet) on the sandbox node `node`.
    /// `volumes` gives the directory behind each volume that is not a hostPath (ConfigMap and
    /// projected volumes), by volume name; hostPaths are this machine's, as on a node.
    pub fn from_manifest(
        workload: &Value,
        name: &str,
        node: &Netns,
        volumes: &[(&str, &Path)],
    ) -> Self {
        let pod = &workload["spec"]["template"]["spec"];
        let spec = container(workload, name);
        let mut options: Vec<String> = Vec::new();
        let mut option =
            |words: &[&str]| options.extend(words.iter().map(|word| (*word).to_owned()));

        assert_eq!(
            pod["hostNetwork"], true,
            "only hostNetwork pods are emulated (in a sandbox node namespace)"
        );
        option(&["--network", &format!("ns:{}", node.path().display())]);

        let context = &spec["securityContext"];
        assert_ne!(
            context["privileged"], true,
            "privileged containers are not emulated"
        );
        if context["readOnlyRootFilesystem"] == true {
            // Podman would add tmpfs mounts on /run, /tmp...; the kubelet adds none.
            option(&["--read-only", "--read-only-tmpfs=false"]);
        }
        if context["allowPrivilegeEscalation"] == false {
            option(&["--security-opt", "no-new-privileges"]);
        }
        let drop = strings(&context["capabilities"]["drop"]);
        for dropped in &drop {
            if dropped == "ALL" {
                option(&["--cap-drop=all"]);
            } else {
                option(&[&format!("--cap-drop={}", capability(dropped))]);
            }
        }
        for added in strings(&context["capabilities"]["add"]) {
            option(&[&format!("--cap-add={}", capability(&added))]);
        }
        match security(workload, spec, "seccompProfile")["type"].as_str() {
            Some("Unconfined") => option(&["--security-opt", "seccomp=unconfined"]),
            None | Some("RuntimeDefault") => {}
            Some(other) => panic!("seccompProfile {other} is not emulated"),
        }
        match security(workload, spec, "appArmorProfile")["type"].as_str() {
            Some("Unconfined") => option(&["--security-opt", "apparmor=unconfined"]),
            None | Some("RuntimeDefault") => {}
            Some(other) => panic!("appArmorProfile {other} is not emulated"),
        }
        if let Some(selinux) = security(workload, spec, "seLinuxOptions").as_object() {
            for (key, value) in selinux {
                let value = value.as_str().unwrap_or_default();
                option(&["--security-opt", &format!("label={key}:{value}")]);
            }
        }
        for variable in spec["env"].as_array().into_iter().flatten() {
            let value = variable["value"]
                .as_str()
                .unwrap_or_else(|| panic!("only literal env values are emulated: {variable}"));
            option(&[
                "--env",
                &format!("{}={value}", variable["name"].as_str().unwrap_or("")),
            ]);
        }

        for mount in spec["volumeMounts"].as_array().into_iter().flatten() {
            let volume_name = mount["name"].as_str().unwrap_or_default();
            assert!(
                mount["subPath"].is_null(),
                "subPath mounts are not emulated"
            );
            let volume = pod["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|volume| volume["name"] == volume_name)
                .unwrap_or_else(|| panic!("volume {volume_name} is mounted but not defined"));
            let mut read_only = mount["readOnly"] == true;
            let source = if let Some(host_path) = volume["hostPath"]["path"].as_str() {
                prepare_host_path(host_path, volume["hostPath"]["type"].as_str().unwrap_or(""));
                host_path.to_owned()
            } else if ["configMap", "projected", "secret"]
                .iter()
                .any(|kind| !volume[*kind].is_null())
            {
                // The kubelet mounts these read-only whatever the mount says.
                read_only = true;
                volumes
                    .iter()
                    .find(|(name, _)| *name == volume_name)
                    .unwrap_or_else(|| {
                        panic!("the test supplies no directory for volume {volume_name}")
                    })
                    .1
                    .display()
                    .to_string()
            } else {
                panic!("volume {volume} is not emulated");
            };
            let mut flags = Vec::new();
            if read_only {
                flags.push("ro");
            }
            match mount["mountPropagation"].as_str() {
                Some("HostToContainer") => flags.push("rslave"),
                Some("Bidirectional") => flags.push("rshared"),
                None | Some("None") => {}
                Some(other) => panic!("mountPropagation {other} is unknown"),
            }
            let target = mount["mountPath"].as_str().unwrap_or_default();
            let flags = if flags.is_empty() {
                String::new()
            } else {
                format!(":{}", flags.join(","))
            };
            option(&["--volume", &format!("{source}:{target}{flags}")]);
        }

        let command = strings(&spec["command"]);
        if !command.is_empty() {
            let entrypoint = serde_json::to_string(&command).unwrap_or_default();
            option(&["--entrypoint", &entrypoint]);
        }
        Self {
            image: image_under_test(spec["image"].as_str().unwrap_or_default()),
            options,
            args: strings(&spec["args"]),
        }
    }

    /// The same container with `extra` arguments after the manifest's.
    pub fn with_args(mut self, extra: &[&str]) -> Self {
        self.args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        self
    }

    /// The same container with mount `source:target` replaced by `replacement` (e.g. to give
    /// it a directory that is not bpffs at /sys/fs/bpf).
    pub fn with_mount(mut self, target: &str, replacement: &Path) -> Self {
        for (index, option) in self.options.iter().enumerate() {
            if index > 0
                && self.options[index - 1] == "--volume"
                && option.split(':').nth(1) == Some(target)
            {
                let rest: Vec<&str> = option.splitn(3, ':').skip(1).collect();
                self.options[index] = format!("{}:{}", replacement.display(), rest.join(":"));
                return self;
            }
        }
        panic!("the container mounts nothing at {target}");
    }

    /// The value of `--<flag>=VALUE` among the arguments.
    pub fn arg_value(&self, flag: &str) -> Option<&str> {
        let prefix = format!("--{flag}=");
        self.args.iter().find_map(|arg| arg.strip_prefix(&prefix))
    }

    fn run_args(&self) -> Vec<String> {
        let mut words = vec!["--pull=never".to_owned()];
        words.extend(self.options.iter().cloned());
        words.push(self.image.clone());
        words.extend(self.args.iter().cloned());
        words
    }

    /// Runs the container in the foreground until it exits (as an init container runs).
    pub fn run_to_completion(&self) -> Output {
        require_image(&self.image);
        let mut command = podman();
        command.args(["run", "--rm"]).args(self.run_args());
        command
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|error| panic!("podman run: {error}"))
    }
}

/// A hostPath as the kubelet prepares it for its `type`.
fn prepare_host_path(path: &str, kind: &str) {
    let path = Path::new(path);
    match kind {
        "Directory" => assert!(path.is_dir(), "hostPath {} is no directory", path.display()),
        "DirectoryOrCreate" => fs::create_dir_all(path)
            .unwrap_or_else(|error| panic!("creating {}: {error}", path.display())),
        "File" => assert!(path.is_file(), "hostPath {} is no file", path.display()),
        "FileOrCreate" => {
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .unwrap_or_else(|error| panic!("creating {}: {error}", path.display()));
        }
        "" => {}
        other => panic!("hostPath type {other} is not emulated"),
    }
}

/// A running container, restarted as the kubelet restarts one: a new container from the same
/// spec (so the pins, not the container, carry state). Removed when dropped; the logs of every
/// incarnation are kept.
#[derive(Debug)]
pub struct Container {
    prefix: String,
    name: String,
    spec: ContainerSpec,
    earlier_logs: String,
}

impl Container {
    /// Starts `spec` in the background; `prefix` (e.g. the sandbox's tag) names it.
    pub fn start(prefix: &str, spec: ContainerSpec) -> Self {
        require_image(&spec.image);
        let mut container = Self {
            prefix: prefix.to_owned(),
            name: String::new(),
            spec,
            earlier_logs: String::new(),
        };
        container.launch();
        container
    }

    fn launch(&mut self) {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        self.name = format!("{}-{}", self.prefix, NEXT.fetch_add(1, Ordering::Relaxed));
        let _ = podman_output(&["rm", "--force", &self.name]);
        let mut command = podman();
        command
            .args(["run", "--detach", "--name", &self.name])
            .args(self.spec.run_args());
        let output = command
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|error| panic!("podman run: {error}"));
        assert!(
            output.status.success(),
            "podman run {:?} failed: {}",
            self.spec.run_args(),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The container's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The logs of every incarnation so far.
    pub fn logs(&self) -> String {
        let current = podman_output(&["logs", &self.name]);
        format!(
            "{}{}{}",
            self.earlier_logs,
            String::from_utf8_lossy(&current.stdout),
            String::from_utf8_lossy(&current.stderr)
        )
    }

    /// `(status, exit code)` as podman reports them.
    fn state(&self) -> (String, Option<i32>) {
        let output = podman_output(&[
            "inspect",
            "--format",
            "{{.State.Status}} {{.State.ExitCode}}",
            &self.name,
        ]);
        let text = String::from_utf8_lossy(&output.stdout);
        let mut words = text.split_whitespace();
        let status = words.next().unwrap_or("gone").to_owned();
        (status, words.next().and_then(|code| code.parse().ok()))
    }

    /// The exit code once the container exited by itself, waiting up to `timeout`.
    pub fn wait_exit(&self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let (status, code) = self.state();
            if status == "exited" || status == "stopped" {
                return code;
            }
            thread::sleep(Duration::from_millis(100));
        }
        None
    }

    /// Whether the container still runs.
    pub fn running(&self) -> bool {
        self.state().0 == "running"
    }

    /// SIGKILL, as when a node's runtime kills the pod; the datapath stays.
    pub fn kill(&mut self) {
        let _ = podman_output(&["kill", "--signal", "KILL", &self.name]);
        let _ = self.wait_exit(Duration::from_secs(10));
    }

    /// SIGTERM, then SIGKILL after `grace`, as the kubelet stops a container; the exit code.
    pub fn stop(&mut self, grace: Duration) -> Option<i32> {
        let seconds = grace.as_secs().max(1).to_string();
        let _ = podman_output(&["stop", "--time", &seconds, &self.name]);
        self.wait_exit(Duration::from_secs(5))
    }

    /// Replaces the container with a new one from the same spec (killing it first if it runs).
    pub fn restart(&mut self) {
        if self.running() {
            self.kill();
        }
        self.earlier_logs = self.logs();
        let _ = podman_output(&["rm", "--force", &self.name]);
        self.launch();
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman_output(&["rm", "--force", "--time", "0", &self.name]);
    }
}
