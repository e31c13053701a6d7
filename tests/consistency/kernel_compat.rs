//! The minimum kernels of docs/kernels.md hold for the datapath object the agent embeds. Reads
//! the object only: no root needed.

#![expect(
    clippy::expect_used,
    reason = "test helpers fail the test with context"
)]

use std::collections::BTreeSet;

use aya_obj::generated::{
    BPF_ADD, BPF_ALU64, BPF_ATOMIC, BPF_CALL, BPF_DW, BPF_EXIT, BPF_FETCH, BPF_JA, BPF_JEQ,
    BPF_JLT, BPF_JMP, BPF_JMP32, BPF_LDX, BPF_MEMSX, BPF_MOV, BPF_PSEUDO_CALL,
    BPF_PSEUDO_KFUNC_CALL, BPF_STX, BPF_W, bpf_insn,
};
use masq::datapath::object::DATAPATH_OBJECT;
use masq_common::kernel::{KernelVersion, MIN_KERNEL_TC, MIN_KERNEL_TCX};
use masq_testbed::kernel_compat::{
    AGENT_REQUIREMENTS, Kind, Usage, instruction_usage, object_usage, too_new,
};

fn datapath_usage() -> BTreeSet<Usage> {
    object_usage(DATAPATH_OBJECT).expect("the embedded object parses")
}

#[test]
fn datapath_object_needs_nothing_newer_than_min_kernel_tc() {
    let usage = datapath_usage();
    // With --nocapture this prints the table docs/kernels.md's numbers come from.
    for Usage { kind, what, since } in &usage {
        let since = since.map_or_else(|| "?".to_owned(), |since| since.to_string());
        println!("{since:>5}  {kind:?}: {what}");
    }
    // An extractor that silently found nothing would pass the check below.
    for kind in [Kind::Program, Kind::Map, Kind::Helper, Kind::Instruction] {
        assert!(
            usage.iter().any(|usage| usage.kind == kind),
            "nothing of kind {kind:?} found in the object: {usage:#?}"
        );
    }
    let problems = too_new(&usage, MIN_KERNEL_TC);
    assert!(
        problems.is_empty(),
        "the datapath object does not run on Linux {MIN_KERNEL_TC} (MIN_KERNEL_TC):\n{}",
        problems.join("\n")
    );
}

/// The constant (and docs/kernels.md) must not promise less than needed, nor demand more: if
/// this fails after a datapath change, move `MIN_KERNEL_TC` and docs/kernels.md's "Kernel
/// requirements".
#[test]
fn min_kernel_tc_is_exactly_what_object_and_agent_need() {
    let needed = datapath_usage()
        .iter()
        .filter_map(|usage| usage.since)
        .chain(AGENT_REQUIREMENTS.iter().map(|&(_, since)| since))
        .max()
        .expect("something is needed");
    assert_eq!(
        needed, MIN_KERNEL_TC,
        "object and agent need Linux {needed}: make that MIN_KERNEL_TC and update docs/kernels.md"
    );
    assert!(MIN_KERNEL_TC < MIN_KERNEL_TCX);
}

fn insn(code: u32, src_reg: u32, off: i16, imm: i32) -> bpf_insn {
    bpf_insn {
        code: code.try_into().expect("opcode fits a byte"),
        _bitfield_align_1: [],
        _bitfield_1: bpf_insn::new_bitfield_1(0, src_reg.try_into().expect("register fits")),
        off,
        imm,
    }
}

const CALL: u32 = BPF_JMP | BPF_CALL;
const EXIT: u32 = BPF_JMP | BPF_EXIT;

/// Runs the check on a hand-made program and returns its complaints.
fn problems_in(instructions: &[bpf_insn]) -> Vec<String> {
    too_new(&instruction_usage(instructions), MIN_KERNEL_TC)
}

#[test]
fn a_helper_newer_than_the_minimum_is_named_with_its_kernel() {
    // bpf_loop is helper 181, from Linux 5.17.
    let problems = problems_in(&[insn(CALL, 0, 0, 181), insn(EXIT, 0, 0, 0)]);
    assert_eq!(
        problems,
        [format!(
            "bpf_loop (181) needs Linux 5.17, newer than {MIN_KERNEL_TC}"
        )]
    );
}

#[test]
fn a_helper_missing_from_the_table_is_reported() {
    // bpf_ktime_get_tai_ns (208) is real but not in the table: it must be added consciously.
    let problems = problems_in(&[insn(CALL, 0, 0, 208), insn(EXIT, 0, 0, 0)]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("helper 208 is not in the tables"),
        "{problems:?}"
    );
}

#[test]
fn a_kfunc_call_is_reported() {
    let problems = problems_in(&[
        insn(CALL, BPF_PSEUDO_KFUNC_CALL, 0, 4242),
        insn(EXIT, 0, 0, 0),
    ]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("kfunc (BTF id 4242)"),
        "{problems:?}"
    );
}

#[test]
fn cpu_v4_instructions_are_reported() {
    let v4 = [
        // r1 = *(s32 *)(r2 + 0)
        insn(BPF_LDX | BPF_MEMSX | BPF_W, 2, 0, 0),
        // r1 = (s8)r2
        insn(BPF_ALU64 | BPF_MOV, 2, 8, 0),
        // gotol +0
        insn(BPF_JMP32 | BPF_JA, 0, 0, 0),
    ];
    for instruction in v4 {
        let problems = problems_in(&[instruction, insn(EXIT, 0, 0, 0)]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("needs Linux 6.6"), "{problems:?}");
    }
}

#[test]
fn atomics_beyond_add_are_reported() {
    // lock *(u64 *)(r1 + 0) += r2, fetching the old value into r2
    let fetch_add = insn(
        BPF_STX | BPF_ATOMIC | BPF_DW,
        2,
        0,
        (BPF_ADD | BPF_FETCH) as i32,
    );
    let problems = problems_in(&[fetch_add, insn(EXIT, 0, 0, 0)]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("needs Linux 5.12"), "{problems:?}");
}

#[test]
fn older_instruction_features_are_recognised_and_accepted() {
    let usage = instruction_usage(&[
        insn(CALL, BPF_PSEUDO_CALL, 0, 1),
        // lock *(u64 *)(r1 + 0) += r2: the old BPF_XADD, needs nothing new
        insn(BPF_STX | BPF_ATOMIC | BPF_DW, 2, 0, BPF_ADD as i32),
        // if r0 == 0 goto -3
        insn(BPF_JMP | BPF_JEQ, 0, -3, 0),
        // if w0 == 0 goto +1
        insn(BPF_JMP32 | BPF_JEQ, 0, 1, 0),
        // if r0 < 0 goto +0
        insn(BPF_JMP | BPF_JLT, 0, 0, 0),
        insn(EXIT, 0, 0, 0),
    ]);
    let found: Vec<_> = usage
        .iter()
        .map(|usage| (usage.what.as_str(), usage.since))
        .collect();
    let linux = |major, minor| Some(KernelVersion::new(major, minor));
    assert_eq!(
        found,
        [
            ("32-bit jumps (JMP32, cpu v3)", linux(5, 1)),
            ("JLT/JLE/JSLT/JSLE (cpu v2)", linux(4, 14)),
            ("backward jumps (bounded loops)", linux(5, 3)),
            ("bpf-to-bpf function calls", linux(4, 16)),
        ]
    );
    assert!(too_new(&usage, MIN_KERNEL_TC).is_empty());
}

/// Issue 25, point 1: arm64's JIT lets a program mix tail calls with bpf-to-bpf calls only from
/// Linux 6.0 (x86-64 from 5.10). Every masq program tail-calls or is tail-called, so none may
/// call a function: the calls that crept in were LLVM's, a `memset` for zeroing an odd run of
/// bytes and a `memmove` for copying an IPv6 address or an entry out of a map value. This
/// fails the day one comes back.
#[test]
fn no_program_makes_a_bpf_to_bpf_call() {
    let object = aya_obj::Object::parse(DATAPATH_OBJECT).expect("the embedded object parses");
    assert!(object.programs.len() >= 10, "{:?}", object.programs.keys());
    let mut callers: Vec<&str> = object
        .programs
        .iter()
        .filter(|(_, program)| {
            let function = object
                .functions
                .get(&program.function_key())
                .expect("every program has its function");
            function.instructions.iter().any(|insn| {
                u32::from(insn.code) == BPF_JMP | BPF_CALL
                    && u32::from(insn.src_reg()) == BPF_PSEUDO_CALL
            })
        })
        .map(|(name, _)| name.as_str())
        .collect();
    callers.sort_unstable();
    assert!(
        callers.is_empty(),
        "these programs call functions (disassemble with llvm-objdump -dr to see which): \
         {callers:?}"
    );
}
