//! The addresses the datapath handles: IPv4's are `[u8; 4]`, IPv6's [`V6`]. A leaf: the maps'
//! types and everything above them name these.

use masq_common::nat::Address;

/// An IPv6 address as the datapath handles it: its 16 bytes, aligned to 4. As a plain byte
/// array LLVM moves and compares it byte by byte, each byte in a stack slot of its own eight
/// bytes wide, and an IPv6 program then outgrows its 512-byte stack; aligned, it moves in
/// words. The maps' layout is the same as with `[u8; 16]` (what userspace uses).
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct V6(pub(crate) [u8; 16]);

impl Address for V6 {
    type EntryPad = [u8; 4];
    const ENTRY_PAD: [u8; 4] = [0; 4];
}
