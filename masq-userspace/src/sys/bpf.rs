//! The `bpf(2)` commands aya does not wrap, or wraps in a way the agent cannot use.
//!
//! On hash maps:
//!
//! * Reading a whole hash map with `BPF_MAP_LOOKUP_BATCH` (Linux 5.6). Walking a map key by key
//!   costs two system calls per entry (next key, then lookup): over a full NAT table of half a
//!   million entries that is seconds of the agent's CPU for every garbage collection pass. A
//!   batch call copies thousands of entries at once.
//! * Removing an entry and getting the value it had at that instant with
//!   `BPF_MAP_LOOKUP_AND_DELETE_ELEM` (hash maps from Linux 5.14), which lets the garbage
//!   collector see whether a packet refreshed a flow after it decided to remove it.
//!
//! On tcx attachments, asked without CAP_SYS_ADMIN: aya answers "which programs run on this
//! hook" by opening every program by id (`BPF_PROG_GET_FD_BY_ID`), which needs CAP_SYS_ADMIN
//! even when CAP_BPF is held; the DaemonSet does not grant it. Both questions the agent has can
//! be answered from objects it already holds: a link's own info (`BPF_OBJ_GET_INFO_BY_FD` on the
//! pinned link, opened with `BPF_OBJ_GET`) tells which program it runs and on which interface,
//! and `BPF_PROG_QUERY` (CAP_NET_ADMIN) lists the ids of everything attached to a hook.
//!
//! Each attribute is the prefix of `union bpf_attr` (`include/uapi/linux/bpf.h`) its command
//! reads; the kernel takes it by size, and zero-fills what a shorter one leaves out.

use std::{
    ffi::CString,
    io,
    mem::{MaybeUninit, size_of},
    os::{
        fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::Path,
};

use aya::{Pod, maps::MapError, sys::SyscallError};

use crate::datapath::pins::Hook;

/// The commands used here, from `enum bpf_cmd`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Command {
    ObjGet,
    ObjGetInfoByFd,
    ProgQuery,
    MapLookupAndDeleteElem,
    MapLookupBatch,
}

impl Command {
    const fn number(self) -> libc::c_long {
        match self {
            Self::ObjGet => 7,
            Self::ObjGetInfoByFd => 15,
            Self::ProgQuery => 16,
            Self::MapLookupAndDeleteElem => 21,
            Self::MapLookupBatch => 24,
        }
    }
}

/// The `bpf(2)` system call: `command` with its attribute `attr`. Returns what the command
/// returns: a new descriptor for the commands that open one, 0 for the others.
///
/// # Safety
///
/// `T` must be a `#[repr(C)]` prefix of `union bpf_attr` laid out as `command` reads it, and
/// every pointer in `attr` must point to memory that stays valid for the call and is large
/// enough for what the command reads from or writes to it there.
unsafe fn bpf<T>(command: Command, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, exclusively borrowed attribute of the size passed along; the
    // caller vouches for its layout and for the buffers it points to.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command.number(),
            std::ptr::from_mut(attr),
            size_of::<T>(),
        )
    };
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

/// The kernel's `ENOTSUPP` (not in libc: it is internal to the kernel, yet reaches user space
/// from the bpf system call), what kernels before 5.14 answer
/// `BPF_MAP_LOOKUP_AND_DELETE_ELEM` with on a hash map.
const ENOTSUPP: i32 = 524;

/// Entries asked for per call, at first: large enough for the longest hash bucket (a bucket is
/// never split across calls) and few calls on a full table.
const FIRST_CHUNK: usize = 4096;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    /// Where to resume (a pointer to the previous call's `out_batch`), 0 to start.
    in_batch: u64,
    /// Where the kernel writes the position to resume from.
    out_batch: u64,
    keys: u64,
    values: u64,
    /// In: room in `keys` and `values`; out: entries copied.
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Every entry of the hash map `fd` with keys `K` and values `V`. Like a walk, a snapshot that
/// may miss entries created or deleted meanwhile, but consistent per hash bucket.
pub(crate) fn lookup_all<K: Pod, V: Pod>(fd: BorrowedFd<'_>) -> Result<Vec<(K, V)>, MapError> {
    let mut entries = Vec::new();
    // The kernel's position token for hash maps is a bucket index (u32); room for more.
    let mut position = [0u64; 1];
    let mut next = [0u64; 1];
    let mut started = false;
    let mut chunk = FIRST_CHUNK;
    loop {
        let mut keys: Vec<MaybeUninit<K>> = Vec::with_capacity(chunk);
        let mut values: Vec<MaybeUninit<V>> = Vec::with_capacity(chunk);
        let mut attr = BatchAttr {
            in_batch: if started { position.as_ptr() as u64 } else { 0 },
            out_batch: next.as_mut_ptr() as u64,
            map_fd: u32::try_from(fd.as_raw_fd()).unwrap_or(u32::MAX),
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: u32::try_from(chunk).unwrap_or(u32::MAX),
            ..BatchAttr::default()
        };
        // SAFETY: `attr` is the `batch` member of `bpf_attr`; the kernel writes at most `count`
        // keys and values into buffers with room for `chunk` of each, reads one position token
        // from `position` and writes one into `next`, all of which outlive the call.
        let error = unsafe { bpf(Command::MapLookupBatch, &mut attr) }.err();
        let copied = usize::try_from(attr.count).unwrap_or(0).min(chunk);
        if error
            .as_ref()
            .is_some_and(|error| error.raw_os_error() == Some(libc::ENOSPC))
            && copied == 0
        {
            // A bucket holds more entries than the buffers: retry it with more room.
            chunk *= 2;
            continue;
        }
        // SAFETY: the kernel initialised the first `copied` keys and values.
        unsafe {
            keys.set_len(copied);
            values.set_len(copied);
        }
        entries.extend(
            keys.into_iter()
                .zip(values)
                // SAFETY: as above; `Pod` types are valid for any bytes.
                .map(|(key, value)| unsafe { (key.assume_init(), value.assume_init()) }),
        );
        match error {
            None => {}
            // The end of the map.
            Some(error) if error.raw_os_error() == Some(libc::ENOENT) => return Ok(entries),
            Some(io_error) => {
                return Err(MapError::SyscallError(SyscallError {
                    call: "bpf_map_lookup_batch",
                    io_error,
                }));
            }
        }
        position = next;
        started = true;
    }
}

/// The element member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct ElementAttr {
    map_fd: u32,
    pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// What [`take`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Taken<V> {
    /// The entry was removed; it held this value at that instant.
    Removed(V),
    /// There was no such entry.
    Absent,
    /// This kernel cannot do it on this map (hash maps before Linux 5.14).
    Unsupported,
}

/// Removes `key` from the hash map `fd` (keys `K`, values `V`) and returns the value it held
/// when it was removed: no update made before the removal is missed, as one between a read
/// and a separate delete would be.
pub(crate) fn take<K: Pod, V: Pod>(fd: BorrowedFd<'_>, key: &K) -> Result<Taken<V>, MapError> {
    let mut value = MaybeUninit::<V>::uninit();
    let mut attr = ElementAttr {
        map_fd: u32::try_from(fd.as_raw_fd()).unwrap_or(u32::MAX),
        key: std::ptr::from_ref(key) as u64,
        value: value.as_mut_ptr() as u64,
        ..ElementAttr::default()
    };
    // SAFETY: `attr` is the element member of `bpf_attr`; the kernel reads one key and writes
    // at most one value of the map's value size, which `V` is, both living across the call.
    let Err(io_error) = (unsafe { bpf(Command::MapLookupAndDeleteElem, &mut attr) }) else {
        // SAFETY: the call succeeded, so the kernel wrote the value; `Pod` is valid for any
        // bytes.
        return Ok(Taken::Removed(unsafe { value.assume_init() }));
    };
    match io_error.raw_os_error() {
        Some(libc::ENOENT) => Ok(Taken::Absent),
        Some(ENOTSUPP | libc::EINVAL) => Ok(Taken::Unsupported),
        _ => Err(MapError::SyscallError(SyscallError {
            call: "bpf_map_lookup_and_delete_elem",
            io_error,
        })),
    }
}

/// `enum bpf_attach_type` values of the tcx hooks.
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;

/// The tcx attach type of `hook`.
const fn tcx_attach_type(hook: Hook) -> u32 {
    match hook {
        Hook::Ingress => BPF_TCX_INGRESS,
        Hook::Egress => BPF_TCX_EGRESS,
    }
}

/// What a tcx link is attached to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TcxLinkInfo {
    /// The link's id.
    pub(crate) link_id: u32,
    /// The program the link runs.
    pub(crate) program_id: u32,
    /// The interface, or 0 when the interface is gone and the link is defunct.
    pub(crate) ifindex: u32,
    /// Which hook, when attached.
    pub(crate) hook: Option<Hook>,
}

/// `struct bpf_link_info` as far as a tcx link fills it: the common header, then the tcx
/// member of the union, which starts at offset 16 (the union holds 64-bit members).
#[repr(C)]
#[derive(Default)]
struct RawLinkInfo {
    link_type: u32,
    id: u32,
    prog_id: u32,
    padding: u32,
    ifindex: u32,
    attach_type: u32,
    /// Room for the rest of the union, which the kernel zero-fills for a tcx link.
    rest: [u64; 6],
}

/// The attribute of `BPF_OBJ_GET_INFO_BY_FD`.
#[repr(C)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The attribute of `BPF_PROG_QUERY`, up to the fields this call uses.
#[repr(C)]
#[derive(Default)]
struct QueryAttr {
    target_ifindex: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_count: u32,
    padding: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// The attachment of the tcx link `link`.
pub(crate) fn tcx_link_info(link: BorrowedFd<'_>) -> io::Result<TcxLinkInfo> {
    let mut info = RawLinkInfo::default();
    let mut attr = InfoAttr {
        bpf_fd: u32::try_from(link.as_raw_fd()).map_err(io::Error::other)?,
        info_len: u32::try_from(size_of::<RawLinkInfo>()).map_err(io::Error::other)?,
        info: std::ptr::from_mut(&mut info) as u64,
    };
    // SAFETY: `attr` is the `info` member of `bpf_attr`; the kernel writes at most `info_len`
    // bytes into `info`, which lives across the call.
    unsafe { bpf(Command::ObjGetInfoByFd, &mut attr) }?;
    let hook = match info.attach_type {
        BPF_TCX_INGRESS => Some(Hook::Ingress),
        BPF_TCX_EGRESS => Some(Hook::Egress),
        _ => None,
    };
    Ok(TcxLinkInfo {
        link_id: info.id,
        program_id: info.prog_id,
        ifindex: info.ifindex,
        hook,
    })
}

/// The ids of the programs attached to `hook` of interface `ifindex` through tcx, in the order
/// they run. Empty when the kernel has no tcx.
pub(crate) fn tcx_program_ids(ifindex: u32, hook: Hook) -> io::Result<Vec<u32>> {
    let mut ids = vec![0u32; 64];
    loop {
        let mut attr = QueryAttr {
            target_ifindex: ifindex,
            attach_type: tcx_attach_type(hook),
            prog_ids: ids.as_mut_ptr() as u64,
            prog_count: u32::try_from(ids.len()).map_err(io::Error::other)?,
            ..QueryAttr::default()
        };
        // SAFETY: `attr` is the `query` member of `bpf_attr`; the kernel writes at most
        // `prog_count` ids into `ids`, which lives across the call.
        match unsafe { bpf(Command::ProgQuery, &mut attr) } {
            Ok(_) => {
                ids.truncate(attr.prog_count as usize);
                return Ok(ids);
            }
            // More programs than room: the kernel said how many there are.
            Err(error)
                if error.raw_os_error() == Some(libc::ENOSPC)
                    && attr.prog_count as usize > ids.len() =>
            {
                ids.resize(attr.prog_count as usize, 0);
            }
            // A kernel without tcx does not know the attach type.
            Err(error) if error.raw_os_error() == Some(libc::EINVAL) => return Ok(Vec::new()),
            Err(error) => return Err(error),
        }
    }
}

/// The attribute of `BPF_OBJ_GET`.
#[repr(C)]
struct ObjGetAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

/// Opens the object pinned at `path` (`BPF_OBJ_GET`: only bpffs file permissions are checked).
pub(crate) fn open_pinned(path: &Path) -> io::Result<OwnedFd> {
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut attr = ObjGetAttr {
        pathname: path.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: 0,
    };
    // SAFETY: `attr` is the `obj` member of `bpf_attr`; the kernel reads the NUL-terminated
    // `path`, which outlives the call.
    let fd = unsafe { bpf(Command::ObjGet, &mut attr) }?;
    let fd = i32::try_from(fd).map_err(io::Error::other)?;
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

// The kernel reads each attribute by size: a layout that drifted from the header would hand it
// the wrong descriptor.
const _: () = assert!(size_of::<BatchAttr>() == 56);
const _: () = assert!(size_of::<ElementAttr>() == 32);
const _: () = assert!(size_of::<InfoAttr>() == 16);
const _: () = assert!(size_of::<QueryAttr>() == 64);
const _: () = assert!(size_of::<ObjGetAttr>() == 16);
