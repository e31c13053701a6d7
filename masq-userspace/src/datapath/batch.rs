//! Map operations aya does not offer on hash maps.
//!
//! * Reading a whole hash map with `BPF_MAP_LOOKUP_BATCH` (Linux 5.6). Walking a map key by key
//!   costs two system calls per entry (next key, then lookup): over a full NAT table of half a
//!   million entries that is seconds of the agent's CPU for every garbage collection pass. A
//!   batch call copies thousands of entries at once.
//! * Removing an entry and getting the value it had at that instant with
//!   `BPF_MAP_LOOKUP_AND_DELETE_ELEM` (hash maps from Linux 5.14), which lets the garbage
//!   collector see whether a packet refreshed a flow after it decided to remove it.

use std::{
    mem::{MaybeUninit, size_of},
    os::fd::{AsRawFd as _, BorrowedFd},
};

use aya::{Pod, maps::MapError, sys::SyscallError};

/// `BPF_MAP_LOOKUP_AND_DELETE_ELEM` in `enum bpf_cmd`.
const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;
/// The kernel's `ENOTSUPP` (not in libc: it is internal to the kernel, yet reaches user space
/// from the bpf system call), what kernels before 5.14 answer the call above on a hash map.
const ENOTSUPP: i32 = 524;

/// `BPF_MAP_LOOKUP_BATCH` in `enum bpf_cmd`.
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// Entries asked for per call, at first: large enough for the longest hash bucket (a bucket is
/// never split across calls) and few calls on a full table.
const FIRST_CHUNK: usize = 4096;

/// The `batch` member of `union bpf_attr` (`include/uapi/linux/bpf.h`).
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
        // SAFETY: `attr` is a valid `bpf_attr` prefix of the size passed; the kernel writes at
        // most `count` keys and values into buffers with room for `chunk` of each, and one
        // position token into `next`.
        let error = super::bpf(BPF_MAP_LOOKUP_BATCH, &mut attr).err();
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

/// The element member of `union bpf_attr` (`include/uapi/linux/bpf.h`).
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
    // SAFETY: `attr` is a valid `bpf_attr` prefix of the size passed; the kernel reads one key
    // and writes at most one value of the map's value size, which `V` is.
    let Err(io_error) = super::bpf(BPF_MAP_LOOKUP_AND_DELETE_ELEM, &mut attr) else {
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

const _: () = assert!(size_of::<ElementAttr>() == 32);

// The kernel reads the attribute by size: a layout that drifted from the header would hand it
// the wrong descriptor.
const _: () = assert!(size_of::<BatchAttr>() == 56);
