//! A loaded, unattached datapath driven through `BPF_PROG_TEST_RUN`.

use std::net::Ipv4Addr;

use aya::{
    maps::lpm_trie::Key,
    programs::{SchedClassifier, TestRun, TestRunOptions},
};
use masq::datapath::object::{Datapath, LoadOptions};
use masq_common::{
    counters::Counter,
    flow::{EvictionCause, FlowClass},
    layout::{ATTACH_TCX, NOMASQ_KIND_CIDR, NOMASQ_KIND_LINK_LOCAL, NOMASQ_KIND_SOURCE, Uplink},
    nat::{Direction, NatEntryV4, NatKeyV4},
    ports::PortRange,
    settings::{
        MAX_PORT_RANGES, SETTING_ENABLED, SETTING_RANDOM_FULLY, SETTING_SOURCE_EXEMPTIONS, Settings,
    },
};

/// The node address masqueraded traffic leaves with in these tests.
pub const NODE_IP: &str = "192.0.2.1";

/// What the program told TC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// TC_ACT_UNSPEC: continue (tcx: next program).
    Pass,
    /// TC_ACT_SHOT.
    Drop,
}

/// The result of running a program on one frame.
#[derive(Debug)]
pub struct Run {
    pub action: Action,
    pub frame: Vec<u8>,
}

/// Fails the test loudly when not root: these tests need BPF_PROG_LOAD.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the datapath tests load eBPF programs and must run as root (cargo xtask test)"
    );
}

/// A freshly loaded datapath with its own maps.
#[derive(Debug)]
pub struct Harness {
    pub datapath: Datapath,
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    /// A datapath with the default non-masquerade CIDRs (10/8, 172.16/12, 192.168/16, and
    /// link-local), translating to [`NODE_IP`] with ports 1024-29999 chosen at random.
    pub fn new() -> Self {
        Self::with_ports(&[PortRange::new(1024, 29_999)], true)
    }

    pub fn with_ports(ranges: &[PortRange], random_fully: bool) -> Self {
        Self::unconfigured().with_defaults(ranges, random_fully)
    }

    /// Configured for `ranges` with the default non-masquerade CIDRs and link-local.
    fn with_defaults(mut self, ranges: &[PortRange], random_fully: bool) -> Self {
        self.configure(ranges, random_fully);
        for cidr in ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"] {
            self.add_nomasq(cidr, NOMASQ_KIND_CIDR);
        }
        self.add_nomasq("169.254.0.0/16", NOMASQ_KIND_LINK_LOCAL);
        self
    }

    /// Like [`Harness::new`], with maps of the given sizes (`--nat-max-entries`,
    /// `--nomasq-max-entries`).
    pub fn sized(nat_max_entries: u32, nomasq_max_entries: u32) -> Self {
        Self::load(&LoadOptions {
            nat_max_entries,
            nomasq_max_entries,
            ..LoadOptions::default()
        })
        .with_defaults(&[PortRange::new(1024, 29_999)], true)
    }

    /// A datapath whose settings were never written, as before the agent configures it.
    pub fn unconfigured() -> Self {
        Self::load(&LoadOptions {
            nat_max_entries: 4096,
            ..LoadOptions::default()
        })
    }

    fn load(options: &LoadOptions) -> Self {
        require_root();
        // Both families, so every test datapath can run IPv6 frames too.
        let options = LoadOptions {
            ipv6: true,
            ..options.clone()
        };
        let datapath = Datapath::load(&options)
            .unwrap_or_else(|error| panic!("loading the datapath: {error}"));
        Self { datapath }
    }

    pub fn configure(&mut self, ranges: &[PortRange], random_fully: bool) {
        assert!(ranges.len() <= MAX_PORT_RANGES);
        let mut settings = Settings::DISABLED;
        settings.flags = SETTING_ENABLED
            | if random_fully {
                SETTING_RANDOM_FULLY
            } else {
                0
            };
        for (slot, range) in settings.port_ranges.iter_mut().zip(ranges) {
            *slot = *range;
        }
        settings.port_range_count = u32::try_from(ranges.len()).unwrap_or(0);
        settings.total_ports = ranges.iter().map(PortRange::size).sum();
        // Sized as the agent sizes them, with no pod share: the tests of the share set one.
        self.datapath.maps.size_settings(&mut settings, 0);
        self.datapath
            .maps
            .set_settings(&settings)
            .unwrap_or_else(|error| panic!("{error}"));
        self.set_uplink(Some(node_ip()));
    }

    /// Like [`Harness::sized`], with the ports masq uses without `--to-ports`: 1024-65535 but
    /// the NodePort range, shared with the node.
    pub fn shared_ports(nat_max_entries: u32) -> Self {
        let mut harness = Self::sized(nat_max_entries, 64);
        let (ranges, count) =
            masq_common::ports::shared_snat_ranges(masq_common::ports::DEFAULT_NODEPORT_RANGE);
        harness.configure(&ranges[..count], true);
        let maps = &mut harness.datapath.maps;
        let mut settings = maps.settings().unwrap_or_else(|error| panic!("{error}"));
        settings.flags |= masq_common::settings::SETTING_SHARED_PORTS;
        maps.set_settings(&settings)
            .unwrap_or_else(|error| panic!("{error}"));
        harness
    }

    /// Gives each pod (each local address) at most `percent` of the table's flows in unassured
    /// flows, as `--nat-pod-share` does (0: no limit).
    pub fn set_pod_share(&mut self, percent: u8) {
        let maps = &mut self.datapath.maps;
        let mut settings = maps.settings().unwrap_or_else(|error| panic!("{error}"));
        maps.size_settings(&mut settings, percent);
        maps.set_settings(&settings)
            .unwrap_or_else(|error| panic!("{error}"));
    }

    /// Makes the device `BPF_PROG_TEST_RUN` runs frames on (the namespace's loopback) an uplink
    /// masquerading to `address`, or, with `None`, an interface masq does not translate on.
    pub fn set_uplink(&mut self, address: Option<Ipv4Addr>) {
        let maps = &mut self.datapath.maps;
        let updated = match address {
            Some(address) => maps.set_uplink(
                TEST_RUN_IFINDEX,
                &Uplink::new(
                    address.octets(),
                    ATTACH_TCX,
                    Uplink::encode_name("lo").unwrap_or_default(),
                ),
            ),
            None => maps.remove_uplink(TEST_RUN_IFINDEX),
        };
        updated.unwrap_or_else(|error| panic!("{error}"));
    }

    /// Makes the test-run device an uplink masquerading IPv4 to `now` that still answers for
    /// the flows of `former`, an address it had before and still has (see
    /// `Uplink::former_addr`).
    pub fn set_uplink_renumbered(&mut self, now: Ipv4Addr, former: Ipv4Addr) {
        let mut uplink = Uplink::new(
            now.octets(),
            ATTACH_TCX,
            Uplink::encode_name("lo").unwrap_or_default(),
        );
        uplink.former_addr = former.octets();
        self.datapath
            .maps
            .set_uplink(TEST_RUN_IFINDEX, &uplink)
            .unwrap_or_else(|error| panic!("{error}"));
    }

    /// Makes the test-run device an uplink masquerading IPv4 to [`NODE_IP`] and IPv6 to
    /// `address` (`None`: IPv6 untranslated there).
    pub fn set_uplink_v6(&mut self, address: Option<std::net::Ipv6Addr>) {
        let mut uplink = Uplink::new(
            node_ip().octets(),
            ATTACH_TCX,
            Uplink::encode_name("lo").unwrap_or_default(),
        );
        if let Some(address) = address {
            uplink.has_v6 = 1;
            uplink.snat_addr_v6 = address.octets();
        }
        self.datapath
            .maps
            .set_uplink(TEST_RUN_IFINDEX, &uplink)
            .unwrap_or_else(|error| panic!("{error}"));
    }

    /// Adds an IPv6 non-masquerade CIDR.
    pub fn add_nomasq_v6(&mut self, cidr: &str, kind: u32) {
        let (address, prefix) = parse_cidr_v6(cidr);
        self.datapath
            .maps
            .nomasq_v6
            .insert(&Key::new(prefix, address.octets()), kind, 0)
            .unwrap_or_else(|error| panic!("inserting {cidr}: {error}"));
    }

    /// The IPv6 NAT table.
    pub fn nat_v6(&self) -> Vec<(masq_common::nat::NatKeyV6, masq_common::nat::NatEntryV6)> {
        self.datapath
            .maps
            .nat_v6
            .iter()
            .collect::<Result<_, _>>()
            .unwrap_or_else(|error| panic!("{error}"))
    }

    pub fn add_nomasq(&mut self, cidr: &str, kind: u32) {
        let (addr, prefix) = parse_cidr(cidr);
        self.datapath
            .maps
            .nomasq_v4
            .insert(&Key::new(prefix, addr.octets()), kind, 0)
            .unwrap_or_else(|error| panic!("inserting {cidr}: {error}"));
    }

    /// Adds a pod source never masqueraded (`nonMasqueradeSrcCIDRs`) to the IPv4 source trie.
    /// The egress program looks it up only once [`Harness::set_source_exemptions`] says so.
    pub fn add_nomasq_src(&mut self, cidr: &str) {
        let (addr, prefix) = parse_cidr(cidr);
        self.datapath
            .maps
            .nomasq_src_v4
            .insert(&Key::new(prefix, addr.octets()), NOMASQ_KIND_SOURCE, 0)
            .unwrap_or_else(|error| panic!("inserting {cidr}: {error}"));
    }

    /// As [`Harness::add_nomasq_src`], into the IPv6 source trie.
    pub fn add_nomasq_src_v6(&mut self, cidr: &str) {
        let (address, prefix) = parse_cidr_v6(cidr);
        self.datapath
            .maps
            .nomasq_src_v6
            .insert(&Key::new(prefix, address.octets()), NOMASQ_KIND_SOURCE, 0)
            .unwrap_or_else(|error| panic!("inserting {cidr}: {error}"));
    }

    /// Sets or clears `SETTING_SOURCE_EXEMPTIONS` in the settings in force: whether the egress
    /// program looks pod sources up in the source tries.
    pub fn set_source_exemptions(&mut self, on: bool) {
        let maps = &mut self.datapath.maps;
        let mut settings = maps.settings().unwrap_or_else(|error| panic!("{error}"));
        if on {
            settings.flags |= SETTING_SOURCE_EXEMPTIONS;
        } else {
            settings.flags &= !SETTING_SOURCE_EXEMPTIONS;
        }
        maps.set_settings(&settings)
            .unwrap_or_else(|error| panic!("{error}"));
    }

    pub fn remove_nomasq(&mut self, cidr: &str) {
        let (addr, prefix) = parse_cidr(cidr);
        self.datapath
            .maps
            .nomasq_v4
            .remove(&Key::new(prefix, addr.octets()))
            .unwrap_or_else(|error| panic!("removing {cidr}: {error}"));
    }

    fn run(program: &SchedClassifier, frame: &[u8]) -> Run {
        let mut out = vec![0u8; frame.len() + 256];
        let options = TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ..TestRunOptions::default()
        };
        let result = program.test_run(options).unwrap_or_else(|error| {
            panic!(
                "BPF_PROG_TEST_RUN on a {}-byte frame: {error:?}",
                frame.len()
            )
        });
        out.truncate(result.data_size_out as usize);
        let action = match result.return_value as i32 {
            -1 => Action::Pass,
            2 => Action::Drop,
            other => panic!("unexpected TC action {other}"),
        };
        Run { action, frame: out }
    }

    pub fn egress(&self, frame: &[u8]) -> Run {
        Self::run(
            self.datapath
                .egress()
                .unwrap_or_else(|error| panic!("{error}")),
            frame,
        )
    }

    pub fn ingress(&self, frame: &[u8]) -> Run {
        Self::run(
            self.datapath
                .ingress()
                .unwrap_or_else(|error| panic!("{error}")),
            frame,
        )
    }

    pub fn counter(&self, counter: Counter) -> u64 {
        self.datapath
            .maps
            .counter(counter)
            .unwrap_or_else(|error| panic!("{error}"))
    }

    /// Every nonzero counter, for readable assertion failures.
    /// One IPv6 counter summed over all CPUs.
    pub fn counter_v6(&self, counter: Counter) -> u64 {
        self.datapath
            .maps
            .counter_v6(counter)
            .unwrap_or_else(|error| panic!("{error}"))
    }

    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        let totals = self
            .datapath
            .maps
            .counter_totals()
            .unwrap_or_else(|error| panic!("{error}"));
        totals
            .into_iter()
            .filter(|(_, value)| *value != 0)
            .map(|(counter, value)| (counter.name(), value))
            .collect()
    }

    pub fn nat(&self) -> Vec<(NatKeyV4, NatEntryV4)> {
        self.datapath
            .maps
            .nat_entries()
            .unwrap_or_else(|error| panic!("{error}"))
    }

    /// The egress halves in the table.
    pub fn egress_mappings(&self) -> Vec<(NatKeyV4, NatEntryV4)> {
        self.nat()
            .into_iter()
            .filter(|(key, _)| key.direction() == Some(Direction::Egress))
            .collect()
    }

    /// IPv4 evictions for `cause`, whatever the evicted flow's class.
    pub fn evicted(&self, cause: EvictionCause) -> u64 {
        self.evictions()
            .into_iter()
            .filter(|(counted, _, _)| *counted == cause)
            .map(|(_, _, count)| count)
            .sum()
    }

    /// IPv4 evictions by cause and class.
    pub fn evictions(&self) -> Vec<(EvictionCause, FlowClass, u64)> {
        self.datapath
            .maps
            .evictions_of::<[u8; 4]>()
            .unwrap_or_else(|error| panic!("{error}"))
    }

    /// The unassured IPv4 flows the datapath counts for each local address that holds any.
    pub fn holders(&self) -> Vec<(Ipv4Addr, u64)> {
        self.datapath
            .maps
            .holders_of::<[u8; 4]>()
            .unwrap_or_else(|error| panic!("{error}"))
            .into_iter()
            .map(|(holder, flows)| (Ipv4Addr::from(holder), flows))
            .filter(|(_, flows)| *flows != 0)
            .collect()
    }

    /// The removed IPv4 TCP flows the datapath may still pick up, by egress key.
    pub fn buried(&self) -> Vec<NatKeyV4> {
        self.datapath
            .maps
            .buried_v4
            .keys()
            .map(|key| key.unwrap_or_else(|error| panic!("{error}")))
            .collect()
    }

    pub fn alloc_histogram(&self) -> Vec<u64> {
        self.datapath
            .maps
            .alloc_histogram()
            .unwrap_or_else(|error| panic!("{error}"))
    }
}

/// The device `BPF_PROG_TEST_RUN` hands frames to a classifier on: loopback, unless the context
/// names another.
const TEST_RUN_IFINDEX: u32 = 1;

pub fn node_ip() -> Ipv4Addr {
    NODE_IP.parse().unwrap_or(Ipv4Addr::UNSPECIFIED)
}

fn parse_cidr_v6(cidr: &str) -> (std::net::Ipv6Addr, u32) {
    let (address, prefix) = cidr
        .split_once('/')
        .unwrap_or_else(|| panic!("bad IPv6 CIDR {cidr}"));
    let address: std::net::Ipv6Addr = address
        .parse()
        .unwrap_or_else(|error| panic!("bad IPv6 CIDR {cidr}: {error}"));
    let prefix: u32 = prefix
        .parse()
        .unwrap_or_else(|error| panic!("bad IPv6 CIDR {cidr}: {error}"));
    (address, prefix)
}

fn parse_cidr(cidr: &str) -> (Ipv4Addr, u32) {
    let (addr, prefix) = cidr
        .split_once('/')
        .unwrap_or_else(|| panic!("bad CIDR {cidr}"));
    let addr: Ipv4Addr = addr
        .parse()
        .unwrap_or_else(|error| panic!("bad CIDR {cidr}: {error}"));
    let prefix: u32 = prefix
        .parse()
        .unwrap_or_else(|error| panic!("bad CIDR {cidr}: {error}"));
    (addr, prefix)
}
