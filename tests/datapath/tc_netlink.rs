//! The clsact plumbing of the legacy attach mode against the running kernel: a veth in a
//! namespace of its own, masq's programs attached through aya's netlink path, and filters of
//! another tool next to them that must survive everything masq does. Needs root.

use std::{io::Write, process::Stdio};

use aya::programs::{
    ProgramError, TcAttachType,
    tc::{NlOptions, SchedClassifierLink, TcAttachOptions, TcError, TcHandle},
};
use masq::datapath::{
    object::{Datapath, LoadOptions},
    tc_netlink::{
        ClsactHook, TcFilter, TcNetlinkError, add_clsact, delete_clsact, delete_filter_if_named,
        has_clsact, ingress_qdisc_kind, list_filters,
    },
};
use masq_common::layout::{PROG_EGRESS, PROG_INGRESS};
use masq_testbed::netns::{Netns, require_root, run, unique_tag};
use nix::{errno::Errno, net::if_::if_nametoindex};

/// The interface under test (one end of a veth pair: this kernel may lack the dummy driver).
const IFACE: &str = "masq0";
/// Where masq's filters go.
const PRIO: u16 = 1;
const HANDLE: u32 = 0x6d61;
/// `ETH_P_ALL`, the protocol aya's filters match.
const ETH_P_ALL: u16 = 0x0003;

/// A fresh namespace holding `IFACE`.
fn sandbox() -> Netns {
    require_root();
    let netns = Netns::new(&unique_tag("tcnl"));
    netns.ip(&[
        "link", "add", IFACE, "type", "veth", "peer", "name", "masq1",
    ]);
    netns
}

/// `tc ARGS...` inside the namespace: the foreign tool.
fn tc(netns: &Netns, args: &[&str]) {
    netns.exec("tc", args);
}

fn ifindex() -> u32 {
    if_nametoindex(IFACE).unwrap_or_else(|error| panic!("no {IFACE}: {error}"))
}

fn load() -> Datapath {
    let options = LoadOptions {
        nat_max_entries: 1024,
        ..LoadOptions::default()
    };
    Datapath::load(&options).unwrap_or_else(|error| panic!("loading the datapath: {error}"))
}

fn netlink_options(priority: u16, handle: u32) -> TcAttachOptions {
    TcAttachOptions::Netlink(NlOptions {
        priority,
        handle: TcHandle::from(handle),
        ..NlOptions::default()
    })
}

fn attach_egress(datapath: &mut Datapath) -> u32 {
    datapath
        .egress_mut()
        .unwrap_or_else(|error| panic!("{error}"))
        .attach_with_options(IFACE, TcAttachType::Egress, netlink_options(PRIO, HANDLE))
        .unwrap_or_else(|error| panic!("attaching {PROG_EGRESS}: {error}"));
    egress_id(datapath)
}

/// The id the kernel gave the egress program (what `TCA_BPF_ID` reports).
fn egress_id(datapath: &Datapath) -> u32 {
    datapath
        .egress()
        .unwrap_or_else(|error| panic!("{error}"))
        .info()
        .unwrap_or_else(|error| panic!("inspecting {PROG_EGRESS}: {error}"))
        .id()
}

fn filters(hook: ClsactHook) -> Vec<TcFilter> {
    list_filters(ifindex(), hook).unwrap_or_else(|error| panic!("listing {hook:?}: {error}"))
}

fn filter_at(filters: &[TcFilter], priority: u16) -> Vec<&TcFilter> {
    filters
        .iter()
        .filter(|filter| filter.priority == priority)
        .collect()
}

fn ours(name: &str, prog_id: u32) -> TcFilter {
    TcFilter {
        priority: PRIO,
        handle: HANDLE,
        protocol: ETH_P_ALL,
        chain: 0,
        kind: "bpf".to_owned(),
        bpf_name: Some(name.to_owned()),
        bpf_prog_id: Some(prog_id),
        direct_action: true,
    }
}

#[test]
fn clsact_and_filters_from_creation_to_removal() {
    let netns = sandbox();
    netns.enter(|| {
        let ifindex = ifindex();
        assert!(!has_clsact(ifindex).unwrap());
        assert_eq!(ingress_qdisc_kind(ifindex).unwrap(), None);
        assert_eq!(filters(ClsactHook::Egress), []);
        assert!(
            !delete_clsact(ifindex).unwrap(),
            "there is none yet (ENOENT)"
        );
        // An interface that does not exist: nothing to list, and the errno comes through.
        let missing = ifindex + 1000;
        assert!(!has_clsact(missing).unwrap());
        assert_eq!(list_filters(missing, ClsactHook::Egress).unwrap(), []);
        let error = add_clsact(missing).unwrap_err();
        assert_eq!(error.errno(), Some(Errno::ENODEV), "{error}");

        assert!(add_clsact(ifindex).unwrap(), "the first add creates it");
        assert!(
            !add_clsact(ifindex).unwrap(),
            "the second finds it (EEXIST)"
        );
        assert!(has_clsact(ifindex).unwrap());

        let mut datapath = load();
        let egress_id = attach_egress(&mut datapath);
        datapath
            .ingress_mut()
            .unwrap()
            .attach_with_options(IFACE, TcAttachType::Ingress, netlink_options(PRIO, HANDLE))
            .unwrap();
        let ingress_id = datapath.ingress().unwrap().info().unwrap().id();
        assert_ne!(egress_id, ingress_id);

        // Another tool's filters: a u32, and two classic bpf filters (no name, no program id)
        // with masq's handle, one of them direct-action.
        tc(
            &netns,
            &[
                "filter", "add", "dev", IFACE, "egress", "prio", "5", "u32", "match", "u32", "0",
                "0",
            ],
        );
        let handle = format!("{HANDLE:#x}");
        tc(
            &netns,
            &[
                "filter",
                "add",
                "dev",
                IFACE,
                "egress",
                "prio",
                "6",
                "handle",
                &handle,
                "bpf",
                "bytecode",
                "1,6 0 0 4294967295,",
            ],
        );
        tc(
            &netns,
            &[
                "filter",
                "add",
                "dev",
                IFACE,
                "egress",
                "prio",
                "7",
                "handle",
                &handle,
                "bpf",
                "da",
                "bytecode",
                "1,6 0 0 0,",
            ],
        );

        let egress = filters(ClsactHook::Egress);
        assert_eq!(filter_at(&egress, PRIO), [&ours(PROG_EGRESS, egress_id)]);
        let foreign_u32 = filter_at(&egress, 5);
        assert!(!foreign_u32.is_empty(), "{egress:#?}");
        for filter in &foreign_u32 {
            assert_eq!(
                (filter.kind.as_str(), filter.protocol, &filter.bpf_name),
                ("u32", ETH_P_ALL, &None)
            );
        }
        let classic = TcFilter {
            priority: 6,
            handle: HANDLE,
            protocol: ETH_P_ALL,
            chain: 0,
            kind: "bpf".to_owned(),
            bpf_name: None,
            bpf_prog_id: None,
            direct_action: false,
        };
        let classic_da = TcFilter {
            priority: 7,
            direct_action: true,
            ..classic.clone()
        };
        assert_eq!(filter_at(&egress, 6), [&classic]);
        assert_eq!(filter_at(&egress, 7), [&classic_da]);
        assert_eq!(egress.len(), 1 + foreign_u32.len() + 2, "{egress:#?}");
        // The ingress hook is listed apart.
        assert_eq!(
            filters(ClsactHook::Ingress),
            [ours(PROG_INGRESS, ingress_id)]
        );

        // Nothing but our own filter, at exactly its address, may go.
        let delete = |priority, handle, name| {
            delete_filter_if_named(ifindex, ClsactHook::Egress, priority, handle, name).unwrap()
        };
        assert!(!delete(PRIO, HANDLE, PROG_INGRESS), "wrong name");
        assert!(!delete(PRIO, HANDLE + 1, PROG_EGRESS), "no filter there");
        assert!(!delete(6, HANDLE, PROG_EGRESS), "classic bpf, no name");
        assert!(!delete(7, HANDLE, PROG_EGRESS), "classic bpf, no name");
        for filter in &foreign_u32 {
            assert!(!delete(5, filter.handle, PROG_EGRESS), "not bpf");
        }
        for (priority, handle) in [(0, HANDLE), (PRIO, 0)] {
            let error =
                delete_filter_if_named(ifindex, ClsactHook::Egress, priority, handle, PROG_EGRESS)
                    .unwrap_err();
            assert!(matches!(error, TcNetlinkError::Wildcard { .. }), "{error}");
        }
        assert_eq!(filters(ClsactHook::Egress), egress, "nothing was deleted");

        assert!(delete(PRIO, HANDLE, PROG_EGRESS));
        let after = filters(ClsactHook::Egress);
        assert_eq!(filter_at(&after, PRIO), Vec::<&TcFilter>::new());
        let others: Vec<_> = egress
            .iter()
            .filter(|filter| filter.priority != PRIO)
            .cloned()
            .collect();
        assert_eq!(after, others, "the other tool's filters stay");
        assert!(!delete(PRIO, HANDLE, PROG_EGRESS), "already gone");
        assert_eq!(
            filters(ClsactHook::Ingress),
            [ours(PROG_INGRESS, ingress_id)]
        );

        assert!(delete_clsact(ifindex).unwrap());
        assert!(!has_clsact(ifindex).unwrap());
        assert_eq!(filters(ClsactHook::Egress), []);
        assert_eq!(filters(ClsactHook::Ingress), []);
        // Now the kernel says EINVAL ("Invalid handle"): the emptied slot holds a noop qdisc.
        assert!(!delete_clsact(ifindex).unwrap(), "nothing left to delete");
        // aya tries to detach the ingress filter it still tracks; it is already gone.
        drop(datapath);
    });
}

#[test]
fn replacing_in_place_swaps_the_program_and_keeps_the_address() {
    let netns = sandbox();
    netns.enter(|| {
        let ifindex = ifindex();
        assert!(add_clsact(ifindex).unwrap());
        let mut old = load();
        let old_id = attach_egress(&mut old);
        assert_eq!(filters(ClsactHook::Egress), [ours(PROG_EGRESS, old_id)]);

        let mut new = load();
        // A second attach at the same address is refused (aya asks for NLM_F_EXCL)...
        let error = new
            .egress_mut()
            .unwrap()
            .attach_with_options(IFACE, TcAttachType::Egress, netlink_options(PRIO, HANDLE))
            .unwrap_err();
        assert_eq!(netlink_errno(&error), Some(libc::EEXIST), "{error:?}");
        assert_eq!(filters(ClsactHook::Egress), [ours(PROG_EGRESS, old_id)]);
        // ...replacing goes through a link naming that address.
        let link = SchedClassifierLink::attached(
            IFACE,
            TcAttachType::Egress,
            PRIO,
            TcHandle::from(HANDLE),
            None,
        )
        .unwrap();
        new.egress_mut().unwrap().attach_to_link(link).unwrap();
        let new_id = egress_id(&new);
        assert_ne!(old_id, new_id);
        assert_eq!(filters(ClsactHook::Egress), [ours(PROG_EGRESS, new_id)]);

        // aya's netlink links are only (interface, hook, priority, handle): the old program
        // still holds one, and dropping it deletes whatever filter sits there now, replacement
        // included. The legacy mode must release (forget) the old program's link first.
        drop(old);
        assert_eq!(
            filters(ClsactHook::Egress),
            [],
            "aya no longer deletes by address on drop: the legacy mode may keep old links"
        );

        // Replacing needs a filter to replace: without one the kernel says ENOENT.
        let link = SchedClassifierLink::attached(
            IFACE,
            TcAttachType::Egress,
            PRIO,
            TcHandle::from(HANDLE),
            None,
        )
        .unwrap();
        let error = new.egress_mut().unwrap().attach_to_link(link).unwrap_err();
        assert_eq!(netlink_errno(&error), Some(libc::ENOENT), "{error:?}");
        assert_eq!(filters(ClsactHook::Egress), []);
        assert!(delete_clsact(ifindex).unwrap());
    });
}

/// The errno of a failed netlink attach through aya.
fn netlink_errno(error: &ProgramError) -> Option<i32> {
    match error {
        ProgramError::TcError(TcError::NetlinkError(netlink)) => netlink.raw_os_error(),
        _ => None,
    }
}

#[test]
fn an_ingress_qdisc_in_the_slot_is_left_alone() {
    let netns = sandbox();
    tc(&netns, &["qdisc", "add", "dev", IFACE, "ingress"]);
    tc(
        &netns,
        &[
            "filter", "add", "dev", IFACE, "parent", "ffff:", "prio", "3", "u32", "match", "u32",
            "0", "0",
        ],
    );
    netns.enter(|| {
        let ifindex = ifindex();
        assert_eq!(
            ingress_qdisc_kind(ifindex).unwrap().as_deref(),
            Some("ingress")
        );
        assert!(!has_clsact(ifindex).unwrap());
        let error = add_clsact(ifindex).unwrap_err();
        assert!(
            matches!(&error, TcNetlinkError::IngressSlotTaken { kind, .. } if kind == "ingress"),
            "{error}"
        );
        // The ingress qdisc's filters are not clsact filters, on either hook.
        assert_eq!(filters(ClsactHook::Egress), []);
        assert_eq!(filters(ClsactHook::Ingress), []);
        assert!(!delete_clsact(ifindex).unwrap());
        assert_eq!(
            ingress_qdisc_kind(ifindex).unwrap().as_deref(),
            Some("ingress")
        );
    });
    let shown = run(netns
        .command("tc")
        .args(["filter", "show", "dev", IFACE, "parent", "ffff:"]));
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("pref 3 u32"), "{shown}");
}

#[test]
fn listing_needs_no_privilege_and_changes_report_eperm() {
    let netns = sandbox();
    netns.enter(|| {
        let ifindex = ifindex();
        assert!(add_clsact(ifindex).unwrap());
        let mut datapath = load();
        let egress_id = attach_egress(&mut datapath);
        // A thread of its own inherits the namespace, then drops root for good.
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    drop_root_on_this_thread();
                    assert!(has_clsact(ifindex).unwrap());
                    assert_eq!(filters(ClsactHook::Egress), [ours(PROG_EGRESS, egress_id)]);
                    for error in [
                        delete_clsact(ifindex).unwrap_err(),
                        delete_filter_if_named(
                            ifindex,
                            ClsactHook::Egress,
                            PRIO,
                            HANDLE,
                            PROG_EGRESS,
                        )
                        .unwrap_err(),
                    ] {
                        assert_eq!(error.errno(), Some(Errno::EPERM), "{error}");
                    }
                    // add_clsact finds the qdisc only after the kernel checked the capability.
                    let error = add_clsact(ifindex).unwrap_err();
                    assert_eq!(error.errno(), Some(Errno::EPERM), "{error}");
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        });
        assert_eq!(filters(ClsactHook::Egress), [ours(PROG_EGRESS, egress_id)]);
        assert!(delete_clsact(ifindex).unwrap());
    });
}

/// Leaves uid 0 on the calling thread only, which clears its capabilities. The raw system call
/// matters: libc's setresuid would change every thread of the test process.
fn drop_root_on_this_thread() {
    let nobody: libc::uid_t = 65_534;
    // SAFETY: setresuid takes three integers and touches no memory of this process.
    let result = unsafe { libc::syscall(libc::SYS_setresuid, nobody, nobody, nobody) };
    assert_eq!(result, 0, "setresuid: {}", std::io::Error::last_os_error());
}

#[test]
fn dumps_spanning_many_datagrams_are_read_to_the_end() {
    const FILTERS: u16 = 400;
    let netns = sandbox();
    tc(&netns, &["qdisc", "add", "dev", IFACE, "clsact"]);
    let batch: String = (0..FILTERS)
        .map(|n| {
            format!(
                "filter add dev {IFACE} egress prio {} u32 match u32 0 0\n",
                10 + n
            )
        })
        .collect();
    let mut child = netns
        .command("tc")
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(batch.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "tc -batch failed");
    netns.enter(|| {
        let mut datapath = load();
        let egress_id = attach_egress(&mut datapath);
        let egress = filters(ClsactHook::Egress);
        // Each u32 priority has its hash table and its key node.
        assert_eq!(egress.len(), 1 + 2 * usize::from(FILTERS));
        assert_eq!(filter_at(&egress, PRIO), [&ours(PROG_EGRESS, egress_id)]);
        let mut priorities: Vec<_> = egress.iter().map(|filter| filter.priority).collect();
        priorities.dedup();
        let expected: Vec<_> = [PRIO].into_iter().chain(10..10 + FILTERS).collect();
        assert_eq!(priorities, expected);
        assert!(
            delete_filter_if_named(ifindex(), ClsactHook::Egress, PRIO, HANDLE, PROG_EGRESS)
                .unwrap()
        );
        assert_eq!(filters(ClsactHook::Egress).len(), 2 * usize::from(FILTERS));
    });
}
