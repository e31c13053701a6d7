//! Packets whose `skb->csum` the receiving NIC computed (`CHECKSUM_COMPLETE`: mlx5, and most
//! NICs that do not parse headers) cross masq in both directions and both families, and the
//! stacks after it never find that sum wrong.
//!
//! A wrong `skb->csum` does not corrupt the packet: the stack that checks the transport checksum
//! with it sees a mismatch, verifies the packet again in software, finds it right and calls
//! `netdev_rx_csum_fault` ("hw csum failure"), for every packet. The checksum counters
//! (`InCsumErrors`) only move if the packet itself is wrong, and the kernel log shows only the
//! first report since boot (`DO_ONCE_LITE`, until `clear_warn_once` rearms it). So the test
//! counts the calls with an fentry program (where the kernel refuses tracing programs, lockdown,
//! it reads the log, rearming its report through debugfs, and fails loudly where it cannot),
//! and reads every namespace's counters for real errors. A control for each direction spoils
//! `skb->csum` on purpose, before masq, and must be seen by the judge after it: proof that the
//! skbs are `CHECKSUM_COMPLETE` and the failures are seen, so the test can fail. With the
//! counter the controls run first; with the log, which shows one report per rearming, they run
//! after the checked phases and must each add exactly one report, from the judge's device.
//!
//! Where the `CHECKSUM_COMPLETE` skbs come from. veth never makes one (it hands over what the
//! sender had: `CHECKSUM_PARTIAL` or `CHECKSUM_NONE`); tun's virtio-net header only says
//! `PARTIAL`; GRO (`skb_gro_checksum_try_convert`) converts only its own bookkeeping, and a GRO
//! that checked the outer checksum of a tunnel checks the inner one too, which leaves the inner
//! skb `CHECKSUM_UNNECESSARY`; `__skb_checksum_complete` marks the skbs it sums
//! `csum_complete_sw`, which silences the report. A UDP tunnel socket makes one as a NIC would:
//! for a datagram whose checksum is already known good (`CHECKSUM_UNNECESSARY`),
//! `udp_unicast_rcv_skb` calls `skb_checksum_try_convert`, which sets `skb->csum` to the sum of
//! the datagram and `CHECKSUM_COMPLETE`; VXLAN then pulls its headers with `skb_pull_rcsum` and
//! `skb_postpull_rcsum`, so the inner frame arrives `CHECKSUM_COMPLETE` with the sum of exactly
//! its own bytes. The outer datagram is marked good by a tc program in front
//! (`bpf_csum_level(BPF_CSUM_LEVEL_INC)`), as a NIC that checks outer UDP checksums marks it;
//! the senders compute their checksums in software (`tx off`), so the frames arrive
//! `CHECKSUM_NONE` and can be marked, and GRO is off on the tunnel devices.
//!
//! Forwarding throws `skb->csum` away (`skb_forward_csum`), so a `COMPLETE` skb reaches masq's
//! egress only when something puts it there straight from a receive (a tc redirect, as CNIs
//! do), and is judged after masq's ingress only by what runs before forwarding: conntrack,
//! which checks the transport checksum of every packet in PREROUTING
//! (`nf_conntrack_checksum`, on by default, and conntrack runs on every Kubernetes node).
//! Hence:
//!
//! ```text
//!  pod 10.244.9.2 ═cvx═▶ node: cvx ingress ─mirred─▶ up0 egress (masq_egress) ─▶ router
//!  (VXLAN over the pod's veth)                                          conntrack checks
//!  router ═rvx═▶ node: rvx ingress ─mirred─▶ up0 ingress (masq_ingress) ─▶ conntrack checks,
//!  (VXLAN over ul0; the router's route to the node's address)            then on to the pod
//! ```
//!
//! Both ends that judge the sum run conntrack with a rule that only needs it (it accepts
//! everything), as a node's kube-proxy rules do.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    process::Command,
    time::Duration,
};

use masq_testbed::{
    agent::Agent,
    netns::Netns,
    sandbox::{
        AttachMode, NODE_IP, NODE_IPV6, OUTSIDE_IP, OUTSIDE_IPV6, Offload, Sandbox, SandboxOptions,
        UPLINK,
    },
    traffic::{Server, UdpFlow, fnv1a, payload, tcp_server, tcp_transfer, udp_server},
};

const TIMEOUT: Duration = Duration::from_secs(10);
const TCP_PORT: u16 = 8080;
const UDP_PORT: u16 = 5353;

/// The pod's addresses on its tunnel: the sources masq translates.
const POD_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 9, 2);
const POD_IPV6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x244, 9, 0, 0, 0, 2);
/// The node's addresses on the pod's tunnel.
const POD_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 244, 9, 1);
const POD_GATEWAY_IPV6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x244, 9, 0, 0, 0, 1);

/// Fixed MAC addresses, so frames redirected from one device to another are addressed to the
/// device that will read them and no neighbour discovery has to cross a redirect.
const ROUTER_MAC: &str = "02:00:5e:00:01:fe";
const POD_TUNNEL_MAC: &str = "02:00:5e:00:09:02";
const NODE_POD_TUNNEL_MAC: &str = "02:00:5e:00:09:01";
const NODE_ROUTER_TUNNEL_MAC: &str = "02:00:5e:00:0a:01";

/// The underlay between the router and the node (documentation range, no other use here).
const UNDERLAY_NODE: &str = "203.0.113.1";
const UNDERLAY_ROUTER: &str = "203.0.113.2";

fn ethtool(netns: &Netns, device: &str, settings: &[&str]) {
    let mut args = vec!["-K", device];
    args.extend_from_slice(settings);
    netns.exec("ethtool", &args);
}

/// The tc program that marks every frame `device` receives as checksum-verified (`bpf_csum_level`
/// with `BPF_CSUM_LEVEL_INC`: `CHECKSUM_NONE` becomes `CHECKSUM_UNNECESSARY`), as a NIC that
/// checks the outer UDP checksum of a tunnel does. Eight instructions, loaded straight through
/// `bpf(2)`: r2 = 1 (`BPF_CSUM_LEVEL_INC`); call 135 (`bpf_csum_level`, Linux 5.8); r0 = 0
/// (`TC_ACT_OK`); exit.
const MARK_VERIFIED: [u64; 4] = [
    insn(0xb7, 2, 0, 1),   // mov64 r2, 1
    insn(0x85, 0, 0, 135), // call bpf_csum_level
    insn(0xb7, 0, 0, 0),   // mov64 r0, 0
    insn(0x95, 0, 0, 0),   // exit
];

/// One eBPF instruction (`regs` is dst | src << 4), as the kernel reads it on little-endian
/// machines.
const fn insn(code: u8, regs: u8, off: i16, imm: i32) -> u64 {
    (code as u64) | ((regs as u64) << 8) | ((off as u16 as u64) << 16) | ((imm as u32 as u64) << 32)
}

/// The leading fields of `union bpf_attr` for `BPF_PROG_LOAD`; the rest stays zero.
#[repr(C)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    rest: [u8; 96],
}

/// `union bpf_attr` for `BPF_OBJ_PIN`.
#[repr(C)]
struct ObjPin {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    rest: [u8; 16],
}

/// Runs [`MARK_VERIFIED`] on the ingress of `device` in `netns` (a tc filter; the program is
/// pinned under `/sys/fs/bpf/TAG-verified` for `tc` to find it, and unpinned once attached).
fn mark_checksums_verified(tag: &str, netns: &Netns, device: &str) {
    tc_program(tag, netns, device, &MARK_VERIFIED, "49152");
}

/// [`CORRUPT_CSUM`]: for a `CHECKSUM_COMPLETE` IPv4 UDP frame, moves `skb->csum` off the
/// packet's sum and leaves the packet as it was (the checksum field takes `-D` with the
/// pseudo-header flag, which moves `skb->csum` too, then `+D` without it, which does not): the
/// mistake masq must not make, for the test to show it can see it. Returns `TC_ACT_UNSPEC`,
/// so the next filter (the redirect) still runs.
const CORRUPT_CSUM: [u64; 15] = [
    insn(0xbf, 6 | (1 << 4), 0, 0), // r6 = r1
    insn(0xbf, 1 | (6 << 4), 0, 0), // r1 = r6
    insn(0xb7, 2, 0, UDP_CHECK_V4), // r2 = the UDP checksum's offset
    insn(0xb7, 3, 0, 0),            // r3 = 0 (from: none, a difference follows)
    insn(0xb7, 4, 0, 0x100),        // r4 = D
    insn(0xb7, 5, 0, 0x10),         // r5 = BPF_F_PSEUDO_HDR, size 0
    insn(0x85, 0, 0, 11),           // call bpf_l4_csum_replace
    insn(0xbf, 1 | (6 << 4), 0, 0), // r1 = r6
    insn(0xb7, 2, 0, UDP_CHECK_V4), // r2 = the UDP checksum's offset
    insn(0xb7, 3, 0, 0),            // r3 = 0
    insn(0xb7, 4, 0, !0x100),       // r4 = -D (ones' complement)
    insn(0xb7, 5, 0, 0),            // r5 = no flags, size 0
    insn(0x85, 0, 0, 11),           // call bpf_l4_csum_replace
    insn(0xb7, 0, 0, -1),           // r0 = TC_ACT_UNSPEC
    insn(0x95, 0, 0, 0),            // exit
];

/// Offset of the UDP checksum in an Ethernet frame with an IPv4 header of 20 bytes.
const UDP_CHECK_V4: i32 = 14 + 20 + 6;

/// Loads `program` as a tc classifier and attaches it to the ingress of `device` in `netns` at
/// preference `pref` (the program is pinned under `/sys/fs/bpf/TAG-tc` for `tc` to find it, and
/// unpinned once attached).
fn tc_program(tag: &str, netns: &Netns, device: &str, program: &[u64], pref: &str) {
    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_OBJ_PIN: libc::c_long = 6;
    const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
    let license = c"GPL";
    let mut log = vec![0u8; 4096];
    let load = ProgLoad {
        prog_type: BPF_PROG_TYPE_SCHED_CLS,
        insn_cnt: program.len() as u32,
        insns: program.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        rest: [0; 96],
    };
    // SAFETY: `load` is a valid `bpf_attr` prefix whose pointers outlive the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            &load as *const ProgLoad,
            size_of::<ProgLoad>(),
        )
    };
    assert!(
        fd >= 0,
        "loading a tc program: {}\n{}",
        std::io::Error::last_os_error(),
        String::from_utf8_lossy(&log)
    );
    let path = format!("/sys/fs/bpf/{tag}-tc");
    let path_c = std::ffi::CString::new(path.clone()).unwrap_or_default();
    let pin = ObjPin {
        pathname: path_c.as_ptr() as u64,
        bpf_fd: fd as u32,
        file_flags: 0,
        rest: [0; 16],
    };
    // SAFETY: `pin` is a valid `bpf_attr` for BPF_OBJ_PIN whose path outlives the call.
    let pinned = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_PIN,
            &pin as *const ObjPin,
            size_of::<ObjPin>(),
        )
    };
    let pin_error = std::io::Error::last_os_error();
    // SAFETY: `fd` is the program's descriptor, owned here; the pin (or nothing) keeps it.
    unsafe { libc::close(fd as libc::c_int) };
    assert!(pinned == 0, "pinning a tc program at {path}: {pin_error}");
    let _ = netns
        .command("tc")
        .args(["qdisc", "add", "dev", device, "clsact"])
        .output();
    let attached = netns
        .command("tc")
        .args([
            "filter",
            "add",
            "dev",
            device,
            "ingress",
            "pref",
            pref,
            "bpf",
            "object-pinned",
            &path,
            "direct-action",
        ])
        .output();
    let _ = std::fs::remove_file(&path);
    let attached = attached.unwrap_or_else(|error| panic!("running tc: {error}"));
    assert!(
        attached.status.success(),
        "attaching a tc program to {device}: {}",
        String::from_utf8_lossy(&attached.stderr)
    );
}

/// A VXLAN device `name` in `netns` from `local` to `remote` with UDP checksums and GRO off.
fn vxlan(
    netns: &Netns,
    name: &str,
    id: &str,
    port: &str,
    (local, remote): (&str, &str),
    mac: &str,
) {
    netns.ip(&[
        "link", "add", name, "address", mac, "type", "vxlan", "id", id, "local", local, "remote",
        remote, "dstport", port, "udpcsum",
    ]);
    netns.ip(&["link", "set", name, "up"]);
    ethtool(netns, name, &["gro", "off"]);
}

/// Static neighbour `address` at `mac` on `device`.
fn neighbour(netns: &Netns, address: &str, mac: &str, device: &str) {
    netns.ip(&[
        "neigh",
        "replace",
        address,
        "lladdr",
        mac,
        "dev",
        device,
        "nud",
        "permanent",
    ]);
}

/// Redirects every IPv4 and IPv6 frame received on `from` to `direction` (`egress` or
/// `ingress`) of `to`.
fn redirect(netns: &Netns, from: &str, direction: &str, to: &str) {
    netns.exec("tc", &["qdisc", "add", "dev", from, "clsact"]);
    for protocol in ["ip", "ipv6"] {
        netns.exec(
            "tc",
            &[
                "filter", "add", "dev", from, "ingress", "protocol", protocol, "u32", "match",
                "u32", "0", "0", "action", "mirred", direction, "redirect", "dev", to,
            ],
        );
    }
}

/// Makes conntrack check every packet `netns` receives, changing no verdict.
fn conntrack(netns: &Netns) {
    for tool in ["iptables", "ip6tables"] {
        netns.exec(
            tool,
            &[
                "-A",
                "FORWARD",
                "-m",
                "conntrack",
                "--ctstate",
                "INVALID,NEW,ESTABLISHED",
                "-j",
                "ACCEPT",
            ],
        );
    }
    netns.sysctl("net.netfilter.nf_conntrack_checksum", "1");
}

/// The dual-stack sandbox with the two tunnels of the module's drawing.
fn complete_sandbox() -> Sandbox {
    let sandbox = Sandbox::new(
        "csum",
        SandboxOptions {
            pods: 1,
            offload: Offload::Off,
            ..SandboxOptions::in_mode(AttachMode::native())
        },
    );
    sandbox.add_ipv6();
    let (pod, node, router) = (sandbox.pod(1), &sandbox.node, &sandbox.router);
    router.ip(&["link", "set", "eth0", "address", ROUTER_MAC]);

    // The pod's tunnel, over its veth: the pod computes the outer checksum in software, the
    // node's side marks it good, the node's VXLAN socket converts it to CHECKSUM_COMPLETE.
    ethtool(pod, "eth0", &["tx", "off"]);
    mark_checksums_verified(&sandbox.tag, node, "vpod1");
    vxlan(
        pod,
        "cvx",
        "42",
        "4789",
        ("10.244.1.2", "10.244.1.1"),
        POD_TUNNEL_MAC,
    );
    vxlan(
        node,
        "cvx",
        "42",
        "4789",
        ("10.244.1.1", "10.244.1.2"),
        NODE_POD_TUNNEL_MAC,
    );
    pod.ip(&["addr", "add", &format!("{POD_IP}/24"), "dev", "cvx"]);
    pod.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{POD_IPV6}/64"),
        "dev",
        "cvx",
        "nodad",
    ]);
    node.ip(&["addr", "add", &format!("{POD_GATEWAY}/24"), "dev", "cvx"]);
    node.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{POD_GATEWAY_IPV6}/64"),
        "dev",
        "cvx",
        "nodad",
    ]);
    // The pod reaches the outside host through the tunnel; its frames are redirected onto the
    // uplink unchanged, so they are addressed to the router.
    for (destination, gateway, source) in [
        (
            format!("{OUTSIDE_IP}/32"),
            POD_GATEWAY.to_string(),
            POD_IP.to_string(),
        ),
        (
            format!("{OUTSIDE_IPV6}/128"),
            POD_GATEWAY_IPV6.to_string(),
            POD_IPV6.to_string(),
        ),
    ] {
        pod.ip(&[
            "route",
            "add",
            &destination,
            "via",
            &gateway,
            "dev",
            "cvx",
            "src",
            &source,
        ]);
        neighbour(pod, &gateway, ROUTER_MAC, "cvx");
    }
    neighbour(node, &POD_IP.to_string(), POD_TUNNEL_MAC, "cvx");
    neighbour(node, &POD_IPV6.to_string(), POD_TUNNEL_MAC, "cvx");
    redirect(node, "cvx", "egress", UPLINK);

    // The router's tunnel to the node, over a link of its own: everything the router sends to
    // the node's addresses takes it.
    node.add_veth("ul0", router, "ul0");
    node.ip(&["addr", "add", &format!("{UNDERLAY_NODE}/30"), "dev", "ul0"]);
    router.ip(&[
        "addr",
        "add",
        &format!("{UNDERLAY_ROUTER}/30"),
        "dev",
        "ul0",
    ]);
    node.ip(&["link", "set", "ul0", "up"]);
    router.ip(&["link", "set", "ul0", "up"]);
    ethtool(router, "ul0", &["tx", "off"]);
    mark_checksums_verified(&sandbox.tag, node, "ul0");
    let ends = (UNDERLAY_ROUTER, UNDERLAY_NODE);
    vxlan(router, "rvx", "43", "4790", ends, "02:00:5e:00:0a:02");
    vxlan(
        node,
        "rvx",
        "43",
        "4790",
        (ends.1, ends.0),
        NODE_ROUTER_TUNNEL_MAC,
    );
    for address in [format!("{NODE_IP}/32"), format!("{NODE_IPV6}/128")] {
        router.ip(&["route", "add", &address, "dev", "rvx"]);
    }
    neighbour(router, &NODE_IP.to_string(), NODE_ROUTER_TUNNEL_MAC, "rvx");
    neighbour(
        router,
        &NODE_IPV6.to_string(),
        NODE_ROUTER_TUNNEL_MAC,
        "rvx",
    );
    redirect(node, "rvx", "ingress", UPLINK);

    conntrack(node);
    conntrack(router);
    sandbox
}

/// Counts the kernel's calls of `netdev_rx_csum_fault`, where the stack found `skb->csum` wrong
/// for a packet whose checksum is right ("hw csum failure"). The kernel log is no measure: it
/// reports that once per boot (`DO_ONCE_LITE`). An fentry program (BTF, Linux 5.5) adds one to
/// an array map for each call, on every CPU; it is detached when this is dropped.
struct CsumFaults {
    map: std::os::fd::OwnedFd,
    _program: std::os::fd::OwnedFd,
    _event: std::os::fd::OwnedFd,
}

/// The BTF id of `netdev_rx_csum_fault` in the running kernel, as bpftool reads it.
fn fault_function_btf_id() -> Result<u32, String> {
    let output = Command::new("bpftool")
        .args(["btf", "dump", "file", "/sys/kernel/btf/vmlinux"])
        .output()
        .map_err(|error| format!("running bpftool to find netdev_rx_csum_fault: {error}"))?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find(|line| line.contains("FUNC 'netdev_rx_csum_fault'"))
        .and_then(|line| line.strip_prefix('[')?.split(']').next()?.parse().ok())
        .ok_or_else(|| "the kernel's BTF has no function netdev_rx_csum_fault".to_owned())
}

/// `bpf(2)`, panicking with `what` on failure.
fn bpf(
    command: libc::c_long,
    attr: &mut [u64],
    what: &str,
) -> Result<std::os::fd::OwnedFd, String> {
    // SAFETY: `attr` is a zero-padded `union bpf_attr` whose pointers outlive the call.
    let result =
        unsafe { libc::syscall(libc::SYS_bpf, command, attr.as_mut_ptr(), size_of_val(attr)) };
    if result < 0 {
        return Err(format!("{what}: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: a new descriptor the kernel just returned, owned by no one else.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(result as libc::c_int) })
}

impl CsumFaults {
    fn attach() -> Result<Self, String> {
        use std::os::fd::AsRawFd;
        // BPF_MAP_CREATE: an array of one u64.
        let mut attr = [0u64; 16];
        attr[0] = 2 | (4 << 32); // map_type ARRAY, key_size 4
        attr[1] = 8 | (1 << 32); // value_size 8, max_entries 1
        let map = bpf(0, &mut attr, "creating the fault counter")?;
        let fd = map.as_raw_fd();
        let program: [u64; 11] = [
            insn(0x18, 1 | (1 << 4), 0, fd), // r1 = the map (BPF_PSEUDO_MAP_FD)
            0,
            insn(0xbf, 2 | (10 << 4), 0, 0), // r2 = r10
            insn(0x07, 2, 0, -4),            // r2 += -4
            insn(0x62, 10, -4, 0),           // *(u32 *)(r10 - 4) = 0
            insn(0x85, 0, 0, 1),             // call bpf_map_lookup_elem
            insn(0x15, 0, 2, 0),             // if r0 == 0 goto +2
            insn(0xb7, 1, 0, 1),             // r1 = 1
            insn(0xdb, 1 << 4, 0, 0),        // lock *(u64 *)(r0 + 0) += r1
            insn(0xb7, 0, 0, 0),             // r0 = 0
            insn(0x95, 0, 0, 0),             // exit
        ];
        let license = c"GPL";
        let mut attr = [0u64; 16];
        attr[0] = 26 | ((program.len() as u64) << 32); // BPF_PROG_TYPE_TRACING
        attr[1] = program.as_ptr() as u64;
        attr[2] = license.as_ptr() as u64;
        attr[8] = 24 << 32; // expected_attach_type BPF_TRACE_FENTRY
        attr[13] = u64::from(fault_function_btf_id()?) << 32; // attach_btf_id
        let program_fd = bpf(5, &mut attr, "loading the fault-counting fentry program")?;
        // BPF_RAW_TRACEPOINT_OPEN without a name attaches a tracing program where it was
        // loaded for (Linux 5.5).
        let mut attr = [0u64; 2];
        attr[1] = program_fd.as_raw_fd() as u64;
        let event = bpf(17, &mut attr, "attaching the fault-counting fentry program")?;
        Ok(Self {
            map,
            _program: program_fd,
            _event: event,
        })
    }

    /// Calls so far.
    fn count(&self) -> u64 {
        use std::os::fd::AsRawFd;
        let key = 0u32;
        let mut value = 0u64;
        let mut attr = [0u64; 4];
        attr[0] = self.map.as_raw_fd() as u64;
        attr[1] = &key as *const u32 as u64;
        attr[2] = &mut value as *mut u64 as u64;
        // SAFETY: BPF_MAP_LOOKUP_ELEM with pointers to live locals of the map's sizes.
        let result =
            unsafe { libc::syscall(libc::SYS_bpf, 1, attr.as_mut_ptr(), size_of_val(&attr)) };
        assert_eq!(
            result,
            0,
            "reading the fault counter: {}",
            std::io::Error::last_os_error()
        );
        value
    }
}

/// The kernel's "hw csum failure" reports.
fn hw_csum_failures() -> Vec<String> {
    let output = Command::new("dmesg")
        .output()
        .unwrap_or_else(|error| panic!("cannot run dmesg: {error}"));
    assert!(
        output.status.success(),
        "dmesg is needed to see hw csum failure reports: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| line.contains("hw csum failure"))
        .map(str::to_owned)
        .collect()
}

/// Where the kernel rearms its one "hw csum failure" report (with every other once-only
/// warning): debugfs, which the test mounts where it is not.
const CLEAR_WARN_ONCE: &str = "/sys/kernel/debug/clear_warn_once";

/// Rearms the kernel's one "hw csum failure" report (`DO_ONCE_LITE` keeps its flag where
/// `clear_warn_once` clears it).
fn rearm_report() -> Result<(), String> {
    if !std::path::Path::new(CLEAR_WARN_ONCE).exists() {
        let _ = Command::new("mount")
            .args(["-t", "debugfs", "debugfs", "/sys/kernel/debug"])
            .output();
    }
    std::fs::write(CLEAR_WARN_ONCE, "1")
        .map_err(|error| format!("writing {CLEAR_WARN_ONCE}: {error}"))
}

/// How the test sees the stack find `skb->csum` wrong: the fentry counter where the kernel
/// allows tracing programs (the kernel matrix's guests), else the kernel log, which shows one
/// report until it is rearmed (a kernel in lockdown, as some CI sandboxes run, refuses tracing
/// programs, and may refuse the rearming too: then the test fails, as it cannot prove its
/// premise).
enum Faults {
    Counted(CsumFaults),
    Logged,
}

impl Faults {
    fn watch() -> Self {
        match CsumFaults::attach() {
            Ok(counter) => Self::Counted(counter),
            Err(why) => Self::logged(&why),
        }
    }

    /// The kernel log, its report armed.
    fn logged(why: &str) -> Self {
        let spent = hw_csum_failures();
        if !spent.is_empty() {
            rearm_report().unwrap_or_else(|error| {
                panic!(
                    "cannot count hw csum failures ({why}), and the kernel log cannot show a new \
                     one: the kernel reports only its first since boot, it has: {spent:?}, and \
                     it cannot be rearmed ({error}); run this test where tracing programs load \
                     (cargo xtask kernels)"
                )
            });
        }
        Self::Logged
    }

    fn mode(&self) -> &'static str {
        match self {
            Self::Counted(_) => "counted by an fentry program on netdev_rx_csum_fault",
            Self::Logged => "read from the kernel log (one report per rearming)",
        }
    }

    fn count(&self) -> u64 {
        match self {
            Self::Counted(counter) => counter.count(),
            Self::Logged => hw_csum_failures().len() as u64,
        }
    }
}

/// Says which way the test sees failures, past the test harness's capture, so the kernel
/// matrix's logs show it.
fn announce(what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "e2e_checksum_complete: {what}");
}

/// A direction through masq, as the test judges it.
#[derive(Clone, Copy, Debug)]
enum Direction {
    /// Pod to outside: the router's conntrack judges masq's egress.
    Egress,
    /// Outside to pod: the node's conntrack judges masq's ingress.
    Ingress,
}

impl Direction {
    /// The node's device whose received frames cross masq this way; the namespace that judges
    /// them, the other one, and the device the judge sees them arrive on.
    fn ends(self, sandbox: &Sandbox) -> (&'static str, &Netns, &Netns, &'static str) {
        match self {
            Self::Egress => ("cvx", &sandbox.router, &sandbox.node, "eth0"),
            Self::Ingress => ("rvx", &sandbox.node, &sandbox.router, UPLINK),
        }
    }
}

/// Lets only `judge` check transport checksums.
fn judge_only(judge: &Netns, other: &Netns) {
    judge.sysctl("net.netfilter.nf_conntrack_checksum", "1");
    other.sysctl("net.netfilter.nf_conntrack_checksum", "0");
}

/// Datagrams [`udp_exchange`] sends, and receives a reply to, each.
const DATAGRAMS: u64 = 8;

/// The control of `direction`: with `skb->csum` spoiled before masq sees the IPv4 UDP datagrams
/// that cross it this way, the judge must object, or the skbs are not `CHECKSUM_COMPLETE` (or
/// the objections are not seen) and nothing the test checks could fail. The counter must see
/// one fault per datagram at least; the kernel log, rearmed, exactly one new report, from the
/// judge's device.
fn control(sandbox: &Sandbox, faults: &Faults, direction: Direction) {
    let (spoiled, judge, other, device) = direction.ends(sandbox);
    judge_only(judge, other);
    if matches!(faults, Faults::Logged) {
        rearm_report().unwrap_or_else(|error| {
            panic!(
                "{direction:?} control: cannot rearm the kernel's hw csum failure report \
                 ({error}), so the kernel log cannot show this control's"
            )
        });
    }
    let logged = hw_csum_failures();
    tc_program(&sandbox.tag, &sandbox.node, spoiled, &CORRUPT_CSUM, "1");
    let before = faults.count();
    udp_exchange(sandbox, OUTSIDE_IP.into(), NODE_IP.into());
    let found = faults.count() - before;
    sandbox.node.exec(
        "tc",
        &["filter", "del", "dev", spoiled, "ingress", "pref", "1"],
    );
    let premise = "the skbs do not arrive CHECKSUM_COMPLETE on this kernel, or the failures \
                   are not seen, so this test cannot judge masq";
    match faults {
        Faults::Counted(_) => assert!(
            found >= DATAGRAMS,
            "{direction:?} control: {} saw {found} hw csum failures for {DATAGRAMS} spoiled \
             datagrams: {premise}",
            judge.name()
        ),
        Faults::Logged => {
            let new: Vec<String> = hw_csum_failures()
                .into_iter()
                .filter(|line| !logged.contains(line))
                .collect();
            let expected = format!("{device}: hw csum failure");
            assert!(
                new.len() == 1 && new[0].contains(&expected),
                "{direction:?} control: the kernel log shows {new:?} new, not one \
                 \"{expected}\" from {}: {premise}",
                judge.name()
            );
        }
    }
    announce(&format!(
        "{direction:?} control: {found} hw csum failures {} for {DATAGRAMS} spoiled datagrams",
        faults.mode()
    ));
}

/// Checksum errors every namespace counted.
fn checksum_errors(sandbox: &Sandbox) -> Vec<(String, String, u64)> {
    let mut errors = Vec::new();
    for netns in [
        &sandbox.node,
        &sandbox.router,
        &sandbox.outside,
        sandbox.pod(1),
    ] {
        for (name, value) in netns.nstat() {
            if name.ends_with("CsumErrors") && value > 0 {
                errors.push((netns.name().to_owned(), name, value));
            }
        }
    }
    errors
}

/// UDP datagrams and a TCP transfer from the pod to `server`'s address, each arriving from
/// `node` (masqueraded) with its payload intact.
fn exchange(sandbox: &Sandbox, server: IpAddr, node: IpAddr) {
    udp_exchange(sandbox, server, node);
    let tcp = SocketAddr::new(server, TCP_PORT);
    let data = payload(64 * 1024, 7);
    let transfer = sandbox
        .pod(1)
        .enter(|| tcp_transfer(tcp, "complete", &data, TIMEOUT))
        .unwrap_or_else(|error| panic!("TCP to {tcp}: {error}"));
    assert_eq!(transfer.peer.ip(), node, "TCP to {tcp} was not masqueraded");
    assert_eq!((transfer.bytes, transfer.hash), (data.len(), fnv1a(&data)));
}

/// The UDP half of [`exchange`].
fn udp_exchange(sandbox: &Sandbox, server: IpAddr, node: IpAddr) {
    let udp = SocketAddr::new(server, UDP_PORT);
    sandbox.pod(1).enter(|| {
        let flow = UdpFlow::open(udp, TIMEOUT).unwrap_or_else(|error| panic!("{error}"));
        for seed in 0..8 {
            let peer = flow
                .request(&payload(600, seed))
                .unwrap_or_else(|error| panic!("UDP to {udp}: {error}"));
            assert_eq!(peer.ip(), node, "UDP to {udp} was not masqueraded");
        }
    });
}

fn servers(sandbox: &Sandbox) -> Vec<Server> {
    let outside = &sandbox.outside;
    vec![
        tcp_server(outside, SocketAddr::from((OUTSIDE_IP, TCP_PORT))),
        udp_server(outside, SocketAddr::from((OUTSIDE_IP, UDP_PORT))),
        tcp_server(outside, SocketAddr::from((OUTSIDE_IPV6, TCP_PORT))),
        udp_server(outside, SocketAddr::from((OUTSIDE_IPV6, UDP_PORT))),
    ]
}

/// TCP and UDP of both families leave and come back through masq as `CHECKSUM_COMPLETE` skbs
/// (see the module's documentation), and neither the router's conntrack (after masq's egress)
/// nor the node's (after its ingress) finds `skb->csum` wrong, nor anyone a packet's checksum.
/// Each direction is judged on its own: only one side checks checksums at a time, since the
/// kernel reports one failure per rearming.
#[test]
#[ignore = "needs fentry programs or a rearmable hw-csum-failure report: run by `cargo xtask kernels` in the Debian guests"]
fn checksum_complete_packets_keep_a_right_sum_through_masq() {
    let sandbox = complete_sandbox();
    let _servers = servers(&sandbox);
    let agent = Agent::start(
        &sandbox,
        &[
            "--config",
            &format!("/tmp/{}-absent", sandbox.tag),
            "--enable-ipv6",
        ],
    );
    let faults = Faults::watch();
    announce(&format!("hw csum failures {}", faults.mode()));

    // The controls, which spoil skb->csum on purpose. The counter tells their failures apart,
    // so they run first; the kernel log must keep its one report for the checked phases, so
    // they run last there, where they cannot disturb them.
    let controls = || {
        for direction in [Direction::Ingress, Direction::Egress] {
            control(&sandbox, &faults, direction);
        }
    };
    if matches!(faults, Faults::Counted(_)) {
        controls();
    }

    for (family, server, node) in [
        ("IPv4", IpAddr::from(OUTSIDE_IP), IpAddr::from(NODE_IP)),
        ("IPv6", IpAddr::from(OUTSIDE_IPV6), IpAddr::from(NODE_IPV6)),
    ] {
        for direction in [Direction::Egress, Direction::Ingress] {
            let (_, judge, other, _) = direction.ends(&sandbox);
            judge_only(judge, other);
            let before = faults.count();
            exchange(&sandbox, server, node);
            let found = faults.count() - before;
            assert_eq!(
                found,
                0,
                "{family} {direction:?}: {} found skb->csum wrong {found} times after masq \
                 rewrote CHECKSUM_COMPLETE packets (\"hw csum failure\")\nagent log:\n{}",
                judge.name(),
                agent.log()
            );
            assert_eq!(
                checksum_errors(&sandbox),
                [],
                "{family} {direction:?}: checksum errors"
            );
        }
    }

    if matches!(faults, Faults::Logged) {
        controls();
    }
}
