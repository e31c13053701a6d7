//! What a built eBPF object needs from the kernel, for the minimum kernel docs/kernels.md
//! promises.
//!
//! [`object_usage`] lists what the object uses that older kernels lack: program types, map types
//! and flags, helpers and instruction-set features, each with the first release whose tc
//! classifiers have it. [`too_new`] names every entry that is newer than a given kernel or missing
//! from the tables. The tables hold what masq uses, not every helper the kernel has: an entry
//! they do not know fails the check, so that each addition is looked up in the kernel's history
//! (`include/uapi/linux/bpf.h` and the commit that wired the helper up for `BPF_PROG_TYPE_SCHED_CLS`)
//! instead of being waved through.
//!
//! Not counted, because aya adapts them to the running kernel before loading: the BTF kinds the
//! object's BTF uses (aya-obj's sanitizer rewrites FLOAT, DECL_TAG, TYPE_TAG, ENUM64, FUNC
//! linkage and DATASEC for kernels that lack them, and aya loads the programs without BTF when the
//! kernel refuses it), and func/line info (dropped without kernel support). CO-RE relocations
//! would need the kernel's own BTF; the object has none and [`object_usage`] reports them as
//! unknown if that changes.

use std::collections::BTreeSet;

use aya_obj::{
    EbpfSectionKind, Object, ParseError, ProgramSection,
    generated::{
        BPF_ADD, BPF_ALU, BPF_ALU64, BPF_ATOMIC, BPF_CALL, BPF_DIV, BPF_END, BPF_EXIT,
        BPF_F_NO_PREALLOC, BPF_F_RDONLY_PROG, BPF_JA, BPF_JCOND, BPF_JLE, BPF_JLT, BPF_JMP,
        BPF_JMP32, BPF_JSLE, BPF_JSLT, BPF_LDX, BPF_MEMSX, BPF_MOD, BPF_MOV, BPF_PSEUDO_CALL,
        BPF_PSEUDO_KFUNC_CALL, BPF_STX, bpf_func_id, bpf_insn, bpf_map_type,
    },
};
use masq_common::kernel::KernelVersion;

/// What part of the object an entry comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A program's type (from its ELF section).
    Program,
    /// A map's type or flags, or global data.
    Map,
    /// A call into the kernel: helper or kfunc.
    Helper,
    /// An instruction-set feature.
    Instruction,
}

/// One thing the object uses and the first kernel that has it for tc classifiers; `since` is
/// `None` when the tables do not know it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Usage {
    /// Where it comes from.
    pub kind: Kind,
    /// What it is, named as in the kernel's headers.
    pub what: String,
    /// First kernel that has it, if known.
    pub since: Option<KernelVersion>,
}

const fn linux(major: u32, minor: u32) -> KernelVersion {
    KernelVersion::new(major, minor)
}

/// Helpers, with the first release that lets a `BPF_PROG_TYPE_SCHED_CLS` program call them.
const HELPERS: &[(bpf_func_id, KernelVersion)] = &[
    // The map helpers predate tc's eBPF support (4.1), which is what bounds them here.
    (bpf_func_id::BPF_FUNC_map_lookup_elem, linux(4, 1)),
    (bpf_func_id::BPF_FUNC_map_update_elem, linux(4, 1)),
    (bpf_func_id::BPF_FUNC_map_delete_elem, linux(4, 1)),
    (bpf_func_id::BPF_FUNC_get_prandom_u32, linux(4, 1)),
    (bpf_func_id::BPF_FUNC_skb_store_bytes, linux(4, 1)),
    (bpf_func_id::BPF_FUNC_l3_csum_replace, linux(4, 1)),
    (bpf_func_id::BPF_FUNC_l4_csum_replace, linux(4, 1)),
    (bpf_func_id::BPF_FUNC_skb_load_bytes, linux(4, 5)),
    // IPv6 address changes go into the transport checksum as one difference.
    (bpf_func_id::BPF_FUNC_csum_diff, linux(4, 6)),
    // Puts back the skb->csum that bpf_l4_csum_replace moves wrongly for an IPv6 address on a
    // CHECKSUM_COMPLETE skb, before BPF_F_IPV6 (6.16).
    (bpf_func_id::BPF_FUNC_csum_update, linux(4, 9)),
    // New flows go through the allocator by tail call. No masq program makes bpf-to-bpf calls
    // (a test checks), which arm64 allows next to tail calls only from 6.0.
    (bpf_func_id::BPF_FUNC_tail_call, linux(4, 2)),
    // Socket lookups for tc programs: 4.20; the one that also finds request and time-wait
    // sockets: 5.2.
    (bpf_func_id::BPF_FUNC_sk_lookup_udp, linux(4, 20)),
    (bpf_func_id::BPF_FUNC_sk_release, linux(4, 20)),
    (bpf_func_id::BPF_FUNC_skc_lookup_tcp, linux(5, 2)),
    // aya-log's debug records; compiled in even when the level global turns them off.
    (bpf_func_id::BPF_FUNC_ringbuf_reserve, linux(5, 8)),
    (bpf_func_id::BPF_FUNC_ringbuf_submit, linux(5, 8)),
    (bpf_func_id::BPF_FUNC_ringbuf_discard, linux(5, 8)),
    // In bpf_base_func_proto from 5.11; 5.16 moved it to bpf_sk_base_func_proto, which tc
    // classifiers still reach.
    (bpf_func_id::BPF_FUNC_ktime_get_coarse_ns, linux(5, 11)),
    // In bpf_base_func_proto's part for loaders with CAP_BPF (or CAP_SYS_ADMIN), which the
    // DaemonSet grants; 64-bit JITs inline it as a load of jiffies.
    (bpf_func_id::BPF_FUNC_jiffies64, linux(5, 5)),
    // Not used by masq: lets the tests show that a helper newer than the minimum is caught.
    (bpf_func_id::BPF_FUNC_loop, linux(5, 17)),
];

/// Map types, with the release that introduced them.
const MAP_TYPES: &[(bpf_map_type, KernelVersion)] = &[
    (bpf_map_type::BPF_MAP_TYPE_HASH, linux(3, 19)),
    (bpf_map_type::BPF_MAP_TYPE_ARRAY, linux(3, 19)),
    // With BTF, as aya declares it: 4.20.
    (bpf_map_type::BPF_MAP_TYPE_PROG_ARRAY, linux(4, 20)),
    (bpf_map_type::BPF_MAP_TYPE_PERCPU_ARRAY, linux(4, 6)),
    (bpf_map_type::BPF_MAP_TYPE_LRU_HASH, linux(4, 10)),
    (bpf_map_type::BPF_MAP_TYPE_LPM_TRIE, linux(4, 11)),
    (bpf_map_type::BPF_MAP_TYPE_RINGBUF, linux(5, 8)),
];

/// Map flags, with the release that introduced them.
const MAP_FLAGS: &[(u32, &str, KernelVersion)] = &[
    // Mandatory for LPM tries.
    (BPF_F_NO_PREALLOC, "BPF_F_NO_PREALLOC", linux(4, 6)),
    // aya-obj sets it on `.rodata`.
    (BPF_F_RDONLY_PROG, "BPF_F_RDONLY_PROG", linux(5, 2)),
];

/// What the agent needs beyond the object's contents, with the first kernel that has it.
pub const AGENT_REQUIREMENTS: &[(&str, KernelVersion)] = &[
    (
        "clsact qdisc with direct-action cls_bpf filters (legacy tc attachment)",
        linux(4, 5),
    ),
    (
        "CAP_BPF and CAP_PERFMON, the only BPF capabilities the DaemonSet grants",
        linux(5, 8),
    ),
    (
        "BPF memory charged to the memory cgroup: the agent never raises RLIMIT_MEMLOCK",
        linux(5, 11),
    ),
];

/// Everything in `elf` (a BPF ELF object) that depends on the kernel, without duplicates.
pub fn object_usage(elf: &[u8]) -> Result<BTreeSet<Usage>, ParseError> {
    let object = Object::parse(elf)?;
    let mut usage = BTreeSet::new();
    for program in object.programs.values() {
        usage.insert(program_usage(&program.section));
    }
    for map in object.maps.values() {
        usage.insert(map_type_usage(map.map_type()));
        usage.extend(map_flag_usage(map.map_flags()));
        if matches!(
            map.section_kind(),
            EbpfSectionKind::Data | EbpfSectionKind::Rodata | EbpfSectionKind::Bss
        ) {
            // Instructions that address a map value directly (BPF_PSEUDO_MAP_VALUE) and
            // BPF_MAP_FREEZE, which aya uses on `.rodata`, both arrived in 5.2.
            usage.insert(Usage {
                kind: Kind::Map,
                what: "global data (.rodata, .data, .bss)".into(),
                since: Some(linux(5, 2)),
            });
        }
    }
    if object.has_btf_relocations() {
        usage.insert(Usage {
            kind: Kind::Program,
            what: "CO-RE relocations (need the kernel's BTF)".into(),
            since: None,
        });
    }
    for function in object.functions.values() {
        usage.extend(instruction_usage(&function.instructions));
    }
    Ok(usage)
}

fn program_usage(section: &ProgramSection) -> Usage {
    match section {
        ProgramSection::SchedClassifier => Usage {
            kind: Kind::Program,
            what: "BPF_PROG_TYPE_SCHED_CLS".into(),
            since: Some(linux(4, 1)),
        },
        other => Usage {
            kind: Kind::Program,
            what: format!("program section {other:?}"),
            since: None,
        },
    }
}

fn map_type_usage(map_type: u32) -> Usage {
    let known = MAP_TYPES
        .iter()
        .find(|(known, _)| *known as u32 == map_type);
    Usage {
        kind: Kind::Map,
        what: known.map_or_else(
            || format!("map type {map_type}"),
            |(known, _)| format!("{known:?}"),
        ),
        since: known.map(|&(_, since)| since),
    }
}

fn map_flag_usage(flags: u32) -> Vec<Usage> {
    let known_bits = MAP_FLAGS.iter().fold(0, |bits, (flag, _, _)| bits | flag);
    let mut usage: Vec<Usage> = MAP_FLAGS
        .iter()
        .filter(|(flag, _, _)| flags & flag != 0)
        .map(|&(_, name, since)| Usage {
            kind: Kind::Map,
            what: name.into(),
            since: Some(since),
        })
        .collect();
    if flags & !known_bits != 0 {
        usage.push(Usage {
            kind: Kind::Map,
            what: format!("map flags {:#x}", flags & !known_bits),
            since: None,
        });
    }
    usage
}

fn helper_usage(id: i32) -> Usage {
    let known = HELPERS
        .iter()
        .find(|(known, _)| *known as i64 == i64::from(id));
    Usage {
        kind: Kind::Helper,
        what: known.map_or_else(
            || format!("helper {id}"),
            // bpf_func_id's variants are the uapi names, `BPF_FUNC_` and the helper's name.
            |(known, _)| format!("{known:?} ({id})").replacen("BPF_FUNC_", "bpf_", 1),
        ),
        since: known.map(|&(_, since)| since),
    }
}

/// What a stream of instructions needs: helpers it calls and instruction-set features.
pub fn instruction_usage(instructions: &[bpf_insn]) -> BTreeSet<Usage> {
    let feature = |what: &str, since: Option<KernelVersion>| Usage {
        kind: Kind::Instruction,
        what: what.into(),
        since,
    };
    let cpu_v4 = || {
        feature(
            "cpu v4 instructions (sign extension, signed division, bswap, gotol)",
            Some(linux(6, 6)),
        )
    };
    let mut usage = BTreeSet::new();
    for insn in instructions {
        let code = u32::from(insn.code);
        let (class, op, mode) = (code & 0x07, code & 0xf0, code & 0xe0);
        match class {
            BPF_JMP if op == BPF_CALL => {
                match u32::from(insn.src_reg()) {
                    0 => usage.insert(helper_usage(insn.imm)),
                    BPF_PSEUDO_CALL => {
                        usage.insert(feature("bpf-to-bpf function calls", Some(linux(4, 16))))
                    }
                    BPF_PSEUDO_KFUNC_CALL => usage.insert(Usage {
                        kind: Kind::Helper,
                        what: format!("kfunc (BTF id {})", insn.imm),
                        since: None,
                    }),
                    other => usage.insert(feature(&format!("call with src_reg {other}"), None)),
                };
            }
            BPF_JMP if op == BPF_EXIT => {}
            BPF_JMP if op == BPF_JCOND => {
                usage.insert(feature("may_goto", None));
            }
            BPF_JMP32 if op == BPF_JA => {
                usage.insert(cpu_v4());
            }
            BPF_JMP | BPF_JMP32 => {
                if class == BPF_JMP32 {
                    usage.insert(feature("32-bit jumps (JMP32, cpu v3)", Some(linux(5, 1))));
                }
                if matches!(op, BPF_JLT | BPF_JLE | BPF_JSLT | BPF_JSLE) {
                    usage.insert(feature("JLT/JLE/JSLT/JSLE (cpu v2)", Some(linux(4, 14))));
                }
                // The verifier rejected every back-edge until bounded loops.
                if insn.off < 0 {
                    usage.insert(feature("backward jumps (bounded loops)", Some(linux(5, 3))));
                }
            }
            BPF_LDX if mode == BPF_MEMSX => {
                usage.insert(cpu_v4());
            }
            // Plain atomic add is the old BPF_XADD; fetching and the other operations are newer.
            BPF_STX if mode == BPF_ATOMIC && insn.imm != BPF_ADD as i32 => {
                usage.insert(feature(
                    "atomics beyond add (fetch, and, or, xor, xchg, cmpxchg)",
                    Some(linux(5, 12)),
                ));
            }
            // cpu v4 reuses `off`, which older instructions leave zero: sign-extending moves
            // and signed division/modulo set it, and bswap is BPF_END in the 64-bit class.
            BPF_ALU | BPF_ALU64
                if (matches!(op, BPF_MOV | BPF_DIV | BPF_MOD) && insn.off != 0)
                    || (class == BPF_ALU64 && op == BPF_END) =>
            {
                usage.insert(cpu_v4());
            }
            _ => {}
        }
    }
    usage
}

/// One message per entry of `usage` that `kernel` lacks or the tables do not know.
pub fn too_new<'a>(
    usage: impl IntoIterator<Item = &'a Usage>,
    kernel: KernelVersion,
) -> Vec<String> {
    usage
        .into_iter()
        .filter_map(|usage| match usage.since {
            Some(since) if since <= kernel => None,
            Some(since) => Some(format!(
                "{} needs Linux {since}, newer than {kernel}",
                usage.what
            )),
            None => Some(format!(
                "{} is not in the tables of tests/src/kernel_compat.rs: add it with the first \
                 kernel that has it",
                usage.what
            )),
        })
        .collect()
}
