//! The datapath fuzzer (issue 9): random and mutated frames through both programs, every
//! result checked by the oracle in `masq_testbed::fuzz::oracle`. Needs root (loads eBPF
//! programs).
//!
//! * `random_frames`: `MASQ_FUZZ_FRAMES` frames (default 5000) from seed `MASQ_FUZZ_SEED`
//!   (default fixed, so `cargo xtask test` is deterministic up to the datapath's own random
//!   ports; decimal or 0x-hex). `MASQ_FUZZ_SURVEY=1` collects every class of violation instead
//!   of stopping at the first, for triage. Most uplink epochs translate IPv6 as well, and a
//!   quarter of their frames are IPv6 (`masq_testbed::fuzz::v6`).
//! * `truncations_at_every_length`: representative frames cut at every length, with their IPv4
//!   total length left lying and made consistent.

use masq_common::{counters::Counter, nat::Direction, ports::PortRange};
use masq_testbed::{
    fuzz::{
        CONFIGS, Config, Fuzzer, KnownBug, MAX_EPOCH, Probe, Reproduction,
        generate::fragment,
        oracle::{self, Kind, Region, Sum},
        v6,
        wire::{self, proto},
    },
    pktgen::{
        ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, ICMP_PORT_UNREACH, ICMP_TIME_EXCEEDED, Packet,
        TCP_ACK, TCP_PSH, TCP_SYN,
    },
    pktgen6::{DESTINATION_OPTIONS, Packet6},
};

const POD: &str = "10.244.1.5";
const REMOTE: &str = "203.0.113.10";
const ROUTER: &str = "198.51.100.1";
const NODE: &str = masq_testbed::harness::NODE_IP;

/// Datapath bugs found by the fuzzer and not fixed yet. Frames of their classes (the predicate)
/// may show their violations (`tolerated`) in the random run; anything else they show still
/// fails. A bug listed here has its minimal case checked by `known_datapath_bugs_still_fail`:
/// it must still fail exactly the expected way (its `reproduce` and `matches`), so that fixing
/// the datapath fails that test until the entry moves to [`FIXED_DATAPATH_BUGS`].
static KNOWN_DATAPATH_BUGS: &[KnownBug] = &[];

/// A pod's TCP flow over IPv6 maps to [node]:20000; the same flow's next segment with six
/// destination options headers (8 bytes of PadN each) before its TCP header.
fn six_extension_headers_case(fuzzer: &mut Fuzzer) -> Reproduction {
    fuzzer.start_epoch(Config {
        ipv6: true,
        ..one_port_config()
    });
    let (pod, remote) = ("2001:db8:ab::5", "2001:db8:ff::1");
    fuzzer.send(
        Direction::Egress,
        &Packet6::tcp(pod, 40_000, remote, 443, TCP_SYN).frame(),
    );
    let mut segment = Packet6::tcp(pod, 40_000, remote, 443, TCP_ACK);
    for _ in 0..v6::MAX_EXTENSION_HEADERS {
        segment = segment.with_extension(DESTINATION_OPTIONS, &[0, 0, 1, 4, 0, 0, 0, 0]);
    }
    Reproduction {
        direction: Direction::Egress,
        frame: segment.frame(),
        shows: &[Kind::Missed],
    }
}

/// Datapath bugs the fuzzer found that are fixed: their minimal cases must pass the oracle
/// cleanly, so a regression fails by name (the random run would find it only by chance).
static FIXED_DATAPATH_BUGS: &[FixedBug] = &[
    // packet::parse_ipv6 turned its extension-header loop IPV6_MAX_EXTENSION_HEADERS (6) times
    // and gave up when the sixth turn had consumed a header, before looking at what follows
    // it: a mapped flow's packet with exactly 6 extension headers passed untranslated.
    FixedBug {
        name: "ipv6_sixth_extension_header_not_walked",
        reproduce: six_extension_headers_case,
    },
    // icmp::translate loads the quoted header, ports and transport checksum with
    // `ctx.load`, bounded by the frame, not by the outer IPv4 total length. When the quote ends
    // before its transport checksum and the frame goes on (an Ethernet trailer, or a total
    // length that lies short), the bytes after the packet are taken for the checksum (or the
    // ports, or the quoted header), rewritten, and their change folded into the ICMP checksum,
    // which then no longer verifies over the real ICMP message. A quoted ICMP query whose
    // identifier lies beyond the end also gets its checksum, inside, adjusted for it.
    FixedBug {
        name: "icmp_quote_read_beyond_total_length",
        reproduce: quote_beyond_total_length_case,
    },
    // icmp::translate ignores the fragment offset of the quoted packet. When an error quotes a
    // later fragment, the bytes after its IPv4 header are payload, yet they are looked up as
    // ports and, when they match a mapping, rewritten as ports (Linux conntrack does not
    // translate errors about fragments at all).
    FixedBug {
        name: "icmp_quote_of_later_fragment",
        reproduce: quote_of_later_fragment_case,
    },
    // DCCP (33) and UDP-Lite (136) are "other protocols", translated by address only, but
    // their checksums cover the IPv4 pseudo-header like TCP's and UDP's: rewrite::l4_checksum
    // knows only TCP and UDP, so every translated DCCP or UDP-Lite packet leaves with a
    // checksum that no longer verifies, both ways.
    FixedBug {
        name: "dccp_udplite_checksum_not_updated",
        reproduce: udplite_case,
    },
    // frag::remember runs only when a first fragment is translated or exempt. A first fragment
    // left alone by any other path (a TCP segment that cannot open a connection, the node's
    // own packet, ICMP that is not translated, a transport header cut by the fragmentation)
    // records nothing, so its later fragments leave with the node address by the fallback
    // policy while the first kept the pod's: the datagram never reassembles.
    FixedBug {
        name: "egress_later_fragment_translated_after_untouched_first",
        reproduce: egress_untouched_first_case,
    },
    // The same on ingress: a first fragment passed untouched (no mapping) does not replace the
    // record an earlier datagram with the same addresses, protocol and identification left, so
    // its later fragments are translated to that earlier datagram's pod.
    FixedBug {
        name: "ingress_later_fragment_follows_stale_decision",
        reproduce: ingress_stale_decision_case,
    },
    // icmp::egress and icmp::ingress translate an ICMP error's first fragment without
    // recording it, so on ingress its later fragments stay addressed to the node while the
    // first goes to the pod.
    FixedBug {
        name: "later_fragments_of_translated_icmp_error_untranslated",
        reproduce: fragmented_icmp_error_case,
    },
    // icmp::translate found the egress half of a UDP flow opened from outside (ORIGIN_INBOUND,
    // which "translates" to the pod's own address) and rewrote the outer source of the error
    // to it. An error the node itself sends about such a flow (time exceeded while forwarding
    // to the pod: a traceroute to a pod address) then claimed to come from the pod. Conntrack
    // leaves errors about untranslated flows alone.
    FixedBug {
        name: "icmp_error_about_inbound_flow_takes_pod_source",
        reproduce: error_about_inbound_flow_case,
    },
    // icmp::translate knew quotes of TCP, UDP, SCTP and ICMP queries only; for every other
    // protocol it returned before the lookup. Those flows are translated (by address, like
    // conntrack's generic tracking), so errors about them must be too, or they reach the node
    // instead of the pod, and leave with the pod's unroutable address: path MTU discovery of a
    // pod's GRE or IPsec (ESP) tunnel through the node broke.
    FixedBug {
        name: "icmp_error_about_address_only_flow_untranslated",
        reproduce: error_about_gre_flow_case,
    },
];

/// A fixed bug: its name and its minimal case.
struct FixedBug {
    name: &'static str,
    reproduce: fn(&mut Fuzzer) -> Reproduction,
}

/// One SNAT port, so that every case's translated port is known: a pod flow from port 40000
/// leaves from 20000.
fn one_port(fuzzer: &mut Fuzzer) {
    fuzzer.start_epoch(one_port_config());
}

fn one_port_config() -> Config {
    Config {
        ranges: vec![PortRange::new(20_000, 20_000)],
        random_fully: true,
        uplink: true,
        ipv6: false,
    }
}

/// Sends `frame` and returns the IPv4 packet that came out.
fn left(fuzzer: &mut Fuzzer, frame: &[u8]) -> Vec<u8> {
    fuzzer.send(Direction::Egress, frame).output[wire::ETH_HLEN..].to_vec()
}

/// A SYN from the pod's port 40000 to the remote's 443 (it leaves as 192.0.2.1:20000): the
/// router on the path answers fragmentation needed quoting the IPv4 header and 8 bytes, and
/// the frame carrying the error goes on after its total length with the rest of the TCP header,
/// checksum included. The datapath rewrites those 2 trailer bytes as the quoted checksum and
/// folds the change into the ICMP checksum.
fn quote_beyond_total_length_case(fuzzer: &mut Fuzzer) -> Reproduction {
    one_port(fuzzer);
    let syn = left(
        fuzzer,
        &Packet::tcp(&format!("{POD}:40000"), &format!("{REMOTE}:443"), TCP_SYN).frame(),
    );
    let mut frame = Packet::icmp_error(
        ROUTER,
        NODE,
        ICMP_DEST_UNREACH,
        ICMP_FRAG_NEEDED,
        &syn[..28],
    )
    .frame();
    frame.extend_from_slice(&syn[28..40]);
    Reproduction {
        direction: Direction::Ingress,
        frame,
        shows: &[
            Kind::Outside(Region::BeyondTotalLength),
            Kind::Checksum(Sum::OuterTransport),
        ],
    }
}

/// With 192.0.2.1:20000 -> 203.0.113.10:443 mapped, time exceeded about a later fragment (8
/// bytes in) of a TCP datagram between those addresses whose payload there reads 4e20 01bb:
/// "port" 20000 becomes 40000 (9c40) in the payload.
fn quote_of_later_fragment_case(fuzzer: &mut Fuzzer) -> Reproduction {
    one_port(fuzzer);
    left(
        fuzzer,
        &Packet::tcp(&format!("{POD}:40000"), &format!("{REMOTE}:443"), TCP_SYN).frame(),
    );
    let body = [0x4e, 0x20, 0x01, 0xbb, 0, 0, 0, 0];
    let quoted = Packet::raw(NODE, REMOTE, proto::TCP)
        .later_fragment(1, false, &body)
        .ip_packet();
    Reproduction {
        direction: Direction::Ingress,
        frame: Packet::icmp_error(ROUTER, NODE, ICMP_TIME_EXCEEDED, 0, &quoted).frame(),
        shows: &[Kind::Outside(Region::Quote), Kind::Mapping],
    }
}

/// A UDP-Lite datagram from a pod, checksum over all of it: it leaves from the node address
/// with the checksum computed for the pod's.
fn udplite_case(fuzzer: &mut Fuzzer) -> Reproduction {
    one_port(fuzzer);
    let (pod, remote) = (wire_addr(POD), wire_addr(REMOTE));
    let datagram = wire::udplite(pod, remote, (5000, 5000), 0, b"masq");
    Reproduction {
        direction: Direction::Egress,
        frame: Packet::raw(POD, REMOTE, proto::UDPLITE)
            .payload(&datagram)
            .frame(),
        shows: &[Kind::Checksum(Sum::OuterTransport)],
    }
}

fn wire_addr(text: &str) -> std::net::Ipv4Addr {
    masq_testbed::pktgen::addr(text)
}

/// A pod answers a connection opened from outside with an 84-byte segment fragmented after 40
/// bytes: the first fragment (no mapping, not a SYN) leaves untouched, the second with the
/// node address.
fn egress_untouched_first_case(fuzzer: &mut Fuzzer) -> Reproduction {
    one_port(fuzzer);
    let segment = Packet::tcp(
        &format!("{POD}:8080"),
        &format!("{REMOTE}:50000"),
        TCP_ACK | TCP_PSH,
    )
    .payload(&[7; 64])
    .ip_id(0x77)
    .ip_packet();
    fuzzer.send(Direction::Egress, &fragment(&segment, 0, 40, true));
    Reproduction {
        direction: Direction::Egress,
        frame: fragment(&segment, 40, 84, false),
        shows: &[Kind::Fragment],
    }
}

/// A fragmented reply to the pod's UDP flow (192.0.2.1:20000) records "to the pod" for
/// (203.0.113.10, 192.0.2.1, UDP, id 0x77); the next datagram with that identification is for
/// the node's own port 45000: its first fragment passes untouched, its second goes to the pod.
fn ingress_stale_decision_case(fuzzer: &mut Fuzzer) -> Reproduction {
    one_port(fuzzer);
    left(
        fuzzer,
        &Packet::udp(&format!("{POD}:40000"), &format!("{REMOTE}:53")).frame(),
    );
    let reply = Packet::udp(&format!("{REMOTE}:53"), &format!("{NODE}:20000"))
        .payload(&[1; 32])
        .ip_id(0x77)
        .ip_packet();
    fuzzer.send(Direction::Ingress, &fragment(&reply, 0, 16, true));
    fuzzer.send(Direction::Ingress, &fragment(&reply, 16, 40, false));
    let node_own = Packet::udp(&format!("{REMOTE}:53"), &format!("{NODE}:45000"))
        .payload(&[2; 32])
        .ip_id(0x77)
        .ip_packet();
    fuzzer.send(Direction::Ingress, &fragment(&node_own, 0, 16, true));
    Reproduction {
        direction: Direction::Ingress,
        frame: fragment(&node_own, 16, 40, false),
        shows: &[Kind::Fragment],
    }
}

/// Port unreachable quoting all of a 228-byte UDP datagram the pod sent (as Linux quotes, up
/// to 576 bytes), fragmented after 64 bytes on the way back: the first fragment goes to the
/// pod, the second stays addressed to the node.
fn fragmented_icmp_error_case(fuzzer: &mut Fuzzer) -> Reproduction {
    one_port(fuzzer);
    let datagram = left(
        fuzzer,
        &Packet::udp(&format!("{POD}:40000"), &format!("{REMOTE}:53"))
            .payload(&[5; 200])
            .frame(),
    );
    let error = Packet::icmp_error(
        REMOTE,
        NODE,
        ICMP_DEST_UNREACH,
        ICMP_PORT_UNREACH,
        &datagram,
    )
    .ip_id(0x99)
    .ip_packet();
    fuzzer.send(Direction::Ingress, &fragment(&error, 0, 64, true));
    Reproduction {
        direction: Direction::Ingress,
        frame: fragment(&error, 64, error.len(), false),
        shows: &[Kind::Fragment],
    }
}

/// 203.0.113.10:5000 sends to the pod's own address (routed pod IPs), which the ingress
/// program remembers; forwarding it, the node finds the TTL exhausted and answers time
/// exceeded from 192.0.2.1. The error leaves claiming to come from 10.244.1.5.
fn error_about_inbound_flow_case(fuzzer: &mut Fuzzer) -> Reproduction {
    one_port(fuzzer);
    let inbound = Packet::udp(&format!("{REMOTE}:5000"), &format!("{POD}:53"));
    fuzzer.send(Direction::Ingress, &inbound.frame());
    let quoted = inbound.ip_packet();
    Reproduction {
        direction: Direction::Egress,
        frame: Packet::icmp_error(NODE, REMOTE, ICMP_TIME_EXCEEDED, 0, &quoted[..28]).frame(),
        shows: &[Kind::Address, Kind::Mapping],
    }
}

/// A pod's GRE packet leaves as 192.0.2.1; a router on the path answers fragmentation needed
/// quoting it. The error stays addressed to the node instead of reaching the pod.
fn error_about_gre_flow_case(fuzzer: &mut Fuzzer) -> Reproduction {
    one_port(fuzzer);
    let gre = left(
        fuzzer,
        &Packet::raw(POD, REMOTE, proto::GRE)
            .payload(&wire::gre(false, &[0x45; 40]))
            .frame(),
    );
    Reproduction {
        direction: Direction::Ingress,
        frame: Packet::icmp_error(
            ROUTER,
            NODE,
            ICMP_DEST_UNREACH,
            ICMP_FRAG_NEEDED,
            &gre[..28],
        )
        .frame(),
        shows: &[Kind::Missed],
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    let Ok(text) = std::env::var(name) else {
        return default;
    };
    let text = text.trim();
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.unwrap_or_else(|error| panic!("{name}={text}: {error}"))
}

/// The default seed: fixed, so that a plain test run is repeatable.
const SEED: u64 = 0x6d61_7371;

#[test]
fn random_frames() {
    let seed = env_u64("MASQ_FUZZ_SEED", SEED);
    let frames = env_u64("MASQ_FUZZ_FRAMES", 5000);
    let mut fuzzer = Fuzzer::new(seed, KNOWN_DATAPATH_BUGS);
    if std::env::var_os("MASQ_FUZZ_SURVEY").is_some() {
        fuzzer.survey();
    }
    fuzzer.run(frames);
    for finding in fuzzer.findings() {
        eprintln!(
            "{} (x{})\n{}\n",
            finding.signature, finding.count, finding.first
        );
    }
    assert!(
        fuzzer.findings().is_empty(),
        "{} classes of violations (seed {seed:#x})",
        fuzzer.findings().len()
    );
    fuzzer.finish();
    let stats = &fuzzer.stats;
    eprintln!(
        "seed {seed:#x}: {} frames ({} refused by BPF_PROG_TEST_RUN, {} translated, {} dropped) \
         in {} epochs, {:.0} frames/s\nexcused by known bugs: {:?}\noutcomes: {:?}\nof which \
         IPv6 by an uplink translating it: {:?}",
        stats.frames,
        stats.refused,
        stats.translated,
        stats.drops,
        stats.epochs,
        fuzzer.rate(),
        stats.excused,
        stats.outcomes,
        stats.ipv6_outcomes
    );
    // A run long enough to meet every configuration must reach the paths it is meant to
    // exercise, or it proves little.
    if frames < CONFIGS * MAX_EPOCH {
        return;
    }
    for counter in [
        Counter::EgressNotConfigured,
        Counter::IngressNotConfigured,
        Counter::EgressNewMapping,
        Counter::EgressMasqueraded,
        Counter::IngressReverseNat,
        Counter::IngressIcmpErrorTranslated,
        Counter::EgressIcmpErrorTranslated,
        Counter::EgressFragmentTranslated,
        Counter::IngressFragmentTranslated,
        Counter::EgressDropNoPort,
        Counter::EgressMalformed,
        Counter::IngressMalformed,
    ] {
        assert!(
            stats.outcomes.iter().any(|(seen, _)| *seen == counter),
            "no frame reached {} in {} frames (seed {seed:#x})",
            counter.name(),
            stats.frames
        );
    }
    // IPv6 through a translating uplink: new mappings, their reuse, replies and Packet Too Big
    // restored, exemptions, pods' errors about replies, fragments both ways, extension chains
    // too long to walk.
    for counter in [
        Counter::EgressNewMapping,
        Counter::EgressMasqueraded,
        Counter::IngressReverseNat,
        Counter::IngressIcmpErrorTranslated,
        Counter::EgressExemptCidr,
        Counter::EgressExemptLinkLocal,
        Counter::EgressIcmpErrorTranslated,
        Counter::EgressFragmentTranslated,
        Counter::IngressFragmentTranslated,
        Counter::EgressUnsupported,
    ] {
        assert!(
            stats.ipv6_outcomes.iter().any(|(seen, _)| *seen == counter),
            "no IPv6 frame reached {} in {} frames (seed {seed:#x})",
            counter.name(),
            stats.frames
        );
    }
    // Paths no counter of their own tells: translation after extension headers, and later
    // fragments following their first.
    let reached = fuzzer.model.v6.reached;
    eprintln!("IPv6 paths reached: {reached:?}");
    assert!(
        reached.translated_with_extensions > 0
            && reached.too_deep > 0
            && reached.fragments_followed > 0,
        "IPv6 paths not reached in {} frames (seed {seed:#x}): {reached:?}",
        stats.frames
    );
}

#[test]
fn truncations_at_every_length() {
    let mut fuzzer = Fuzzer::new(SEED, KNOWN_DATAPATH_BUGS);
    one_port(&mut fuzzer);
    let tcp = left(
        &mut fuzzer,
        &Packet::tcp(&format!("{POD}:40000"), &format!("{REMOTE}:443"), TCP_SYN).frame(),
    );
    left(
        &mut fuzzer,
        &Packet::udp(&format!("{POD}:40001"), "203.0.113.20:53").frame(),
    );
    let sample = [
        (
            Direction::Egress,
            Packet::tcp(&format!("{POD}:40000"), &format!("{REMOTE}:443"), TCP_ACK)
                .options(&[1, 1, 1, 1])
                .frame(),
        ),
        (
            Direction::Egress,
            Packet::udp_without_checksum(&format!("{POD}:40002"), "203.0.113.30:53").frame(),
        ),
        (
            Direction::Egress,
            Packet::icmp_echo_request(POD, REMOTE, 7).frame(),
        ),
        (
            Direction::Ingress,
            Packet::tcp(&format!("{REMOTE}:443"), &format!("{NODE}:20000"), TCP_ACK).frame(),
        ),
        (
            Direction::Ingress,
            Packet::icmp_error(ROUTER, NODE, ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, &tcp).frame(),
        ),
        (
            Direction::Egress,
            Packet::icmp_error(
                POD,
                "203.0.113.20",
                ICMP_DEST_UNREACH,
                ICMP_PORT_UNREACH,
                &Packet::udp("203.0.113.20:53", &format!("{POD}:40001")).ip_packet(),
            )
            .frame(),
        ),
        (
            Direction::Ingress,
            Packet::udp("203.0.113.20:53", &format!("{NODE}:20000"))
                .first_fragment()
                .frame(),
        ),
    ];
    let mut ran = 0;
    for (direction, frame) in &sample {
        for len in 0..=frame.len() {
            let mut cut = frame[..len].to_vec();
            for program in [*direction, other(*direction)] {
                fuzzer.send(program, &cut);
                ran += 1;
            }
            // The same length with a total length that says so.
            if len >= wire::ETH_HLEN + 20 {
                let total = u16::try_from(len - wire::ETH_HLEN).unwrap_or(0);
                cut[16..18].copy_from_slice(&total.to_be_bytes());
                wire::fix_ip_checksum(&mut cut, wire::ETH_HLEN);
                for program in [*direction, other(*direction)] {
                    fuzzer.send(program, &cut);
                    ran += 1;
                }
            }
        }
    }
    fuzzer.finish();
    assert_eq!(fuzzer.stats.frames + fuzzer.stats.refused, ran + 2);
    // This kernel refuses IPv4 frames shorter than an IPv4 header; all others run.
    let refusable = sample
        .iter()
        .map(|_| 2 * (wire::ETH_HLEN + 20) as u64)
        .sum::<u64>();
    assert!(
        fuzzer.stats.refused <= refusable,
        "{} frames refused",
        fuzzer.stats.refused
    );
}

const fn other(direction: Direction) -> Direction {
    match direction {
        Direction::Egress => Direction::Ingress,
        Direction::Ingress => Direction::Egress,
    }
}

#[test]
fn known_datapath_bugs_still_fail() {
    let mut fuzzer = Fuzzer::new(SEED, KNOWN_DATAPATH_BUGS);
    for bug in KNOWN_DATAPATH_BUGS {
        let case = (bug.reproduce)(&mut fuzzer);
        let probe = Probe {
            direction: case.direction,
            frame: &case.frame,
            model: &fuzzer.model,
            uplink: Some(masq_testbed::harness::node_ip().octets()),
        };
        assert!(
            (bug.matches)(&probe),
            "{}: the predicate does not cover its own case {}",
            bug.name,
            wire::hex(&case.frame)
        );
        let sent = fuzzer.run_frame(case.direction, &case.frame);
        let mut shown: Vec<Kind> = Vec::new();
        for violation in &sent.violations {
            if !shown.contains(&violation.kind) {
                shown.push(violation.kind);
            }
        }
        assert!(
            !shown.is_empty(),
            "{} no longer reproduces: the datapath was fixed, move it to FIXED_DATAPATH_BUGS",
            bug.name
        );
        assert!(
            shown.len() == case.shows.len() && shown.iter().all(|kind| case.shows.contains(kind)),
            "{} fails another way now: {:#?}\ninput:  {}\noutput: {}",
            bug.name,
            sent.violations,
            wire::hex(&case.frame),
            wire::hex(&sent.output)
        );
        assert!(
            shown.iter().all(|kind| bug.tolerated.contains(kind)),
            "{}: its case shows violations its class does not tolerate",
            bug.name
        );
        assert!(
            sent.excused_by.contains(&bug.name),
            "{}: its case is not excused by it",
            bug.name
        );
    }
}

#[test]
fn fixed_datapath_bugs_stay_fixed() {
    let mut fuzzer = Fuzzer::new(SEED, KNOWN_DATAPATH_BUGS);
    for bug in FIXED_DATAPATH_BUGS {
        let case = (bug.reproduce)(&mut fuzzer);
        let sent = fuzzer.run_frame(case.direction, &case.frame);
        assert!(
            sent.violations.is_empty(),
            "{} is back: {:#?}\ninput:  {}\noutput: {}",
            bug.name,
            sent.violations,
            wire::hex(&case.frame),
            wire::hex(&sent.output)
        );
    }
}

#[test]
fn every_counter_is_classified_once() {
    for counter in Counter::ALL {
        let classes = [
            oracle::UNTOUCHED,
            oracle::TRANSLATING,
            oracle::DROPS,
            oracle::EVENTS,
        ]
        .iter()
        .filter(|class| class.contains(counter))
        .count();
        assert_eq!(
            classes,
            1,
            "{} must be in exactly one of the oracle's counter classes",
            counter.name()
        );
        assert_eq!(
            oracle::DROPS.contains(counter),
            counter.name().contains("_drop_"),
            "{}",
            counter.name()
        );
    }
}
